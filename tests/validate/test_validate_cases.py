"""scripts/validate_cases.py: a matrix run one case per process; a case that fails costs that case alone, and the
report of the rest is written as `kvplan validate --report` writes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


def test_a_failing_case_costs_itself_alone(tmp_path):
    matrix = tmp_path / "m.yaml"
    fixture = ROOT / "tests" / "fixtures" / "configs" / "tiny-deepseek-v3.json"
    matrix.write_text("cases:\n"
                      "  - {model: no-such-model-anywhere, device: cpu}\n"
                      f"  - {{model: {fixture}, batch: 2, seq_len: 24, dtype: bf16, device: cpu}}\n")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "validate_cases.py"), str(matrix), "--out", str(out),
                           "--timeout", "300"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED no-such-model-anywhere: exit 2" in done.stdout
    report = json.loads((out / "validation.json").read_text())
    assert {c["model"] for c in report["cases"]} == {"tiny-deepseek-v3"}
    kv = next(c for c in report["cases"] if c["component"] == "kv_cache")
    assert kv["error_bytes"] == 0 and kv["measured_bytes"] > 0
    log = [json.loads(line) for line in (out / "cases.jsonl").read_text().splitlines()]
    assert [e["exit"] for e in log] == [2, 0] and "error" in log[0] and "report" in log[1]
    assert "| tiny-deepseek-v3 | 2 | 24 | bf16 |" in (out / "validation.md").read_text()
