"""The ``hf`` engine against transformers' real cache, byte for byte, for every hybrid architecture
transformers 5.23 builds here (tiny random weights): Kimi Delta Attention + MLA, MiniMax lightning
attention, Mamba-2 in Nemotron-H (with MLP and MoE layers), Granite 4.0-H, Bamba and Falcon-H1 (attention and
Mamba-2 in one layer), LFM2 short convolutions, Qwen3.5 dense and MoE (also through text_config)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvplan.core.engines import get_engine  # noqa: E402
from kvplan.core.sizing import size_kv  # noqa: E402
from kvplan.io.hf_config import spec_from_hf_config  # noqa: E402
from tests.validate.hf_check import assert_hf_equals_measured, build_or_skip  # noqa: E402

_BASE = dict(hidden_size=64, intermediate_size=128, vocab_size=128, max_position_embeddings=256,
             pad_token_id=0, bos_token_id=0, eos_token_id=0)
_QWEN_GDN = dict(head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
                 linear_num_key_heads=2, linear_num_value_heads=4, num_attention_heads=4, num_key_value_heads=2)

TINY = {
    "kimi-linear-kda-mla": dict(
        _BASE, model_type="kimi_linear", num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, moe_intermediate_size=32,
        num_experts=4, num_experts_per_token=2, first_k_dense_replace=1,
        linear_attn_config={"head_dim": 8, "num_heads": 4, "short_conv_kernel_size": 4, "kda_layers": [1, 2, 4],
                            "full_attn_layers": [3]}),
    "minimax-lightning": dict(
        _BASE, model_type="minimax", num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        num_local_experts=4, num_experts_per_tok=2, block_size=4),
    "nemotron-h-mamba2-mlp-moe": dict(
        _BASE, model_type="nemotron_h", num_hidden_layers=5, hybrid_override_pattern="M-M*E", num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=2,
        conv_kernel=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=32),
    "granite-4-h-mamba2-moe": dict(
        _BASE, model_type="granitemoehybrid", num_hidden_layers=4, layer_types=["mamba", "attention", "mamba", "mamba"],
        num_attention_heads=4, num_key_value_heads=2, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16,
        mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2, num_local_experts=4, num_experts_per_tok=2,
        shared_intermediate_size=32),
    "bamba-mamba2": dict(
        _BASE, model_type="bamba", num_hidden_layers=3, attn_layer_indices=[1], num_attention_heads=4,
        num_key_value_heads=2, mamba_n_heads=8, mamba_d_head="auto", mamba_d_state=16, mamba_n_groups=2,
        mamba_d_conv=4, mamba_expand=2),
    "falcon-h1-parallel": dict(
        _BASE, model_type="falcon_h1", num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        mamba_d_ssm=96, mamba_n_heads=6, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=1, mamba_d_conv=4),
    "lfm2-short-conv": dict(
        _BASE, model_type="lfm2", num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        full_attn_idxs=[1], conv_L_cache=3),
    "qwen3.5-gdn": dict(_BASE, **_QWEN_GDN, model_type="qwen3_5_text", num_hidden_layers=4, mamba_ssm_dtype="float32"),
    "qwen3.5-moe-gdn": dict(_BASE, **_QWEN_GDN, model_type="qwen3_5_moe_text", num_hidden_layers=4,
                            moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
                            num_experts_per_tok=2),
    "qwen3.5-text-config": dict(model_type="qwen3_5", text_config=dict(_BASE, **_QWEN_GDN, model_type="qwen3_5_text",
                                                                       num_hidden_layers=4)),
}

# (batch, prompt tokens, tokens in cache when measured): a prompt shorter than the conv kernels (3-4) and one
# longer (and over MiniMax's 4-token lightning blocks), decoded past the prompt. No windows here, so longer
# sequences would only repeat these on a CPU shared by many test runs.
SHAPES = [(1, 3, 4), (2, 5, 7)]


@pytest.fixture(scope="module", params=sorted(TINY))
def tiny(request):
    return build_or_skip(request.param, TINY[request.param])


def _with_dtype(config: dict, dtype: str) -> dict:
    return dict(config, torch_dtype=dtype)


@pytest.mark.parametrize("batch,prompt_len,seq_len", SHAPES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hf_engine_equals_measured_cache(tiny, dtype, batch, prompt_len, seq_len):
    assert_hf_equals_measured(tiny, dtype, batch, prompt_len, seq_len)


def test_the_recurrent_states_are_what_makes_bf16_differ_from_half_of_fp32():
    """In bfloat16 the conv and K/V halve but the Mamba-2 / gated-delta-net / KDA states stay float32: a
    rule that used the model dtype everywhere would predict exactly half the float32 cache."""
    config = TINY["nemotron-h-mamba2-mlp-moe"]
    fp32 = size_kv(spec_from_hf_config(_with_dtype(config, "float32"), name="n", origin="n"), get_engine("hf"),
                   batch=1, seq_len=8)
    bf16 = size_kv(spec_from_hf_config(_with_dtype(config, "bfloat16"), name="n", origin="n"), get_engine("hf"),
                   batch=1, seq_len=8)
    # 2 Mamba-2 layers: 8 heads x 16 x 16 fp32 state each stays 4 B an element in both
    state = 2 * 8 * 16 * 16 * 4
    assert fp32.total_bytes - bf16.total_bytes == (fp32.total_bytes - state) // 2
