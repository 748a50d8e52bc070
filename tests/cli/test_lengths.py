"""Every length option and file key takes 8192, 8k or 8K (x1024); fractions and negatives are one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli import app

runner = CliRunner()
LOG = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_logs" / "v0_6_4_llama31_8b_rtx3090_20k.log"

# (command line up to the flag, the flag, where --json puts the value)
OPTIONS = [
    (["size", "llama2-7b"], "--seq-len", ("seq_len",)),
    (["size", "llama2-7b"], "-s", ("seq_len",)),
    (["size", "llama2-7b"], "--max-model-len", ("seq_len",)),
    (["fit", "llama3.1-8b", "--gpu", "H100-80GB"], "--max-model-len", ("max_model_len",)),
    (["fit", "llama3.1-8b", "--gpu", "H100-80GB"], "--max-num-batched-tokens", ("settings", "max_num_batched_tokens")),
    (["explain", str(LOG)], "--max-model-len", ("logged", "max_seq_len")),
    (["explain", str(LOG)], "--max-num-batched-tokens", ("logged", "max_num_batched_tokens")),
]


def _json(r) -> dict:
    assert r.exit_code == 0, (r.output, r.exception)
    return json.loads(r.stdout)


@pytest.mark.parametrize("text, tokens", [("8k", 8192), ("8K", 8192), ("8192", 8192), ("2k", 2048)])
@pytest.mark.parametrize("argv, flag, key", OPTIONS, ids=[f"{a[0]} {f}" for a, f, _ in OPTIONS])
def test_a_length_option_takes_k(argv, flag, key, text, tokens):
    out = _json(runner.invoke(app, [*argv, flag, text, "--json"]))
    for k in key:
        out = out[k]
    assert out == tokens


@pytest.mark.parametrize("text, words", [("1.5k", "not a fraction"), ("8192.5", "not a fraction"),
                                         ("-5", "must be positive"), ("-2k", "must be positive"),
                                         ("8m", "not a length"), ("0", "must be positive")])
@pytest.mark.parametrize("argv, flag", [(a, f) for a, f, _ in OPTIONS] + [(["validate", "llama2-7b"], "--seq-len"),
                                                                         (["validate", "llama2-7b"], "--prompt-len")])
def test_a_bad_length_is_one_line_naming_the_flag(argv, flag, text, words):
    r = runner.invoke(app, [*argv, flag, text])
    assert r.exit_code == 2, (r.output, r.exception)
    [line] = r.stderr.strip().splitlines()
    assert words in line and "8192 or 8k" in line, line
    named = "--seq-len" if argv[0] == "size" else flag  # size's -s, --seq-len and --max-model-len are one option
    assert line.startswith(f"error: {named}"), line


def test_validate_reads_k_lengths(monkeypatch):
    pytest.importorskip("torch")
    seen = []

    def run_case(case, spec):
        seen.append(case)
        return []

    monkeypatch.setattr("kvplan.validate.run.run_case", run_case)
    r = runner.invoke(app, ["validate", "llama2-7b", "--seq-len", "2k", "--prompt-len", "1K", "--json"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert (seen[0].seq_len, seen[0].prompt_len) == (2048, 1024)


def test_fit_still_takes_minus_one_for_the_longest_that_fits():
    out = _json(runner.invoke(app, ["fit", "llama3.1-8b", "--gpu", "H100-80GB", "--max-model-len", "-1", "--json"]))
    assert out["max_model_len"] > 0


BUDGET = """budgets:
  - name: b
    model: llama2-7b
    gpu: H100-80GB
    max_model_len: {max_model_len}
    seq_len: {seq_len}
    require: {{max_kv_bytes: 1TiB}}
"""


def test_a_budget_takes_k_lengths(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text(BUDGET.format(max_model_len="4k", seq_len="2K"))
    out = _json(runner.invoke(app, ["check", str(path), "--json"]))
    [result] = out["results"]
    assert result["value"] == 2048 * 524_288  # llama2-7b: 512 KiB per token, fp16


@pytest.mark.parametrize("key, text, words", [("seq_len", "1.5k", "not a fraction"),
                                               ("max_model_len", "-4k", "must be positive")])
def test_a_bad_length_in_a_budget_names_the_key_and_line(tmp_path, key, text, words):
    path = tmp_path / "b.yaml"
    path.write_text(BUDGET.format(**{"max_model_len": "4k", "seq_len": "2k", key: text}))
    r = runner.invoke(app, ["check", str(path)])
    assert r.exit_code == 2, r.output
    [line] = r.stderr.strip().splitlines()
    assert f"budgets.0.{key}" in line and words in line and "line " in line, line


def test_a_workload_takes_k_lengths(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("serving: {model: opt-13b, gpu: A100-40GB, kv_pool_tokens: 8192}\n"
                    "scheduler: {max_model_len: 2k, max_num_batched_tokens: 4K}\n"
                    "requests: {count: 4, arrival: {process: all_at_once}, prompt_tokens: {dist: constant, value: 8}, "
                    "output_tokens: {dist: constant, value: 8}}\n")
    out = _json(runner.invoke(app, ["simulate", str(path), "--json"]))
    assert (out["max_model_len"], out["max_num_batched_tokens"]) == (2048, 4096)
