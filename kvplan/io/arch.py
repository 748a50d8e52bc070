"""The architecture shape for weight counts, read from config.json keys.

Which keys mean what follows transformers v5.23's modeling files (``models/<type>/modeling_<type>.py``):
plain (up/down) MLPs and LayerNorm with bias for GPT-2, OPT and Falcon; gated MLPs and RMSNorm
elsewhere; Qwen2's q/k/v bias; gpt-oss's attention and expert biases; MoE placement from
``first_k_dense_replace``/``moe_layer_freq`` (DeepSeek), ``decoder_sparse_step``/``mlp_only_layers``
(Qwen MoE), ``interleave_moe_layer_step`` (Llama 4), ``expert_layer_period``/``offset`` (Jamba).
Defaults for absent keys are the config classes' own (``tie_word_embeddings`` True for Gemma,
Falcon, OPT and GPT-2).
"""

from __future__ import annotations

from typing import Any

from kvplan.core.spec import ArchShape, Layer, LinearLayer, MoEShape

_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text", "falcon", "opt", "gpt2"}
_PLAIN_MLP = {"gpt2", "opt", "falcon", "gpt_bigcode", "gpt_neox", "bloom"}
_LAYERNORM_WITH_BIAS = {"gpt2", "opt", "falcon", "gpt_bigcode", "gpt_neox", "bloom"}


def _moe(cfg: Any, model_type: str, num_layers: int, hidden: int) -> tuple[MoEShape | None, tuple[bool, ...]]:
    get = cfg.get
    if model_type in ("deepseek_v2", "deepseek_v3") and get("n_routed_experts"):
        first = get("first_k_dense_replace", 0)
        freq = get("moe_layer_freq", 1)
        moe = MoEShape(num_experts=get("n_routed_experts"), experts_per_token=get("num_experts_per_tok"),
                       expert_intermediate=get("moe_intermediate_size"),
                       shared_intermediate=get("n_shared_experts", 0) * get("moe_intermediate_size"))
        return moe, tuple(i >= first and i % freq == 0 for i in range(num_layers))
    if model_type in ("qwen2_moe", "qwen3_moe", "qwen3_next") and get("num_experts"):
        step = get("decoder_sparse_step", 1)
        dense = set(get("mlp_only_layers", []) or [])
        shared = get("shared_expert_intermediate_size", 0)
        moe = MoEShape(num_experts=get("num_experts"), experts_per_token=get("num_experts_per_tok"),
                       expert_intermediate=get("moe_intermediate_size"), shared_intermediate=shared,
                       shared_gate=bool(shared))
        return moe, tuple(i not in dense and (i + 1) % step == 0 for i in range(num_layers))
    if model_type in ("mixtral", "gpt_oss") and get("num_local_experts"):
        moe = MoEShape(num_experts=get("num_local_experts"), experts_per_token=get("num_experts_per_tok"),
                       expert_intermediate=get("intermediate_size"), bias=model_type == "gpt_oss")
        return moe, (True,) * num_layers
    if model_type in ("llama4", "llama4_text") and get("num_local_experts"):
        step = get("interleave_moe_layer_step", 1)
        moe = MoEShape(num_experts=get("num_local_experts"), experts_per_token=get("num_experts_per_tok"),
                       expert_intermediate=get("intermediate_size"), shared_intermediate=get("intermediate_size"))
        return moe, tuple((i + 1) % step == 0 for i in range(num_layers))
    if model_type == "jamba" and get("num_experts", 1) > 1:
        period, offset = get("expert_layer_period", 2), get("expert_layer_offset", 1)
        moe = MoEShape(num_experts=get("num_experts"), experts_per_token=get("num_experts_per_tok"),
                       expert_intermediate=get("intermediate_size"))
        return moe, tuple(i % period == offset for i in range(num_layers))
    return None, ()


def _linear_params(cfg: Any, layer: LinearLayer, hidden: int) -> int:
    get = cfg.get
    if layer.family == "gated_delta_net":
        k_heads, v_heads = get("linear_num_key_heads"), get("linear_num_value_heads")
        key_dim, value_dim = k_heads * get("linear_key_head_dim"), v_heads * get("linear_value_head_dim")
        return (hidden * (2 * key_dim + 2 * value_dim)  # in_proj_qkvz
                + hidden * 2 * v_heads  # in_proj_ba
                + layer.conv_channels * layer.conv_kernel  # conv1d
                + 2 * v_heads  # dt_bias, A_log
                + get("linear_value_head_dim")  # gated RMSNorm
                + value_dim * hidden)  # out_proj
    # Mamba-1 (Jamba): in_proj, conv1d (+bias), x_proj, dt_proj (+bias), A_log, D, out_proj, dt/B/C norms
    inner = layer.conv_channels
    d_state = layer.state_elems // inner
    dt_rank = get("mamba_dt_rank") or -(-hidden // 16)
    return (hidden * 2 * inner + inner * layer.conv_kernel + inner + inner * (dt_rank + 2 * d_state)
            + dt_rank * inner + inner + inner * d_state + inner + inner * hidden + dt_rank + 2 * d_state)


def arch_from_config(cfg: Any, *, model_type: str, layers: tuple[Layer, ...], hidden: int) -> ArchShape | None:
    """None when the config lacks what a weight count needs (vocab_size)."""
    get = cfg.get
    vocab = get("vocab_size")
    if not isinstance(vocab, int):
        return None
    num_layers = len(layers)
    moe, moe_layers = _moe(cfg, model_type, num_layers, hidden)
    intermediate = get("intermediate_size") or get("ffn_dim") or get("n_inner") or 4 * hidden
    if model_type in ("llama4", "llama4_text"):
        intermediate = get("intermediate_size_mlp", intermediate)
    if model_type in ("deepseek_v2", "deepseek_v3", "qwen2_moe", "qwen3_moe", "qwen3_next"):
        intermediate = get("intermediate_size", intermediate)
    linear = next((layer for layer in layers if isinstance(layer, LinearLayer)), None)
    plain = model_type in _PLAIN_MLP
    bias_all = model_type == "gpt2" or (model_type == "opt" and get("enable_bias", True)) or (model_type == "falcon" and get("bias", False))
    attention_bias = bool(get("attention_bias", False))
    norms = 2
    if model_type in ("gemma2", "gemma3", "gemma3_text"):
        norms = 4  # pre/post attention and pre/post feed-forward norms
    elif model_type == "falcon" and not get("new_decoder_architecture", False):
        norms = 1  # one input_layernorm shared by the parallel attention and MLP
    return ArchShape(
        vocab_size=vocab,
        hidden_size=hidden,
        tie_word_embeddings=bool(get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT)),
        position_embeddings=(get("n_positions", 0) if model_type in ("gpt2", "gpt_bigcode")
                             else get("max_position_embeddings", 0) + 2 if model_type == "opt" else 0),
        qkv_bias=bias_all or attention_bias or model_type == "qwen2",
        o_bias=bias_all or attention_bias,
        gated_mlp=not plain,
        intermediate_size=intermediate,
        mlp_bias=bias_all or bool(get("mlp_bias", False)),
        moe=moe,
        moe_layers=moe_layers,
        norms_per_layer=norms,
        norm_bias=model_type in _LAYERNORM_WITH_BIAS,
        q_lora_rank=get("q_lora_rank") or 0,
        linear_layer_params=_linear_params(cfg, linear, hidden) if linear else 0,
    )
