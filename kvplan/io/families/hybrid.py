"""Hybrids of attention with linear-attention / state-space mixers: which layers cache K/V and which
keep a fixed state, with that state's exact shape (kvplan.core.spec.LinearLayer).

Each reader follows transformers v5.23's config class and modeling file for its model type
(``models/<type>/configuration_<type>.py``, ``modeling_<type>.py``), and the state shapes agree with
vLLM 0.33.0's ``get_mamba_state_shape_from_config`` of the same model
(``vllm/model_executor/layers/mamba/mamba_utils.py::MambaStateShapeCalculator``):

- ``kimi_linear`` (Kimi-Linear): ``linear_attn_config`` names the 1-based ``kda_layers`` and
  ``full_attn_layers``; full layers are MLA (the latent is cached, ``mla_use_nope`` or not), KDA layers
  keep a conv over q, k and v (3 x heads x head_dim channels) and a head_dim x head_dim matrix per head.
- ``minimax`` (MiniMax-Text-01 / M1 in transformers' layout; ``minimax_text_01`` / ``minimax_m1`` in the
  original remote-code layout): ``layer_types``, or ``attn_type_list`` (0 lightning, 1 softmax); lightning
  layers keep one head_dim x head_dim K^T V matrix per attention head and no conv.
- ``nemotron_h`` (Nemotron-H, Nemotron 3): ``hybrid_override_pattern``, one character a layer (M Mamba-2,
  * attention, - MLP, E MoE: the last two cache nothing), or ``layers_block_type``.
- ``granitemoehybrid`` (Granite 4.0-H) and ``bamba``: ``layer_types`` / ``attn_layer_indices``; Mamba-2.
- ``falcon_h1``: every layer runs attention and Mamba-2 in parallel: a LinearLayer with ``attention``.
- ``lfm2``: ``layer_types`` or ``full_attn_idxs`` (conv / full_attention); conv layers keep only the
  short convolution's last ``conv_L_cache`` inputs of hidden_size channels.
- ``qwen3_5`` / ``qwen3_5_moe`` (Qwen3.5, Qwen3.6): Qwen3-Next's gated delta net under ``text_config``;
  the config's ``mamba_ssm_dtype`` is kept for the engines that read it.

Mamba-2 everywhere: d_inner channels of x plus 2 x n_groups x d_state of B and C in the conv, a
heads x head_dim x d_state recurrent state (``MambaStateShapeCalculator.mamba2_state_shape``).
"""

from __future__ import annotations

from typing import Any

from kvplan.core.dtypes import get_dtype
from kvplan.core.spec import ArchShape, AttentionLayer, Layer, LayerKind, LinearLayer, MLALayer, NoCacheLayer
from kvplan.errors import ConfigError, InputError
from kvplan.io.config_reader import _Cfg
from kvplan.io.hf_config import _linear_layer, _num_kv_heads, _num_layers, unmodeled

MODEL_TYPES: tuple[str, ...] = (
    "kimi_linear", "minimax", "minimax_text_01", "minimax_m1", "nemotron_h", "granitemoehybrid", "bamba",
    "falcon_h1", "lfm2", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text",
)

_MINIMAX = ("minimax", "minimax_text_01", "minimax_m1")
_QWEN35 = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")


# -- shared pieces ---------------------------------------------------------------------------------

def _dtype_key(cfg: _Cfg, key: str, default: str = "") -> str:
    """A dtype name the config gives under ``key`` (kvplan's name), ``default`` when absent."""
    value = cfg.str(key) or default
    if not value:
        return ""
    try:
        return get_dtype(value).name
    except InputError:
        raise ConfigError(f"{cfg.origin}: {key} {value!r} is not a dtype kvplan knows") from None


def _attention(cfg: _Cfg, model_type: str, num_heads: int, hidden: int, notes: list[str]) -> AttentionLayer:
    kv = _num_kv_heads(cfg, model_type, num_heads, notes)
    if cfg.has("head_dim"):
        head_dim = cfg.int("head_dim")
    elif hidden % num_heads:
        raise ConfigError(f"{cfg.origin}: hidden_size {hidden} is not a multiple of num_attention_heads "
                          f"{num_heads}; add head_dim to the config")
    else:
        head_dim = hidden // num_heads
    return AttentionLayer(num_kv_heads=kv, k_head_dim=head_dim, v_head_dim=head_dim)


def _mamba2(cfg: _Cfg, *, d_inner: int, heads: int, head_dim: int, groups: int, d_state: int, kernel: int,
            ssm_cache_dtype: str = "") -> LinearLayer:
    if heads * head_dim != d_inner:
        raise ConfigError(f"{cfg.origin}: Mamba-2 heads x head_dim ({heads} x {head_dim}) must equal the inner "
                          f"size {d_inner}")
    if heads % groups:
        raise ConfigError(f"{cfg.origin}: the Mamba-2 groups ({groups}) must divide its heads ({heads})")
    return LinearLayer(
        family="mamba2", conv_channels=d_inner + 2 * groups * d_state, conv_kernel=kernel,
        state_elems=heads * head_dim * d_state, num_heads=heads, state_shape=(heads, head_dim, d_state),
        n_groups=groups, group_state=d_state, ssm_dtype=_dtype_key(cfg, "mamba_ssm_dtype"),
        ssm_cache_dtype=ssm_cache_dtype,
    )


def _d_head(cfg: _Cfg, key: str, d_inner: int, heads: int) -> int:
    """``mamba_d_head``, where "auto" (the config classes' default) means d_inner / heads."""
    if cfg.get(key, "auto") == "auto":
        if d_inner % heads:
            raise ConfigError(f"{cfg.origin}: {key} is auto but {heads} heads do not divide the inner size {d_inner}")
        return d_inner // heads
    return cfg.int(key)


def _kinds_from_types(cfg: _Cfg, key: str, num_layers: int, names: dict[str, LayerKind]) -> list[LayerKind]:
    types = cfg.get(key)
    if not isinstance(types, list) or len(types) != num_layers:
        raise ConfigError(f"{cfg.origin}: {key} must list one type per layer ({num_layers})")
    kinds = []
    for i, t in enumerate(types):
        if not isinstance(t, str) or t not in names:
            raise ConfigError(f"{cfg.origin}: {key}[{i}] = {t!r} is not a layer type of this model "
                              f"({', '.join(sorted(names))})")
        kinds.append(names[t])
    return kinds


def _indices_to_kinds(cfg: _Cfg, key: str, num_layers: int, *, base: int, hit: LayerKind, rest: LayerKind) -> list[LayerKind]:
    idx = set(cfg.int_list(key, minimum=base, maximum=num_layers - 1 + base))
    return [hit if i + base in idx else rest for i in range(num_layers)]


def _layers_from_kinds(kinds: list[LayerKind], attention: Layer, linear: LinearLayer | None) -> list[Layer]:
    out: list[Layer] = []
    for kind in kinds:
        if kind is LayerKind.LINEAR:
            assert linear is not None
            out.append(linear)
        elif kind is LayerKind.NONE:
            out.append(NoCacheLayer())
        else:
            out.append(attention)
    return out


# -- per family: layers ----------------------------------------------------------------------------

def _kimi_config(cfg: _Cfg) -> _Cfg:
    raw = cfg.get("linear_attn_config", {})
    if not isinstance(raw, dict):
        raise ConfigError(f"{cfg.origin}: linear_attn_config must be an object of config keys")
    return _Cfg(raw, f"{cfg.origin}: linear_attn_config")


def _kimi(cfg: _Cfg, num_layers: int, num_heads: int, notes: list[str]) -> list[Layer]:
    lac = _kimi_config(cfg)
    heads = lac.int("num_heads", default=cfg.int("linear_num_heads", default=32))
    head_dim = lac.int("head_dim", default=cfg.int("linear_head_dim", default=128))
    kernel = lac.int("short_conv_kernel_size", default=cfg.int("linear_conv_kernel_dim", default=4))
    if cfg.has("layer_types"):
        kinds = _kinds_from_types(cfg, "layer_types", num_layers,
                                  {"linear_attention": LayerKind.LINEAR, "full_attention": LayerKind.MLA})
    elif lac.has("kda_layers") and lac.has("full_attn_layers"):
        # 1-based in the checkpoint (transformers KimiLinearConfig.__post_init__; vLLM is_kda_layer)
        kda = set(lac.int_list("kda_layers", minimum=1, maximum=num_layers))
        full = set(lac.int_list("full_attn_layers", minimum=1, maximum=num_layers))
        if kda & full or kda | full != set(range(1, num_layers + 1)):
            raise ConfigError(f"{cfg.origin}: linear_attn_config kda_layers and full_attn_layers must split the "
                              f"layers 1..{num_layers} between them (1-based), each layer once")
        kinds = [LayerKind.LINEAR if i + 1 in kda else LayerKind.MLA for i in range(num_layers)]
    else:
        notes.append("no kda_layers/full_attn_layers: transformers' default layout (every 4th layer from layer 4 "
                     "MLA) is assumed")
        kinds = [LayerKind.MLA if i and i % 4 == 0 else LayerKind.LINEAR for i in range(num_layers)]
    kda_layer = LinearLayer(family="kda", conv_channels=3 * heads * head_dim, conv_kernel=kernel,
                            state_elems=heads * head_dim * head_dim, num_heads=heads,
                            state_shape=(heads, head_dim, head_dim))
    mla = MLALayer(num_heads=num_heads, kv_lora_rank=cfg.int("kv_lora_rank"),
                   qk_rope_head_dim=cfg.int("qk_rope_head_dim", minimum=0), qk_nope_head_dim=cfg.int("qk_nope_head_dim"),
                   v_head_dim=cfg.int("v_head_dim"))
    if cfg.has("num_key_value_heads"):
        notes.append(f"num_key_value_heads {cfg.get('num_key_value_heads')} ignored: the MLA layers cache the "
                     f"kv_lora_rank latent ({mla.kv_lora_rank} + {mla.qk_rope_head_dim} rope)")
    return [kda_layer if k is LayerKind.LINEAR else mla for k in kinds]


def _minimax(cfg: _Cfg, model_type: str, num_layers: int, num_heads: int, hidden: int,
             notes: list[str]) -> list[Layer]:
    if cfg.has("layer_types"):
        kinds = _kinds_from_types(cfg, "layer_types", num_layers,
                                  {"linear_attention": LayerKind.LINEAR, "full_attention": LayerKind.FULL})
    elif cfg.has("attn_type_list"):
        flags = cfg.int_list("attn_type_list", maximum=1)
        if len(flags) != num_layers:
            raise ConfigError(f"{cfg.origin}: attn_type_list must give one 0/1 per layer ({num_layers})")
        kinds = [LayerKind.FULL if f else LayerKind.LINEAR for f in flags]
    else:
        notes.append("no layer_types/attn_type_list: transformers' MiniMaxConfig default (even layers softmax, "
                     "odd layers lightning) is assumed")
        kinds = [LayerKind.FULL if (i + 1) % 2 else LayerKind.LINEAR for i in range(num_layers)]
    if cfg.has("sliding_window"):
        notes.append(f"sliding_window {cfg.get('sliding_window')} ignored: MiniMaxCache keeps every softmax "
                     "layer's K/V (transformers models/minimax/modeling_minimax.py)")
    notes.append("serving engines: vLLM runs MiniMax-Text-01 / M1 up to 0.23.0 (the model class was removed after "
                 "it: vllm/model_executor/models/registry.py, _PREVIOUSLY_SUPPORTED_MODELS); SGLang 0.5.10 has no "
                 "model for it, so its figures are what its Mamba pool would hold")
    attention = _attention(cfg, model_type, num_heads, hidden, notes)
    head_dim = attention.k_head_dim
    lightning = LinearLayer(family="lightning", conv_channels=0, conv_kernel=0,
                            state_elems=num_heads * head_dim * head_dim, num_heads=num_heads,
                            state_shape=(num_heads, head_dim, head_dim))
    return _layers_from_kinds(kinds, attention, lightning)


_NEMOTRON_PATTERN = {"M": LayerKind.LINEAR, "*": LayerKind.FULL, "-": LayerKind.NONE, "E": LayerKind.NONE}
_NEMOTRON_TYPES = {"mamba": LayerKind.LINEAR, "linear_attention": LayerKind.LINEAR, "attention": LayerKind.FULL,
                   "full_attention": LayerKind.FULL, "mlp": LayerKind.NONE, "moe": LayerKind.NONE}


def _nemotron_types(cfg: _Cfg, num_layers: int, notes: list[str]) -> list[str]:
    """One of M * - E per layer, from hybrid_override_pattern or layers_block_type / layer_types."""
    for key in ("layers_block_type", "layer_types"):
        if cfg.has(key):
            kinds = cfg.get(key)
            if not isinstance(kinds, list) or not all(isinstance(t, str) for t in kinds):
                raise ConfigError(f"{cfg.origin}: {key} must list mamba/attention/mlp/moe per layer")
            unknown = sorted({t for t in kinds if t not in _NEMOTRON_TYPES})
            if unknown:
                raise unmodeled(cfg.origin, f"{key} holds a block kvplan does not model: "
                                f"{', '.join(map(repr, unknown[:3]))} (it models {', '.join(_NEMOTRON_TYPES)})",
                                config=cfg.data, model_type="nemotron_h")
            to_char = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-",
                       "moe": "E"}
            return [to_char[t] for t in kinds]
    pattern = cfg.str("hybrid_override_pattern")
    if not pattern:
        raise ConfigError(f"{cfg.origin}: a nemotron_h config needs hybrid_override_pattern (M, *, -, E per layer) "
                          "or layers_block_type")
    if len(pattern) > 4096:
        raise ConfigError(f"{cfg.origin}: hybrid_override_pattern has {len(pattern):,} layers; at most 4096")
    unknown = sorted({c for c in pattern if c not in _NEMOTRON_PATTERN})
    if unknown:
        raise unmodeled(cfg.origin, "hybrid_override_pattern holds a block kvplan does not model: "
                        f"{', '.join(map(repr, unknown[:3]))} (it models M Mamba-2, * attention, - MLP, E MoE)",
                        config=cfg.data, model_type="nemotron_h")
    if len(pattern) != num_layers:
        notes.append(f"hybrid_override_pattern has {len(pattern)} layers, num_hidden_layers says {num_layers}: "
                     "the pattern wins, as in transformers' NemotronHConfig")
    return list(pattern)


def _nemotron(cfg: _Cfg, model_type: str, num_layers: int, num_heads: int, hidden: int,
              notes: list[str]) -> list[Layer]:
    chars = _nemotron_types(cfg, num_layers, notes)
    heads = cfg.int("mamba_num_heads", default=128)
    head_dim = cfg.int("mamba_head_dim", default=64)
    mamba = _mamba2(cfg, d_inner=heads * head_dim, heads=heads, head_dim=head_dim,
                    groups=cfg.int("n_groups", "mamba_n_groups", default=8),
                    d_state=cfg.int("ssm_state_size", default=128),
                    kernel=cfg.int("conv_kernel", "mamba_d_conv", default=4),
                    # transformers NemotronHConfig.mamba_ssm_cache_dtype defaults to "float32"
                    ssm_cache_dtype=_dtype_key(cfg, "mamba_ssm_cache_dtype", "float32"))
    return _layers_from_kinds([_NEMOTRON_PATTERN[c] for c in chars], _attention(cfg, model_type, num_heads, hidden, notes),
                              mamba)


def _granite_mamba(cfg: _Cfg, hidden: int, *, d_inner: int | None = None) -> LinearLayer:
    inner = d_inner or cfg.int("mamba_expand", default=2) * hidden
    heads = cfg.int("mamba_n_heads", default=128)
    return _mamba2(cfg, d_inner=inner, heads=heads, head_dim=_d_head(cfg, "mamba_d_head", inner, heads),
                   groups=cfg.int("mamba_n_groups", default=1), d_state=cfg.int("mamba_d_state", default=256),
                   kernel=cfg.int("mamba_d_conv", default=4))


def _granite(cfg: _Cfg, model_type: str, num_layers: int, num_heads: int, hidden: int,
             notes: list[str]) -> list[Layer]:
    names = {"mamba": LayerKind.LINEAR, "linear_attention": LayerKind.LINEAR, "attention": LayerKind.FULL,
             "full_attention": LayerKind.FULL}
    if cfg.has("layer_types") or cfg.has("layers_block_type"):
        key = "layer_types" if cfg.has("layer_types") else "layers_block_type"
        kinds = _kinds_from_types(cfg, key, num_layers, names)
    elif cfg.has("attn_layer_indices"):  # Bamba
        kinds = _indices_to_kinds(cfg, "attn_layer_indices", num_layers, base=0, hit=LayerKind.FULL,
                                  rest=LayerKind.LINEAR)
    else:
        notes.append(f"no layer_types: every layer is Mamba-2, as in transformers' {model_type} config class")
        kinds = [LayerKind.LINEAR] * num_layers
    return _layers_from_kinds(kinds, _attention(cfg, model_type, num_heads, hidden, notes), _granite_mamba(cfg, hidden))


def _falcon_h1(cfg: _Cfg, model_type: str, num_layers: int, num_heads: int, hidden: int,
               notes: list[str]) -> list[Layer]:
    inner = cfg.int("mamba_d_ssm", default=0, minimum=0) or cfg.int("mamba_expand", default=2) * hidden
    if cfg.get("attn_layer_indices"):
        notes.append("attn_layer_indices ignored: transformers and vLLM run attention and Mamba-2 in every "
                     "Falcon-H1 layer")
    mamba = _granite_mamba(cfg, hidden, d_inner=inner)
    parallel = LinearLayer(**{**_fields(mamba), "attention": _attention(cfg, model_type, num_heads, hidden, notes)})
    notes.append("Falcon-H1 runs attention and Mamba-2 side by side in every layer: each layer caches both")
    return [parallel] * num_layers


def _fields(layer: LinearLayer) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(layer, f.name) for f in dataclasses.fields(layer)}


def _lfm2(cfg: _Cfg, model_type: str, num_layers: int, num_heads: int, hidden: int,
          notes: list[str]) -> list[Layer]:
    if cfg.has("layer_types"):
        kinds = _kinds_from_types(cfg, "layer_types", num_layers,
                                  {"conv": LayerKind.LINEAR, "full_attention": LayerKind.FULL})
    elif cfg.has("full_attn_idxs"):
        kinds = _indices_to_kinds(cfg, "full_attn_idxs", num_layers, base=0, hit=LayerKind.FULL,
                                  rest=LayerKind.LINEAR)
    else:
        notes.append("no layer_types/full_attn_idxs: every layer is attention (transformers' Lfm2Config default)")
        kinds = [LayerKind.FULL] * num_layers
    conv = LinearLayer(family="short_conv", conv_channels=hidden, conv_kernel=cfg.int("conv_L_cache", default=3),
                       state_elems=0, num_heads=hidden)
    return _layers_from_kinds(kinds, _attention(cfg, model_type, num_heads, hidden, notes), conv)


def _qwen35(cfg: _Cfg, model_type: str, num_layers: int, num_heads: int, hidden: int,
            notes: list[str]) -> list[Layer]:
    if cfg.has("layer_types"):
        kinds = _kinds_from_types(cfg, "layer_types", num_layers,
                                  {"linear_attention": LayerKind.LINEAR, "full_attention": LayerKind.FULL})
    else:  # transformers Qwen3_5TextConfig.__post_init__
        interval = cfg.int("full_attention_interval", default=4)
        kinds = [LayerKind.LINEAR if (i + 1) % interval else LayerKind.FULL for i in range(num_layers)]
    missing = {k: v for k, v in _QWEN35_DEFAULTS.items() if not cfg.has(k)}
    if missing:  # transformers Qwen3_5TextConfig / Qwen3_5MoeTextConfig class defaults
        notes.append("not in the config, taken from transformers' Qwen3.5 defaults: "
                     + ", ".join(f"{k}={v}" for k, v in missing.items()))
        cfg = _Cfg({**cfg.data, **missing}, cfg.origin)
    gdn = _linear_layer(cfg, "qwen3_next", hidden)
    k_heads, k_dim = cfg.int("linear_num_key_heads"), cfg.int("linear_key_head_dim")
    v_heads, v_dim = cfg.int("linear_num_value_heads"), cfg.int("linear_value_head_dim")
    if v_heads % k_heads:
        raise ConfigError(f"{cfg.origin}: linear_num_key_heads ({k_heads}) must divide linear_num_value_heads "
                          f"({v_heads})")
    gdn = LinearLayer(**{**_fields(gdn), "state_shape": (v_heads, k_dim, v_dim), "n_groups": k_heads,
                         "group_state": k_dim, "ssm_dtype": _dtype_key(cfg, "mamba_ssm_dtype")})
    return _layers_from_kinds(kinds, _attention(cfg, model_type, num_heads, hidden, notes), gdn)


# transformers v5.23 models/qwen3_5/configuration_qwen3_5.py (and _moe): the same in both classes
_QWEN35_DEFAULTS = {"head_dim": 256, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
                    "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32}


def layers(cfg: _Cfg, model_type: str, *, hidden: int, num_heads: int, notes: list[str]) -> list[Layer]:
    num_layers = _num_layers(cfg)
    if model_type == "kimi_linear":
        return _kimi(cfg, num_layers, num_heads, notes)
    if model_type in _MINIMAX:
        return _minimax(cfg, model_type, num_layers, num_heads, hidden, notes)
    if model_type == "nemotron_h":
        return _nemotron(cfg, model_type, num_layers, num_heads, hidden, notes)
    if model_type in ("granitemoehybrid", "bamba"):
        return _granite(cfg, model_type, num_layers, num_heads, hidden, notes)
    if model_type == "falcon_h1":
        return _falcon_h1(cfg, model_type, num_layers, num_heads, hidden, notes)
    if model_type == "lfm2":
        return _lfm2(cfg, model_type, num_layers, num_heads, hidden, notes)
    return _qwen35(cfg, model_type, num_layers, num_heads, hidden, notes)


# -- weights: kvplan.io.families.hybrid_weights ------------------------------------------------------

def arch(cfg: _Cfg, model_type: str, *, layers: tuple[Layer, ...], hidden: int) -> ArchShape | None:
    """The weight shape of a hybrid model, None where the config gives no vocab_size."""
    from kvplan.io.families.hybrid_weights import arch_shape  # imported here: it reads _nemotron_types from here

    return arch_shape(cfg, model_type, layers=layers, hidden=hidden)
