"""KV-cache element formats: bits per element and the scale bytes a format carries.

No dtype width is written anywhere else in kvplan: everything asks this table.

Sources:
- fp32/bf16/fp16: IEEE 754 / bfloat16 widths.
- fp8 (e4m3, e5m2): OCP 8-bit floating point spec; vLLM stores one scale per layer for K and one
  for V (``k_scale``/``v_scale`` in vllm/attention/layer.py), not per token, so no per-token bytes.
- int8, int4: LMDeploy's online KV quantization (docs/en/quantization/kv_quant.md, ``quant_policy``
  8 and 4): asymmetric, per-token per-head, one fp16 scale and one fp16 zero point per head vector.
- nvfp4: NVIDIA "Introducing NVFP4" (2025): 4-bit E2M1 values, one FP8 E4M3 scale per block of 16
  values, plus one FP32 scale per tensor (not per token).
- fp8_per_token_head, int8_per_token_head: vLLM's per-token-head quantized caches (from 0.20.0): the
  dense 8-bit page plus one fp32 scale per token, head and K/V, i.e. 2 x block x kv_heads x 4 B a page
  (0.20.0: vllm/v1/kv_cache_interface.py::AttentionSpec.page_size_bytes).
- fp8_ds_mla: vLLM's sparse-MLA layout for DeepSeek V3.2 (from 0.11.0): 656 B per token per layer,
  512 fp8 latent values + 4 fp32 scales (one per 128 values) + 64 bf16 RoPE values
  (0.11.0: vllm/v1/kv_cache_interface.py::MLAAttentionSpec.page_size_bytes, ``block_size * 656``).
- INDEXER_FP8 (not a KV dtype a user picks): DeepSeek Sparse Attention's lightning-indexer key cache, fp8 values
  with one fp32 scale per 128 (``quant_block_size``): 128 + 4 = 132 B per 128-element key. vLLM 0.33.0
  vllm/models/deepseek_v32/attention.py::DeepseekV32Indexer (``head_dim + head_dim // quant_block_size * 4``
  uint8) and SGLang 0.5.10 python/sglang/srt/mem_cache/memory_pool.py::NSATokenToKVPool
  (``index_k_with_scale_buffer``, uint8).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kvplan.errors import InputError


class ScaleGranularity(str, Enum):
    NONE = "none"  # no scales at all (plain floats)
    TENSOR = "tensor"  # a few scales per layer: constant, not per token
    VECTOR = "vector"  # one set of scale bytes per stored head vector (per token, per head)
    GROUP = "group"  # one set of scale bytes per `group_elems` consecutive elements


@dataclass(frozen=True, kw_only=True)
class KVDtype:
    name: str
    bits: int
    scale: ScaleGranularity = ScaleGranularity.NONE
    scale_bytes: int = 0  # bytes per vector (VECTOR) or per group (GROUP)
    group_elems: int = 0  # elements per scale group (GROUP only)
    # A kernel's fixed token layout (fp8_ds_mla): every vector of ``fixed_for_elems`` elements takes
    # ``fixed_vector_bytes``, mixed widths and scales included; other vector lengths have no layout.
    fixed_vector_bytes: int = 0
    fixed_for_elems: int = 0
    description: str = ""

    def data_bytes(self, num_elems: int) -> int:
        """Bytes of the packed values of one vector of ``num_elems`` elements."""
        return -(-num_elems * self.bits // 8)

    def scale_bytes_for(self, num_elems: int) -> int:
        """Scale (and zero-point) bytes one vector of ``num_elems`` elements carries."""
        if self.scale is ScaleGranularity.VECTOR:
            return self.scale_bytes
        if self.scale is ScaleGranularity.GROUP:
            return -(-num_elems // self.group_elems) * self.scale_bytes
        return 0

    def vector_bytes(self, num_elems: int) -> int:
        """Bytes one stored vector (one token, one head) takes, scales included."""
        if self.fixed_vector_bytes:
            if num_elems != self.fixed_for_elems:
                raise InputError(f"{self.name} is a fixed layout for {self.fixed_for_elems}-element vectors "
                                 f"(MLA latent 512 + RoPE 64); this layer stores {num_elems}: use fp8 or auto")
            return self.fixed_vector_bytes
        return self.data_bytes(num_elems) + self.scale_bytes_for(num_elems)

    @property
    def bytes_per_elem_plain(self) -> int:
        """Whole bytes per element for byte-addressed formats; raises for sub-byte ones."""
        if self.bits % 8:
            raise InputError(f"{self.name} packs {self.bits}-bit values; it has no whole-byte width")
        return self.bits // 8


_DTYPES: dict[str, KVDtype] = {
    d.name: d
    for d in (
        KVDtype(name="fp32", bits=32, description="IEEE float32"),
        KVDtype(name="bf16", bits=16, description="bfloat16"),
        KVDtype(name="fp16", bits=16, description="IEEE float16"),
        KVDtype(name="fp8_e4m3", bits=8, scale=ScaleGranularity.TENSOR, description="FP8 E4M3, per-tensor scale"),
        KVDtype(name="fp8_e5m2", bits=8, scale=ScaleGranularity.TENSOR, description="FP8 E5M2, per-tensor scale"),
        KVDtype(
            name="int8",
            bits=8,
            scale=ScaleGranularity.VECTOR,
            scale_bytes=4,  # fp16 scale + fp16 zero point per token-head (LMDeploy quant_policy=8)
            description="INT8, per-token-head fp16 scale + zero point",
        ),
        KVDtype(
            name="int4",
            bits=4,
            scale=ScaleGranularity.VECTOR,
            scale_bytes=4,  # fp16 scale + fp16 zero point per token-head (LMDeploy quant_policy=4)
            description="INT4, per-token-head fp16 scale + zero point",
        ),
        KVDtype(
            name="nvfp4",
            bits=4,
            scale=ScaleGranularity.GROUP,
            scale_bytes=1,  # one FP8 E4M3 scale ...
            group_elems=16,  # ... per 16 values (NVIDIA NVFP4)
            description="NVFP4 (E2M1), FP8 scale per 16 values",
        ),
        KVDtype(
            name="fp8_per_token_head",
            bits=8,
            scale=ScaleGranularity.VECTOR,
            scale_bytes=4,  # one fp32 scale per token, head and K/V (vLLM 0.20.0 AttentionSpec.page_size_bytes)
            description="FP8, per-token-head fp32 scale (vLLM)",
        ),
        KVDtype(
            name="int8_per_token_head",
            bits=8,
            scale=ScaleGranularity.VECTOR,
            scale_bytes=4,  # one fp32 scale per token, head and K/V (vLLM 0.20.0 AttentionSpec.page_size_bytes)
            description="INT8, per-token-head fp32 scale (vLLM)",
        ),
        KVDtype(
            name="fp8_ds_mla",
            bits=8,
            scale=ScaleGranularity.GROUP,
            scale_bytes=4,  # one fp32 scale ...
            group_elems=128,  # ... per 128 fp8 latent values
            fixed_vector_bytes=512 + 4 * 4 + 64 * 2,  # = 656: fp8 latent, fp32 scales, bf16 RoPE (vLLM 0.11.0)
            fixed_for_elems=512 + 64,
            description="vLLM sparse-MLA layout: 656 B per 512+64 latent",
        ),
    )
}

# The DSA indexer's key format (see the module docstring); engines size indexer keys with it, users cannot pick it.
INDEXER_FP8 = KVDtype(name="fp8_e4m3 + fp32 scale per 128", bits=8, scale=ScaleGranularity.GROUP, scale_bytes=4,
                      group_elems=128, description="DSA lightning-indexer keys: fp8, fp32 scale per 128 values")

_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp8": "fp8_e4m3",  # vLLM: "fp8" means e4m3 on CUDA
    "fp8_e4m3fn": "fp8_e4m3",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
    "fp4": "nvfp4",
}

KV_DTYPE_CHOICES = ("auto", *_DTYPES, *_ALIASES)


def get_dtype(name: str) -> KVDtype:
    """Look a dtype up by kvplan, torch or vLLM name (``fp16``, ``float16``, ``fp8``...)."""
    key = name.strip().lower().removeprefix("torch.")
    key = _ALIASES.get(key, key)
    try:
        return _DTYPES[key]
    except KeyError:
        known = ", ".join(sorted(_DTYPES))
        raise InputError(f"unknown dtype {name!r}; use one of: auto, {known}") from None


def all_dtypes() -> tuple[KVDtype, ...]:
    return tuple(_DTYPES.values())
