"""Weight shapes of the softmax-attention families (kvplan.io.families.attention): Gemma 3n and Gemma 4 module by
module; OLMo 3, Seed-OSS, GLM-4.x MoE, MiniMax-M2 and Hunyuan as the generic count (kvplan.io.arch) with what
their modeling files add. Read from transformers v5.23 (``models/<type>/modeling_<type>.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kvplan.core.spec import ArchShape, AttentionLayer, Layer, LayerKind, MoEShape, NoCacheLayer
from kvplan.errors import ConfigError
from kvplan.io.arch import arch_from_config
from kvplan.io.families.attention import _GEMMA3N, _GEMMA4, _PLE_DEFAULTS


def _intermediates(cfg: Any, num_layers: int) -> tuple[int, ...]:
    """Gemma 3n's ``intermediate_size``: one width for all layers or a list with one per layer."""
    from kvplan.io.config_reader import _MAX_WIDTH

    value = cfg.get("intermediate_size")
    if isinstance(value, list):
        widths = cfg.int_list("intermediate_size", minimum=1, maximum=_MAX_WIDTH)
        if len(widths) != num_layers:
            raise ConfigError(f"{cfg.origin}: intermediate_size lists {len(widths)} widths for {num_layers} layers; "
                              "give one per layer or a single number")
        return tuple(widths)
    return (cfg.int("intermediate_size"),) * num_layers


@dataclass(frozen=True, kw_only=True)
class _GemmaBlocks:
    """What Gemma 3n's AltUp/LAuReL or Gemma 4's experts add to the decoder layers."""

    per_layer: list[int]  # parameters counted whole in each layer
    extra_params: int = 0
    moe: MoEShape | None = None


def _gemma_widths(cfg: Any, gemma3n: bool, layers: tuple[Layer, ...]) -> tuple[int, ...]:
    widths = _intermediates(cfg, len(layers))
    if not gemma3n and cfg.bool("use_double_wide_mlp"):
        # Gemma4TextMLP: KV-shared layers get twice the intermediate width
        widths = tuple(w * 2 if isinstance(layers[i], NoCacheLayer) else w for i, w in enumerate(widths))
    return widths


def _gemma_head_norms(layers: tuple[Layer, ...]) -> list[int]:
    """q_norm on every layer; k_norm where the layer computes K (v_norm has no scale)."""
    head_norms = []
    for layer in layers:
        shape = layers[layer.reads_layer] if isinstance(layer, NoCacheLayer) and layer.reads_layer >= 0 else layer
        dim = shape.k_head_dim if isinstance(shape, AttentionLayer) else 0
        head_norms.append(dim * (1 if isinstance(layer, NoCacheLayer) else 2))
    return head_norms


def _gemma_blocks(cfg: Any, gemma3n: bool, hidden: int, per_layer: list[int]) -> _GemmaBlocks:
    if gemma3n:
        alt = cfg.int("altup_num_inputs", default=4)  # Gemma3nTextConfig.altup_num_inputs
        rank = cfg.int("laurel_rank", default=64)  # Gemma3nTextConfig.laurel_rank
        # AltUp (correct_output_scale, correction/prediction coefs, modality_router, router_norm) and
        # LAuReL (linear_left, linear_right, post_laurel_norm), per layer
        per_layer = [p + hidden + alt * alt + alt ** 3 + hidden * alt + hidden + 2 * hidden * rank + hidden
                     for p in per_layer]
        # altup_projections and altup_unembed_projections
        return _GemmaBlocks(per_layer=per_layer, extra_params=2 * (alt - 1) * hidden * hidden)
    if cfg.bool("enable_moe_block"):
        experts = cfg.int("num_experts")
        per_token = cfg.int("top_k_experts")
        if per_token > experts:
            raise ConfigError(f"{cfg.origin}: top_k_experts ({per_token}) must be <= num_experts ({experts})")
        moe = MoEShape(num_experts=experts, experts_per_token=per_token,
                       expert_intermediate=cfg.int("moe_intermediate_size"))
        # Gemma4TextRouter's scale and per_expert_scale, and the three extra feed-forward norms
        return _GemmaBlocks(per_layer=[p + hidden + experts + 3 * hidden for p in per_layer], moe=moe)
    return _GemmaBlocks(per_layer=per_layer)


def _gemma_arch(cfg: Any, model_type: str, layers: tuple[Layer, ...], hidden: int) -> ArchShape:
    """Gemma 3n / Gemma 4 text decoder, module by module (``Gemma4TextDecoderLayer``,
    ``Gemma3nTextDecoderLayer``, ``Gemma*TextModel``)."""
    gemma3n = model_type in _GEMMA3N
    n = len(layers)
    family = "gemma3n" if gemma3n else "gemma4"
    ple_dim = cfg.int("hidden_size_per_layer_input", default=_PLE_DEFAULTS[family][0], minimum=0)
    ple_vocab = cfg.int("vocab_size_per_layer_input", default=_PLE_DEFAULTS[family][1])
    widths = _gemma_widths(cfg, gemma3n, layers)
    # per_layer_input_gate, per_layer_projection
    blocks = _gemma_blocks(cfg, gemma3n, hidden, [norms + 2 * hidden * ple_dim for norms in _gemma_head_norms(layers)])
    moe = blocks.moe
    embedding_extra = 0
    if ple_dim:
        # embed_tokens_per_layer (all layers packed), per_layer_model_projection, per_layer_projection_norm
        embedding_extra = ple_vocab * n * ple_dim + hidden * n * ple_dim + ple_dim
    return ArchShape(
        vocab_size=cfg.int("vocab_size"),
        hidden_size=hidden,
        tie_word_embeddings=cfg.bool("tie_word_embeddings", True),  # Gemma*TextConfig default
        qkv_bias=cfg.bool("attention_bias"),
        o_bias=cfg.bool("attention_bias"),
        intermediate_size=widths[0],
        layer_intermediate=widths,
        moe=moe,
        moe_layers=(True,) * n if moe else (),
        dense_with_moe=moe is not None,  # Gemma4TextDecoderLayer: the dense MLP and the experts both run
        norms_per_layer=4 + (1 if ple_dim else 0),  # pre/post attention and feed-forward (+ per-layer input)
        k_eq_v_layers=tuple(cfg.bool("attention_k_eq_v") and not gemma3n and isinstance(layer, AttentionLayer)
                            and layer.kind is LayerKind.FULL for layer in layers),
        layer_whole_params=tuple(blocks.per_layer),
        extra_params=blocks.extra_params,
        embedding_extra_params=embedding_extra,
    )


def _qk_norms(cfg: Any, layer: Layer, num_heads: int, *, whole_projection: bool) -> int:
    """Parameters of a layer's q/k RMSNorms: per head (one head_dim each) or over the whole projection."""
    if not isinstance(layer, AttentionLayer):
        return 0
    if whole_projection:
        return (num_heads + layer.num_kv_heads) * layer.k_head_dim
    return 2 * layer.k_head_dim


def arch_shape(cfg: Any, model_type: str, *, layers: tuple[Layer, ...], hidden: int) -> ArchShape | None:
    """The weight shape of a model of these families, None where the config gives no vocab_size."""
    if not cfg.has("vocab_size"):
        return None
    if model_type in _GEMMA4 or model_type in _GEMMA3N:
        return _gemma_arch(cfg, model_type, layers, hidden)
    num_heads = cfg.int("num_attention_heads")
    base = arch_from_config(cfg, model_type=model_type, layers=layers, hidden=hidden)
    assert base is not None
    if model_type == "olmo3":
        # Olmo3Attention: q_norm/k_norm over the whole projection; post-attention and post-feed-forward norms
        return dataclasses.replace(base, layer_whole_params=tuple(
            _qk_norms(cfg, layer, num_heads, whole_projection=True) for layer in layers))
    if model_type == "seed_oss":
        # SeedOssAttention: q/k/v biases from attention_bias, the o_proj bias from attention_out_bias
        return dataclasses.replace(base, qkv_bias=cfg.bool("attention_bias", True),
                                   o_bias=cfg.bool("attention_out_bias"))
    if model_type == "glm4_moe":
        return _glm4_moe_arch(cfg, base, layers, num_heads)
    if model_type == "minimax_m2":
        return _minimax_m2_arch(cfg, base, layers, num_heads)
    return _hunyuan_arch(cfg, model_type, base, layers, num_heads)


def _glm4_moe_arch(cfg: Any, base: ArchShape, layers: tuple[Layer, ...], num_heads: int) -> ArchShape:
    experts = cfg.int("n_routed_experts")
    width = cfg.int("moe_intermediate_size")
    first = cfg.int("first_k_dense_replace", default=1, minimum=0)  # Glm4MoeConfig default
    moe = MoEShape(num_experts=experts, experts_per_token=_top_k(cfg, "num_experts_per_tok", experts),
                   expert_intermediate=width,
                   shared_intermediate=cfg.int("n_shared_experts", default=1, minimum=0) * width)
    qk = cfg.bool("use_qk_norm")
    return dataclasses.replace(
        base, moe=moe, moe_layers=tuple(i >= first for i in range(len(layers))), o_bias=False,  # o_proj has no bias
        # per-head q/k norms (use_qk_norm) and the router's e_score_correction_bias on MoE layers
        layer_whole_params=tuple((_qk_norms(cfg, layer, num_heads, whole_projection=False) if qk else 0)
                                 + (experts if i >= first else 0) for i, layer in enumerate(layers)))


def _minimax_m2_arch(cfg: Any, base: ArchShape, layers: tuple[Layer, ...], num_heads: int) -> ArchShape:
    experts = cfg.int("num_local_experts")
    moe = MoEShape(num_experts=experts, experts_per_token=_top_k(cfg, "num_experts_per_tok", experts),
                   expert_intermediate=cfg.int("intermediate_size"),
                   shared_intermediate=cfg.int("shared_intermediate_size", default=0, minimum=0))
    qk = cfg.bool("use_qk_norm", True)
    return dataclasses.replace(
        base, moe=moe, moe_layers=(True,) * len(layers),
        # q/k norms over the whole projection (qk_norm_type per_layer) and e_score_correction_bias
        layer_whole_params=tuple((_qk_norms(cfg, layer, num_heads, whole_projection=True) if qk else 0)
                                 + experts for layer in layers))


def _hunyuan_arch(cfg: Any, model_type: str, base: ArchShape, layers: tuple[Layer, ...], num_heads: int) -> ArchShape:
    # Hunyuan: query_layernorm/key_layernorm per head on every layer
    norms = tuple(_qk_norms(cfg, layer, num_heads, whole_projection=False) for layer in layers)
    if model_type == "hunyuan_v1_dense":
        return dataclasses.replace(base, layer_whole_params=norms)
    experts = _per_layer_int(cfg, "num_experts", 0)
    # HunYuanMoEV1Moe (every layer): experts and one shared MLP, all intermediate_size wide (transformers
    # reads neither moe_intermediate_size nor num_shared_expert)
    width = base.intermediate_size
    moe = MoEShape(num_experts=experts, experts_per_token=_top_k(cfg, "moe_topk", experts, per_layer=True),
                   expert_intermediate=width, shared_intermediate=width)
    return dataclasses.replace(base, moe=moe, moe_layers=(True,) * len(layers), layer_whole_params=norms)


def _per_layer_int(cfg: Any, key: str, index: int) -> int:
    """A key that may be one number or a list with one per layer (Hunyuan's moe_topk, num_experts)."""
    value = cfg.get(key)
    if isinstance(value, list):
        values = cfg.int_list(key, minimum=1, maximum=1 << 16)
        if not values:
            raise ConfigError(f"{cfg.origin}: {key} is an empty list")
        if len(set(values)) > 1:
            raise ConfigError(f"{cfg.origin}: {key} differs between layers ({sorted(set(values))}); kvplan counts "
                              "weights for one value")
        return values[index]
    return cfg.int(key)


def _top_k(cfg: Any, key: str, experts: int, *, per_layer: bool = False) -> int:
    per_token = _per_layer_int(cfg, key, 0) if per_layer else cfg.int(key)
    if per_token > experts:
        raise ConfigError(f"{cfg.origin}: {key} ({per_token}) must be <= the {experts} experts")
    return per_token
