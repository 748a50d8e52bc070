"""Input files a new user gets wrong: empty ones, one command's file given to another, misspelt keys.
Each is refused in one line per problem that says what to change, and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.io.models import configs_dir

runner = CliRunner()
WORKLOAD = configs_dir() / "workloads" / "vllm-paper-sharegpt.yaml"
BUDGETS = configs_dir() / "budgets" / "example.yaml"
SERVING = "serving: {model: opt-13b, gpu: A100-40GB, kv_pool_tokens: 4096}\n"
SYNTHETIC = ("requests:\n  count: 4\n  arrival: {process: all_at_once}\n  prompt_tokens: {dist: constant, value: 8}\n"
             "  output_tokens: {dist: constant, value: 8}\n")
BUDGET = "budgets:\n  - name: b\n    model: opt-13b\n    gpu: H100-80GB\n    require: {max_kv_bytes_per_token: 1MiB}\n"


def _errors(r) -> list[str]:
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output
    lines = r.stderr.strip().splitlines()
    assert all(line.startswith("error: ") for line in lines), r.stderr
    return lines


def _run(tmp_path: Path, command: str, text: str, *extra: str):
    path = tmp_path / "f.yaml"
    path.write_text(text)
    return runner.invoke(app, [command, str(path), *extra])


@pytest.mark.parametrize("text", ["", "# a comment, nothing else\n", "---\n", "{}\n"])
@pytest.mark.parametrize("command, holds", [("check", "`budgets:`"), ("simulate", "`serving:`")])
def test_an_empty_file_says_so_and_what_it_should_hold(tmp_path, command, holds, text):
    [line] = _errors(_run(tmp_path, command, text))
    assert "the file is empty" in line and holds in line, line
    assert "valid dictionary" not in line


@pytest.mark.parametrize("command", ["check", "simulate"])
def test_a_list_at_the_top_level(tmp_path, command):
    [line] = _errors(_run(tmp_path, command, "- a\n- b\n"))
    assert "holds a list at the top level" in line, line


def test_a_workload_given_to_check_names_simulate():
    [line] = _errors(runner.invoke(app, ["check", str(WORKLOAD)]))
    assert "this is a workload file" in line and f"use `kvplan simulate {WORKLOAD}`" in line, line


def test_a_budgets_file_given_to_simulate_names_check():
    [line] = _errors(runner.invoke(app, ["simulate", str(BUDGETS)]))
    assert "this is a budgets file" in line and f"use `kvplan check {BUDGETS}`" in line, line


def test_a_model_file_given_to_check_names_size():
    path = configs_dir() / "models" / "llama2-7b.yaml"
    [line] = _errors(runner.invoke(app, ["check", str(path)]))
    assert "this is a model file" in line and "use `kvplan size" in line, line


def test_a_workload_with_a_misspelt_key_is_still_read_as_one(tmp_path):
    """A workload with `requets` is a workload with a typo, not another kind of file."""
    [line] = _errors(_run(tmp_path, "simulate", SERVING + SYNTHETIC.replace("requests:", "requets:")))
    assert "requets: unknown key; did you mean `requests`?" in line, line  # and no "requests: Field required"


@pytest.mark.parametrize("command, text, wrong, right", [
    ("simulate", SERVING + SYNTHETIC + "schedular: {max_model_len: 2048}\n", "schedular", "scheduler"),
    ("simulate", SERVING + SYNTHETIC.replace("value: 8", "valeu: 8", 1),
     "valeu", "value"),
    ("simulate", SERVING + SYNTHETIC + "sharing: {shared_prefix_token: 16}\n", "shared_prefix_token",
     "shared_prefix_tokens"),
    ("check", BUDGET.replace("require:", "requires:"), "requires", "require"),
    ("check", BUDGET.replace("max_kv_bytes_per_token", "max_kv_byte_per_token"), "max_kv_byte_per_token",
     "max_kv_bytes_per_token"),
    ("check", BUDGET + "    max_modle_len: 2048\n", "max_modle_len", "max_model_len"),
])
def test_an_unknown_key_gets_the_nearest_known_one(tmp_path, command, text, wrong, right):
    [line] = _errors(_run(tmp_path, command, text))
    assert f"{wrong}: unknown key; did you mean `{right}`?" in line, line


def test_an_unknown_key_far_from_every_known_one_lists_them(tmp_path):
    [line] = _errors(_run(tmp_path, "check", BUDGET.replace("require: {", "require: {zzz: 1, ")))
    assert "zzz: unknown key (known here: " in line and "min_kv_cache_tokens" in line, line
    assert "did you mean" not in line


def test_each_misspelt_key_is_one_line(tmp_path):
    text = SERVING + SYNTHETIC.replace("requests:", "requets:") + "schedular: {max_model_len: 2048}\n"
    lines = _errors(_run(tmp_path, "simulate", text))
    assert len(lines) == 2, lines
    assert "did you mean `requests`?" in lines[0] and "did you mean `scheduler`?" in lines[1], lines


def test_an_empty_validation_matrix(tmp_path):
    pytest.importorskip("torch")
    path = tmp_path / "m.yaml"
    path.write_text("")
    [line] = _errors(runner.invoke(app, ["validate", "--matrix", str(path)]))
    assert "the file is empty" in line and "`cases:`" in line, line
