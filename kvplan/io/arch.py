"""The architecture shape for weight counts, read from config.json keys.

Which keys mean what follows transformers v5.23's modeling files (``models/<type>/modeling_<type>.py``):
plain (up/down) MLPs and LayerNorm with bias for GPT-2, OPT, Falcon and Phi (-1/-2); gated MLPs and RMSNorm
elsewhere; Qwen2's q/k/v bias; gpt-oss's attention and expert biases; MoE placement from
``first_k_dense_replace``/``moe_layer_freq`` (DeepSeek), ``decoder_sparse_step``/``mlp_only_layers``
(Qwen MoE), ``interleave_moe_layer_step`` (Llama 4), ``expert_layer_period``/``offset`` (Jamba).
Defaults for absent keys are the config classes' own (``tie_word_embeddings`` True for Gemma,
Falcon, OPT and GPT-2).
"""

from __future__ import annotations

from typing import Any

from kvplan.core.spec import ArchShape, Layer, LinearLayer, MLALayer, MoEShape
from kvplan.errors import ConfigError

_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text", "falcon", "opt", "gpt2"}
_PLAIN_MLP = {"gpt2", "opt", "falcon", "gpt_bigcode", "gpt_neox", "bloom", "phi"}
_LAYERNORM_WITH_BIAS = {"gpt2", "opt", "falcon", "gpt_bigcode", "gpt_neox", "bloom", "phi"}


def _moe_shape(cfg: Any, experts_key: str, expert_intermediate: int, **extra: Any) -> MoEShape:
    num_experts = cfg.int(experts_key)
    per_token = cfg.int("num_experts_per_tok")
    if per_token > num_experts:
        raise ConfigError(f"{cfg.origin}: num_experts_per_tok ({per_token}) must be <= {experts_key} ({num_experts})")
    return MoEShape(num_experts=num_experts, experts_per_token=per_token, expert_intermediate=expert_intermediate,
                    **extra)


def _moe(cfg: Any, model_type: str, num_layers: int, hidden: int) -> tuple[MoEShape | None, tuple[bool, ...]]:
    """Every read is typed and bounded by ``_Cfg`` (periods >= 1: a 0 period would divide by zero)."""
    if model_type in ("deepseek_v2", "deepseek_v3") and cfg.int("n_routed_experts", default=0, minimum=0):
        first = cfg.int("first_k_dense_replace", default=0, minimum=0)
        freq = cfg.int("moe_layer_freq", default=1)
        expert = cfg.int("moe_intermediate_size")
        moe = _moe_shape(cfg, "n_routed_experts", expert,
                         shared_intermediate=cfg.int("n_shared_experts", default=0, minimum=0) * expert)
        return moe, tuple(i >= first and i % freq == 0 for i in range(num_layers))
    if model_type in ("qwen2_moe", "qwen3_moe", "qwen3_next") and cfg.int("num_experts", default=0, minimum=0):
        step = cfg.int("decoder_sparse_step", default=1)
        dense = set(cfg.int_list("mlp_only_layers"))
        shared = cfg.int("shared_expert_intermediate_size", default=0, minimum=0)
        moe = _moe_shape(cfg, "num_experts", cfg.int("moe_intermediate_size"), shared_intermediate=shared,
                         shared_gate=bool(shared))
        return moe, tuple(i not in dense and (i + 1) % step == 0 for i in range(num_layers))
    if model_type in ("mixtral", "gpt_oss") and cfg.int("num_local_experts", default=0, minimum=0):
        moe = _moe_shape(cfg, "num_local_experts", cfg.int("intermediate_size"), bias=model_type == "gpt_oss")
        return moe, (True,) * num_layers
    if model_type in ("llama4", "llama4_text") and cfg.int("num_local_experts", default=0, minimum=0):
        step = cfg.int("interleave_moe_layer_step", default=1)
        expert = cfg.int("intermediate_size")
        moe = _moe_shape(cfg, "num_local_experts", expert, shared_intermediate=expert)
        return moe, tuple((i + 1) % step == 0 for i in range(num_layers))
    if model_type == "jamba" and cfg.int("num_experts", default=1) > 1:
        period = cfg.int("expert_layer_period", default=2)
        offset = cfg.int("expert_layer_offset", default=1, minimum=0)
        moe = _moe_shape(cfg, "num_experts", cfg.int("intermediate_size"))
        return moe, tuple(i % period == offset for i in range(num_layers))
    return None, ()


def _linear_params(cfg: Any, layer: LinearLayer, hidden: int) -> int:
    if layer.family == "gated_delta_net":
        k_heads, v_heads = cfg.int("linear_num_key_heads"), cfg.int("linear_num_value_heads")
        v_dim = cfg.int("linear_value_head_dim")
        key_dim, value_dim = k_heads * cfg.int("linear_key_head_dim"), v_heads * v_dim
        return (hidden * (2 * key_dim + 2 * value_dim)  # in_proj_qkvz
                + hidden * 2 * v_heads  # in_proj_ba
                + layer.conv_channels * layer.conv_kernel  # conv1d
                + 2 * v_heads  # dt_bias, A_log
                + v_dim  # gated RMSNorm
                + value_dim * hidden)  # out_proj
    # Mamba-1 (Jamba): in_proj, conv1d (+bias), x_proj, dt_proj (+bias), A_log, D, out_proj, dt/B/C norms
    inner = layer.conv_channels
    d_state = layer.state_elems // inner
    # "auto" (Mamba's own configs) and absent both mean ceil(hidden / 16)
    dt_rank = -(-hidden // 16) if cfg.get("mamba_dt_rank") == "auto" else cfg.int("mamba_dt_rank", default=-(-hidden // 16))
    return (hidden * 2 * inner + inner * layer.conv_kernel + inner + inner * (dt_rank + 2 * d_state)
            + dt_rank * inner + inner + inner * d_state + inner + inner * hidden + dt_rank + 2 * d_state)


def arch_from_config(cfg: Any, *, model_type: str, layers: tuple[Layer, ...], hidden: int) -> ArchShape | None:
    """None when the config lacks what a weight count needs (vocab_size)."""
    if not cfg.has("vocab_size"):
        return None
    vocab = cfg.int("vocab_size")
    num_layers = len(layers)
    moe, moe_layers = _moe(cfg, model_type, num_layers, hidden)
    intermediate = cfg.int("intermediate_size", "ffn_dim", "n_inner", default=4 * hidden)
    if model_type in ("llama4", "llama4_text"):
        intermediate = cfg.int("intermediate_size_mlp", default=intermediate)
    linear = next((layer for layer in layers if isinstance(layer, LinearLayer)), None)
    plain = model_type in _PLAIN_MLP
    # phi (modeling_phi.py): q/k/v/dense and fc1/fc2 all carry a bias (the LM head's 51,200 are not counted)
    bias_all = (model_type in ("gpt2", "phi") or (model_type == "opt" and cfg.bool("enable_bias", True))
                or (model_type == "falcon" and cfg.bool("bias", False)))
    attention_bias = cfg.bool("attention_bias", False)
    norms = 2
    if model_type in ("gemma2", "gemma3", "gemma3_text"):
        norms = 4  # pre/post attention and pre/post feed-forward norms
    elif model_type == "phi" or (model_type == "falcon" and not cfg.bool("new_decoder_architecture", False)):
        norms = 1  # one input_layernorm shared by the parallel attention and MLP
    q_lora = cfg.int("q_lora_rank", default=0, minimum=0)
    return ArchShape(
        vocab_size=vocab,
        hidden_size=hidden,
        tie_word_embeddings=cfg.bool("tie_word_embeddings", model_type in _TIED_BY_DEFAULT),
        position_embeddings=(cfg.int("n_positions", default=0, minimum=0) if model_type in ("gpt2", "gpt_bigcode")
                             else cfg.int("max_position_embeddings", default=0, minimum=0) + 2 if model_type == "opt"
                             else 0),
        qkv_bias=bias_all or attention_bias or model_type == "qwen2",
        o_bias=bias_all or attention_bias,
        gated_mlp=not plain,
        intermediate_size=intermediate,
        mlp_bias=bias_all or cfg.bool("mlp_bias", False),
        moe=moe,
        moe_layers=moe_layers,
        norms_per_layer=norms,
        norm_bias=model_type in _LAYERNORM_WITH_BIAS,
        q_lora_rank=q_lora,
        linear_layer_params=_linear_params(cfg, linear, hidden) if linear else 0,
        # an MLA layer's q_a_proj and kv_a_proj_with_mqa: linears every rank holds whole, quantized as the
        # checkpoint's attention is (vLLM models/deepseek_v2.py: ReplicatedLinear / the fused qkv_a projection with
        # quant_config; SGLang's fused_qkv_a_proj_with_mqa alike); their norms stay in the model dtype
        layer_whole_quantized=tuple(hidden * (x.kv_lora_rank + x.qk_rope_head_dim) + hidden * q_lora
                                    if isinstance(x, MLALayer) else 0 for x in layers),
    )
