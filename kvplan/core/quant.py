"""How a quantized checkpoint stores each decoder Linear, read from config.json's ``quantization_config``.

The rules are the parameters vLLM 0.19.0 allocates when it loads such a checkpoint (what its
"Model loading took X GiB" measures), file and function cited at each one; paths are under
``vllm/model_executor/layers/quantization/``. Pure: the config arrives as a dict.

Three methods name their modules, so a layer's attention, MLP and routed experts may differ:

- ``compressed-tensors`` (llm-compressor, RedHat/Neural Magic): ``config_groups`` say which modules
  (``targets``: the class ``Linear`` or names / ``re:`` patterns) get which ``weights`` scheme;
  ``ignore`` lists modules left in the model dtype.
- ``modelopt`` (NVIDIA TensorRT Model Optimizer): ``quant_algo`` FP8 / FP8_PER_CHANNEL_PER_TOKEN /
  FP8_PB_WO / NVFP4, ``exclude_modules`` (``ignore`` in the flat form).
- ``fbgemm_fp8``: FP8 with a scale per output channel, ``modules_to_not_convert``.
- ``gptq`` / ``awq`` (as vLLM's Marlin kernels hold them on CUDA) and ``bitsandbytes`` (4-bit nf4/fp4 with their
  absmax, 8-bit): every Linear but the modules their config leaves out.

Only Linear layers are quantized; embeddings, norms and the LM head (vLLM's ``ParallelLMHead`` is a
``VocabParallelEmbedding``, not a ``LinearBase``: ``compressed_tensors.py::CompressedTensorsConfig.
get_quant_method`` returns None for it) stay in the model dtype, as do the routers and replicated
down-projections kvplan counts whole (a compressed-tensors checkpoint that quantizes a router is
over-counted by its few parameters).

Scale counts: one per group of ``group_size`` inputs (strategy group), per tensor (a handful of fp32
per module, not counted), and per output channel, counted as one per ``hidden_size`` parameters: exact
for q/k/v/gate/up, whose inputs are hidden_size wide; o_proj and down_proj have fewer rows than that
rule gives them, an over-count under 0.05% of the weights (Llama-3.3-70B: 6.5 MB of 70 GB).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Any

from kvplan.core.weights import WeightFormat
from kvplan.errors import ConfigError

# Module names (as the checkpoint spells them) that make up each part kvplan counts; a part is left
# unquantized only when every one of its modules is.
_PART_MODULES = {
    "attn": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"),
    "mlp": ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"),
    "shared": ("mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj", "mlp.shared_experts.down_proj"),
    "experts": ("mlp.experts.0.gate_proj", "mlp.experts.0.up_proj", "mlp.experts.0.down_proj"),
}
# A vision-language checkpoint nests the text decoder (Mistral3, Gemma 3: language_model.model.layers)
_LAYER_PREFIXES = ("model.layers", "language_model.model.layers", "model.language_model.layers")


@dataclass(frozen=True, kw_only=True)
class QuantRule:
    """Formats of the quantized parts and the modules left out, as one checkpoint's config gives them."""

    method: str
    groups: tuple[tuple[tuple[str, ...], WeightFormat], ...]  # (targets, format), first match wins
    expert_groups: tuple[tuple[tuple[str, ...], WeightFormat], ...]  # for FusedMoE experts
    ignore: tuple[str, ...]
    note: str

    def part_fmt(self, layer: int, part: str) -> WeightFormat | None:
        """The format of one layer's ``attn``, ``mlp``, ``shared`` (experts) or ``experts`` weights; None: left in
        the model dtype."""
        groups = self.expert_groups if part == "experts" else self.groups
        for module in _PART_MODULES[part]:
            names = [f"{prefix}.{layer}.{module}" for prefix in _LAYER_PREFIXES]
            if any(self._ignored(n) for n in names):
                continue
            for targets, fmt in groups:
                if any(_targets_match(self.method, targets, n) for n in names):
                    return fmt
        return None

    def _ignored(self, name: str) -> bool:
        return any(_matches(self.method, pattern, name) for pattern in self.ignore)


def _matches(method: str, pattern: str, name: str) -> bool:
    if method == "compressed-tensors":
        # compressed_tensors/utils.py::_is_equal_or_regex_match: the name itself, or re.match after "re:"
        return re.match(pattern[3:], name) is not None if pattern.startswith("re:") else pattern == name
    if method == "modelopt":
        # modelopt.py::ModelOptQuantConfigBase.is_layer_excluded: exact, then substring, then fnmatch wildcards
        return pattern == name or pattern in name or fnmatch(name, pattern)
    # fbgemm_fp8.py::FBGEMMFp8Config.get_quant_method -> utils/quant_utils.py::is_layer_skipped: exact name
    return pattern == name


def _targets_match(method: str, targets: tuple[str, ...], name: str) -> bool:
    # compressed_tensors/utils.py::find_matched_target: a name or re: pattern, else the class name; every
    # module kvplan counts per part is a Linear (experts too: CompressedTensorsConfig.
    # _add_fused_moe_to_target_scheme_map lets a "Linear" target match FusedMoE)
    return "Linear" in targets or any(_matches(method, t, name) for t in targets if t != "Linear")


def _section(value: Any, field: str) -> dict[str, Any]:
    """A quantization_config section that must be a mapping (absent: empty)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"quantization_config.{field} must be a mapping, not {type(value).__name__}")
    return value


def _count(value: Any, field: str, default: int) -> int:
    """A positive whole number of the config (bits, a group size, a block side); absent: ``default``."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 1 \
            or value != int(value):
        raise ConfigError(f"quantization_config.{field} must be a positive whole number (got {value!r})")
    return int(value)


def _names(value: Any, field: str) -> tuple[str, ...]:
    """Module names or patterns: a list of strings, or one string (a list of its one entry, not its letters)."""
    if value is None:
        return ()
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(x, str) for x in items):
        raise ConfigError(f"quantization_config.{field} must be a list of module names (got {value!r})")
    for x in items:
        if x.startswith("re:"):
            try:
                re.compile(x[3:])
            except re.error as exc:
                raise ConfigError(f"quantization_config.{field}: {x!r} is not a regular expression ({exc})") from None
    return tuple(items)


def _fmt(name: str, bits: int, per: int = 0, scale_bits: int = 0) -> WeightFormat:
    return WeightFormat(name=name, bits=bits, group_elems=per if scale_bits else 0,
                        group_overhead_bits=scale_bits if per else 0, description=name)


def _ct_format(group: dict[str, Any], *, model_bits: int, hidden_size: int) -> WeightFormat | None:
    """One config group's weights as vLLM's compressed-tensors scheme allocates them."""
    w = _section(group.get("weights"), "config_groups.*.weights")
    if not w:
        return None
    bits = _count(w.get("num_bits"), "weights.num_bits", 8)
    kind = w.get("type", "int")
    strategy = w.get("strategy") or "tensor"
    act = _section(group.get("input_activations"), "config_groups.*.input_activations")
    symmetric = w.get("symmetric", True) is not False
    if kind == "float" and bits == 4:
        # schemes/compressed_tensors_w4a4_nvfp4.py::CompressedTensorsW4A4Fp4.create_weights (and w4a16_nvfp4):
        # weight uint8 [out, in // 2], weight_scale float8_e4m3fn [out, in // group_size] (group_size 16),
        # weight_global_scale one fp32 per partition. MXFP4 (w4a16_mxfp4) alike with a uint8 E8M0 scale per 32.
        per, scale_bits = _count(w.get("group_size"), "weights.group_size", 16), 8
    elif bits == 8 and (kind == "float" or act.get("num_bits") == 8):
        # schemes/compressed_tensors_w8a8_fp8.py::CompressedTensorsW8A8Fp8.create_weights
        # (utils/fp8_utils.py::create_fp8_scale_parameter) and compressed_tensors_w8a8_int8.py::
        # CompressedTensorsW8A8Int8.create_weights: weight fp8 / int8 [out, in]; weight_scale fp32, [out, 1]
        # for channel, one per logical partition for tensor, [out / bn, in / bk] for block
        scale_bits = 32
        if strategy == "block":
            block = w.get("block_structure") or [128, 128]
            if not isinstance(block, (list, tuple)) or len(block) != 2:
                raise ConfigError(f"quantization_config weights.block_structure must be two numbers (got {block!r})")
            per = _count(block[0], "weights.block_structure", 128) * _count(block[1], "weights.block_structure", 128)
        else:
            per = hidden_size if strategy == "channel" else 0
    else:
        # schemes/compressed_tensors_wNa16.py::CompressedTensorsWNA16.create_weights: weight packed in int32
        # (num_bits each), weight_scale in params_dtype (the model dtype) per group (group_size) or per output
        # channel (group_size -1), and when not symmetric weight_zero_point packed at num_bits per scale
        scale_bits = model_bits + (0 if symmetric else bits)
        if strategy == "group" and w.get("group_size") is None:
            raise ConfigError("quantization_config weights.strategy group needs weights.group_size")
        per = _count(w.get("group_size"), "weights.group_size", 0) if strategy == "group" else hidden_size
    label = f"{kind}{bits}" + (f" {strategy}" if strategy != "tensor" else " per-tensor")
    return _fmt(label, bits, per, scale_bits)


def _compressed_tensors(quant: dict[str, Any], model_bits: int, hidden_size: int) -> QuantRule | None:
    groups = []
    for group in _section(quant.get("config_groups"), "config_groups").values():
        fmt = _ct_format(_section(group, "config_groups.*"), model_bits=model_bits, hidden_size=hidden_size)
        if fmt is not None:
            groups.append((_names(group.get("targets"), "config_groups.*.targets") or ("Linear",), fmt))
    if not groups:
        return None
    ignore = _names(quant.get("ignore"), "ignore")
    kinds = ", ".join(sorted({f.name for _, f in groups}))
    return QuantRule(method="compressed-tensors", groups=tuple(groups), expert_groups=tuple(groups), ignore=ignore,
                     note=f"weights: compressed-tensors {kinds} on the Linear layers (quantization_config), "
                          f"{len(ignore)} ignore entries, embeddings, norms and LM head in the model dtype")


def _modelopt(quant: dict[str, Any], hidden_size: int) -> QuantRule | None:
    nested = quant.get("quantization")  # hf_quant_config.json: {"quantization": {"quant_algo", "exclude_modules"}}
    src = nested if isinstance(nested, dict) else quant
    algo = str(src.get("quant_algo") or "").upper()
    ignore = _names(src.get("exclude_modules") or src.get("ignore"), "exclude_modules")
    if algo == "FP8":
        # modelopt.py::ModelOptFp8LinearMethod.create_weights: fp8 weight, one fp32 weight_scale per partition
        fmt = _fmt("fp8 per-tensor", 8)
    elif algo == "FP8_PER_CHANNEL_PER_TOKEN":
        # modelopt.py::ModelOptFp8PcPtLinearMethod.create_weights: fp32 weight_scale per output channel
        fmt = _fmt("fp8 channel", 8, hidden_size, 32)
    elif algo == "FP8_PB_WO":
        # modelopt.py::ModelOptFp8PbWoLinearMethod.create_weights: fp32 scale per 128 x 128 block
        fmt = _fmt("fp8 block", 8, 128 * 128, 32)
    elif algo == "NVFP4":
        # modelopt.py::ModelOptNvFp4LinearMethod.create_weights: uint8 weight (two E2M1 per byte), fp8 weight_scale
        # per group_size (16 by default, ModelOptNvFp4Config) inputs, fp32 weight_scale_2 per partition
        fmt = _fmt("nvfp4", 4, _count(src.get("group_size"), "group_size", 16), 8)
    else:
        return None
    groups = ((("Linear",), fmt),)
    # modelopt.py::ModelOptFp8MoEMethod / ModelOptNvFp4FusedMoE quantize the routed experts alike
    return QuantRule(method="modelopt", groups=groups, expert_groups=groups, ignore=ignore,
                     note=f"weights: ModelOpt {algo} on the Linear layers (quantization_config), {len(ignore)} "
                          "excluded module patterns, embeddings, norms and LM head in the model dtype")


def _fbgemm_fp8(quant: dict[str, Any], hidden_size: int) -> QuantRule:
    # fbgemm_fp8.py::FBGEMMFp8LinearMethod.create_weights: fp8 weight, fp32 weight_scale [out, 1]; FBGEMMFp8Config.
    # get_quant_method quantizes LinearBase only, so FusedMoE experts load unquantized
    ignore = _names(quant.get("modules_to_not_convert"), "modules_to_not_convert")
    return QuantRule(method="fbgemm_fp8", groups=((("Linear",), _fmt("fp8 channel", 8, hidden_size, 32)),),
                     expert_groups=(), ignore=ignore,
                     note=f"weights: fbgemm FP8 per channel on the Linear layers (quantization_config), "
                          f"{len(ignore)} modules_to_not_convert in the model dtype")


def _group(value: Any, field: str, hidden_size: int) -> int:
    """A group size (absent: 128); -1 (one scale per output channel) counted as one per ``hidden_size`` inputs."""
    if value == -1 and not isinstance(value, bool):
        return hidden_size
    return _count(value, field, 128)


def _gptq(quant: dict[str, Any], model_bits: int, hidden_size: int) -> QuantRule:
    # gptq_marlin.py::GPTQMarlinLinearMethod.create_weights: qweight int32 [in / (32 / bits), out], scales in the
    # model dtype [in / group_size, out], qzeros int32 [in / group_size, out / (32 / bits)], g_idx int32 [in];
    # process_weights_after_loading empties qzeros when sym (marlin_make_empty_g_idx) and g_idx without desc_act
    # (a desc_act model keeps g_idx and its sort indices: 8 bytes per input row, not counted). GPTQMarlinMoEMethod
    # quantizes the routed experts alike.
    bits = _count(quant.get("bits"), "bits", 4)
    group = _group(quant.get("group_size", 128), "group_size", hidden_size)
    sym = quant.get("sym", True) is not False
    fmt = _fmt(f"gptq int{bits} g{group}" + ("" if sym else " zero points"), bits, group, model_bits + (0 if sym else bits))
    groups = ((("Linear",), fmt),)
    ignore = _names(quant.get("modules_to_not_convert"), "modules_to_not_convert")
    return QuantRule(method="gptq", groups=groups, expert_groups=groups, ignore=ignore,
                     note=f"weights: GPTQ {bits}-bit, a scale{'' if sym else ' and a zero point'} per {group} inputs "
                          "(quantization_config), embeddings, norms and LM head in the model dtype")


def _awq(quant: dict[str, Any], model_bits: int, hidden_size: int) -> QuantRule:
    # awq_marlin.py::AWQMarlinLinearMethod.create_weights: qweight int32 [in, out / (32 / bits)], qzeros int32
    # [in / group_size, out / (32 / bits)] (converted to marlin's zero points, the same size), scales in the model
    # dtype [in / group_size, out]; AWQMarlinMoEMethod quantizes the routed experts alike. Without zero_point
    # (AWQConfig) no qzeros.
    bits = _count(quant.get("bits", quant.get("w_bit")), "bits", 4)
    group = _group(quant.get("group_size", quant.get("q_group_size", 128)), "group_size", hidden_size)
    zeros = quant.get("zero_point", True) is not False
    fmt = _fmt(f"awq int{bits} g{group}", bits, group, model_bits + (bits if zeros else 0))
    groups = ((("Linear",), fmt),)
    ignore = _names(quant.get("modules_to_not_convert"), "modules_to_not_convert")
    return QuantRule(method="awq", groups=groups, expert_groups=groups, ignore=ignore,
                     note=f"weights: AWQ {bits}-bit, a scale{' and a zero point' if zeros else ''} per {group} inputs "
                          f"(quantization_config), {len(ignore)} modules_to_not_convert, embeddings, norms and LM head "
                          "in the model dtype")


BNB_BLOCK = 64  # bitsandbytes 4-bit: one absmax per 64 values (blocksize of quantize_4bit)
BNB_NESTED_BLOCK = 256  # double quantization: the absmax values quantized to 8 bits in blocks of 256


def _bitsandbytes(quant: dict[str, Any], hidden_size: int, absmax_fp32: bool) -> QuantRule:
    # bitsandbytes.py::BitsAndBytesLinearMethod.create_weights (a pre-quantized checkpoint): 4-bit weights packed
    # two to a uint8, each module's QuantState beside them: an absmax per 64 values, fp32, or with
    # bnb_4bit_use_double_quant (nested) a uint8 absmax per 64 and an fp32 one per 256 of those, until vLLM
    # dequantizes them to fp32 at load (``absmax_fp32``: model_loader/bitsandbytes_loader.py::_dequantize_dq,
    # 0.10.0-0.27.x); 8-bit: int8 weights and an fp32 scale per output row (SCB). Modules in
    # llm_int8_skip_modules stay in the model dtype; BitsAndBytesMoEMethod quantizes the routed experts.
    ignore = _names(quant.get("llm_int8_skip_modules"), "llm_int8_skip_modules")
    if quant.get("load_in_8bit") is True and quant.get("load_in_4bit") is not True:
        fmt, what = _fmt("bnb int8", 8, hidden_size, 32), "8-bit, an fp32 scale per output row"
    else:
        kind = str(quant.get("bnb_4bit_quant_type") or "fp4")
        if quant.get("bnb_4bit_use_double_quant") is True and not absmax_fp32:
            per = BNB_BLOCK * BNB_NESTED_BLOCK
            fmt, what = _fmt(f"bnb {kind}", 4, per, BNB_NESTED_BLOCK * 8 + 32), f"4-bit {kind}, double-quantized absmax"
        else:
            fmt, what = _fmt(f"bnb {kind}", 4, BNB_BLOCK, 32), f"4-bit {kind}, an fp32 absmax per {BNB_BLOCK} values"
    groups = ((("Linear",), fmt),)
    return QuantRule(method="bitsandbytes", groups=groups, expert_groups=groups, ignore=ignore,
                     note=f"weights: bitsandbytes {what} (quantization_config), {len(ignore)} llm_int8_skip_modules, "
                          "embeddings, norms and LM head in the model dtype")


def quant_rule(quant: dict[str, Any] | None, *, model_bits: int, hidden_size: int,
               bnb_absmax_fp32: bool = False) -> QuantRule | None:
    """The rule for a compressed-tensors, ModelOpt, fbgemm_fp8, GPTQ, AWQ or bitsandbytes config; None for any
    other method. ``bnb_absmax_fp32``: the engine dequantizes double-quantized bitsandbytes scales at load."""
    if not isinstance(quant, dict):
        return None
    method = quant.get("quant_method")
    if method == "compressed-tensors":
        return _compressed_tensors(quant, model_bits, hidden_size)
    if method == "modelopt":
        return _modelopt(quant, hidden_size)
    if method == "fbgemm_fp8":
        return _fbgemm_fp8(quant, hidden_size)
    if method == "gptq":
        return _gptq(quant, model_bits, hidden_size)
    if method == "awq":
        return _awq(quant, model_bits, hidden_size)
    if method == "bitsandbytes":
        return _bitsandbytes(quant, hidden_size, bnb_absmax_fp32)
    return None
