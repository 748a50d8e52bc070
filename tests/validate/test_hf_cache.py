"""The ``hf`` engine against transformers' real DynamicCache, byte for byte, on tiny random models."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvplan.core.engines import get_engine  # noqa: E402
from kvplan.core.sizing import size_kv  # noqa: E402
from kvplan.io.hf_config import spec_from_hf_config  # noqa: E402
from tests.validate.hf_check import assert_hf_equals_measured, build_or_skip  # noqa: E402

_BASE = dict(hidden_size=64, intermediate_size=128, vocab_size=128, max_position_embeddings=256)

TINY = {
    "llama-gqa": dict(_BASE, model_type="llama", num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    "mistral-window": dict(_BASE, model_type="mistral", num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=1, sliding_window=8),
    "gemma2-interleaved": dict(_BASE, model_type="gemma2", num_hidden_layers=4, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=32, sliding_window=8),
    "gemma3-text": dict(_BASE, model_type="gemma3_text", num_hidden_layers=6, num_attention_heads=4,
                        num_key_value_heads=1, head_dim=16, sliding_window=6),
    "falcon-mqa": dict(model_type="falcon", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       multi_query=True, new_decoder_architecture=False, vocab_size=128, alibi=False),
    "falcon-new-arch-gqa": dict(model_type="falcon", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                num_kv_heads=2, new_decoder_architecture=True, vocab_size=128, alibi=False),
    "gpt2-mha": dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=256,
                     bos_token_id=0, eos_token_id=0),
    "deepseek-v3-mla": dict(_BASE, model_type="deepseek_v3", moe_intermediate_size=32, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48,
                            qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4,
                            n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, n_group=1,
                            topk_group=1),
    "qwen3-next-linear": dict(_BASE, model_type="qwen3_next", moe_intermediate_size=32,
                              shared_expert_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8,
                              linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
                              num_experts=4, num_experts_per_tok=2),
    "llama4-chunked": dict(_BASE, model_type="llama4_text", num_hidden_layers=4, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16, attention_chunk_size=8, intermediate_size_mlp=128,
                           num_local_experts=2, num_experts_per_tok=1, interleave_moe_layer_step=1),
}

# (batch, prompt tokens, tokens in cache when measured): short of and well past the windows (6-8).
SHAPES = [(1, 3, 4), (2, 5, 7), (2, 12, 20)]


@pytest.fixture(scope="module", params=sorted(TINY))
def tiny(request):
    return build_or_skip(request.param, TINY[request.param])


@pytest.mark.parametrize("batch,prompt_len,seq_len", SHAPES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hf_engine_equals_measured_cache(tiny, dtype, batch, prompt_len, seq_len):
    assert_hf_equals_measured(tiny, dtype, batch, prompt_len, seq_len)


def test_sliding_layers_differ_from_ideal_chunked_in_hf():
    """transformers caches chunked layers as a sliding window of C tokens: more than the current chunk."""
    spec = spec_from_hf_config(dict(TINY["llama4-chunked"], torch_dtype="float32"), name="l4", origin="l4")
    hf = size_kv(spec, get_engine("hf"), batch=1, seq_len=17)
    ideal = size_kv(spec, get_engine("ideal"), batch=1, seq_len=17)
    assert hf.total_bytes > ideal.total_bytes
