"""Engine budgets: exact arithmetic once the estimated parts are given, vLLM's block layout, what-ifs."""

from __future__ import annotations

import math

import pytest

from kvplan.core.capacity.common import FitRequest
from kvplan.core.capacity.fit import fit, what_if
from kvplan.core.capacity.sglang import default_mem_fraction_static
from kvplan.core.capacity.vllm import kv_layout
from kvplan.core.gpus import GPUSpec
from kvplan.core.profiles import parse_engine
from kvplan.core.spec import LayerKind
from kvplan.errors import InputError
from kvplan.io.models import load_model

GiB = 1 << 30
MiB = 1 << 20
GPU80 = GPUSpec(name="test-80", memory_bytes=80 * GiB)


def given(**kw):
    """A request whose estimated parts are all given, so every figure is exact arithmetic."""
    base = dict(gpu=GPU80, weights_memory=12 * GiB, activation_memory=GiB, non_torch_memory=512 * MiB,
                cuda_graph_memory=0, gpu_memory_utilization=0.9)
    base.update(kw)
    return FitRequest(**base)


def test_vllm_budget_blocks_tokens_concurrency():
    r = fit(given(spec=load_model("llama2-7b")))
    kv = math.ceil(80 * GiB * 0.9) - 12 * GiB - GiB - 512 * MiB
    assert r.kv_cache_memory_bytes == kv == 58.5 * GiB
    page = 16 * 524_288  # 16 tokens x 32 layers x 16 KiB
    assert r.page_size_bytes == page and r.block_size == 16
    assert r.num_blocks == kv // page == 7488
    assert r.kv_cache_tokens == 7488 * 16
    assert r.max_concurrency == pytest.approx(7488 / (4096 / 16))
    assert r.fits and r.max_model_len_fit == 4096
    assert r.breakdown.as_dict() == {"weights": 12 * GiB, "activation": GiB, "non_torch": 512 * MiB, "cuda_graph": 0,
                                     "kv_cache": kv, "unused": 80 * GiB - math.ceil(80 * GiB * 0.9)}
    assert r.estimated == ()


def test_kv_cache_memory_bytes_skips_the_budget():
    r = fit(FitRequest(spec=load_model("llama2-7b"), gpu=GPU80, kv_cache_memory_bytes=8 * GiB))
    assert r.kv_cache_memory_bytes == 8 * GiB and r.num_blocks == 8 * GiB // (16 * 524_288)
    assert set(r.estimated) == {"activation", "non_torch", "cuda_graph"}  # the breakdown still shows estimates


def vllm(version: str):
    return parse_engine(f"vllm=={version}").profile


def test_vllm_max_model_len_estimate_is_the_largest_that_fits():
    # 1 GiB / 128 KiB per token = 8192 tokens exactly: 512 blocks of 16, the null block among them
    r = fit(given(spec=load_model("llama3-8b"), kv_cache_memory_bytes=GiB, max_model_len=8192, profile=vllm("0.28.0")))
    assert r.num_blocks == 512 and r.usable_blocks == 511 and r.fits and r.max_model_len_fit == 8192
    # from 0.29 the fit check leaves one block for the null block: the exact fit is refused, 16 tokens fewer fit
    r = fit(given(spec=load_model("llama3-8b"), kv_cache_memory_bytes=GiB, max_model_len=8192, profile=vllm("0.29.0")))
    assert r.num_blocks == 512 and not r.fits and r.max_model_len_fit == 8192 - 16
    r = fit(given(spec=load_model("llama3-8b"), kv_cache_memory_bytes=GiB // 2, max_model_len=8192,
                  profile=vllm("0.28.0")))
    assert not r.fits and r.max_model_len_fit == 4096
    assert "the longest that fits is 4,096" in r.reasons[0]


def test_gemma3_hybrid_groups_like_vllm():
    spec = load_model("gemma3-27b")
    layout = kv_layout(list(spec.layers), given(spec=spec), 16)
    assert layout.group_size == 10  # 52 sliding + 10 full: min count, as max >= 1.5 x min
    kinds = {b.kind: (b.num_layers, b.num_groups) for b in layout.buckets}
    assert kinds == {LayerKind.SLIDING: (52, 6), LayerKind.FULL: (10, 1)}
    assert layout.page_bytes == 16 * 16 * 128 * 2 * 2
    # per request at 32k: the full group needs 2048 blocks; each sliding group cdiv(1023 + 8192, 16) + 1
    assert layout.blocks_per_request(32768, 8192) == 2048 + 6 * (576 + 1)


def test_mamba_hybrid_enlarges_the_attention_block():
    spec = load_model("qwen3-next-80b-a3b")
    layout = kv_layout(list(spec.layers), given(spec=spec, tp=4), 16)
    # per rank: 1 (replicated) KV head x 256 x 2 (K, V) x 2 B = 1 KiB per token; mamba state per request:
    # conv 3 x 8192/4 x 2 B + 32/4 x 128 x 128 x 2 B = 274,432 B -> 16 x cdiv(274432, 16 KiB) = 272 tokens
    assert layout.min_block_size == 272 and layout.page_bytes == 272 * 1024
    assert layout.group_size == 12 and layout.num_groups == 4


def test_pp_takes_the_fewest_blocks_of_any_stage():
    one = fit(given(spec=load_model("llama2-7b")))
    two = fit(given(spec=load_model("llama2-7b"), pp=2, weights_memory=6 * GiB))
    assert two.num_blocks == (math.ceil(80 * GiB * 0.9) - 6 * GiB - GiB - 512 * MiB) // (16 * 16 * 16384)
    assert two.num_blocks > one.num_blocks


def test_sglang_default_fraction_matches_its_published_h100_value():
    assert default_mem_fraction_static(81559 * MiB, 1, 1) == 0.835


def test_sglang_token_pool():
    r = fit(given(spec=load_model("llama3-8b"), engine="sglang", gpu_memory_utilization=0.8))
    free_before = 80 * GiB - 512 * MiB
    rest = int(free_before * 0.8) - 12 * GiB
    assert r.kv_cache_tokens == rest // 131_072
    assert r.max_concurrency == pytest.approx(r.kv_cache_tokens / 8192)


def test_trtllm_fraction_of_what_is_left():
    r = fit(given(spec=load_model("llama3-8b"), engine="trtllm"))
    kv = int((80 * GiB - 12 * GiB - GiB - 512 * MiB) * 0.9)
    assert r.kv_cache_memory_bytes == kv
    assert r.kv_cache_tokens == kv // 131_072 and r.num_blocks == r.kv_cache_tokens // 32


def test_not_fitting_explains_by_how_much_and_what_if_offers_fixes():
    req = FitRequest(spec=load_model("llama3-70b"), gpu=GPUSpec(name="x", memory_bytes=80 * GiB), max_model_len=8192)
    r = fit(req)
    assert not r.fits and "short by" in r.reasons[0]
    options = {w.change: w for w in what_if(req, r)}
    assert options["--tensor-parallel-size 4"].result.fits
    assert not options["--kv-cache-dtype fp8"].result.fits  # weights alone are too large


def test_concurrency_target():
    r = fit(given(spec=load_model("llama2-7b"), concurrency=64))
    assert not r.fits and "64 concurrent requests" in r.reasons[0]
    assert fit(given(spec=load_model("llama2-7b"), concurrency=29)).fits


def test_estimates_are_marked():
    r = fit(FitRequest(spec=load_model("llama3-8b"), gpu=GPU80))
    assert set(r.estimated) == {"activation", "non_torch", "cuda_graph"}
    r = fit(FitRequest(spec=load_model("llama3-8b"), gpu=GPU80, enforce_eager=True))
    assert r.breakdown.cuda_graph == 0 and "cuda_graph" not in r.estimated


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(gpu_memory_utilization=1.5), r"must be in \(0, 1\]"),
        (dict(gpu_memory_utilization=0.0), r"must be in \(0, 1\]"),
        (dict(tp=3), "divide the 32 attention heads"),
        (dict(engine="tgi"), "fit knows the budgets of"),
        (dict(max_model_len=0), "max_model_len must be >= 1"),
    ],
)
def test_bad_requests(kw, match):
    with pytest.raises(InputError, match=match):
        fit(FitRequest(spec=load_model("llama2-7b"), gpu=GPU80, **kw))


def test_sglang_sliding_only_model_needs_only_its_window_per_request():
    r = fit(given(spec=load_model("mistral-7b"), engine="sglang", max_model_len=32768))
    assert r.max_concurrency == pytest.approx(r.kv_cache_tokens / 4096)
    hybrid = fit(given(spec=load_model("gemma2-9b"), engine="sglang", max_model_len=8192))
    assert 0 < hybrid.max_concurrency <= hybrid.kv_cache_tokens / 8192 * 2
