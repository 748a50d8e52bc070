"""Every command's text output at 80 columns outside a terminal (a CI log, a pipe): no cell is cut with
an ellipsis, no line is wider than the console or ends in spaces, nothing but text (no colour bar), and
the exact figures of the JSON output appear whole."""

from __future__ import annotations

import io
import json
import re
import sys

import pytest
from typer.testing import CliRunner

import kvplan.cli.simulate_tables  # noqa: F401  (imported by simulate on demand: its console is narrowed too)
from kvplan.cli import app

runner = CliRunner()
WIDTH = 80
LOGS = "tests/fixtures/vllm_logs"


@pytest.fixture(autouse=True)
def narrow_consoles(monkeypatch):
    """Every kvplan console renders at 80 columns, as Rich does when stdout is not a terminal."""
    for name, module in list(sys.modules.items()):
        if name.startswith("kvplan.cli.") and hasattr(module, "console"):
            monkeypatch.setattr(module.console, "width", WIDTH)


COMMANDS = [
    ["size", "llama2-7b", "--batch", "16"],
    ["size", "deepseek-v3", "-tp", "8", "--seq-len", "8192"],
    ["size", "gemma3-27b", "--engine", "vllm", "--batch", "8", "--seq-len", "30001"],
    ["size", "qwen3-next-80b-a3b", "--engine", "vllm", "-tp", "4", "-pp", "2"],
    ["size", "jamba-mini", "--engine", "sglang", "--kv-cache-dtype", "fp8"],
    ["models"],
    ["show", "deepseek-v3"],
    ["show", "qwen3-next-80b-a3b"],
    ["show", "gemma3n-e4b"],  # a long layer list folds, never cut
    ["show", "falcon-h1-34b"],
    ["show", "deepseek-v4-pro"],
    ["gpus"],
    ["examples"],
    ["engines"],
    ["engines", "vllm"],
    ["size", "gemma3-27b", "--engine", "vllm==0.8.5", "--batch", "8"],
    ["fit", "llama3.1-70b", "--gpu", "H100", "-tp", "2", "--max-model-len", "131072"],
    ["fit", "deepseek-v3", "--gpu", "H200", "-tp", "8"],
    ["fit", "gemma3-27b", "--gpu", "L4", "--engine", "sglang"],
    ["fit", "qwen3-32b", "--engine", "vllm==0.11.0", "--gpu-memory", "79.18GiB", "--max-model-len", "16000"],
    ["fit", "llama3.1-8b", "--gpu", "H100", "--max-model-len", "200000"],  # vLLM does not start
    ["fit", "llama3.1-70b", "--gpu", "H100", "--engine", "trtllm", "--max-model-len", "200000"],
    ["fit", "llama3.1-405b", "--gpu", "H100-80GB"],  # the fewest GPUs
    ["check", "example"],
    ["simulate", "vllm-paper-sharegpt"],
    ["simulate", "llama3.1-8b-long-chat", "--engine", "vllm==0.11.0"],
    ["simulate", "llama3.1-8b-multiturn-offload"],
    ["explain", f"{LOGS}/v1_0_9_mistral_small31_24b_tp2.log", "--model", "mistral-7b", "--gpu", "L40S"],
    ["explain", f"{LOGS}/v0_7_1_qwen25_32b_l40s_tp2.log", "--model", "qwen2.5-72b"],
]


def _text(args: list[str]) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code in (0, 1), r.output
    return r.stdout


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_no_cell_is_cut_at_80_columns(args):
    out = _text(args)
    assert "\u2026" not in out, out
    wide = [line for line in out.splitlines() if len(line) > WIDTH]
    assert not wide, "\n".join(wide)


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_piped_output_is_clean_text(args):
    """Rich pads table cells and titles and leaves a space where it wraps; a file or a CI log gets neither,
    and no colour bar (block characters) either."""
    out = _text(args)
    padded = [f"{i}: {line!r}" for i, line in enumerate(out.splitlines(), 1) if line != line.rstrip()]
    assert not padded, "\n".join(padded)
    assert not set(out) & set("\u2588\u2589\u258a\u258b\u258c\u258d\u258e\u258f"), out
    assert "\x1b" not in out


def test_a_terminal_gets_the_bar_and_no_trailing_spaces(monkeypatch):
    """On a terminal the memory bar is printed, in colour; padding is stripped there too (before the colour
    codes that end a line)."""
    from kvplan.cli import fit as fit_cli
    from kvplan.cli.format import make_console

    screen = io.StringIO()
    console = make_console(file=screen, force_terminal=True, color_system="standard", width=WIDTH)
    monkeypatch.setattr(fit_cli, "console", console)
    r = runner.invoke(app, ["fit", "llama3.1-8b", "--gpu", "H100"])
    assert r.exit_code == 0, r.output
    out = screen.getvalue()
    assert "\u2588" in out and "\x1b[" in out
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert [line for line in plain.splitlines() if line != line.rstrip()] == []


def test_counts_carry_separators_and_flags_stay_bare():
    """STYLE.md: a number a user may paste back as a flag is printed as typed; every other figure with
    thousands separators (the issue: `KV pool 948672 token slots` beside `5,000 requests`)."""
    data = json.loads(runner.invoke(app, ["simulate", "vllm-paper-sharegpt", "--json"]).stdout)
    out = " ".join(_text(["simulate", "vllm-paper-sharegpt"]).split())
    slots = data["config"]["pool_slots"] if "config" in data else data["pool_slots"]
    assert slots >= 1000 and f"KV pool {slots:,} token slots" in out
    assert "max_model_len 2048," in out  # a setting: as typed
    fit = json.loads(runner.invoke(app, ["fit", "llama3.1-8b", "--gpu", "H100", "--json"]).stdout)
    out = " ".join(_text(["fit", "llama3.1-8b", "--gpu", "H100"]).split())
    assert f"KV cache tokens {fit['kv_cache_tokens']:,}" in out
    assert f"max_model_len {fit['max_model_len']}" in out  # the settings line: as typed
    assert f"longest max_model_len that fits (<= {fit['max_model_len']}) {fit['max_model_len_fit']}" in out


def test_size_figures_appear_whole():
    data = json.loads(runner.invoke(app, ["size", "deepseek-v3", "-tp", "8", "--json"]).stdout)
    out = _text(["size", "deepseek-v3", "-tp", "8"])
    for key in ("bytes_per_token", "bytes_per_token_per_gpu", "total_bytes", "per_gpu_bytes"):
        assert f"{data[key]:,} B" in out, key


def test_fit_figures_appear_whole():
    args = ["fit", "llama3.1-70b", "--gpu", "H100", "-tp", "2", "--max-model-len", "131072"]
    data = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    out = _text(args)
    assert f"{data['kv_cache_memory_bytes']:,} B" in out
    assert f"{data['num_blocks']:,} x {data['block_size']} tokens" in out
    for alt in data["what_if"]:
        assert alt["change"] in out  # a flag to paste stays on one line
        if alt.get("max_model_len_fit") is not None:
            assert str(alt["max_model_len_fit"]) in out


def test_v1_simulate_figures_appear_whole():
    args = ["simulate", "llama3.1-8b-multiturn-offload"]
    data = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    out = _text(args)
    for key in ("gpu_hit_tokens", "cpu_hit_tokens", "recomputed_tokens", "evictions"):
        assert f"{data['prefix_cache'][key]:,}" in out, key
    assert f"{data['steps']:,}" in out and f"{data['pool_blocks']:,} blocks" in " ".join(out.split())
