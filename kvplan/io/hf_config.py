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

Layer patterns, where ``layer_types`` is absent, follow transformers' own config classes
(``models/<name>/configuration_<name>.py``, v5.23): Gemma 2 and gpt-oss alternate sliding/full
starting with sliding; Gemma 3 has 5 sliding then 1 full (``sliding_window_pattern`` 6); Llama 4
makes every 4th layer full and the rest chunked; Qwen3-Next every 4th layer full and the rest
linear attention; Qwen2/Qwen3 with a window slide only from ``max_window_layers`` on.
"""

from __future__ import annotations

from typing import Any

from kvplan.core.dtypes import get_dtype
from kvplan.core.spec import AttentionLayer, Layer, LayerKind, LinearLayer, MLALayer, ModelSpec, NoCacheLayer
from kvplan.errors import ConfigError, InputError, UnmodeledError
from kvplan.io.arch import arch_from_config
from kvplan.io.architectures import is_checked, not_modeled_reason
from kvplan.io.families import FAMILY_TYPES, family_module


# Upper bounds on config.json integers, so that no input can build per-layer structures of a billion
# layers or sizes no machine has (``num_hidden_layers: 1000000`` made `fit` hang). Each is the largest
# value in a released model's config.json times a wide margin:
_MAX_LAYERS = 4096  # Llama 3.1 405B: 126 layers (x32)
_MAX_HEADS = 1 << 14  # DeepSeek-V3, Llama 3.1 405B: 128 attention heads (x128)
_MAX_WIDTH = 1 << 20  # Llama 3.1 405B: hidden 16,384, intermediate 53,248 (x19)
_MAX_HEAD_DIM = 1 << 14  # Gemma 2: head_dim 256; DeepSeek-V3: kv_lora_rank 512 (x32)
_MAX_VOCAB = 1 << 24  # Gemma 3: 262,208 (x64)
_MAX_POSITIONS = 1 << 30  # Llama 4 Scout: 10,485,760 positions (x100); also windows and chunks
_MAX_EXPERTS = 1 << 16  # Qwen3-Next: 512 routed experts (x128)
_MAX_SMALL = 1024  # conv kernels (Mamba, gated delta net: 4), expansion factors (Mamba: 2)
_BOUNDS: dict[str, int] = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers", "first_k_dense_replace",
                     "moe_layer_freq", "decoder_sparse_step", "interleave_moe_layer_step", "expert_layer_period",
                     "expert_layer_offset", "attn_layer_period", "attn_layer_offset", "sliding_window_pattern",
                     "no_rope_layer_interval", "full_attention_interval", "max_window_layers"), _MAX_LAYERS),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "n_heads", "attention_heads", "num_key_value_heads",
                     "num_kv_heads",
                     "n_head_kv", "linear_num_key_heads", "linear_num_value_heads"), _MAX_HEADS),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "intermediate_size", "ffn_dim", "n_inner",
                     "intermediate_size_mlp", "moe_intermediate_size", "shared_expert_intermediate_size",
                     "q_lora_rank", "mamba_dt_rank"), _MAX_WIDTH),
    **dict.fromkeys(("head_dim", "v_head_dim", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                     "linear_key_head_dim", "linear_value_head_dim", "mamba_d_state"), _MAX_HEAD_DIM),
    **dict.fromkeys(("mamba_d_conv", "linear_conv_kernel_dim", "mamba_expand"), _MAX_SMALL),
    "vocab_size": _MAX_VOCAB,
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "max_seq_len",
                     "sliding_window", "attention_chunk_size"), _MAX_POSITIONS),
    **dict.fromkeys(("n_routed_experts", "num_experts", "num_local_experts", "num_experts_per_tok",
                     "n_shared_experts"), _MAX_EXPERTS),
    # attention family readers (kvplan.io.families.attention): Gemma 3n/4, GLM-4.x MoE, MiniMax-M2, Hunyuan
    **dict.fromkeys(("num_kv_shared_layers", "num_nextn_predict_layers", "num_mtp_modules"), _MAX_LAYERS),
    "num_global_key_value_heads": _MAX_HEADS,
    **dict.fromkeys(("global_head_dim", "attention_head_dim"), _MAX_HEAD_DIM),
    **dict.fromkeys(("hidden_size_per_layer_input", "laurel_rank", "shared_intermediate_size"), _MAX_WIDTH),
    "vocab_size_per_layer_input": _MAX_VOCAB,
    "altup_num_inputs": _MAX_SMALL,
    "top_k_experts": _MAX_EXPERTS,
    # MLA families (kvplan.io.families.mla): DSA indexers, LongCat-Flash, DeepSeek-V4
    **dict.fromkeys(("index_head_dim",), _MAX_HEAD_DIM),
    **dict.fromkeys(("index_n_heads",), _MAX_HEADS),
    **dict.fromkeys(("index_topk", "compress_rate_csa", "compress_rate_hca"), _MAX_POSITIONS),
    **dict.fromkeys(("index_topk_freq", "index_skip_topk_offset", "num_hash_layers"), _MAX_LAYERS),
    **dict.fromkeys(("ffn_hidden_size", "expert_ffn_hidden_size", "o_lora_rank"), _MAX_WIDTH),
    **dict.fromkeys(("zero_expert_num", "moe_topk"), _MAX_EXPERTS),
    **dict.fromkeys(("o_groups", "hc_mult"), _MAX_SMALL),
    # hybrid families (kvplan.io.families.hybrid): Mamba-2, KDA, lightning attention, LFM2 short convs
    **dict.fromkeys(("mamba_num_heads", "mamba_n_heads", "linear_num_heads", "n_groups", "mamba_n_groups"), _MAX_HEADS),
    **dict.fromkeys(("mamba_head_dim", "mamba_d_head", "ssm_state_size", "linear_head_dim"), _MAX_HEAD_DIM),
    **dict.fromkeys(("conv_kernel", "expand", "conv_L_cache", "short_conv_kernel_size", "block_multiple_of"), _MAX_SMALL),
    **dict.fromkeys(("mamba_d_ssm", "block_ff_dim", "moe_shared_expert_intermediate_size"), _MAX_WIDTH),
    **dict.fromkeys(("num_experts_per_token", "num_shared_experts"), _MAX_EXPERTS),
    "model_max_length": _MAX_POSITIONS,
}
_MAX_OTHER = 1 << 30  # any integer key not listed above


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Cfg:
    """Typed reads from a config dict with messages that name the file and the key.

    Every key kvplan reads goes through ``int``/``bool``/``str``/``int_list``: the type is checked (a
    number written as a string, ``"14336"``, is refused; a bool is not an int), and integers are
    bounded below by ``minimum`` and above by ``_BOUNDS``.
    """

    def __init__(self, data: dict[str, Any], origin: str) -> None:
        self.data = data
        self.origin = origin

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def int(self, *names: str, default: int | None = None, minimum: int = 1) -> int:
        for name in names:
            value = self.data.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{self.origin}: {name} must be an integer (got {_show(value)})")
            maximum = _BOUNDS.get(name, _MAX_OTHER)
            if value < minimum:
                raise ConfigError(f"{self.origin}: {name} must be >= {minimum} (got {value})")
            if value > maximum:
                raise ConfigError(f"{self.origin}: {name} must be <= {maximum} (got {_show(value)}); "
                                  "no released model comes near that")
            return value
        if default is not None:
            return default
        alt = f" (or {', '.join(names[1:])})" if len(names) > 1 else ""
        raise ConfigError(f"{self.origin}: required key {names[0]}{alt} is missing")

    def bool(self, name: str, default: bool = False) -> bool:
        value = self.data.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(f"{self.origin}: {name} must be true or false (got {_show(value)})")
        return value

    def str(self, name: str, default: str = "") -> str:
        value = self.data.get(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ConfigError(f"{self.origin}: {name} must be a string (got {_show(value)})")
        return value

    def int_list(self, name: str, *, minimum: int = 0, maximum: int = _MAX_LAYERS) -> list[int]:
        value = self.data.get(name)
        if value is None:
            return []
        if not isinstance(value, list) or len(value) > _MAX_LAYERS or any(
                isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= maximum for v in value):
            raise ConfigError(f"{self.origin}: {name} must be a list of integers in {minimum}..{maximum} "
                              f"(got {_show(value)})")
        return value


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


def _layer_kinds(cfg: _Cfg, model_type: str, num_layers: int, notes: list[str]) -> list[LayerKind]:
    types = cfg.get("layer_types")
    if types is not None:
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
    context = {k: cfg.data[k] for k in CONTEXT_KEYS if cfg.data.get(k) is not None}

    layers: list[Layer]
    family = family_module(model_type)
    if family is not None:
        layers = family.layers(cfg, model_type, hidden=hidden, num_heads=num_heads, notes=notes)
    elif cfg.has("kv_lora_rank"):
        if cfg.has("num_key_value_heads"):
            notes.append(
                f"num_key_value_heads {_show(cfg.get('num_key_value_heads'))} ignored: MLA caches the "
                f"kv_lora_rank latent ({cfg.int('kv_lora_rank')} + {cfg.int('qk_rope_head_dim')} rope)"
            )
        mla = MLALayer(
            num_heads=num_heads,
            kv_lora_rank=cfg.int("kv_lora_rank"),
            qk_rope_head_dim=cfg.int("qk_rope_head_dim", minimum=0),  # 0: no RoPE part (a NoPE latent)
            qk_nope_head_dim=cfg.int("qk_nope_head_dim"),
            v_head_dim=cfg.int("v_head_dim"),
        )
        layers = [mla] * num_layers
    else:
        kv_heads = _num_kv_heads(cfg, model_type, num_heads, notes)
        if cfg.has("head_dim"):
            head_dim = cfg.int("head_dim")
        else:
            if hidden % num_heads:
                raise ConfigError(
                    f"{origin}: hidden_size {hidden} is not a multiple of num_attention_heads {num_heads}; "
                    "add head_dim to the config"
                )
            head_dim = hidden // num_heads
        v_head_dim = cfg.int("v_head_dim", default=head_dim)
        kinds = _layer_kinds(cfg, model_type, num_layers, notes)
        # read only where a layer slides: a config may carry sliding_window 0 or null beside full attention
        window = cfg.int("sliding_window") if LayerKind.SLIDING in kinds else 0
        chunk = cfg.int("attention_chunk_size", default=0, minimum=0)
        if LayerKind.CHUNKED in kinds and chunk == 0:
            raise ConfigError(f"{origin}: chunked attention layers need attention_chunk_size")
        linear = _linear_layer(cfg, model_type, hidden) if LayerKind.LINEAR in kinds else None
        layers = []
        for kind in kinds:
            if kind is LayerKind.LINEAR:
                assert linear is not None
                layers.append(linear)
            elif kind is LayerKind.NONE:
                layers.append(NoCacheLayer())
            else:
                size = {LayerKind.SLIDING: window, LayerKind.CHUNKED: chunk}.get(kind, 0)
                layers.append(
                    AttentionLayer(kind=kind, num_kv_heads=kv_heads, k_head_dim=head_dim, v_head_dim=v_head_dim, window=size)
                )
    if family is not None and hasattr(family, "arch"):
        arch = family.arch(cfg, model_type, layers=tuple(layers), hidden=hidden)
    else:
        arch = arch_from_config(cfg, model_type=model_type, layers=tuple(layers), hidden=hidden)
    if isinstance(raw.get("vision_config"), dict):
        notes.append("the vision tower's weights are not counted (language model only)")
    quirks: set[str] = set()
    if model_type == "falcon" and cfg.bool("new_decoder_architecture"):
        quirks.add("hf_kv_broadcast")
    return ModelSpec(
        quirks=frozenset(quirks),
        name=name,
        layers=tuple(layers),
        dtype=dtype,
        max_model_len=max_len,
        num_attention_heads=num_heads,
        hidden_size=hidden,
        model_type=model_type,
        source=source,
        provenance=provenance,
        arch=arch,
        notes=tuple(notes),
        raw_config=raw,
        context_config=context,
    )
