"""`kvplan fit --enable-lora`: the adapters' slots as a line of the budget, by engine and release (the shapes:
tests/core/test_lora.py)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli import app

runner = CliRunner()


def _fit(*args: str) -> dict:
    r = runner.invoke(app, ["fit", "llama3.1-8b", "--gpu", "H100-80GB", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("engine, lora, growth", [
    ("vllm==0.12.0", 369_426_432, 0),  # every linear module, the embedding and the LM head
    ("vllm==0.11.0", 386_269_184, 10_485_760),  # their extra vocabulary, and the base vocabulary's growth
    ("sglang", 335_544_320, 0),  # all-linear unless the adapters say otherwise
])
def test_the_slots_are_a_line_of_their_own_and_the_kv_cache_gives_way(engine, lora, growth):
    fixed = ("--engine", engine, "--gpu-memory-utilization", "0.85")  # SGLang's default moves with LoRA (below)
    plain = _fit(*fixed)
    out = _fit(*fixed, "--enable-lora", "--max-loras", "4", "--max-lora-rank", "16")
    assert out["breakdown"]["lora"] == lora and plain["breakdown"]["lora"] == 0
    assert out["breakdown"]["weights"] - plain["breakdown"]["weights"] == growth
    assert plain["kv_cache_memory_bytes"] - out["kv_cache_memory_bytes"] == lora + growth
    assert any(n.startswith("LoRA: 4 slots of rank 16") for n in out["notes"])


def test_sglang_0_5_10_captures_no_piecewise_graphs_with_lora():
    """_handle_piecewise_cuda_graph turns them off with LoRA (0.5.10 server_args.py): their reserve goes too."""
    plain = _fit("--engine", "sglang==0.5.10")["settings"]["mem_fraction_static"]
    lora = _fit("--engine", "sglang==0.5.10", "--enable-lora")["settings"]["mem_fraction_static"]
    no_piecewise = _fit("--engine", "sglang==0.5.3")["settings"]["mem_fraction_static"]  # the same reserve rule
    assert plain < lora == no_piecewise


def test_the_engines_defaults():
    assert _fit("--enable-lora")["breakdown"]["lora"] == 369_426_432 // 4  # vLLM: 1 slot of rank 16
    assert _fit("--engine", "sglang", "--enable-lora")["breakdown"]["lora"] == 335_544_320 * 2  # 8 slots


@pytest.mark.parametrize("args, match", [
    (["--max-loras", "4"], "go with --enable-lora"),
    (["--enable-lora", "--lora-target-modules", "mlp"], "not a module kvplan counts"),
    (["--enable-lora", "--engine", "trtllm"], "not modelled"),
    (["--enable-lora", "--max-loras", "0"], "at least 1 slot"),
])
def test_what_cannot_be_planned_is_exit_2(args, match):
    r = runner.invoke(app, ["fit", "llama3.1-8b", "--gpu", "H100-80GB", *args])
    assert r.exit_code == 2 and match in r.output and "Traceback" not in r.output


def test_moe_experts_are_refused():
    r = runner.invoke(app, ["fit", "qwen3-30b-a3b", "--gpu", "H100-80GB", "--enable-lora"])
    assert r.exit_code == 2 and "routed experts" in r.output


def test_measured_weights_hold_the_slots_already():
    """vLLM allocates them inside the profiler that logs "Model loading took": --weights-memory from a log has them."""
    given = ["--weights-memory", "16GiB"]
    assert _fit(*given)["kv_cache_memory_bytes"] == _fit(*given, "--enable-lora")["kv_cache_memory_bytes"]
