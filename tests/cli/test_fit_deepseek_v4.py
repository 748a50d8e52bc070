"""DeepSeek-V4-Flash on vLLM, predicted from model, GPU and flags alone, against public starts."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli import app

runner = CliRunner()

# vllm-project/vllm#51454 (2026-08-07, "DP8 vs TP8 for single-KV-head MLA", DeepSeek-V4-Flash-0731 on 8 x B200,
# vllm/vllm-openai:v0.25.0). Both starts' non-default args: enable_expert_parallel True, block_size 256,
# gpu_memory_utilization 0.95, kv_cache_dtype fp8, max_num_batched_tokens 8192, max_num_seqs 256, moe_backend
# deep_gemm_mega_moe, a 1,048,576-token context; one with tensor_parallel_size 8, one with data_parallel_size 8.
# The author's follow-up quotes the logs: "TP8 `GPU KV cache size: 21,419,891 tokens / 20.43x`; DP8 eight
# `EngineCore_DP*` replicas each at `20,571,235 tokens / 19.62x`".
FLAGS = ("deepseek-ai/DeepSeek-V4-Flash-0731", "--gpu", "B200", "--engine", "vllm==0.25.0", "--enable-expert-parallel",
         "--block-size", "256", "--gpu-memory-utilization", "0.95", "--kv-cache-dtype", "fp8",
         "--max-num-batched-tokens", "8192", "--max-num-seqs", "256", "--moe-backend", "deep_gemm_mega_moe",
         "--max-model-len", "1048576")


def _fit(*args: str) -> dict:
    r = runner.invoke(app, ["fit", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize(("parallel", "logged", "concurrency"), [
    (("-tp", "8"), 21_419_891, 20.43),
    (("-dp", "8"), 20_571_235, 19.62),
])
def test_deepseek_v4_flash_on_8_b200_matches_the_public_starts(parallel, logged, concurrency):
    out = _fit(*FLAGS, *parallel)
    assert out["engine_version"] == "0.25.0" and out["expert_parallel_size"] == 8
    assert abs(out["kv_cache_tokens"] / logged - 1) < 0.02
    assert abs(out["max_concurrency"] / concurrency - 1) < 0.02


def test_data_parallel_replicates_attention_and_counts_every_engine():
    """DP 8 holds attention, the shared expert and the vocabulary whole on each GPU (6.1 GiB more weights than TP 8),
    so each engine's pool is a little smaller, but there are eight of them: the issue's '7.7x'."""
    tp8, dp8 = _fit(*FLAGS, "-tp", "8"), _fit(*FLAGS, "-dp", "8")
    assert 5.5 < (dp8["breakdown"]["weights"] - tp8["breakdown"]["weights"]) / 2**30 < 6.5
    assert dp8["all_ranks"]["kv_cache_tokens"] == 8 * dp8["kv_cache_tokens"]
    assert 7.5 < dp8["all_ranks"]["kv_cache_tokens"] / tp8["kv_cache_tokens"] < 7.9


def test_megamoe_is_non_torch_memory_and_needs_expert_parallelism():
    auto = _fit(*FLAGS[:-4], "--max-model-len", "1048576", "-tp", "8")
    mega = _fit(*FLAGS, "-tp", "8")
    assert mega["breakdown"]["non_torch"] - auto["breakdown"]["non_torch"] == 4_321_690_912
    r = runner.invoke(app, ["fit", "deepseek-v4-flash", "--gpu", "B200", "-tp", "8", "--kv-cache-dtype", "fp8",
                            "--moe-backend", "deep_gemm_mega_moe"])
    assert r.exit_code == 2 and "--enable-expert-parallel" in r.output


@pytest.mark.parametrize(("engine", "code", "says"), [
    ("vllm==0.25.0", 2, "fp8 KV cache only"),  # _resolve_dsv4_kv_cache_dtype asserts fp8
    ("vllm==0.19.0", 2, "no DeepSeek-V4"),
])
def test_deepseek_v4_refusals(engine, code, says):
    r = runner.invoke(app, ["fit", "deepseek-v4-flash", "--gpu", "B200", "-tp", "8", "--engine", engine])
    assert r.exit_code == code and says in r.output


V4_WORKLOAD = """
name: v4-flash
serving: {model: deepseek-v4-flash, gpu: B200, engine: vllm==0.26.0, tensor_parallel_size: 8,
          enable_expert_parallel: true, kv_cache_dtype: fp8}
requests:
  count: 60
  seed: 0
  arrival: {process: poisson, rate: 20.0}
  prompt_tokens: {dist: lognormal, mean: 20000, sigma: 0.8}
  output_tokens: {dist: lognormal, mean: 100, sigma: 0.6}
scheduler: {max_model_len: 262144}
"""


def test_simulate_runs_deepseek_v4s_five_groups_from_one_pool(tmp_path):
    """vLLM's scheduler allocates each of the five groups' blocks (256-token compressed entries, 64-token windows,
    4- and 8-token compressor states) from the one pool fit plans; prefix caching over groups of different block
    sizes is not modelled and says how to go on."""
    path = tmp_path / "w.yaml"
    path.write_text(V4_WORKLOAD + "sharing: {prefix_caching: false}\n")
    r = runner.invoke(app, ["simulate", str(path), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["kv_cache_groups"] == 5 and out["block_size"] == 256
    assert out["allocators"]["paged-256"]["completed"] == 60
    path.write_text(V4_WORKLOAD)
    r = runner.invoke(app, ["simulate", str(path)])
    assert r.exit_code == 2 and "sharing.prefix_caching: false" in r.output


@pytest.mark.parametrize(("parallel", "loader_bytes"), [(("-tp", "8"), 21_476_292_636), (("-dp", "8"), 28_064_260_316)])
def test_deepseek_v4_flash_weights_match_vllms_loader(parallel, loader_bytes):
    """A tensor-by-tensor count of what vLLM 0.25.0 builds for DeepSeek-V4-Flash (docs/research/deepseek-v4-vllm.md:
    32 of 256 MXFP4 experts of 13,369,344 B a layer, the FP8 projections split over tp or whole, the replicated FP8
    fused_wqa_wkv and indexer wq_b, bf16 compressors, gates, embedding and head, fp32 hyper-connection mixers, and
    0.77 GiB of RoPE, MTP and top-k buffers): kvplan's weights within 0.2%."""
    out = _fit(*FLAGS, *parallel)
    assert abs(out["breakdown"]["weights"] / loader_bytes - 1) < 0.002


def test_mtp_on_deepseek_v4_adds_a_window_cache_and_a_layers_weights():
    """The MTP layer sits past num_hidden_layers, where vLLM reads compress ratio 1: a window cache of its own, no
    compressed entries, so nothing a token at 1M tokens; the target's bytes a token are a sequence's share."""
    out = _fit(*FLAGS, "-tp", "8", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}')
    spec = out["speculative"]
    assert spec["draft_kv_layers"] == 1 and spec["draft_kv_bytes_per_token"] == 0
    assert 3_000 < spec["model_kv_bytes_per_token"] < 4_000  # about 3,443 B: 21 CSA + 20 HCA layers' entries and keys
    assert out["breakdown"]["draft_weights"] > 0


@pytest.mark.parametrize(("args", "says"), [
    (("--engine", "vllm==0.25.0"), "fp8 KV cache only"),  # auto is fp8 from 0.30.0 only
    (("--engine", "vllm==0.19.0"), "no DeepSeek-V4"),
    (("--engine", "vllm", "--kv-cache-dtype", "fp16"), "fp8 KV cache only"),
    (("--engine", "vllm", "--kv-cache-dtype", "fp8", "--block-size", "1024"), "block sizes up to 512"),
    (("--engine", "vllm", "--kv-cache-dtype", "fp8", "--block-size", "64"), "a multiple of 128"),
])
def test_size_refuses_what_fit_refuses(args, says):
    r = runner.invoke(app, ["size", "deepseek-v4-flash", "--batch", "4", "--seq-len", "100000", *args])
    f = runner.invoke(app, ["fit", "deepseek-v4-flash", "--gpu", "B200", "-tp", "8", *args])
    assert r.exit_code == f.exit_code == 2 and says in r.output and says in f.output


def test_size_and_check_name_what_vllm_stores(tmp_path):
    """vLLM keeps DeepSeek-V4's caches as fp8_ds_mla rows (584 B an entry) whatever fp8 spelling is given, so size
    names that layout and check offers no "fp8 halves it" for it."""
    sized = [json.loads(runner.invoke(app, ["size", "deepseek-v4-flash", "--batch", "4", "--seq-len", "100000",
                                            "--engine", "vllm", "--kv-cache-dtype", d, "--json"]).output)
             for d in ("auto", "fp8", "fp8_e4m3")]
    assert {s["kv_cache_dtype"] for s in sized} == {"fp8_ds_mla"}
    assert len({s["total_bytes"] for s in sized}) == 1
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(json.dumps({"budgets": [{
        "name": "v4", "model": "deepseek-v4-flash", "gpu": "B200", "engine": "vllm", "tensor_parallel_size": 8,
        "batch": 4, "seq_len": 100000, "require": {"max_kv_bytes": 1}}]}))
    r = runner.invoke(app, ["check", str(budgets)])
    assert r.exit_code == 1 and "fp8_ds_mla" in r.output and "halves" not in r.output


def test_size_compares_vllms_rows_with_the_same_dtypes_token_states():
    """The token states beside vLLM's fp8_ds_mla rows are sized in fp8 too, so what vLLM adds is never negative."""
    args = ["size", "deepseek-v4-flash", "-tp", "8", "--seq-len", "65536", "--json"]
    vllm = json.loads(runner.invoke(app, [*args, "--engine", "vllm"]).output)
    ideal = json.loads(runner.invoke(app, [*args, "--engine", "ideal", "--kv-cache-dtype", "fp8"]).output)
    assert vllm["token_state_bytes"] == ideal["total_bytes"] <= vllm["total_bytes"]
