"""The ``hf`` engine against transformers' real DynamicCache, byte for byte, for the attention families read by
kvplan.io.families.attention (per-layer head shapes, K=V global layers, cross-layer KV sharing), and their
weight counts against transformers' own modules."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvplan.core.spec import NoCacheLayer
from kvplan.core.weights import count_params
from kvplan.io.hf_config import spec_from_hf_config
from kvplan.validate.hf_cache import build_model, measure_decode
from tests.validate.hf_check import assert_hf_equals_measured, build_or_skip

_BASE = {"hidden_size": 64, "intermediate_size": 128, "vocab_size": 128, "max_position_embeddings": 256}
S, F = "sliding_attention", "full_attention"

TINY = {
    # global layers: 1 KV head of 32 (K=V), sliding layers: 2 KV heads of 16
    "gemma4-k-eq-v": dict(_BASE, model_type="gemma4_text", num_hidden_layers=6, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                          attention_k_eq_v=True, sliding_window=6, hidden_size_per_layer_input=0,
                          layer_types=[S, S, F, S, S, F]),
    # the last 2 layers read layers 3 (sliding) and 2 (full); per-layer embeddings; double-wide shared MLPs
    "gemma4-kv-shared": dict(_BASE, model_type="gemma4_text", num_hidden_layers=6, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                             sliding_window=6, hidden_size_per_layer_input=8, vocab_size_per_layer_input=160,
                             num_kv_shared_layers=2, use_double_wide_mlp=True, layer_types=[S, S, F, S, S, F]),
    "gemma4-moe": dict(_BASE, model_type="gemma4_text", num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                       attention_k_eq_v=True, sliding_window=6, hidden_size_per_layer_input=0, enable_moe_block=True,
                       num_experts=4, top_k_experts=2, moe_intermediate_size=32, layer_types=[S, S, S, F]),
    "gemma3n-kv-shared": dict(_BASE, model_type="gemma3n_text", num_hidden_layers=5, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=16, sliding_window=6, hidden_size_per_layer_input=8,
                              vocab_size_per_layer_input=160, num_kv_shared_layers=2, laurel_rank=4,
                              intermediate_size=[128, 128, 64, 64, 64], activation_sparsity_pattern=[0.0] * 5,
                              layer_types=[S, S, F, S, F]),
    "olmo3-sliding": dict(_BASE, model_type="olmo3", num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=2, sliding_window=6, pad_token_id=0, eos_token_id=0),
    "seed-oss": dict(_BASE, model_type="seed_oss", num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=32, attention_bias=True, attention_out_bias=False),
    "hunyuan-moe": dict(_BASE, model_type="hunyuan_v1_moe", num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, num_experts=4, moe_topk=[2, 2]),
    "hunyuan-dense": dict(_BASE, model_type="hunyuan_v1_dense", num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16),
    "minimax-m2": dict(_BASE, model_type="minimax_m2", num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                       intermediate_size=32, bos_token_id=0, eos_token_id=0),
    "glm4-moe": dict(_BASE, model_type="glm4_moe", num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                     first_k_dense_replace=1, n_shared_experts=1, attention_bias=True, use_qk_norm=True),
}

# (batch, prompt tokens, tokens in cache when measured): short of and well past the windows (6).
SHAPES = [(1, 3, 4), (2, 5, 7), (2, 12, 20)]


@pytest.fixture(scope="module", params=sorted(TINY))
def tiny(request):
    return build_or_skip(request.param, TINY[request.param])


@pytest.mark.parametrize("batch,prompt_len,seq_len", SHAPES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hf_engine_equals_measured_cache(tiny, dtype, batch, prompt_len, seq_len):
    assert_hf_equals_measured(tiny, dtype, batch, prompt_len, seq_len)


@pytest.mark.parametrize("name,shared", [("gemma4-kv-shared", {4: 3, 5: 2}), ("gemma3n-kv-shared", {3: 1, 4: 2})])
def test_shared_layers_read_the_last_producer_of_their_type_and_hold_nothing(name, shared):
    """transformers' kv_sharing_modes: the reusing layers get a DummyLayer; the layers they read keep theirs."""
    config = TINY[name]
    spec = spec_from_hf_config(dict(config, torch_dtype="float32"), name=name, origin=name)
    assert {i: x.reads_layer for i, x in enumerate(spec.layers) if isinstance(x, NoCacheLayer)} == shared
    model = build_model(config)
    assert [i for i, mode in enumerate(model.config.kv_sharing_modes) if mode == "reuse"] == sorted(shared)
    measured = measure_decode(model, batch=2, prompt_len=5, seq_len=9)
    assert all((measured.per_layer_bytes[i] == 0) == (i in shared) for i in range(len(spec.layers)))


def test_weight_count_equals_transformers_modules(tiny):
    """Every parameter transformers builds, plus the persistent routing-bias buffers the checkpoints carry
    (``e_score_correction_bias``), equals kvplan's count: the per-layer shapes, K=V layers without v_proj,
    KV-shared layers without k/v projections, per-layer embeddings, AltUp/LAuReL and MoE layouts."""
    name, config, models = tiny
    model = models["float32"]
    params = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() for key, b in model.named_buffers() if key.endswith("e_score_correction_bias"))
    spec = spec_from_hf_config(dict(config, torch_dtype="float32"), name=name, origin=name)
    assert count_params(spec, spec.arch).total == params + buffers
