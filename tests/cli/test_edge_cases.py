"""Edge cases found in review: consistent verdicts, clean errors instead of tracebacks."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli import app

runner = CliRunner()


def fit_json(*args: str) -> dict:
    r = runner.invoke(app, ["fit", *args, "--json"])
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("args", [
    ["mistral-7b", "--gpu-memory", "18GiB", "--engine", "sglang", "--max-model-len", "32768"],
    ["gemma2-9b", "--gpu-memory", "6.25GiB", "-pp", "5", "--max-model-len", "4096", "--max-num-batched-tokens", "512"],
    ["gemma2-9b", "--gpu-memory", "24GiB", "--engine", "sglang", "--max-model-len", "8192"],
    ["gpt-oss-20b", "--gpu-memory", "24GiB", "--engine", "trtllm"],
])
def test_fit_verdict_agrees_with_its_own_figures(args):
    out = fit_json(*args)
    one_request = out["max_model_len_fit"] >= out["max_model_len"]
    assert out["fits"] == (one_request and out["kv_cache_memory_bytes"] > 0), out
    if out["fits"]:
        assert out["max_concurrency"] > 0


@pytest.mark.parametrize("args,message", [
    (["fit", "llama2-7b", "--gpu", "H100", "-tp", "0"], "tensor parallel size must be between 1"),
    (["fit", "llama2-7b", "--gpu", "H100", "-pp", "0"], "pipeline parallel size must be between 1"),
    (["fit", "llama2-7b", "--gpu", "H100", "-tp", "-2"], "tensor parallel size must be between 1"),
    (["fit", "llama2-7b", "--gpu", "H100", "--block-size", "0"], "block size must be between 1"),
    (["size", "llama2-7b", "--engine", "HF", "--block-size", "16"], "applies to paged engines"),
])
def test_bad_numbers_exit_2_without_traceback(args, message):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert message in r.stderr and "Traceback" not in r.output


def test_unwritable_outputs_are_clean_errors(tmp_path):
    budgets = tmp_path / "b.yaml"
    budgets.write_text("budgets:\n  - name: b\n    model: llama2-7b\n    require: {max_kv_bytes_per_token: 1MiB}\n")
    r = runner.invoke(app, ["check", str(budgets), "--junit-xml", str(tmp_path / "no" / "such" / "r.xml")])
    assert r.exit_code == 2 and "cannot write" in r.stderr
    workload = tmp_path / "w.yaml"
    workload.write_text("serving: {model: opt-13b, kv_pool_tokens: 4096}\nrequests: {count: 3, arrival: {process: "
                        "all_at_once}, prompt_tokens: {dist: constant, value: 5}, output_tokens: {dist: zipf, low: 9, "
                        "high: 3}}\nscheduler: {max_model_len: 64}\nstep_time: {model: constant, seconds: 0.01}\n")
    r = runner.invoke(app, ["simulate", str(workload)])
    assert r.exit_code == 2 and "zipf: high (3) must be >= low (9)" in r.stderr
    workload.write_text(workload.read_text().replace("low: 9, high: 3", "low: 3, high: 9"))
    r = runner.invoke(app, ["simulate", str(workload), "--plot", str(tmp_path / "no" / "p.png")])
    assert r.exit_code == 2 and "does not exist" in r.stderr


def test_mla_formula_counts_the_replicas():
    r = runner.invoke(app, ["size", "deepseek-v3", "-tp", "8", "--seq-len", "64", "--json"])
    layer = json.loads(r.stdout)["layers"][0]
    assert "x 8 ranks" in layer["formula"] and layer["bytes_per_token"] == 8 * 70_272
