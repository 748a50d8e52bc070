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
  Seed-OSS (``seed_oss``): plain GQA caches; only their weights need this module
  (counted in kvplan.io.families.attention_weights).
"""

from __future__ import annotations

from typing import Any

from kvplan.core.spec import ArchShape, AttentionLayer, Layer, LayerKind, NoCacheLayer
from kvplan.errors import ConfigError

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


# -- weights: kvplan.io.families.attention_weights ---------------------------------------------------


def arch(cfg: Any, model_type: str, *, layers: tuple[Layer, ...], hidden: int) -> ArchShape | None:
    """The weight shape of a model of these families, None where the config gives no vocab_size."""
    from kvplan.io.families.attention_weights import arch_shape  # imported here: it reads the constants above

    return arch_shape(cfg, model_type, layers=layers, hidden=hidden)
