"""The ``hf`` engine against transformers' real cache, byte for byte, for the MLA families on tiny random models:
DeepSeek Sparse Attention's indexer keys (DeepSeek-V3.2, GLM-5 with and without shared indexers), LongCat-Flash's
two MLA blocks per layer, Kimi-K2.5's multimodal wrapper, and DeepSeek-V4's window + compressed entries +
compressor state (sliding-only, CSA and HCA layers)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvplan.core.engines import get_engine
from kvplan.core.spec import CompressedLayer, MLALayer
from kvplan.io.hf_config import spec_from_hf_config
from tests.validate.hf_check import assert_hf_equals_measured, build_or_skip

_BASE = {"hidden_size": 64, "intermediate_size": 128, "vocab_size": 128, "max_position_embeddings": 256}
_MLA = {"num_attention_heads": 4, "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16, "v_head_dim": 16}
_MOE = {"moe_intermediate_size": 32, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1}

TINY = {
    "deepseek-v32-dsa": dict(_BASE, **_MLA, **_MOE, model_type="deepseek_v32", num_hidden_layers=2,
                             num_key_value_heads=4, index_head_dim=16, index_n_heads=2, index_topk=4),
    # index_topk_freq 2 (offset 2): layer 2 reuses layer 1's top-k and caches no indexer key
    "glm-moe-dsa-shared": dict(_BASE, **_MLA, **_MOE, model_type="glm_moe_dsa", num_hidden_layers=4,
                               num_key_value_heads=4, index_head_dim=16, index_n_heads=2, index_topk=4,
                               index_topk_freq=2),
    "longcat-flash": dict(_MLA, model_type="longcat_flash", hidden_size=64, vocab_size=128,
                          max_position_embeddings=256, num_layers=2, head_dim=8, ffn_hidden_size=96,
                          expert_ffn_hidden_size=32, n_routed_experts=4, zero_expert_num=2, moe_topk=2),
    "kimi-k25": {"model_type": "kimi_k25", "projection_hidden_size": 32,
                 "text_config": dict(_BASE, **_MLA, **_MOE, model_type="kimi_k2", num_hidden_layers=2,
                                     num_key_value_heads=4),
                 "vision_config": {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 32,
                                   "num_attention_heads": 2}},
    # sliding-only, CSA (ratio 4, overlapping, indexer) and HCA (ratio 128) layers; window 8
    "deepseek-v4": dict(_BASE, model_type="deepseek_v4", moe_intermediate_size=32, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=1, head_dim=32, q_lora_rank=48,
                        qk_rope_head_dim=8, sliding_window=8, o_groups=2, o_lora_rank=16, index_n_heads=2,
                        index_head_dim=16, index_topk=4, n_routed_experts=4, n_shared_experts=1,
                        num_experts_per_tok=2, hc_mult=2, compress_ratios=[0, 4, 128, 4], num_hash_layers=1),
}

# (batch, prompt tokens, tokens in cache when measured): before and after the window (8) and CSA windows (4)
# fill, across a decode step that closes a window (8 -> 9 ... 20), and past an HCA window (128)
SHAPES = [(1, 3, 4), (2, 5, 7), (2, 12, 20), (1, 126, 131)]


@pytest.fixture(scope="module", params=sorted(TINY))
def tiny(request):
    return build_or_skip(request.param, TINY[request.param])


@pytest.mark.parametrize("batch,prompt_len,seq_len", SHAPES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hf_engine_equals_measured_cache(tiny, dtype, batch, prompt_len, seq_len):
    assert_hf_equals_measured(tiny, dtype, batch, prompt_len, seq_len)


def test_the_new_cache_kinds_are_all_exercised():
    """The tiny models above cover every kind this file is for: an indexer, a shared (indexer-less) DSA layer,
    and DeepSeek-V4's three layer types."""
    specs = {name: spec_from_hf_config(dict(cfg, torch_dtype="float32"), name=name, origin=name)
             for name, cfg in TINY.items()}
    glm = specs["glm-moe-dsa-shared"].layers
    assert [layer.indexer_head_dim for layer in glm] == [16, 16, 0, 16]  # type: ignore[union-attr]
    v4 = specs["deepseek-v4"].layers
    assert all(isinstance(layer, CompressedLayer) for layer in v4)
    assert [(layer.compress_ratio, layer.overlap, layer.indexer_head_dim) for layer in v4] == [  # type: ignore[union-attr]
        (0, False, 0), (4, True, 16), (128, False, 0), (4, True, 16)]
    assert len(specs["longcat-flash"].layers) == 4 and all(isinstance(x, MLALayer) for x in specs["longcat-flash"].layers)


def test_v4_compressor_buffer_is_the_last_concatenation_in_transformers():
    """transformers keeps the compressor's unclosed tokens as a view of the last concatenation: one token more
    than the open window holds once a decode step closes it, so hf exceeds ideal on HCA layers right after."""
    spec = spec_from_hf_config(dict(TINY["deepseek-v4"], torch_dtype="float32"), name="v4", origin="v4")
    hca = spec.layers[2]
    assert isinstance(hca, CompressedLayer) and hca.compress_ratio == 128
    # 128 tokens: the decode step that closed the first window leaves a buffer view of all 128 tokens
    # (kv and gate of 32 float32 = 2 x 128 x 128 B); ideal keeps none open
    hf = get_engine("hf").compressed_sequence_bytes(hca, 128, _f32(), "float32")
    ideal = get_engine("ideal").compressed_sequence_bytes(hca, 128, _f32(), "float32")
    assert hf - ideal == 2 * 128 * 32 * 4


def _f32():
    from kvplan.core.dtypes import get_dtype

    return get_dtype("fp32")
