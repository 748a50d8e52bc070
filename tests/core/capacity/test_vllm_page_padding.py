"""vLLM pads an attention page that does not divide the largest page (VLLMRules.page_padding): vLLM 0.33.0's
own tests of vllm/v1/core/kv_cache_planning.py::unify_kv_cache_spec_page_size, ported with their specs and
expected numbers, and the release before the rule, which refuses the model."""

from __future__ import annotations

import pytest

from kvplan.core.dtypes import get_dtype
from kvplan.core.engines.vllm.plan import build_layout, plan_vllm
from kvplan.core.profiles import parse_engine
from kvplan.core.spec import LayerKind
from kvplan.errors import ConfigError
from tests.factories import make_attention, make_mla

# vllm-0.33.0 tests/v1/core/utils.py: new_kv_cache_spec / new_sliding_window_spec default to block_size 16,
# 2 KV heads, head_size 64, float32, sliding_window 1.
MEM_PER_BLOCK_PER_LAYER = 16 * 2 * 64 * 4 * 2  # the test's own constant: 16 KiB


def one_full_one_sliding_head_96() -> list:
    return [make_attention(num_kv_heads=2, head_dim=64),
            make_attention(num_kv_heads=2, head_dim=96, kind=LayerKind.SLIDING, window=1)]


def plan_at(version: str, layers: list):
    return plan_vllm(layers, MEM_PER_BLOCK_PER_LAYER * 2 * 32, 16, parse_engine(f"vllm=={version}").profile,
                     model_dtype="float32", in_flight_tokens=8192, block_size=16)


@pytest.mark.parametrize("version", ["0.24.0", "0.28.0", "0.29.0", "0.33.0"])
def test_a_full_page_beside_a_larger_sliding_page_is_padded(version):
    # vllm-0.33.0 tests/v1/core/test_kv_cache_planning.py:1157-1197 (test_get_kv_cache_config_one_worker,
    # "swa_spec = new_sliding_window_spec(head_size=96)"): a 16 KiB full-attention page beside a 24 KiB sliding
    # page; 1 MiB of memory gives 42 blocks, each tensor padded_page_size * 42 with block_stride padded_page_size,
    # the full layer keeping block_size 16 with page_size_padded = the sliding page.
    p = plan_at(version, one_full_one_sliding_head_96())
    padded_page_size = 16 * 2 * 96 * 4 * 2  # swa_spec.page_size_bytes
    assert p.num_blocks == 42
    assert p.num_groups == 2
    assert p.layout.page_bytes == padded_page_size
    full, sliding = p.layout.buckets
    assert (full.kind, full.block_size, full.real_page_bytes) == (LayerKind.FULL, 16, MEM_PER_BLOCK_PER_LAYER)
    assert (sliding.kind, sliding.block_size, sliding.real_page_bytes) == (LayerKind.SLIDING, 16, 0)
    # vLLM lists a tensor for each group's layer; kvplan one per layer slot of a group (group size 1): every
    # tensor is padded_page_size * 42, as vLLM's.
    assert p.tensor_bytes == (padded_page_size * 42,)
    # the padded page counts in the pool: unpadded, the full layer's blocks would be smaller
    assert p.num_blocks < MEM_PER_BLOCK_PER_LAYER * 2 * 32 // MEM_PER_BLOCK_PER_LAYER


def test_a_page_that_divides_still_grows_its_block():
    # the same test, the case before it (test_kv_cache_planning.py:1125-1155): head 64 full beside head 32
    # sliding divides, so the sliding block grows to 32 tokens; 512 KiB give 32 blocks. No padding.
    layers = [make_attention(num_kv_heads=2, head_dim=64),
              make_attention(num_kv_heads=2, head_dim=32, kind=LayerKind.SLIDING, window=1)]
    p = plan_vllm(layers, MEM_PER_BLOCK_PER_LAYER * 32, 16, parse_engine("vllm==0.33.0").profile,
                  model_dtype="float32", in_flight_tokens=8192, block_size=16)
    assert p.num_blocks == 32
    assert [(b.block_size, b.real_page_bytes) for b in p.layout.buckets] == [(16, 0), (32, 0)]


def test_unify_pads_a_draft_page_that_does_not_divide():
    # vllm-0.33.0 tests/v1/core/test_kv_cache_planning.py:1670-1705
    # (test_unify_kv_cache_page_size_uses_padding_for_non_divisible_sizes): a 192-dim target page (12 KiB in
    # bf16, 1 KV head, block 16) beside a 128-dim sliding draft page (8 KiB, window 1024), 3:2. The target is
    # unchanged; the draft keeps block_size 16 and its real page, page_size_padded = the target's page.
    target = make_attention(num_kv_heads=1, head_dim=192)
    draft = make_attention(num_kv_heads=1, head_dim=128, kind=LayerKind.SLIDING, window=1024)
    layout = build_layout([target, draft], rules=parse_engine("vllm==0.33.0").profile.rules,
                          kv_dtype=get_dtype("bfloat16"), model_dtype="bfloat16", block_size=16)
    target_page, draft_real_page = 16 * 1 * 192 * 2 * 2, 16 * 1 * 128 * 2 * 2
    assert layout.page_bytes == target_page  # unified_draft_spec.page_size_bytes == target_spec.page_size_bytes
    full, sliding = layout.buckets
    assert (full.block_size, full.real_page_bytes) == (16, 0)  # unified_specs["target_attn"] == target_spec
    assert sliding.block_size == 16  # == draft_spec.block_size
    assert sliding.real_page_bytes == draft_real_page  # == draft_spec.real_page_size_bytes


def test_the_release_before_the_rule_refuses():
    # 0.23.0's unify_kv_cache_spec_page_size raises NotImplementedError ("Cannot unify by adjusting block_size")
    with pytest.raises(ConfigError, match=r"sizes must divide.*vllm==0\.24\.0"):
        plan_at("0.23.0", one_full_one_sliding_head_96())


def test_an_mla_page_is_not_padded_from_0_29():
    # 0.24.0-0.28.x pad any attention page whose backend indexes KV by the block stride (the dense MLA backends
    # do); 0.29.0 excludes MLA (unify_kv_cache_spec_page_size: "Padding is only supported for non-MLA attention
    # layers").
    mla = make_mla()
    rules = {v: parse_engine(f"vllm=={v}").profile.rules for v in ("0.23.0", "0.28.0", "0.29.0")}
    assert [rules[v].pads_page(mla) for v in rules] == [False, True, False]
    assert [rules[v].pads_page(make_attention()) for v in rules] == [False, True, True]
