"""Turn a Hugging Face ``config.json`` (as a dict) into a ``ModelSpec``.

Only the keys that decide what is cached are read; the rest of HF's format is left alone. The known
traps are resolved here, and each resolution is recorded in ``ModelSpec.notes``:

- DeepSeek-V2/V3 carry ``num_key_value_heads: 128`` beside MLA: ``kv_lora_rank`` wins, the latent
  is what is cached.
- Falcon-7B says ``multi_query: true`` with 71 heads: one KV head is stored (Falcon-40B's
  ``new_decoder_architecture`` uses ``num_kv_heads``).
- Qwen2/Qwen3 carry ``sliding_window`` with ``use_sliding_window: false``: no window
  (transformers ``Qwen2Config.__post_init__`` sets the window to None unless it is used).
- ``head_dim`` given explicitly wins over ``hidden_size / num_attention_heads`` (Gemma, Qwen3).
- Multimodal configs nest the language model under ``text_config``.
- ``torch_dtype`` (or v5's ``dtype``) gives the default KV dtype.
- ``vision_config``: the vision tower and projector are counted for weights where kvplan.io.towers models the
  family (Gemma 3, Llama 4, Mistral 3), and noted as not counted elsewhere.

Layer patterns, where ``layer_types`` is absent, follow transformers' own config classes
(``models/<name>/configuration_<name>.py``, v5.23): Gemma 2 and gpt-oss alternate sliding/full
starting with sliding; Gemma 3 has 5 sliding then 1 full (``sliding_window_pattern`` 6); Llama 4
makes every 4th layer full and the rest chunked; Qwen3-Next every 4th layer full and the rest
linear attention; Qwen2/Qwen3 with a window slide only from ``max_window_layers`` on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from kvplan.core.dtypes import get_dtype
from kvplan.core.spec import (ArchShape, AttentionLayer, Layer, LayerKind, LinearLayer, MLALayer, ModelSpec,
                              NoCacheLayer)
from kvplan.errors import ConfigError, InputError, UnmodeledError
from kvplan.io.arch import arch_from_config
from kvplan.io.architectures import is_checked, not_modeled_reason
from kvplan.io.config_reader import _MAX_LAYERS, _Cfg, _show
from kvplan.io.families import FAMILY_TYPES, family_module
from kvplan.io.rope import rope_cache_elems
from kvplan.io.towers import tower_shape


# What vLLM, SGLang and TensorRT-LLM derive a model's longest context from (kvplan.core.capacity.context)
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_sequence_length", "max_seq_length", "seq_len", "rope_scaling", "rope_parameters")


_LAYER_TYPE_KINDS = {
    "full_attention": LayerKind.FULL,
    "attention": LayerKind.FULL,
    "global": LayerKind.FULL,
    "sliding_attention": LayerKind.SLIDING,
    "local": LayerKind.SLIDING,
    "chunked_attention": LayerKind.CHUNKED,
    "linear_attention": LayerKind.LINEAR,
    "mamba": LayerKind.LINEAR,
    "mamba2": LayerKind.LINEAR,
    "moe": LayerKind.NONE,
    "mlp": LayerKind.NONE,
    "dummy": LayerKind.NONE,
}


# Values transformers' config classes fill in when config.json leaves a key out, so the spec matches
# what the model really runs with. Each from transformers v5.23 models/<type>/configuration_<type>.py
# unless noted.
_CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "falcon": {"max_position_embeddings": 2048},  # FalconConfig.max_position_embeddings
    "gemma3_text": {"max_position_embeddings": 131_072, "sliding_window": 4096, "vocab_size": 262_208},  # Gemma3TextConfig
    "gemma3": {"max_position_embeddings": 131_072, "sliding_window": 4096, "vocab_size": 262_208},
    "gemma2": {"sliding_window": 4096},  # Gemma2Config
    "gpt_oss": {"torch_dtype": "bfloat16", "sliding_window": 128},  # model card: bf16 outside MXFP4 experts
    "gpt2": {"torch_dtype": "float32", "n_positions": 1024},  # the released checkpoints are float32
    # Gemma4TextConfig / Gemma3nTextConfig (kvplan.io.families.attention reads the rest)
    "gemma4_text": {"max_position_embeddings": 131_072, "sliding_window": 512, "vocab_size": 262_144},
    "gemma3n_text": {"max_position_embeddings": 32_768, "sliding_window": 512, "vocab_size": 262_400},
}


_MEASURE_HINT = "; `--engine hf` measures transformers' own cache for this config instead (needs torch and transformers)"


def unmodeled(origin: str, what: str, *, config: dict[str, Any], model_type: str) -> UnmodeledError:
    """The refusal of something kvplan does not model, naming it, with the way to measure it instead."""
    return UnmodeledError(f"{origin}: {what}{_MEASURE_HINT}", config=config, model_type=model_type, what=what)


def _num_layers(cfg: _Cfg) -> int:
    """num_hidden_layers (or its other names); where transformers 5.x derives it from a per-layer list and writes
    none (NemotronHConfig: ``layers_block_type`` / ``hybrid_override_pattern``), that list's length."""
    num = cfg.int("num_hidden_layers", "n_layer", "num_layers", "n_layers", default=0, minimum=0)
    if num:
        return num
    for key in ("layer_types", "layers_block_type", "hybrid_override_pattern"):
        listed = cfg.get(key)
        if isinstance(listed, (list, str)) and 0 < len(listed) <= _MAX_LAYERS:
            return len(listed)
    return cfg.int("num_hidden_layers", "n_layer", "num_layers", "n_layers")  # the "required key" message


def _check_model_type(raw: dict[str, Any], model_type: str, origin: str, notes: list[str]) -> None:
    """Refuse a model type kvplan does not model (kvplan.io.architectures); note one it has not checked.
    ``model_type`` is the text model's (``text_config``'s, for a multimodal config)."""
    # the text model's type, or a multimodal wrapper's (mllama) that kvplan refuses whatever its text model is
    outer = raw.get("model_type") if isinstance(raw.get("model_type"), str) else model_type
    for name in dict.fromkeys((outer, model_type)):
        reason = not_modeled_reason(name)
        if reason is not None:
            raise unmodeled(origin, f"kvplan does not model model_type {name!r}: {reason}", config=raw,
                            model_type=name)
    if not is_checked(model_type, FAMILY_TYPES):
        what = f"model_type {model_type!r} is not one" if model_type else "the config names no model_type, so not one"
        notes.append(f"{what} kvplan has checked against transformers' cache: its layers are read as plain decoder "
                     "attention from the standard keys; with transformers installed, `--engine hf` measures the "
                     "real cache")


def _with_class_defaults(data: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    defaults = _CLASS_DEFAULTS.get(str(data.get("model_type", "")), {})
    missing = {k: v for k, v in defaults.items() if data.get(k) is None}
    if not missing:
        return data
    shown = ", ".join(f"{k}={v}" for k, v in missing.items())
    notes.append(f"not in the config, taken from transformers' {data.get('model_type')} defaults: {shown}")
    return {**data, **missing}


def _text_config(raw: dict[str, Any], notes: list[str], origin: str) -> dict[str, Any]:
    text = raw.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ConfigError(f"{origin}: text_config must be an object of config keys (got {type(text).__name__})")
    if isinstance(text, dict) and not any(k in raw for k in ("num_hidden_layers", "n_layer", "num_layers")):
        merged = dict(text)
        for key in ("torch_dtype", "dtype"):
            if merged.get(key) is None and raw.get(key) is not None:
                merged[key] = raw[key]
        notes.append("multimodal config: the language model is read from text_config")
        return merged
    return raw


def _dtype_name(cfg: _Cfg, notes: list[str]) -> str:
    value = cfg.str("torch_dtype") or cfg.str("dtype") or None
    if value is None:
        notes.append("config has no torch_dtype; fp16 assumed (override with --kv-cache-dtype)")
        return "fp16"
    try:
        return get_dtype(str(value)).name
    except InputError:
        raise ConfigError(f"{cfg.origin}: torch_dtype {value!r} is not a dtype kvplan knows") from None


def _num_kv_heads(cfg: _Cfg, model_type: str, num_heads: int, notes: list[str]) -> int:
    kv = None
    if model_type == "falcon" or cfg.has("multi_query") or cfg.has("new_decoder_architecture"):
        if cfg.bool("new_decoder_architecture"):
            kv = cfg.int("num_kv_heads", "num_key_value_heads", default=num_heads)
        elif cfg.bool("multi_query"):
            notes.append(f"multi_query: true: one KV head is stored for all {num_heads} query heads")
            return 1
    if kv is None and cfg.has("n_head_kv"):
        kv = cfg.int("n_head_kv")
    if kv is None:
        kv = cfg.int("num_key_value_heads", "num_kv_heads", default=num_heads)
    if kv > num_heads or num_heads % kv:
        raise ConfigError(
            f"{cfg.origin}: the number of KV heads ({kv}) must divide num_attention_heads ({num_heads})"
        )
    return kv


def _listed_layer_kinds(cfg: _Cfg, model_type: str, types: Any, num_layers: int) -> list[LayerKind]:
    """The kinds ``layer_types`` lists, one per layer."""
    if not isinstance(types, list) or len(types) != num_layers:
        raise ConfigError(f"{cfg.origin}: layer_types must list one type per layer ({num_layers})")
    kinds = []
    for i, t in enumerate(types):
        if not isinstance(t, str):
            raise ConfigError(f"{cfg.origin}: layer_types[{i}] = {_show(t)} is not a layer type: write one "
                              "name per layer, such as full_attention")
        if t not in _LAYER_TYPE_KINDS:
            known = ", ".join(sorted(_LAYER_TYPE_KINDS))
            raise unmodeled(cfg.origin, f"layer_types[{i}] = {_show(t)} is not a layer type kvplan models ({known})",
                            config=cfg.data, model_type=model_type)
        kinds.append(_LAYER_TYPE_KINDS[t])
    if LayerKind.SLIDING in kinds and not cfg.has("sliding_window"):
        raise ConfigError(f"{cfg.origin}: layer_types has sliding_attention layers but sliding_window is missing")
    return kinds


def _layer_kinds(cfg: _Cfg, model_type: str, num_layers: int, notes: list[str]) -> list[LayerKind]:
    types = cfg.get("layer_types")
    if types is not None:
        return _listed_layer_kinds(cfg, model_type, types, num_layers)

    full = [LayerKind.FULL] * num_layers
    if model_type in ("gemma2", "gpt_oss"):
        return [LayerKind.SLIDING if (i + 1) % 2 else LayerKind.FULL for i in range(num_layers)]
    if model_type in ("gemma3", "gemma3_text"):
        pattern = cfg.int("sliding_window_pattern", default=6)
        return [LayerKind.SLIDING if (i + 1) % pattern else LayerKind.FULL for i in range(num_layers)]
    if model_type in ("llama4", "llama4_text"):
        no_rope = cfg.int_list("no_rope_layers", maximum=1) if cfg.has("no_rope_layers") else None
        if no_rope and len(no_rope) == num_layers:
            return [LayerKind.CHUNKED if flag else LayerKind.FULL for flag in no_rope]
        interval = cfg.int("no_rope_layer_interval", default=4)
        return [LayerKind.CHUNKED if (i + 1) % interval else LayerKind.FULL for i in range(num_layers)]
    if model_type == "qwen3_next":
        interval = cfg.int("full_attention_interval", default=4)
        return [LayerKind.LINEAR if (i + 1) % interval else LayerKind.FULL for i in range(num_layers)]
    if model_type == "jamba":
        period = cfg.int("attn_layer_period", default=8)
        offset = cfg.int("attn_layer_offset", default=4, minimum=0)
        return [LayerKind.FULL if i % period == offset else LayerKind.LINEAR for i in range(num_layers)]
    if cfg.has("sliding_window"):
        if cfg.has("use_sliding_window") and not cfg.bool("use_sliding_window"):
            notes.append(
                f"sliding_window {_show(cfg.get('sliding_window'))} is ignored: use_sliding_window is false"
            )
            return full
        if cfg.has("use_sliding_window"):
            start = cfg.int("max_window_layers", default=0, minimum=0)
            return [LayerKind.SLIDING if i >= start else LayerKind.FULL for i in range(num_layers)]
        return [LayerKind.SLIDING] * num_layers
    if cfg.has("attention_chunk_size"):
        return [LayerKind.CHUNKED] * num_layers
    return full


def _linear_layer(cfg: _Cfg, model_type: str, hidden: int) -> LinearLayer:
    if model_type == "qwen3_next" or cfg.has("linear_num_value_heads"):
        # Gated DeltaNet (transformers models/qwen3_next/modeling_qwen3_next.py): the causal conv runs
        # over q, k and v (2 * key_dim + value_dim channels); the recurrent state is one
        # k_head_dim x v_head_dim matrix per value head.
        k_heads = cfg.int("linear_num_key_heads")
        v_heads = cfg.int("linear_num_value_heads")
        k_dim = cfg.int("linear_key_head_dim")
        v_dim = cfg.int("linear_value_head_dim")
        return LinearLayer(
            family="gated_delta_net",
            conv_channels=2 * k_heads * k_dim + v_heads * v_dim,
            conv_kernel=cfg.int("linear_conv_kernel_dim", default=4),
            state_elems=v_heads * k_dim * v_dim,
            num_heads=v_heads,
        )
    if cfg.has("mamba_d_state") or model_type == "jamba":
        # Mamba-1 (Jamba): conv over the expanded channels, d_state per channel.
        inner = cfg.int("mamba_expand", default=2) * hidden
        return LinearLayer(
            family="mamba",
            conv_channels=inner,
            conv_kernel=cfg.int("mamba_d_conv", default=4),
            state_elems=inner * cfg.int("mamba_d_state", default=16),
            num_heads=inner,
        )
    raise ConfigError(
        f"{cfg.origin}: linear-attention layers need their state sizes "
        "(linear_num_value_heads/linear_key_head_dim/... or mamba_d_state/mamba_d_conv/mamba_expand)"
    )


@dataclass(frozen=True, kw_only=True)
class _Shape:
    """The model-wide numbers read before the layers: counts, widths, dtype and context."""

    num_layers: int
    num_heads: int
    hidden: int
    dtype: str
    max_len: int


def _read_shape(cfg: _Cfg, notes: list[str]) -> _Shape:
    num_layers = _num_layers(cfg)
    # n_heads: MPT (MptConfig); attention_heads: XGLM (XGLMConfig)
    num_heads = cfg.int("num_attention_heads", "n_head", "num_heads", "n_heads", "attention_heads")
    hidden = cfg.int("hidden_size", "n_embd", "d_model")
    dtype = _dtype_name(cfg, notes)
    # model_max_length: Kimi-Linear's name for it (transformers KimiLinearConfig.attribute_map)
    max_len = cfg.int("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "model_max_length",
                      "max_seq_len",
                      default=0, minimum=0)
    if max_len == 0:
        notes.append("config gives no max_position_embeddings; pass --seq-len")
    return _Shape(num_layers=num_layers, num_heads=num_heads, hidden=hidden, dtype=dtype, max_len=max_len)


def _mla_layers(cfg: _Cfg, shape: _Shape, notes: list[str]) -> list[Layer]:
    """DeepSeek-V2/V3-style MLA on every layer: the kv_lora_rank latent is cached, whatever num_key_value_heads says."""
    if cfg.has("num_key_value_heads"):
        notes.append(
            f"num_key_value_heads {_show(cfg.get('num_key_value_heads'))} ignored: MLA caches the "
            f"kv_lora_rank latent ({cfg.int('kv_lora_rank')} + {cfg.int('qk_rope_head_dim')} rope)"
        )
    mla = MLALayer(
        num_heads=shape.num_heads,
        kv_lora_rank=cfg.int("kv_lora_rank"),
        qk_rope_head_dim=cfg.int("qk_rope_head_dim", minimum=0),  # 0: no RoPE part (a NoPE latent)
        qk_nope_head_dim=cfg.int("qk_nope_head_dim"),
        v_head_dim=cfg.int("v_head_dim"),
    )
    return [mla] * shape.num_layers


def _head_dim(cfg: _Cfg, shape: _Shape) -> int:
    """``head_dim`` when the config gives it (Gemma, Qwen3), else hidden_size / num_attention_heads."""
    if cfg.has("head_dim"):
        return cfg.int("head_dim")
    if shape.hidden % shape.num_heads:
        raise ConfigError(
            f"{cfg.origin}: hidden_size {shape.hidden} is not a multiple of num_attention_heads {shape.num_heads}; "
            "add head_dim to the config"
        )
    return shape.hidden // shape.num_heads


def _decoder_layers(cfg: _Cfg, model_type: str, shape: _Shape, notes: list[str]) -> list[Layer]:
    """The generic reader: attention layers (full, sliding, chunked), linear-attention and cache-free layers."""
    kv_heads = _num_kv_heads(cfg, model_type, shape.num_heads, notes)
    head_dim = _head_dim(cfg, shape)
    v_head_dim = cfg.int("v_head_dim", default=head_dim)
    kinds = _layer_kinds(cfg, model_type, shape.num_layers, notes)
    # read only where a layer slides: a config may carry sliding_window 0 or null beside full attention
    window = cfg.int("sliding_window") if LayerKind.SLIDING in kinds else 0
    chunk = cfg.int("attention_chunk_size", default=0, minimum=0)
    if LayerKind.CHUNKED in kinds and chunk == 0:
        raise ConfigError(f"{cfg.origin}: chunked attention layers need attention_chunk_size")
    linear = _linear_layer(cfg, model_type, shape.hidden) if LayerKind.LINEAR in kinds else None
    layers: list[Layer] = []
    for kind in kinds:
        if kind is LayerKind.LINEAR:
            assert linear is not None
            layers.append(linear)
        elif kind is LayerKind.NONE:
            layers.append(NoCacheLayer())
        else:
            size = {LayerKind.SLIDING: window, LayerKind.CHUNKED: chunk}.get(kind, 0)
            layers.append(AttentionLayer(kind=kind, num_kv_heads=kv_heads, k_head_dim=head_dim, v_head_dim=v_head_dim,
                                         window=size))
    return layers


def _read_layers(cfg: _Cfg, model_type: str, family: ModuleType | None, shape: _Shape,
                 notes: list[str]) -> list[Layer]:
    if family is not None:
        return family.layers(cfg, model_type, hidden=shape.hidden, num_heads=shape.num_heads, notes=notes)
    if cfg.has("kv_lora_rank"):
        return _mla_layers(cfg, shape, notes)
    return _decoder_layers(cfg, model_type, shape, notes)


def _read_arch(cfg: _Cfg, model_type: str, family: ModuleType | None, layers: list[Layer],
               hidden: int) -> ArchShape | None:
    """The weight shape: the family reader's where it has one, else the generic one (kvplan.io.arch)."""
    if family is not None and hasattr(family, "arch"):
        return family.arch(cfg, model_type, layers=tuple(layers), hidden=hidden)
    return arch_from_config(cfg, model_type=model_type, layers=tuple(layers), hidden=hidden)


def spec_from_hf_config(
    raw: dict[str, Any], *, name: str, origin: str, source: str = "", provenance: str = ""
) -> ModelSpec:
    """Build a ModelSpec from a config.json dict. ``origin`` names the file in error messages."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: expected a JSON object of config keys")
    notes: list[str] = []
    cfg = _Cfg(_with_class_defaults(_text_config(raw, notes, origin), notes), origin)
    model_type = cfg.str("model_type")
    _check_model_type(raw, model_type, origin, notes)
    shape = _read_shape(cfg, notes)
    context = {k: cfg.data[k] for k in CONTEXT_KEYS if cfg.data.get(k) is not None}
    family = family_module(model_type)
    layers = _read_layers(cfg, model_type, family, shape, notes)
    arch = _read_arch(cfg, model_type, family, layers, shape.hidden)
    tower = tower_shape(raw, text_hidden=shape.hidden, origin=origin, notes=notes)
    if arch is not None and tower is not None:
        arch = dataclasses.replace(arch, tower=tower)
    if arch is not None:
        arch = dataclasses.replace(arch, rope_cache_elems=rope_cache_elems(cfg.data, model_type, tuple(layers)))
    quirks: set[str] = set()
    if model_type == "falcon" and cfg.bool("new_decoder_architecture"):
        quirks.add("hf_kv_broadcast")
    return ModelSpec(
        quirks=frozenset(quirks),
        name=name,
        layers=tuple(layers),
        dtype=shape.dtype,
        max_model_len=shape.max_len,
        num_attention_heads=shape.num_heads,
        hidden_size=shape.hidden,
        model_type=model_type,
        source=source,
        provenance=provenance,
        arch=arch,
        notes=tuple(notes),
        raw_config=raw,
        context_config=context,
    )
