"""`kvplan size` over data-parallel engines (-dp) and vLLM's decode context parallelism (-dcp): the sequences
shared between engines, each sequence's tokens sharded over the tp ranks, in JSON."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli import app

runner = CliRunner()
MLA_TOKEN = 61 * (512 + 64) * 2  # DeepSeek-V3's latent a token, all 61 layers, bf16: 70,272 B


def size(*args: str) -> dict:
    r = runner.invoke(app, ["size", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_data_parallel_engines_share_the_sequences():
    one = size("llama3.1-8b", "-b", "10", "-s", "8192")
    dp = size("llama3.1-8b", "-b", "10", "-s", "8192", "-dp", "4")
    assert dp["data_parallel_size"] == 4 and dp["num_gpus"] == 4 and dp["decode_context_parallel_size"] == 1
    assert dp["total_bytes"] == one["total_bytes"]  # the same sequences, wherever they are
    assert dp["per_gpu_bytes"] == 3 * one["total_bytes"] // 10  # the busiest engine holds cdiv(10, 4) = 3
    assert dp["bytes_per_token"] == one["bytes_per_token"]
    tp = size("llama3.1-8b", "-b", "10", "-s", "8192", "-dp", "2", "-tp", "2")
    assert tp["num_gpus"] == 4 and tp["per_gpu_bytes"] == 5 * one["total_bytes"] // 10 // 2


def test_decode_context_parallel_shards_each_sequence_over_the_ranks():
    # tp 8: vLLM replicates the MLA latent on every rank; -dcp 8 puts token i on rank i % 8 instead
    full = size("deepseek-v3", "--engine", "vllm==0.33.0", "-tp", "8", "-b", "4", "-s", "1000")
    dcp = size("deepseek-v3", "--engine", "vllm==0.33.0", "-tp", "8", "-b", "4", "-s", "1000", "-dcp", "8")
    # without: 1,000 tokens in 16 blocks of 64 on every rank; with: cdiv(1000, 8) = 125 tokens, 2 blocks a rank
    assert full["per_gpu_bytes"] == 4 * 16 * 64 * MLA_TOKEN
    assert dcp["per_gpu_bytes"] == 4 * 2 * 64 * MLA_TOKEN
    assert dcp["layers"][0]["tokens_held"] == 128
    assert dcp["bytes_per_token"] == MLA_TOKEN and full["bytes_per_token"] == 8 * MLA_TOKEN  # held once, not 8 times
    assert dcp["total_bytes"] == 8 * dcp["per_gpu_bytes"] and dcp["num_gpus"] == 8
    assert any("decode context parallel 8" in n for n in dcp["notes"])


@pytest.mark.parametrize("args, match", [
    (["llama3.1-8b", "-tp", "2", "-dcp", "2"], "vLLM's"),  # the ideal engine has no DCP
    (["deepseek-v3", "--engine", "vllm", "-tp", "8", "-dcp", "3"], "must be between 1 and 8|must divide"),
    (["deepseek-v3", "--engine", "vllm==0.10.0", "-tp", "8", "-dcp", "8"], "from 0.10.2"),
    (["gemma3-27b", "--engine", "vllm", "-tp", "4", "-dcp", "2"], "full attention and MLA only"),
    (["llama3.1-8b", "-dp", "0"], "between 1 and"),
])
def test_what_decode_context_parallelism_does_not_take(args, match):
    r = runner.invoke(app, ["size", *args])
    assert r.exit_code == 2
    assert any(m in r.output for m in match.split("|")), r.output
