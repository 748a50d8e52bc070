"""`kvplan validate` on CPU: real transformers models, measured storages beside predictions."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli import app

runner = CliRunner()
CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "configs"
MATRIX = Path(__file__).resolve().parents[2] / "configs" / "validation" / "matrix-cpu.yaml"


def test_missing_torch_is_one_line_exit_2(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    r = runner.invoke(app, ["validate", "gpt2"])
    assert r.exit_code == 2
    assert "pip install -e '.[validate]'" in r.stderr and "Traceback" not in r.output


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_validate_json_contract_and_exact_kv():
    r = runner.invoke(app, ["validate", str(CONFIGS / "tiny-gemma2.json"), "--batch", "3", "--seq-len", "40",
                            "--device", "cpu", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["device"]["name"] == "cpu" and out["passed"] is True
    rows = {row["component"]: row for row in out["cases"]}
    for row in out["cases"]:
        assert {"model", "batch", "seq_len", "dtype", "component", "predicted_bytes", "measured_bytes", "error_bytes",
                "error_frac", "scaled"} <= set(row)
    assert rows["kv_cache"]["error_bytes"] == 0 and rows["kv_cache"]["measured_bytes"] > 0
    assert rows["weights"]["error_bytes"] == 0


def test_reduced_layers_are_scaled_and_marked():
    r = runner.invoke(app, ["validate", str(CONFIGS / "qwen3-0.6b.json"), "--layers", "1", "--seq-len", "20",
                            "--dtype", "bf16", "--device", "cpu", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["cases"]
    measured = [x for x in rows if not x["scaled"]]
    scaled = [x for x in rows if x["scaled"]]
    assert {x["layers"] for x in measured} == {1} and {x["layers"] for x in scaled} == {28}
    kv = next(x for x in scaled if x["component"] == "kv_cache")
    assert kv["predicted_bytes"] == 28 * 20 * 2 * 8 * 128 * 2  # 28 layers, K and V, 8 heads x 128, bf16


def test_tolerance_failure_exits_1(monkeypatch):
    import kvplan.validate.run as run

    original = run.count_params

    def off_by_ten_percent(spec, arch):
        counts = original(spec, arch)
        return type(counts)(**{**counts.__dict__, "extra": counts.total // 10})

    monkeypatch.setattr(run, "count_params", off_by_ten_percent)
    r = runner.invoke(app, ["validate", str(CONFIGS / "tiny-gemma2.json"), "--device", "cpu", "--tolerance", "0.05"])
    assert r.exit_code == 1, r.output
    assert "FAIL" in r.stdout


def test_matrix_report(tmp_path):
    r = runner.invoke(app, ["validate", "--matrix", str(MATRIX), "--report", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    kv = [row for row in out["cases"] if row["component"] == "kv_cache"]
    assert len({row["model"] for row in kv}) >= 4 and all(row["error_bytes"] == 0 for row in kv)
    report = (tmp_path / "validation.md").read_text()
    assert "| model | batch | seq_len |" in report and "torch" in report
    assert json.loads((tmp_path / "validation.json").read_text())["cases"]


@pytest.mark.parametrize("args,message", [
    (["validate"], "give a MODEL"),
    (["validate", "gpt2", "--device", "tpu"], "--device must be auto, cpu or cuda"),
    (["validate", "gpt2", "--layers", "99"], "exceeds the model's 12 layers"),
    (["validate", "gpt2", "--seq-len", "10", "--prompt-len", "10"], "--prompt-len must be between"),
])
def test_validate_bad_input(args, message):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert message in r.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_peak_is_measured():
    r = runner.invoke(app, ["validate", str(CONFIGS / "qwen3-0.6b.json"), "--batch", "4", "--seq-len", "256",
                            "--device", "cuda", "--json"])
    assert r.exit_code in (0, 1), r.output
    rows = {row["component"]: row for row in json.loads(r.stdout)["cases"]}
    assert rows["peak"]["measured_bytes"] >= rows["weights"]["measured_bytes"] + rows["kv_cache"]["measured_bytes"]


def test_a_model_too_big_for_the_device_is_refused_before_anything_is_built(monkeypatch):
    import re

    import kvplan.validate.hf_cache as hf_cache
    import kvplan.validate.run as run
    from kvplan.io.models import load_model

    def never(*args, **kwargs):
        raise AssertionError("built a model that cannot fit")

    monkeypatch.setattr(hf_cache, "build_model", never)
    monkeypatch.setattr(run, "available_bytes", lambda device: 64 << 30)
    r = runner.invoke(app, ["validate", "llama3.1-405b", "--device", "cpu"])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and "llama3.1-405b with 126 layers on cpu needs about" in r.stderr
    n = int(re.search(r"run with --layers (\d+)", r.stderr).group(1))
    # Llama 3.1 405B in bf16: about 405e9 x 2 bytes of weights; the 64 GiB machine holds 57.6 GiB of it.
    need = re.search(r"needs about ([\d.]+) GiB \(weights ([\d.]+) GiB", r.stderr)
    assert 750 < float(need.group(2)) < 760 and float(need.group(1)) >= float(need.group(2))
    spec = load_model("llama3.1-405b")

    def total(layers):
        return run.run_need(spec, layers, batch=1, seq_len=64, prompt_len=56, dtype="bf16").total

    usable = int((64 << 30) * run.USABLE_SHARE)
    assert total(n) <= usable < total(n + 1)
    # The same run with the suggested --layers gets past the check (to the build, stubbed out here).
    r = runner.invoke(app, ["validate", "llama3.1-405b", "--device", "cpu", "--layers", str(n)])
    assert r.exit_code == 3 and "built a model that cannot fit" in r.stderr


def test_even_one_layer_too_big_says_what_to_lower(monkeypatch):
    import kvplan.validate.run as run

    monkeypatch.setattr(run, "available_bytes", lambda device: 1 << 30)
    r = runner.invoke(app, ["validate", "llama3.1-405b", "--device", "cpu", "--layers", "1"])
    assert r.exit_code == 2, r.output
    assert "even one layer does not fit: lower --batch or --seq-len" in r.stderr


def test_available_memory_is_read_from_the_machine():
    from kvplan.validate.run import available_bytes

    assert 0 < available_bytes("cpu") <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_validate_help_covers_every_option():
    import typer

    params = typer.main.get_command(app).commands["validate"].params
    options = [p for p in params if p.name != "model"]
    assert len(options) == 12  # with --fetch and --revision
    for p in options:
        assert p.help and "default" in p.help, p.name


def test_validate_table_keeps_every_digit_at_80_columns():
    r = runner.invoke(app, ["validate", str(CONFIGS / "qwen3-0.6b.json"), "--layers", "1", "--seq-len", "20",
                            "--dtype", "bf16", "--device", "cpu"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert "…" not in r.stdout and max(len(x) for x in r.stdout.splitlines()) <= 80
    for text in ("case / part", "predicted", "measured", "kv_cache", "weights", "326.76 MiB", "scaled"):
        assert text in r.stdout
