"""Weight shapes of the hybrid families (kvplan.io.families.hybrid): each family's ArchShape from its config.

Parameter counts follow each transformers v5.23 modeling file's module shapes (a test builds every bundled
config on the meta device and compares).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvplan.core.spec import ArchShape, AttentionLayer, Layer, LinearLayer, MoEShape
from kvplan.errors import ConfigError
from kvplan.io.config_reader import _Cfg
from kvplan.io.families.hybrid import _MINIMAX, _nemotron_types


def _mamba2_params(layer: LinearLayer, hidden: int, *, conv_bias: bool, proj_bias: bool, norm: bool) -> int:
    """in_proj (z, x, B, C, dt), depthwise conv (+ bias), dt_bias / A_log / D, gated norm, out_proj."""
    heads, d_inner = layer.num_heads, layer.state_shape[0] * layer.state_shape[1]
    in_out = hidden * (d_inner + layer.conv_channels + heads) + d_inner * hidden
    bias = (d_inner + layer.conv_channels + heads + hidden) if proj_bias else 0
    conv = layer.conv_channels * layer.conv_kernel + (layer.conv_channels if conv_bias else 0)
    return in_out + bias + conv + 3 * heads + (d_inner if norm else 0)


def _gdn_params(layer: LinearLayer, hidden: int) -> int:
    """Qwen3.5 gated delta net: in_proj_qkv, in_proj_z, in_proj_a/b, conv1d, dt_bias, A_log, norm, out_proj."""
    v_heads, _, v_dim = layer.state_shape
    value_dim = v_heads * v_dim
    return (hidden * (layer.conv_channels + value_dim + 2 * v_heads) + layer.conv_channels * layer.conv_kernel
            + 2 * v_heads + v_dim + value_dim * hidden)


def _kda_params(layer: LinearLayer, hidden: int) -> int:
    """Kimi Delta Attention: q/k/v projections and their short convs, the low-rank forget gate (f_a, f_b,
    dt_bias, A_log) and output gate (g_a, g_b), the beta projection, the output norm and projection."""
    heads, head_dim, _ = layer.state_shape
    width = heads * head_dim
    return (3 * hidden * width + layer.conv_channels * layer.conv_kernel + 2 * (hidden * head_dim + head_dim * width)
            + width + heads + hidden * heads + head_dim + width * hidden)


def _lightning_params(layer: LinearLayer, hidden: int) -> int:
    """MiniMax lightning attention: qkv_proj, output_gate, out_proj, the RMSNorm over heads x head_dim."""
    width = layer.num_heads * layer.state_shape[1]
    return hidden * 3 * width + hidden * width + width * hidden + width


def _short_conv_params(layer: LinearLayer, hidden: int, conv_bias: bool) -> int:
    """LFM2 short conv: in_proj (B, C, x), depthwise conv, out_proj."""
    return hidden * 3 * hidden + hidden * layer.conv_kernel + (hidden if conv_bias else 0) + hidden * hidden


def _lfm2_ff(cfg: _Cfg) -> int:
    """transformers Lfm2MLP: int(2/3 x ff), times the multiplier, rounded up to block_multiple_of."""
    width = cfg.int("intermediate_size", "block_ff_dim", default=12288)
    if cfg.bool("block_auto_adjust_ff_dim", True):
        width = int(2 * width / 3)
        multiplier = cfg.get("block_ffn_dim_multiplier", 1.0)
        if not isinstance(multiplier, (int, float)) or isinstance(multiplier, bool) or not 0 < multiplier <= 64:
            raise ConfigError(f"{cfg.origin}: block_ffn_dim_multiplier must be a number in (0, 64]")
        width = int(multiplier * width)
        step = cfg.int("block_multiple_of", default=256)
        width = step * ((width + step - 1) // step)
    return width


@dataclass(frozen=True, kw_only=True)
class _Model:
    """What each family's weight shape is read from."""

    cfg: _Cfg
    layers: tuple[Layer, ...]
    hidden: int
    linear: LinearLayer | None  # the first linear-attention / state-space layer
    common: dict[str, Any]  # the ArchShape fields every family reads alike

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def _kimi_arch(m: _Model, model_type: str) -> ArchShape:
    cfg = m.cfg
    first = cfg.int("first_k_dense_replace", default=1, minimum=0)
    freq = cfg.int("moe_layer_freq", default=1)
    expert = cfg.int("moe_intermediate_size")
    moe = MoEShape(num_experts=cfg.int("num_experts", "num_local_experts", default=256),
                   experts_per_token=cfg.int("num_experts_per_token", "num_experts_per_tok", default=8),
                   expert_intermediate=expert,
                   shared_intermediate=cfg.int("num_shared_experts", "n_shared_experts", default=1, minimum=0) * expert)
    return ArchShape(**m.common, intermediate_size=cfg.int("intermediate_size"), moe=moe,
                     moe_layers=tuple(i >= first and i % freq == 0 for i in range(m.num_layers)),
                     linear_layer_params=_kda_params(m.linear, m.hidden) if m.linear else 0)


def _minimax_arch(m: _Model, model_type: str) -> ArchShape:
    cfg = m.cfg
    moe = MoEShape(num_experts=cfg.int("num_local_experts"), experts_per_token=cfg.int("num_experts_per_tok"),
                   expert_intermediate=cfg.int("intermediate_size"))
    return ArchShape(**m.common, intermediate_size=cfg.int("intermediate_size"), moe=moe,
                     moe_layers=(True,) * m.num_layers,
                     linear_layer_params=_lightning_params(m.linear, m.hidden) if m.linear else 0)


def _nemotron_arch(m: _Model, model_type: str) -> ArchShape:
    cfg = m.cfg
    chars = _nemotron_types(cfg, m.num_layers, [])
    moe = None
    if "E" in chars:
        moe = MoEShape(num_experts=cfg.int("n_routed_experts"), experts_per_token=cfg.int("num_experts_per_tok"),
                       expert_intermediate=cfg.int("moe_intermediate_size"),
                       shared_intermediate=cfg.int("n_shared_experts", default=1, minimum=0)
                       * cfg.int("moe_shared_expert_intermediate_size"), gated=False)
    bias = cfg.bool("use_bias", False)
    return ArchShape(**m.common, gated_mlp=False, intermediate_size=cfg.int("intermediate_size"),
                     mlp_bias=cfg.bool("mlp_bias", False), moe=moe, moe_layers=tuple(c == "E" for c in chars),
                     mlp_layers=tuple(c == "-" for c in chars), norms_per_layer=1,
                     linear_layer_params=_mamba2_params(m.linear, m.hidden, conv_bias=cfg.bool("use_conv_bias", True),
                                                        proj_bias=bias, norm=True) if m.linear else 0)


def _granite_arch(m: _Model, model_type: str) -> ArchShape:
    """Granite 4.0-H (granitemoehybrid) and Bamba."""
    cfg = m.cfg
    mamba = dict(conv_bias=cfg.bool("mamba_conv_bias", True), proj_bias=cfg.bool("mamba_proj_bias", False),
                 norm=True)
    experts = cfg.int("num_local_experts", default=0, minimum=0)
    moe = None
    if experts:
        moe = MoEShape(num_experts=experts, experts_per_token=cfg.int("num_experts_per_tok"),
                       expert_intermediate=cfg.int("intermediate_size"),
                       shared_intermediate=cfg.int("shared_intermediate_size", default=0, minimum=0))
    width = cfg.int("shared_intermediate_size", default=0, minimum=0) if model_type == "granitemoehybrid" \
        else cfg.int("intermediate_size")
    return ArchShape(**m.common, intermediate_size=cfg.int("intermediate_size") if model_type == "bamba" else width,
                     moe=moe, moe_layers=(True,) * m.num_layers if moe else (),
                     linear_layer_params=_mamba2_params(m.linear, m.hidden, **mamba) if m.linear else 0)


def _falcon_h1_arch(m: _Model, model_type: str) -> ArchShape:
    cfg = m.cfg
    return ArchShape(**m.common, intermediate_size=cfg.int("intermediate_size"), mlp_bias=cfg.bool("mlp_bias", False),
                     linear_layer_params=_mamba2_params(
                         m.linear, m.hidden, conv_bias=cfg.bool("mamba_conv_bias", True),
                         proj_bias=cfg.bool("mamba_proj_bias", False),
                         norm=cfg.bool("mamba_rms_norm", False)) if m.linear else 0)


def _lfm2_arch(m: _Model, model_type: str) -> ArchShape:
    cfg = m.cfg
    tie = cfg.bool("tie_word_embeddings", cfg.bool("tie_embedding", True))
    return ArchShape(**{**m.common, "tie_word_embeddings": tie}, intermediate_size=_lfm2_ff(cfg),
                     linear_layer_params=_short_conv_params(m.linear, m.hidden, cfg.bool("conv_bias", False))
                     if m.linear else 0)


def _qwen35_arch(m: _Model, model_type: str) -> ArchShape:
    """Qwen3.5 (dense and MoE): the full-attention q_proj also produces the output gate (attn_output_gate), so a
    query head is 2 x head_dim wide; the MoE's shared expert has Qwen's sigmoid gate."""
    cfg = m.cfg
    head_dim = next((x.k_head_dim for x in m.layers if isinstance(x, AttentionLayer)), 0)
    gate = cfg.bool("attn_output_gate", True)
    moe = None
    if model_type in ("qwen3_5_moe", "qwen3_5_moe_text"):
        shared = cfg.int("shared_expert_intermediate_size", default=0, minimum=0)
        moe = MoEShape(num_experts=cfg.int("num_experts"), experts_per_token=cfg.int("num_experts_per_tok"),
                       expert_intermediate=cfg.int("moe_intermediate_size"), shared_intermediate=shared,
                       shared_gate=bool(shared))
    dense = set(cfg.int_list("mlp_only_layers"))
    return ArchShape(**m.common, q_head_dim=2 * head_dim if gate else 0,
                     intermediate_size=cfg.int("intermediate_size", default=0, minimum=0), moe=moe,
                     moe_layers=tuple(i not in dense for i in range(m.num_layers)) if moe else (),
                     linear_layer_params=_gdn_params(m.linear, m.hidden) if m.linear else 0)


_ARCH_READERS: dict[str, Callable[[_Model, str], ArchShape]] = {
    "kimi_linear": _kimi_arch,
    **dict.fromkeys(_MINIMAX, _minimax_arch),
    "nemotron_h": _nemotron_arch,
    "granitemoehybrid": _granite_arch,
    "bamba": _granite_arch,
    "falcon_h1": _falcon_h1_arch,
    "lfm2": _lfm2_arch,
}  # the rest: Qwen3.5


def arch_shape(cfg: _Cfg, model_type: str, *, layers: tuple[Layer, ...], hidden: int) -> ArchShape | None:
    """The weight shape of a hybrid model, None where the config gives no vocab_size."""
    if not cfg.has("vocab_size"):
        return None
    linear = next((x for x in layers if isinstance(x, LinearLayer)), None)
    vocab = cfg.int("vocab_size")
    common: dict[str, Any] = dict(vocab_size=vocab, hidden_size=hidden,
                                  tie_word_embeddings=cfg.bool("tie_word_embeddings", False),
                                  qkv_bias=cfg.bool("attention_bias", False), o_bias=cfg.bool("attention_bias", False))
    model = _Model(cfg=cfg, layers=layers, hidden=hidden, linear=linear, common=common)
    return _ARCH_READERS.get(model_type, _qwen35_arch)(model, model_type)
