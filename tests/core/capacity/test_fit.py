"""Engine budgets: exact arithmetic once the estimated parts are given, vLLM's block layout, what-ifs."""

from __future__ import annotations

import math

import pytest

from kvplan.core.capacity.common import FitRequest
from kvplan.core.capacity.fit import fit, what_if
from kvplan.core.engines.sglang.budget import default_mem_fraction_static
from kvplan.core.engines.vllm.budget import kv_layout
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
    assert r.breakdown.as_dict() == {"weights": 12 * GiB, "draft_weights": 0, "lora": 0, "activation": GiB,
                                     "non_torch": 512 * MiB, "cuda_graph": 0, "kv_cache": kv,
                                     "unused": 80 * GiB - math.ceil(80 * GiB * 0.9)}
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
    assert "the longest that fits: --max-model-len 4096" in r.reasons[0]


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


def test_sglang_windows_only_its_hybrid_swa_architectures():
    """SGLang pools sliding layers apart (a request holds its window) only for architectures on its hybrid-SWA
    list (configs/model_config.py::is_hybrid_swa_model); Mistral is not on it, so a request holds every token."""
    import dataclasses

    mistral = load_model("mistral-7b")
    r = fit(given(spec=mistral, engine="sglang", max_model_len=32768))
    assert r.max_concurrency == pytest.approx(r.kv_cache_tokens / 32768)
    opted = dataclasses.replace(mistral, raw_config={**mistral.raw_config, "is_hybrid_swa": True})
    w = fit(given(spec=opted, engine="sglang", max_model_len=32768))
    assert w.max_concurrency == pytest.approx(w.kv_cache_tokens / 4096)
    oss = fit(given(spec=load_model("gpt-oss-20b"), engine="sglang", max_model_len=8192))  # on the list: windows
    assert 0 < oss.max_concurrency <= oss.kv_cache_tokens / 8192 * 2


# --- vLLM inputs beyond the model and GPU (FitRequest fields) -------------------------------------------

def test_num_gpu_blocks_override_replaces_blocks_and_from_0_20_1_the_fit_check():
    spec = load_model("llama3-8b")  # 128 KiB per token: 2 MiB a 16-token block
    base = dict(spec=spec, kv_cache_memory_bytes=8 * GiB, max_model_len=8192, num_gpu_blocks_override=100)
    old, new = fit(given(profile=vllm("0.20.0"), **base)), fit(given(profile=vllm("0.20.1"), **base))
    assert old.num_blocks == new.num_blocks == 100
    assert old.fits and old.max_model_len_fit == 8192  # 0.20.0 checks the memory: 4096 blocks
    assert not new.fits and new.max_model_len_fit == 100 * 16  # the override's 100 blocks hold 1600 tokens
    assert "--num-gpu-blocks-override 100 replaces the 4096 blocks" in " ".join(new.notes)


def test_disable_hybrid_kv_cache_manager_sizes_sliding_layers_as_full():
    spec = load_model("gemma3-27b")
    on = fit(given(spec=spec, kv_cache_memory_bytes=20 * GiB, max_model_len=32768, profile=vllm("0.11.0")))
    off = fit(given(spec=spec, kv_cache_memory_bytes=20 * GiB, max_model_len=32768, profile=vllm("0.11.0"),
                    disable_hybrid_kv_cache_manager=True))
    assert off.max_concurrency < on.max_concurrency
    assert any("groups the layers" in n for n in on.notes) and not any("groups the layers" in n for n in off.notes)
    assert any("--disable-hybrid-kv-cache-manager" in n for n in off.notes)


def test_gpus_of_different_memory_plan_with_the_smallest():
    spec = load_model("llama3-8b")
    mixed = fit(given(spec=spec, tp=2, gpu_memory_per_rank=(80 * GiB, 40 * GiB)))
    small = fit(given(spec=spec, tp=2, gpu=GPUSpec(name="test-40", memory_bytes=40 * GiB)))
    assert mixed.num_blocks == small.num_blocks and mixed.kv_cache_memory_bytes == small.kv_cache_memory_bytes
    assert any("plans with the smallest, 40.00 GiB" in n for n in mixed.notes)
    # pp: each stage plans with its own smallest GPU, and the pool with the smallest stage
    staged = fit(given(spec=spec, pp=2, gpu_memory_per_rank=(80 * GiB, 40 * GiB)))
    assert staged.num_blocks == fit(given(spec=spec, pp=2, gpu=GPUSpec(name="t", memory_bytes=40 * GiB))).num_blocks
    with pytest.raises(InputError, match="lists 3 GPUs; tp 2 x pp 1 needs 2"):
        fit(given(spec=spec, tp=2, gpu_memory_per_rank=(80 * GiB,) * 3))


def test_layers_with_different_head_sizes_share_one_group_from_0_11():
    from kvplan.core.spec import AttentionLayer
    from tests.factories import make_spec

    layers = [AttentionLayer(num_kv_heads=8, k_head_dim=256, v_head_dim=256)] * 2 + [
        AttentionLayer(num_kv_heads=8, k_head_dim=128, v_head_dim=128)] * 2
    spec = make_spec(layers, dtype="bf16", num_attention_heads=32, max_model_len=4096)
    r = fit(given(spec=spec, kv_cache_memory_bytes=GiB, profile=vllm("0.11.0")))
    page = 16 * 8 * 2 * 2  # one token of one head-128 layer is 8 x 2 x 128 x 2 B; a 16-token block x 128
    assert r.page_size_bytes == 2 * (2 * page * 128) + 2 * (page * 128)  # every layer's page, summed
    assert r.num_blocks == GiB // r.page_size_bytes and any("different page sizes" in n for n in r.notes)


def test_per_token_head_and_ds_mla_dtypes_by_release():
    from kvplan.errors import ConfigError

    spec = load_model("llama3-8b")  # 32 layers x 8 KV heads x 128
    r = fit(given(spec=spec, kv_cache_memory_bytes=GiB, kv_dtype="fp8_per_token_head", profile=vllm("0.20.0")))
    assert r.page_size_bytes == 32 * (16 * 8 * 2 * 128 + 2 * 16 * 8 * 4)  # dense fp8 page + fp32 scales
    with pytest.raises(ConfigError, match="no --kv-cache-dtype fp8_per_token_head \\(from 0.20.0\\)"):
        fit(given(spec=spec, kv_cache_memory_bytes=GiB, kv_dtype="fp8_per_token_head", profile=vllm("0.19.0")))
    ds = load_model("deepseek-v3")
    r = fit(given(spec=ds, kv_cache_memory_bytes=GiB, kv_dtype="fp8_ds_mla", profile=vllm("0.11.0")))
    assert r.block_size == 64 and r.page_size_bytes == ds.num_layers * 64 * 656
    with pytest.raises(ConfigError, match="from 0.11.0"):
        fit(given(spec=ds, kv_cache_memory_bytes=GiB, kv_dtype="fp8_ds_mla", profile=vllm("0.10.2")))
    with pytest.raises(InputError, match="fixed layout"):
        fit(given(spec=spec, kv_cache_memory_bytes=GiB, kv_dtype="fp8_ds_mla", profile=vllm("0.11.0")))


def test_mla_block_size_follows_the_attention_backend():
    ds = load_model("deepseek-v3")
    sizes = {b: fit(given(spec=ds, kv_cache_memory_bytes=GiB, attention_backend=b)).block_size
             for b in ("FLASHMLA", "flashmla-sparse", "CUTLASS_MLA", "FLASHINFER_MLA", "TRITON_MLA")}
    assert sizes == {"FLASHMLA": 64, "flashmla-sparse": 64, "CUTLASS_MLA": 128, "FLASHINFER_MLA": 64, "TRITON_MLA": 16}
    assert fit(given(spec=ds, kv_cache_memory_bytes=GiB, attention_backend="FLASHINFER_MLA", block_size=32)).block_size == 32
    with pytest.raises(InputError, match="CUTLASS_MLA backend takes block size 128, not 64"):
        fit(given(spec=ds, kv_cache_memory_bytes=GiB, attention_backend="CUTLASS_MLA", block_size=64))
    with pytest.raises(InputError, match="no MLA layers"):
        fit(given(spec=load_model("llama3-8b"), kv_cache_memory_bytes=GiB, attention_backend="CUTLASS_MLA"))
    with pytest.raises(InputError, match="unknown vLLM attention backend"):
        fit(given(spec=ds, kv_cache_memory_bytes=GiB, attention_backend="NOPE"))


def test_mamba_cache_mode_align_holds_two_state_blocks():
    from kvplan.errors import ConfigError

    spec = load_model("qwen3-next-80b-a3b")
    base = dict(spec=spec, kv_cache_memory_bytes=4 * GiB, max_model_len=32768, tp=4, profile=vllm("0.16.0"))
    none, align = fit(given(**base)), fit(given(**base, mamba_cache_mode="align"))
    spec_none = fit(given(**base, num_speculative_tokens=2))
    assert none.num_blocks == align.num_blocks and spec_none.max_concurrency < align.max_concurrency < none.max_concurrency
    with pytest.raises(ConfigError, match="from 0.16.0"):
        fit(given(**{**base, "profile": vllm("0.14.0")}, mamba_cache_mode="align"))
    with pytest.raises(InputError, match="use one of none, align"):
        fit(given(**base, mamba_cache_mode="all"))


def test_a_model_without_kv_layers_gets_the_null_block_only():
    from kvplan.core.spec import NoCacheLayer
    from tests.factories import make_spec

    spec = make_spec([NoCacheLayer()] * 4, max_model_len=4096)
    r = fit(given(spec=spec))
    assert r.num_blocks == 1 and r.kv_cache_memory_bytes == 0 and r.fits


def test_auto_fit_max_model_len_takes_the_longest_that_fits():
    from kvplan.errors import ConfigError

    spec = load_model("llama3-8b")  # 128 KiB per token, model max 8192
    r = fit(given(spec=spec, kv_cache_memory_bytes=GiB // 2, auto_fit_max_model_len=True, profile=vllm("0.29.0")))
    assert r.fits and r.max_model_len == 4096 - 16  # 256 blocks, one kept for the null block
    with pytest.raises(ConfigError, match="auto-fit"):
        fit(given(spec=spec, kv_cache_memory_bytes=GiB // 2, auto_fit_max_model_len=True, profile=vllm("0.11.0")))
