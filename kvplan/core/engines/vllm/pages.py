"""``vllm``: vLLM v1's paged KV cache.

Sources (vllm-project/vllm, v1 engine):
- ``vllm/v1/kv_cache_interface.py``: ``AttentionSpec.page_size_bytes`` = block_size x num_kv_heads x
  (head_size + head_size_v) x dtype size; ``MLAAttentionSpec`` stores one head of
  kv_lora_rank + qk_rope_head_dim and no separate V.
- ``vllm/v1/core/single_type_kv_cache_manager.py``: full attention holds ceil(tokens / block_size)
  blocks; ``SlidingWindowManager`` frees (swaps for the null block) every block wholly before
  num_computed_tokens - sliding_window + 1; ``ChunkedLocalAttentionManager`` frees every block wholly
  before the start of the current chunk.
- ``vllm/config/cache.py``: default block_size 16; fp8 KV stores one byte per element with per-layer
  scales only.
- ``vllm/config/model.py:get_num_kv_heads``: max(1, num_kv_heads // tp), and TP must divide the
  heads (or be a multiple of them).
- Mamba/linear layers (``MambaSpec``): one state per request; conv state keeps kernel-1 columns.
- DeepSeek Sparse Attention (V3.2, GLM-5; 0.33.0 ``vllm/models/deepseek_v32/attention.py::DeepseekV32Indexer``):
  the indexer key cache is its own ``MLAAttentionSpec`` of one head of 128 fp8 values + 4 B of fp32 scale, uint8,
  ``max_tp_shards=1`` (every rank holds it): 132 B per token per layer whatever ``--kv-cache-dtype``. Layers
  that reuse another layer's top-k (``index_topk_freq``) have no indexer. The FlashMLA sparse backend takes
  ``--kv-cache-dtype fp8`` as an alias of ``fp8_ds_mla`` (0.33.0 ``vllm/v1/attention/backends/mla/flashmla_sparse.py``
  supported_kv_cache_dtypes): the latent is then 656 B, not 576.
- DeepSeek-V4 (0.33.0 ``vllm/models/deepseek_v4/attention.py``, ``compressor.py``,
  ``vllm/v1/attention/backends/mla/sparse_swa.py``): per layer, replicated on every rank, a sliding-window cache
  (``DeepseekV4SWACache``: 64-token blocks), the compressed entries (``MLAAttentionSpec`` with
  ``tokens_per_state`` = the ratio, 256-token blocks: 256 / ratio entries a block), CSA's indexer keys (132 B an
  entry, 256-token blocks) and the compressors' fp32 state (``CompressorStateCache``: 2 x (1 + overlap) x
  head_dim floats a token over a window of (1 + overlap) x ratio tokens in 4-token (CSA) or 8-token (HCA) blocks;
  the indexer's own compressor at 128). The default FlashMLA sparse backend stores entries in ``fp8_ds_mla``
  (448 fp8 + 64 bf16 RoPE values + 8 B of scales = 584 B; ``--kv-cache-dtype auto`` resolves to it,
  ``_resolve_dsv4_kv_cache_dtype``), every page padded to a multiple of 576 B (``_apply_alignment_padding``).
  Shapes and dtypes per mixer (0.33.0: ``vllm/model_executor/layers/mamba/mamba_utils.py``
  ``MambaStateShapeCalculator`` / ``MambaStateDtypeCalculator``, called from each model's
  ``get_mamba_state_shape_from_config`` / ``get_mamba_state_dtype_from_config``): conv states in the
  model dtype (``mamba_cache_dtype`` auto); recurrent states in the model dtype too
  (``mamba_ssm_cache_dtype`` auto), except Kimi Delta Attention (``kda_state_dtype``: float32 when
  auto), Nemotron-H (``model_executor/models/config.py::NemotronHForCausalLMConfig``: the config's
  ``mamba_ssm_cache_dtype``, float32 by default) and Qwen3.5 (``Qwen3_5ForConditionalGenerationConfig``:
  the config's ``mamba_ssm_dtype``). Mamba-2 groups are replicated up to tp when tp does not divide
  them (``mamba2_state_shape``, ``extra_groups_for_head_shards``). Lightning attention (MiniMax) is
  ``linear_attention_state_shape``: heads x head_dim x head_dim, no conv; vLLM removed the
  MiniMax-Text-01 model class after 0.23.0 (``registry.py`` ``_PREVIOUSLY_SUPPORTED_MODELS``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kvplan.core.dtypes import INDEXER_FP8, KVDtype, get_dtype
from kvplan.core.engines.base import PagedEngine, cdiv
from kvplan.core.spec import CompressedLayer, Layer, LinearLayer, MLALayer, ModelSpec

# DeepSeek-V4 in vLLM 0.33.0 (see the module docstring for each file):
V4_SWA_BLOCK = 64  # DeepseekV4SWACache(block_size=64)
V4_ENTRY_BLOCK = 256  # DeepseekV4SparseMLABackend.get_supported_kernel_block_sizes: [256] tokens a block
V4_STATE_BLOCK = {4: 4, 128: 8}  # CompressorStateCache: C4 states in 4-token blocks, C128 in 8-token blocks
V4_FP8_DS_MLA_STATE_BYTES = 584  # "448B NoPE + 128B RoPE + 8B fp8 scale = 584B per token" (DeepseekV4Attention)
V4_PAGE_ALIGN = 576  # alignment=576 for the fp8_ds_mla layout (every V4 spec), _apply_alignment_padding


def _align(page: int) -> int:
    return cdiv(page, V4_PAGE_ALIGN) * V4_PAGE_ALIGN


def _sliding_blocks(num_tokens: int, window: int, block: int) -> int:
    """Blocks a sliding-window cache holds: all minus those wholly before the window (SlidingWindowManager)."""
    return cdiv(num_tokens, block) - max(0, num_tokens - window) // block if num_tokens else 0


@dataclass(frozen=True, kw_only=True)
class VLLMEngine(PagedEngine):
    name: str = "vllm"
    block_size: int = 16
    strict_tp: bool = True
    # vllm/config/cache.py ``CacheDType``: auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2 (plus backend formats
    # kvplan sizes as fp8). fp16/fp32 caches come from ``auto`` with a model of that dtype. fp8_ds_mla
    # (0.11.0+) and the per-token-head formats (0.20.0+) have their own page layouts; the release's profile
    # says which it has (layout_kv_dtypes), and which block sizes start (VLLMRules.block_sizes).
    kv_cache_dtypes: tuple[str, ...] = ("bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla",
                                        "fp8_per_token_head", "int8_per_token_head")
    replicated_group_families: tuple[str, ...] = ("mamba2",)

    def under(self, rules: Any, *, block_size: int | None) -> VLLMEngine:
        """Before 0.9.1 (no hybrid KV cache manager) a sliding-window layer keeps every block."""
        return dataclasses.replace(self, frees_out_of_window=rules.hybrid_manager)

    def check_block_size(self, block_size: int, profile: Any) -> None:
        """Which block sizes start is a rule of the release (VLLMRules.block_sizes)."""
        from kvplan.core.engines.vllm.profiles import check_block_size, newest

        check_block_size(profile if profile is not None else newest(), block_size)

    def model_block_size(self, spec: ModelSpec, block_size: int | None, profile: Any) -> tuple[int | None, str | None]:
        """MLA models run with the release's forced block size on Hopper (FlashMLA; VLLMRules.mla_block_size);
        DeepSeek-V4's compressed caches with 256-token blocks (kvplan.core.engines.vllm.plan.resolve_block_size)."""
        if any(isinstance(x, CompressedLayer) for x in spec.layers):
            return (block_size or V4_ENTRY_BLOCK,
                    None if block_size else f"vLLM uses {V4_ENTRY_BLOCK}-token blocks for DeepSeek-V4's compressed caches")
        if not any(isinstance(x, MLALayer) for x in spec.layers):
            return block_size, None
        from kvplan.core.engines.vllm.profiles import MlaGivenBlock, mla_block, newest

        rules = (profile if profile is not None else newest()).rules
        sparse = any(isinstance(x, MLALayer) and x.indexer_head_dim for x in spec.layers)
        block, note = mla_block(rules, block_size, sparse=sparse)
        if block_size is None and block != self.block_size:
            note = f"vLLM uses {block}-token blocks for MLA models (FlashMLA)" + (
                "; --block-size overrides" if rules.mla_given_block is MlaGivenBlock.KEPT else "")
        return (block, note) if note else (block_size, None)

    def linear_state_dtypes(self, layer: LinearLayer, model_dtype: str) -> tuple[KVDtype, KVDtype]:
        """Conv in the model dtype; the recurrent state as the model's config class pins it (module docstring)."""
        conv = get_dtype(model_dtype)
        if layer.family == "kda":
            return conv, get_dtype("fp32")
        if layer.family == "mamba2" and layer.ssm_cache_dtype:
            return conv, get_dtype(layer.ssm_cache_dtype)
        if layer.family == "gated_delta_net" and layer.ssm_dtype:
            return conv, get_dtype(layer.ssm_dtype)
        return conv, conv

    def indexer_slot_bytes(self, layer: MLALayer | CompressedLayer, kv_dtype: KVDtype) -> int:
        """The DSA indexer key: 128 fp8 values + an fp32 scale per 128, whatever the KV dtype (132 B)."""
        return INDEXER_FP8.vector_bytes(layer.indexer_head_dim) if layer.indexer_head_dim else 0

    def slot_bytes(self, layer: Layer, kv_dtype: KVDtype, tp: int) -> tuple[int, ...]:
        if isinstance(layer, CompressedLayer):  # one fp8_ds_mla row in the sliding window, on every rank
            return (V4_FP8_DS_MLA_STATE_BYTES,) * tp
        if isinstance(layer, MLALayer) and layer.indexer_head_dim and kv_dtype.name == "fp8_e4m3":
            kv_dtype = get_dtype("fp8_ds_mla")  # the sparse backend's "fp8" is fp8_ds_mla
        return super().slot_bytes(layer, kv_dtype, tp)

    def slots_held(self, layer: Layer, num_tokens: int) -> int:
        if isinstance(layer, CompressedLayer):
            return _sliding_blocks(num_tokens, layer.window, V4_SWA_BLOCK) * V4_SWA_BLOCK
        return super().slots_held(layer, num_tokens)

    def compressed_sequence_bytes(self, layer: CompressedLayer, num_tokens: int, kv_dtype: KVDtype,
                                  model_dtype: str) -> int:
        """Pages one request of ``num_tokens`` tokens holds in one DeepSeek-V4 layer (module docstring)."""
        return sum(held * page for _, held, page in v4_pages(layer, num_tokens))

    def describe_rules(self) -> str:
        windows = ("sliding/chunked layers free out-of-window blocks" if self.frees_out_of_window
                   else "sliding layers keep every block (no hybrid KV cache manager)")
        return f"vLLM paged blocks of {self.block_size} tokens; {windows}"


@dataclass(frozen=True)
class V4Spec:
    """One KV cache spec a DeepSeek-V4 layer registers in vLLM (module docstring): its pages grow with the context
    (``MLAAttentionSpec``: compressed entries, indexer keys) or are bounded by ``window`` tokens
    (``SlidingWindowMLASpec``: the sliding window, the compressors' state); ``block`` tokens a page."""

    grows: bool
    block: int
    window: int
    page: int  # bytes, padded to a multiple of 576 (fp8_ds_mla)
    token_bytes: int = 0  # a window or state cache's bytes a token, before padding

    def page_at(self, block_size: int) -> int:
        """This window or state cache's page at ``block_size`` tokens (as the unified spec without the hybrid
        manager sizes it)."""
        return _align(self.token_bytes * block_size)


def v4_specs(layer: CompressedLayer, block_size: int) -> list[V4Spec]:
    """The specs of one DeepSeek-V4 layer in registration order (read in 0.25.0, 0.26.0 and 0.33.0:
    ``DeepseekV4Attention.__init__`` registers the indexer's key cache and its compressor's state, then the
    sliding-window cache, the compressed entries and the compressor's state). ``block_size``: the compressed
    caches' tokens a block (--block-size; the window and state caches keep their own)."""
    fp32 = get_dtype("fp32")
    m = layer.compress_ratio
    out = []
    if m and layer.indexer_head_dim:
        out.append(V4Spec(True, block_size, 0, _align(block_size // m * INDEXER_FP8.vector_bytes(layer.indexer_head_dim))))
        state = fp32.vector_bytes(2 * 2 * layer.indexer_head_dim)
        out.append(V4Spec(False, 4, 2 * m, _align(4 * state), state))
    out.append(V4Spec(False, V4_SWA_BLOCK, layer.window, _align(V4_SWA_BLOCK * V4_FP8_DS_MLA_STATE_BYTES),
                      V4_FP8_DS_MLA_STATE_BYTES))
    if m:
        out.append(V4Spec(True, block_size, 0, _align(block_size // m * V4_FP8_DS_MLA_STATE_BYTES)))
        coff = 2 if layer.overlap else 1
        state_block = V4_STATE_BLOCK.get(m, 4)
        state = fp32.vector_bytes(2 * coff * layer.head_dim)
        out.append(V4Spec(False, state_block, coff * m, _align(state_block * state), state))
    return out


# v4_pages' cache names whose pages grow with the context (the others are bounded by a window)
V4_GROWING = ("entries", "indexer")


def v4_pages(layer: CompressedLayer, num_tokens: int) -> list[tuple[str, int, int]]:
    """(cache, pages held, page bytes) of each cache of one DeepSeek-V4 layer for one request in vLLM 0.33.0."""
    fp32 = get_dtype("fp32")
    out = [("window", _sliding_blocks(num_tokens, layer.window, V4_SWA_BLOCK),
            _align(V4_SWA_BLOCK * V4_FP8_DS_MLA_STATE_BYTES))]
    m = layer.compress_ratio
    if not m:
        return out
    entries_per_block = V4_ENTRY_BLOCK // m
    out.append(("entries", cdiv(num_tokens, V4_ENTRY_BLOCK), _align(entries_per_block * V4_FP8_DS_MLA_STATE_BYTES)))
    state_block = V4_STATE_BLOCK.get(m, 4)
    coff = 2 if layer.overlap else 1
    out.append(("state", _sliding_blocks(num_tokens, coff * m, state_block),  # kv_state + score_state, fp32
                _align(state_block * fp32.vector_bytes(2 * coff * layer.head_dim))))
    if layer.indexer_head_dim:
        out.append(("indexer", cdiv(num_tokens, V4_ENTRY_BLOCK),
                    _align(entries_per_block * INDEXER_FP8.vector_bytes(layer.indexer_head_dim))))
        out.append(("indexer state", _sliding_blocks(num_tokens, 2 * m, 4),  # its compressor: overlapping, 4-token blocks
                    _align(4 * fp32.vector_bytes(2 * 2 * layer.indexer_head_dim))))
    return out
