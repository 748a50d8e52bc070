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


def test_the_formula_and_the_token_states_count_each_token_once():
    out = size("deepseek-v3", "--engine", "vllm==0.33.0", "-tp", "8", "-b", "4", "-s", "1000", "-dcp", "8")
    assert out["layers"][0]["formula"] == ("(61 layers x (512 kv_lora_rank + 64 rope) x 2 B x 8 ranks (replicated)) "
                                           "/ 8 decode-context ranks")
    assert out["token_state_bytes"] == 4 * 1000 * MLA_TOKEN  # no rank's share rounded up


def test_gqa_copies_split_by_decode_context_parallelism():
    # Llama-3.1-70B at tp 16: 8 KV heads, each on 2 ranks; -dcp 2 gives each copy's pair half the tokens
    # (cdiv(1001, 2) = 501 tokens: 32 blocks of 16 = 512 a rank)
    head = 80 * 2 * 128 * 2  # one KV head's K and V a token over the 80 layers, bf16: 40,960 B
    out = size("llama3.1-70b", "--engine", "vllm==0.33.0", "-tp", "16", "-dcp", "2", "-s", "1001")
    assert out["bytes_per_token"] == 8 * head  # held once: 8 heads, not 16 copies
    assert out["per_gpu_bytes"] == 512 * head and out["layers"][0]["tokens_held"] == 512


def test_stages_and_engines_together():
    # -pp 3 -dp 3, 5 sequences: stages of 27/27/26 layers, the busiest engine holds cdiv(5, 3) = 2 sequences
    out = size("llama3.1-70b", "-tp", "8", "-pp", "3", "-dp", "3", "-b", "5", "-s", "512")
    assert out["num_gpus"] == 72
    assert out["per_gpu_bytes"] == 2 * 512 * 27 * 2 * 128 * 2  # one KV head a rank at tp 8


def test_engines_that_share_no_batch_refuse_data_parallelism():
    r = runner.invoke(app, ["size", "llama3.1-8b", "--engine", "hf", "-dp", "2"])
    assert r.exit_code == 2 and "not modelled" in r.output
