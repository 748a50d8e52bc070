"""`kvplan check`: budgets as a CI gate."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.io.models import configs_dir

runner = CliRunner()
EXAMPLE = configs_dir() / "budgets" / "example.yaml"
TINY_WORKLOAD = """
serving: {model: opt-13b, kv_pool_tokens: 8192}
requests: {count: 60, arrival: {process: poisson, rate: 20}, prompt_tokens: {dist: constant, value: 100}, output_tokens: {dist: constant, value: 60}}
scheduler: {max_model_len: 2048}
step_time: {model: constant, seconds: 0.02}
"""

# The shape the issue asks for, verbatim (its numbers need not pass).
ISSUE_SHAPE = """
budgets:
  - name: chat-70b-prod
    model: llama3-70b
    gpu: H100-80GB
    tensor_parallel_size: 4
    max_model_len: 32768
    kv_cache_dtype: fp8
    require:
      min_max_concurrency: 32
      max_kv_bytes_per_token: 160KiB
  - name: chat-traffic
    workload: workloads/chat.yaml
    require:
      min_token_states_frac: 0.9
      max_rejected: 0
"""


def check(path: Path, *args: str, env: dict | None = None):
    return runner.invoke(app, ["check", str(path), *args], env=env)


def write(tmp_path: Path, text: str, name: str = "budgets.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_shipped_example_passes_with_its_json_contract():
    r = check(EXAMPLE, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["passed"] is True and len(out["results"]) >= 8
    for row in out["results"]:
        assert {"budget", "limit", "value", "threshold", "margin", "passed"} <= set(row)
        assert row["passed"] and row["margin"] >= 0


def test_the_issue_shape_parses_and_is_judged(tmp_path):
    (tmp_path / "workloads").mkdir()
    write(tmp_path / "workloads", TINY_WORKLOAD, "chat.yaml")
    r = check(write(tmp_path, ISSUE_SHAPE), "--json")
    assert r.exit_code in (0, 1), r.output
    rows = {(x["budget"], x["limit"]): x for x in json.loads(r.stdout)["results"]}
    assert rows[("chat-70b-prod", "max_kv_bytes_per_token")]["value"] == 80 * 8 * 128 * 2
    assert rows[("chat-70b-prod", "max_kv_bytes_per_token")]["threshold"] == 160 * 1024
    assert rows[("chat-traffic", "max_rejected")]["passed"] is True


def test_a_budget_broken_on_purpose_fails_with_exit_1(tmp_path):
    path = write(tmp_path, """
budgets:
  - name: too-tight
    model: llama3-70b
    require: {max_kv_bytes_per_token: 100KiB}
  - name: fine
    model: llama2-7b
    require: {max_kv_bytes_per_token: 512KiB}
""")
    r = check(path, "--json")
    assert r.exit_code == 1, r.output
    rows = {x["budget"]: x for x in json.loads(r.stdout)["results"]}
    assert rows["too-tight"]["passed"] is False and rows["too-tight"]["margin"] == 100 * 1024 - 327_680
    assert rows["fine"]["passed"] is True and rows["fine"]["margin"] == 0


def test_junit_xml_one_case_per_limit(tmp_path):
    out = tmp_path / "report.xml"
    path = write(tmp_path, """
budgets:
  - name: b
    model: llama2-7b
    gpu: A10G
    require: {max_kv_bytes_per_token: 256KiB, min_max_concurrency: 1}
""")
    r = check(path, "--junit-xml", str(out))
    assert r.exit_code == 1
    suite = ET.parse(out).getroot()
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["b: max_kv_bytes_per_token"].find("failure") is not None
    assert cases["b: min_max_concurrency"].find("failure") is None


def test_github_actions_annotations_and_summary(tmp_path):
    summary = tmp_path / "summary.md"
    path = write(tmp_path, "budgets:\n  - name: b\n    model: llama2-7b\n    require: {max_kv_bytes_per_token: 1KiB}\n")
    r = check(path, env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
    assert r.exit_code == 1
    assert "::error title=kvplan budget b::max_kv_bytes_per_token" in r.stdout
    assert "| b | max_kv_bytes_per_token |" in summary.read_text() and "**FAIL**" in summary.read_text()


def test_baseline_shows_what_got_worse(tmp_path):
    before = write(tmp_path, "budgets:\n  - name: b\n    model: llama2-7b\n    max_model_len: 4096\n"
                             "    batch: 2\n    require: {max_kv_bytes: 8GiB}\n")
    r = check(before, "--json")
    (tmp_path / "prev.json").write_text(r.stdout)
    after = write(tmp_path, before.read_text().replace("batch: 2", "batch: 3"), "after.yaml")
    r = check(after, "--baseline", str(tmp_path / "prev.json"), "--json")
    assert r.exit_code == 0, r.output
    (change,) = json.loads(r.stdout)["baseline"]["changed"]
    assert change["worse"] is True and change["before"] == 4 * (1 << 30) and change["after"] == 6 * (1 << 30)
    r = check(after, "--baseline", str(tmp_path / "prev.json"))
    assert "worse" in r.stdout


@pytest.mark.parametrize(
    "text,message",
    [
        ("budgets:\n  - name: b\n    model: llama2-7b\n    require: {max_kv_bytes_per_tokn: 1KiB}\n",
         "line 4: budgets.0.require.max_kv_bytes_per_tokn: unknown key"),
        ("budgets:\n  - name: b\n    require: {max_kv_bytes_per_token: 1KiB}\n", "need a model"),
        ("budgets:\n  - name: b\n    model: llama2-7b\n    require: {max_rejected: 0}\n", "need a workload file"),
        ("budgets:\n  - name: b\n    model: llama2-7b\n    require: {min_max_concurrency: 2}\n", "need a gpu"),
        ("budgets:\n  - name: b\n    model: llama2-7b\n    require: {max_kv_bytes: lots}\n", "expected a size"),
        ("budgets: []\n", "budgets: List should have at least 1 item"),
        ("budgets:\n  - name: b\n    model: llama2-7b\n    require: {}\n", "require names no limit"),
    ],
)
def test_invalid_budget_files_exit_2(tmp_path, text, message):
    r = check(write(tmp_path, text))
    assert r.exit_code == 2, r.output
    assert message in r.stderr and "Traceback" not in r.output


def test_missing_baseline_exits_2(tmp_path):
    r = check(EXAMPLE, "--baseline", str(tmp_path / "nope.json"))
    assert r.exit_code == 2 and "no such baseline file" in r.stderr


def test_schema_budgets():
    r = runner.invoke(app, ["schema", "budgets"])
    assert r.exit_code == 0 and "require" in json.dumps(json.loads(r.stdout))
