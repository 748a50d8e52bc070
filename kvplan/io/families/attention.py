"""Softmax-attention families the generic reader cannot describe: per-layer head shapes, cross-layer KV
sharing, and MoE layouts its weight count does not know.

Every rule below is read from transformers v5.23 (``models/<type>/configuration_<type>.py`` and
``modeling_<type>.py``); vLLM 0.33.0 builds the same layers (``vllm/model_executor/models/gemma4.py``,
``gemma3n.py``, ``glm4_moe.py``, ``minimax_m2.py``; OLMo 3, Seed-OSS and Hunyuan run through its
Transformers backend, ``models/transformers/base.py``).

- Gemma 4 (``gemma4``/``gemma4_text``): 5 sliding layers per full one unless ``layer_types`` says
  otherwise, and the last layer is always full (``Gemma4TextConfig.__post_init__`` forces it). Full
  layers have their own shape: ``head_dim = global_head_dim`` (512 when absent), and
  ``num_global_key_value_heads`` KV heads when ``attention_k_eq_v`` (else ``num_key_value_heads``). With
  ``attention_k_eq_v`` a full layer's V is its K projection's output (no ``v_proj``), but both K and V
  are cached (``Gemma4TextAttention.forward``; vLLM loads K into both slots). A ``per_layer_config`` in
  the file (how transformers 5.x saves heterogeneous configs) replaces both rules.
- Gemma 3n (``gemma3n``/``gemma3n_text``): every 5th layer full, the rest sliding; one head shape;
  ``intermediate_size`` may be a per-layer list.
- Cross-layer KV sharing (Gemma 3n, Gemma 4 ``num_kv_shared_layers``): the last N layers compute no K/V;
  each attends over the cache of the last earlier layer of its own type
  (``Gemma3nTextConfig.kv_sharing_modes``, "reuse"). transformers gives them a ``DummyLayer`` (no
  storage); vLLM gives them no ``KVCacheSpec`` (``kv_sharing_target_layer_name``). They become
  ``NoCacheLayer(reads_layer=i)``.
- OLMo 3: 3 sliding layers per full one when ``layer_types`` is absent (``Olmo3Config``).
- GLM-4.5/4.6/4.7 (``glm4_moe``), MiniMax-M2 (``minimax_m2``), Hunyuan (``hunyuan_v1_moe``/``_dense``),
  Seed-OSS (``seed_oss``): plain GQA caches; only their weights need this module.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvplan.core.spec import ArchShape, AttentionLayer, Layer, LayerKind, MoEShape, NoCacheLayer
from kvplan.errors import ConfigError
from kvplan.io.arch import arch_from_config

_GEMMA4 = ("gemma4", "gemma4_text")
_GEMMA3N = ("gemma3n", "gemma3n_text")
MODEL_TYPES: tuple[str, ...] = (*_GEMMA4, *_GEMMA3N, "olmo3", "seed_oss", "hunyuan_v1_moe", "hunyuan_v1_dense",
                                "hunyuan", "minimax_m2", "glm4_moe")

# Config-class defaults for keys the files may omit (transformers v5.23):
_GEMMA4_GLOBAL_HEAD_DIM = 512  # Gemma4TextConfig.__post_init__: kwargs.pop("global_head_dim", 512)
_GEMMA4_PATTERN = 6  # Gemma4TextConfig: "sliding_window_pattern = 6  # by default 5:1"
_GEMMA3N_PATTERN = 5  # Gemma3nTextConfig: full_attention when (i + 1) % 5 == 0
_OLMO3_PATTERN = 4  # Olmo3Config: sliding_attention unless (i + 1) % 4 == 0
_OLMO3_WINDOW = 4096  # Olmo3Config.sliding_window
_PLE_DEFAULTS = {  # hidden_size_per_layer_input, vocab_size_per_layer_input
    "gemma4": (256, 262_144),  # Gemma4TextConfig
    "gemma3n": (256, 262_144),  # Gemma3nTextConfig
}


def _cfg_class() -> Any:
    from kvplan.io.config_reader import _Cfg

    return _Cfg


def _head_dim(cfg: Any, hidden: int, num_heads: int) -> int:
    if cfg.has("head_dim") or cfg.has("attention_head_dim"):
        return cfg.int("head_dim", "attention_head_dim")
    if hidden % num_heads:
        raise ConfigError(f"{cfg.origin}: hidden_size {hidden} is not a multiple of num_attention_heads {num_heads}; "
                          "add head_dim to the config")
    return hidden // num_heads


def _kinds(cfg: Any, model_type: str, num_layers: int, pattern: int, notes: list[str]) -> list[LayerKind]:
    """``layer_types`` when present (checked by the generic reader), else the class's repeating pattern:
    sliding layers with every ``pattern``-th layer full."""
    from kvplan.io.hf_config import _layer_kinds

    if cfg.has("layer_types"):
        kinds = _layer_kinds(cfg, model_type, num_layers, notes)
        bad = next((k for k in kinds if k not in (LayerKind.SLIDING, LayerKind.FULL)), None)
        if bad is not None:
            raise ConfigError(f"{cfg.origin}: {model_type} layers are sliding_attention or full_attention "
                              f"(layer_types has a {bad.value} layer)")
        return kinds
    kinds = [LayerKind.SLIDING if (i + 1) % pattern else LayerKind.FULL for i in range(num_layers)]
    notes.append(f"no layer_types: transformers' {model_type} default, every {pattern}th layer full, "
                 f"the others sliding ({kinds.count(LayerKind.FULL)} full of {num_layers})")
    return kinds


def _window(cfg: Any, model_type: str, notes: list[str]) -> int:
    window = cfg.int("sliding_window", default=_OLMO3_WINDOW if model_type == "olmo3" else 1)
    if model_type == "olmo3" and not cfg.has("sliding_window"):
        notes.append(f"no sliding_window: Olmo3Config's default {_OLMO3_WINDOW}")
    if cfg.str("use_bidirectional_attention") == "all":
        # Gemma4TextConfig.__post_init__: bidirectional attention halves the window (exclusive bounds)
        notes.append(f"use_bidirectional_attention all: sliding window {window} becomes {window // 2 + 1}")
        window = window // 2 + 1
    return window


def _kv_sharing(cfg: Any, kinds: list[LayerKind], notes: list[str]) -> dict[int, int]:
    """Layer -> the earlier layer whose cache it reads (``kv_sharing_modes`` "reuse")."""
    shared = cfg.int("num_kv_shared_layers", default=0, minimum=0)
    if not shared:
        return {}
    first = len(kinds) - shared
    if first < 1:
        raise ConfigError(f"{cfg.origin}: num_kv_shared_layers {shared} leaves no layer to produce a cache "
                          f"({len(kinds)} layers); it must be below num_hidden_layers")
    producer = {kind: i for i, kind in enumerate(kinds[:first])}  # last producer of each kind
    missing = sorted({k.value for k in kinds[first:]} - {k.value for k in producer})
    if missing:
        raise ConfigError(f"{cfg.origin}: the {shared} KV-shared layers include {', '.join(missing)} layers but no "
                          f"earlier layer of that type produces a cache; lower num_kv_shared_layers")
    reads = {i: producer[kinds[i]] for i in range(first, len(kinds))}
    targets = ", ".join(f"{kind.value} layers read layer {i}" for kind, i in sorted(producer.items(),
                                                                                   key=lambda kv: kv[1])
                        if i in reads.values())
    notes.append(f"num_kv_shared_layers {shared}: layers {first}-{len(kinds) - 1} store no KV cache ({targets})")
    return reads


def _per_layer_overrides(cfg: Any, num_layers: int) -> dict[int, Any] | None:
    """``per_layer_config`` ({"05": {"head_dim": 512, ...}}), each override read through its own checked
    reader, or None when the file has none."""
    raw = cfg.get("per_layer_config")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"{cfg.origin}: per_layer_config must map layer indices to config keys")
    out = {}
    for key, value in raw.items():
        index = key if isinstance(key, str) and key.isascii() and key.isdigit() else None  # not "²": int() refuses
        if index is None or int(index) >= num_layers or not isinstance(value, dict):
            raise ConfigError(f"{cfg.origin}: per_layer_config keys must be layer indices below {num_layers} "
                              f"mapping to config keys (got {key!r})")
        out[int(key)] = _cfg_class()(value, f"{cfg.origin}: per_layer_config[{key}]")
    return out


def _gemma4_shapes(cfg: Any, kinds: list[LayerKind], num_heads: int, notes: list[str]) -> list[tuple[int, int]]:
    """(KV heads, head dim) of each layer."""
    from kvplan.io.hf_config import _num_kv_heads

    kv = _num_kv_heads(cfg, "gemma4", num_heads, notes)
    head_dim = cfg.int("head_dim", default=256)  # Gemma4TextConfig.head_dim
    overrides = _per_layer_overrides(cfg, len(kinds))
    if overrides is not None:
        return [(overrides[i].int("num_key_value_heads", default=kv), overrides[i].int("head_dim", default=head_dim))
                if i in overrides else (kv, head_dim) for i in range(len(kinds))]
    global_dim = cfg.int("global_head_dim", default=_GEMMA4_GLOBAL_HEAD_DIM)
    global_kv = kv
    if cfg.bool("attention_k_eq_v") and cfg.has("num_global_key_value_heads"):
        global_kv = cfg.int("num_global_key_value_heads")
    elif cfg.has("num_global_key_value_heads"):
        notes.append(f"num_global_key_value_heads {cfg.int('num_global_key_value_heads')} ignored: "
                     f"transformers applies it only with attention_k_eq_v; full layers keep {kv} KV heads")
    if global_kv > num_heads or num_heads % global_kv:
        raise ConfigError(f"{cfg.origin}: num_global_key_value_heads ({global_kv}) must divide "
                          f"num_attention_heads ({num_heads})")
    if not cfg.has("global_head_dim"):
        notes.append(f"no global_head_dim: Gemma4TextConfig's default {_GEMMA4_GLOBAL_HEAD_DIM} for full layers")
    return [(global_kv, global_dim) if kind is LayerKind.FULL else (kv, head_dim) for kind in kinds]


def layers(cfg: Any, model_type: str, *, hidden: int, num_heads: int, notes: list[str]) -> list[Layer]:
    from kvplan.io.hf_config import _num_kv_heads

    num_layers = cfg.int("num_hidden_layers")
    gemma4, gemma3n = model_type in _GEMMA4, model_type in _GEMMA3N
    pattern = _GEMMA4_PATTERN if gemma4 else _GEMMA3N_PATTERN if gemma3n else _OLMO3_PATTERN
    if gemma4 or gemma3n or model_type == "olmo3":
        kinds = _kinds(cfg, model_type, num_layers, pattern, notes)
    else:
        from kvplan.io.hf_config import _layer_kinds

        kinds = _layer_kinds(cfg, model_type, num_layers, notes)
        if any(k in (LayerKind.LINEAR, LayerKind.CHUNKED) for k in kinds):
            raise ConfigError(f"{cfg.origin}: {model_type} layers are softmax attention; layer_types lists others")
    if gemma4 and kinds[-1] is not LayerKind.FULL:
        notes.append("the last layer is full attention: Gemma4TextConfig forces it whatever layer_types says")
        kinds[-1] = LayerKind.FULL
    window = _window(cfg, model_type, notes) if LayerKind.SLIDING in kinds else 0
    if gemma4:
        shapes = _gemma4_shapes(cfg, kinds, num_heads, notes)
    else:
        kv = _num_kv_heads(cfg, model_type, num_heads, notes)
        head_dim = cfg.int("head_dim", default=256) if gemma3n else _head_dim(cfg, hidden, num_heads)
        shapes = [(kv, head_dim)] * num_layers
    reads = _kv_sharing(cfg, kinds, notes) if gemma4 or gemma3n else {}
    mtp = cfg.int("num_nextn_predict_layers", "num_mtp_modules", default=0, minimum=0)
    if mtp and (model_type != "minimax_m2" or cfg.bool("use_mtp", True)):
        # vLLM 0.33.0 drops them from the served model (glm4_moe.py load_weights: skip_spec_layers;
        # minimax_m2.py maps layers.{num_hidden_layers + i} to None); transformers does not build them either
        notes.append(f"the checkpoint's {mtp} multi-token-prediction layer(s) are not counted (loaded only as a "
                     "speculative-decoding draft)")
    out: list[Layer] = []
    for i, (kind, (kv, head_dim)) in enumerate(zip(kinds, shapes)):
        if i in reads:
            out.append(NoCacheLayer(reads_layer=reads[i]))
        elif kind is LayerKind.NONE:
            out.append(NoCacheLayer())
        else:
            out.append(AttentionLayer(kind=kind, num_kv_heads=kv, k_head_dim=head_dim, v_head_dim=head_dim,
                                      window=window if kind is LayerKind.SLIDING else 0))
    return out


# -- weights -------------------------------------------------------------------------------------


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


def _gemma_arch(cfg: Any, model_type: str, layers: tuple[Layer, ...], hidden: int) -> ArchShape:
    """Gemma 3n / Gemma 4 text decoder, module by module (``Gemma4TextDecoderLayer``,
    ``Gemma3nTextDecoderLayer``, ``Gemma*TextModel``)."""
    gemma3n = model_type in _GEMMA3N
    n = len(layers)
    family = "gemma3n" if gemma3n else "gemma4"
    ple_dim = cfg.int("hidden_size_per_layer_input", default=_PLE_DEFAULTS[family][0], minimum=0)
    ple_vocab = cfg.int("vocab_size_per_layer_input", default=_PLE_DEFAULTS[family][1])
    widths = _intermediates(cfg, n)
    if not gemma3n and cfg.bool("use_double_wide_mlp"):
        # Gemma4TextMLP: KV-shared layers get twice the intermediate width
        widths = tuple(w * 2 if isinstance(layers[i], NoCacheLayer) else w for i, w in enumerate(widths))
    head_norms = []  # q_norm on every layer; k_norm where the layer computes K (v_norm has no scale)
    for layer in layers:
        shape = layers[layer.reads_layer] if isinstance(layer, NoCacheLayer) and layer.reads_layer >= 0 else layer
        dim = shape.k_head_dim if isinstance(shape, AttentionLayer) else 0
        head_norms.append(dim * (1 if isinstance(layer, NoCacheLayer) else 2))
    per_layer = [norms + 2 * hidden * ple_dim for norms in head_norms]  # per_layer_input_gate, per_layer_projection
    extra = 0
    moe = None
    if gemma3n:
        alt = cfg.int("altup_num_inputs", default=4)  # Gemma3nTextConfig.altup_num_inputs
        rank = cfg.int("laurel_rank", default=64)  # Gemma3nTextConfig.laurel_rank
        # AltUp (correct_output_scale, correction/prediction coefs, modality_router, router_norm) and
        # LAuReL (linear_left, linear_right, post_laurel_norm), per layer
        per_layer = [p + hidden + alt * alt + alt ** 3 + hidden * alt + hidden + 2 * hidden * rank + hidden
                     for p in per_layer]
        extra = 2 * (alt - 1) * hidden * hidden  # altup_projections and altup_unembed_projections
    elif cfg.bool("enable_moe_block"):
        experts = cfg.int("num_experts")
        per_token = cfg.int("top_k_experts")
        if per_token > experts:
            raise ConfigError(f"{cfg.origin}: top_k_experts ({per_token}) must be <= num_experts ({experts})")
        moe = MoEShape(num_experts=experts, experts_per_token=per_token,
                       expert_intermediate=cfg.int("moe_intermediate_size"))
        # Gemma4TextRouter's scale and per_expert_scale, and the three extra feed-forward norms
        per_layer = [p + hidden + experts + 3 * hidden for p in per_layer]
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
        layer_whole_params=tuple(per_layer),
        extra_params=extra,
        embedding_extra_params=embedding_extra,
    )


def _qk_norms(cfg: Any, layer: Layer, num_heads: int, *, whole_projection: bool) -> int:
    """Parameters of a layer's q/k RMSNorms: per head (one head_dim each) or over the whole projection."""
    if not isinstance(layer, AttentionLayer):
        return 0
    if whole_projection:
        return (num_heads + layer.num_kv_heads) * layer.k_head_dim
    return 2 * layer.k_head_dim


def arch(cfg: Any, model_type: str, *, layers: tuple[Layer, ...], hidden: int) -> ArchShape | None:
    if not cfg.has("vocab_size"):
        return None
    if model_type in _GEMMA4 or model_type in _GEMMA3N:
        return _gemma_arch(cfg, model_type, layers, hidden)
    num_heads = cfg.int("num_attention_heads")
    base = arch_from_config(cfg, model_type=model_type, layers=layers, hidden=hidden)
    assert base is not None
    n = len(layers)
    if model_type == "olmo3":
        # Olmo3Attention: q_norm/k_norm over the whole projection; post-attention and post-feed-forward norms
        return dataclasses.replace(base, layer_whole_params=tuple(
            _qk_norms(cfg, layer, num_heads, whole_projection=True) for layer in layers))
    if model_type == "seed_oss":
        # SeedOssAttention: q/k/v biases from attention_bias, the o_proj bias from attention_out_bias
        return dataclasses.replace(base, qkv_bias=cfg.bool("attention_bias", True),
                                   o_bias=cfg.bool("attention_out_bias"))
    if model_type == "glm4_moe":
        experts = cfg.int("n_routed_experts")
        width = cfg.int("moe_intermediate_size")
        first = cfg.int("first_k_dense_replace", default=1, minimum=0)  # Glm4MoeConfig default
        moe = MoEShape(num_experts=experts, experts_per_token=_top_k(cfg, "num_experts_per_tok", experts),
                       expert_intermediate=width,
                       shared_intermediate=cfg.int("n_shared_experts", default=1, minimum=0) * width)
        qk = cfg.bool("use_qk_norm")
        return dataclasses.replace(
            base, moe=moe, moe_layers=tuple(i >= first for i in range(n)), o_bias=False,  # o_proj has no bias
            # per-head q/k norms (use_qk_norm) and the router's e_score_correction_bias on MoE layers
            layer_whole_params=tuple((_qk_norms(cfg, layer, num_heads, whole_projection=False) if qk else 0)
                                     + (experts if i >= first else 0) for i, layer in enumerate(layers)))
    if model_type == "minimax_m2":
        experts = cfg.int("num_local_experts")
        moe = MoEShape(num_experts=experts, experts_per_token=_top_k(cfg, "num_experts_per_tok", experts),
                       expert_intermediate=cfg.int("intermediate_size"),
                       shared_intermediate=cfg.int("shared_intermediate_size", default=0, minimum=0))
        qk = cfg.bool("use_qk_norm", True)
        return dataclasses.replace(
            base, moe=moe, moe_layers=(True,) * n,
            # q/k norms over the whole projection (qk_norm_type per_layer) and e_score_correction_bias
            layer_whole_params=tuple((_qk_norms(cfg, layer, num_heads, whole_projection=True) if qk else 0)
                                     + experts for layer in layers))
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
    return dataclasses.replace(base, moe=moe, moe_layers=(True,) * n, layer_whole_params=norms)


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
