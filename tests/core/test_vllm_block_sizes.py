"""vLLM's --block-size, release by release: which sizes start on CUDA (kvplan.core.engines.vllm.profiles.BlockSizeRule).

Every expectation below was read from the release's sdist; vLLM's own unit tests do not test which sizes the
command line or the default CUDA backend take (tests/v1/worker/test_gpu_model_runner.py tests the kernel-block
choice with mock backends), so the table cites the source lines instead.
"""

from __future__ import annotations

import pytest

from kvplan.core.engines import engine_for, get_engine
from kvplan.core.profiles import parse_engine
from kvplan.core.engines.vllm.profiles import VLLM_PROFILES, check_block_size, v0_variant
from kvplan.core.sizing import size_kv
from kvplan.errors import InputError
from tests.factories import make_spec

SIZES = (1, 8, 16, 32, 48, 64, 80, 128, 256, 512)
V0_SMALL, V0_ALL, V1_LITERAL = (8, 16, 32), (8, 16, 32, 64, 128), (16, 32, 64, 128)
MULTIPLES_OF_16 = (16, 32, 48, 64, 80, 128, 256, 512)

# release -> the sizes of SIZES a bf16 model starts with on an A100/H100, and why (each release's source):
STARTS = {
    # vllm/engine/arg_utils.py::EngineArgs.add_cli_args: choices=[8, 16, 32]; V0 runs FlashAttention for a
    # multiple of 16, else XFormers, whose paged kernel takes 8/16/32 (vllm/attention/selector.py::which_attn_to_use)
    "0.6.2": V0_SMALL,
    "0.6.3": V0_SMALL,
    "0.6.4": V0_ALL,  # choices=[8, 16, 32, 64, 128]
    "0.6.5": V0_SMALL,  # choices=[8, 16, 32] again
    "0.6.6": V0_SMALL,  # choices to 128, but CacheConfig._verify_args: "only supports block sizes up to 32"
    "0.7.0": V0_ALL,  # the cap is gone from CacheConfig._verify_args
    "0.7.3": V0_ALL,
    # V1: vllm/v1/attention/backends/flash_attn.py::get_kv_cache_shape: "Block size must be a multiple of 16."
    "0.8.0": V1_LITERAL,
    "0.8.4": V1_LITERAL,
    "0.8.5": V1_LITERAL,  # vllm/config.py: BlockSize = Literal[1, 8, 16, 32, 64, 128]: 1 and 8 parse, FA refuses
    "0.10.2": V1_LITERAL,
    "0.11.0": V1_LITERAL,
    # vllm/config/cache.py: BlockSize adds 256; a block larger than FlashAttention's kernel sizes [16, 32, 64]
    # is split into kernel blocks (gpu_model_runner.py::select_common_block_size: 256 -> 64, as vLLM's
    # test_select_common_block_size_uses_largest_shared_int), 8 has none ("No common block size for 8")
    "0.11.1": (*V1_LITERAL, 256),
    "0.17.1": (*V1_LITERAL, 256),
    # vllm/config/cache.py: block_size: SkipValidation[int] (0.23.0: Field(gt=0)); every CUDA backend's
    # get_supported_kernel_block_sizes is MultipleOf(16) or divides it, and AttentionBackend.supports_block_size
    # refuses the rest: "No valid attention backend found ... block_size not supported"
    "0.18.0": MULTIPLES_OF_16,
    "0.23.0": MULTIPLES_OF_16,
    "0.33.0": MULTIPLES_OF_16,
}


@pytest.mark.parametrize("release,size", [(r, b) for r in STARTS for b in SIZES])
def test_a_release_starts_with_the_block_sizes_its_source_takes(release, size):
    profile = parse_engine(f"vllm=={release}").profile
    if size in STARTS[release]:
        assert get_engine("vllm", block_size=size, profile=profile).block_size == size
    else:
        with pytest.raises(InputError, match=rf"--block-size {size}\b.*; use "):
            get_engine("vllm", block_size=size, profile=profile)


def test_the_rule_is_the_releases_not_one_for_all():
    """8 sizes a model under 0.6.2 and is refused under 0.33.0; 48 the other way round; 64 comes, goes and comes
    back in 0.6.x."""
    spec = make_spec(num_layers=2, num_kv_heads=8, head_dim=128, dtype="bf16")

    def held(release: str, block: int) -> int:
        engine, _ = engine_for(spec, "vllm", block_size=block, profile=parse_engine(f"vllm=={release}").profile)
        return size_kv(spec, engine, batch=1, seq_len=100).groups[0].tokens_held_per_layer

    assert held("0.6.2", 8) == 104
    assert held("0.33.0", 48) == 144
    with pytest.raises(InputError, match="needs a multiple of 16"):
        held("0.33.0", 8)
    with pytest.raises(InputError, match="takes 8, 16, 32"):
        held("0.6.2", 48)
    verdicts = {r: profile_allows(r, 64) for r in ("0.6.2", "0.6.4", "0.6.5", "0.6.6", "0.7.0")}
    assert verdicts == {"0.6.2": False, "0.6.4": True, "0.6.5": False, "0.6.6": False, "0.7.0": True}


def profile_allows(release: str, size: int) -> bool:
    return parse_engine(f"vllm=={release}").profile.rules.block_sizes.allows(size)


@pytest.mark.parametrize("release,size,message", [
    ("0.33.0", 8, "vLLM 0.32.0 and later does not start with --block-size 8 on CUDA: it needs a multiple of 16 "
                  "(0.18.0: vllm/platforms/cuda.py::CudaPlatformBase.get_attn_backend_cls"),
    ("0.33.0", 1, "use 16, 32, 48, 64 or another multiple of 16"),
    ("0.6.2", 64, "has no --block-size 64: it takes 8, 16, 32 (0.6.2: vllm/engine/arg_utils.py::"
                  "EngineArgs.add_cli_args); use one of 8, 16, 32"),
    ("0.6.6", 128, "does not start with --block-size 128 on CUDA: it needs a multiple of 16 or 8 no larger than 32 "
                   "(0.6.6: vllm/config.py::CacheConfig._verify_args); use one of 8, 16, 32"),
    ("0.11.0", 256, "has no --block-size 256: it takes 1, 8, 16, 32, 64, 128 (0.8.5: vllm/config.py::"
                    "CacheConfig.block_size), and on CUDA 16, 32, 64, 128"),
    ("0.11.1", 8, "GPUModelRunner.select_common_block_size); use one of 16, 32, 64, 128, 256"),
])
def test_a_refusal_gives_the_rule_its_source_and_sizes_to_use(release, size, message):
    with pytest.raises(InputError) as info:
        check_block_size(parse_engine(f"vllm=={release}").profile, size)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_v0_engine_inside_a_v1_release_takes_8_through_xformers():
    """VLLM_USE_V1=0 in 0.8-0.10: V0's selector falls back to XFormers for a block FlashAttention refuses."""
    v1 = parse_engine("vllm==0.10.2").profile
    v0 = v0_variant(v1)
    assert not v1.rules.block_sizes.allows(8) and v0.rules.block_sizes.allows(8)
    assert not v0.rules.block_sizes.allows(1)  # in BlockSize, but XFormers' paged kernel takes 8, 16, 32 only


def test_every_profile_cites_its_block_size_rule():
    for p in VLLM_PROFILES:
        rule = p.rules.block_sizes
        for source in (rule.choices_source, rule.cuda_source):
            assert source.split(":")[0].count(".") == 2 and "::" in source, (p.version, source)
        assert rule.allows(16), p.version  # vLLM's default (CacheConfig.DEFAULT_BLOCK_SIZE) always starts


def test_the_fit_plan_refuses_what_the_release_refuses():
    """fit, simulate and explain plan through plan_vllm, which applies the same rule as size."""
    from kvplan.core.engines.vllm.plan import plan_vllm

    spec = make_spec(num_layers=2, num_kv_heads=8, head_dim=128, dtype="bf16")
    old, new = parse_engine("vllm==0.17.1").profile, parse_engine("vllm==0.33.0").profile
    plan = plan_vllm(spec.layers, 1 << 30, 4096, new, model_dtype="bf16", in_flight_tokens=2048, block_size=48)
    assert plan.layout.min_block_size == 48
    with pytest.raises(InputError, match="has no --block-size 48"):
        plan_vllm(spec.layers, 1 << 30, 4096, old, model_dtype="bf16", in_flight_tokens=2048, block_size=48)


# An MLA model on Hopper (vllm/platforms/cuda.py::CudaPlatformBase.check_and_update_config): FlashMLA's 64 replaces
# any other --block-size (0.10.2 line 173: "block_size != 64"), then any non-multiple of 64 (0.11.1 line 207:
# "block_size % 64 != 0"; sparse MLA still "!= 64", line 229); 0.18.0 drops the forcing and keeps the size given.
@pytest.mark.parametrize("model,release,given,runs", [
    ("deepseek-v3", "0.10.2", None, 64), ("deepseek-v3", "0.10.2", 16, 64), ("deepseek-v3", "0.10.2", 128, 64),
    ("deepseek-v3", "0.11.1", 32, 64), ("deepseek-v3", "0.11.1", 128, 128), ("deepseek-v3", "0.17.1", 256, 256),
    ("deepseek-v3.2", "0.17.1", 128, 64),
    ("deepseek-v3", "0.33.0", None, 64), ("deepseek-v3", "0.33.0", 16, 16), ("deepseek-v3", "0.33.0", 48, 48),
    ("deepseek-v3.2", "0.33.0", 128, 128),
])
def test_an_mla_models_block_size_follows_the_releases_flashmla_rule(model, release, given, runs):
    from kvplan.core.capacity.common import FitRequest
    from kvplan.core.capacity.fit import fit
    from kvplan.core.gpus import GPUSpec
    from kvplan.io.models import load_model

    spec, profile = load_model(model), parse_engine(f"vllm=={release}").profile
    engine, note = engine_for(spec, "vllm", block_size=given, profile=profile)
    assert engine.block_size == runs
    assert (given is not None and given != runs) == (note is not None and f"replaces --block-size {given}" in note)
    r = fit(FitRequest(spec=spec, gpu=GPUSpec(name="test-141", memory_bytes=141 << 30), tp=8, block_size=given,
                       profile=profile, kv_cache_memory_bytes=1 << 34, weights_memory=100 << 30,
                       activation_memory=1 << 30, non_torch_memory=1 << 29, cuda_graph_memory=0))
    assert r.block_size == runs
    assert any(f"replaces --block-size {given} with {runs}" in n for n in r.notes) == (given not in (None, runs))
