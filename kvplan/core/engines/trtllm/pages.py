"""``trtllm``: TensorRT-LLM's paged KV cache manager.

Sources (NVIDIA/TensorRT-LLM):
- ``tensorrt_llm/llmapi/llm_args.py:KvCacheConfig``: ``tokens_per_block`` 32 by default.
- Sliding-window layers use ``max_attention_window``: a cyclic buffer whose blocks are reused; a
  sequence holds cdiv(min(S, W) + sink_bubble, tokens_per_block) blocks
  (``cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp``,
  ``KVCacheManager::calculateMaxBlockRequirementsPerBeam``; sink_bubble is 0 without sink tokens).
- Chunked-local layers: no chunk-aware freeing was found in the KV cache manager (chunking is a mask
  in the attention kernel), so they are sized as full attention. An estimate; see docs/engines.md.
- MLA (DeepSeek) caches the compressed latent, kv_lora_rank + qk_rope_head_dim, as one head
  replicated on every rank (``_torch/pyexecutor/resource_manager.py``, cache type SELFKONLY).
- Heads per rank: ceil(num_kv_heads / tp), so a head is replicated when tp exceeds the KV heads.
- DeepSeek Sparse Attention's indexer cache and DeepSeek-V4's compressed attention: kvplan has not read how
  TensorRT-LLM stores them, so it refuses to size them rather than guess.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kvplan.core.dtypes import KVDtype
from kvplan.core.engines.base import PagedEngine, cdiv
from kvplan.core.spec import CompressedLayer, Layer, MLALayer
from kvplan.errors import InputError

_UNREAD = ("kvplan has not read TensorRT-LLM's {what} cache layout; use --engine vllm, sglang or ideal for this "
           "model")


@dataclass(frozen=True, kw_only=True)
class TRTLLMEngine(PagedEngine):
    name: str = "trtllm"
    block_size: int = 32
    strict_tp: bool = True
    # tensorrt_llm/llmapi/llm_args.py ``KvCacheConfig.dtype``: auto, fp8, nvfp4 (and int8 with the
    # TensorRT backend's quantization); no int4 KV cache.
    kv_cache_dtypes: tuple[str, ...] = ("bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "int8", "nvfp4")

    def under(self, rules: Any, *, block_size: int | None) -> TRTLLMEngine:
        """The release's tokens_per_block unless a block size was asked."""
        return self if block_size is not None else dataclasses.replace(self, block_size=rules.tokens_per_block)

    def blocks_held(self, layer: Layer, num_tokens: int) -> int:
        """A sliding layer is a cyclic buffer of min(S, W) tokens in blocks; chunked-local layers are sized as
        full attention (no chunk-aware freeing was found: an estimate, docs/engines.md)."""
        if not layer.holds_tokens:
            return 0
        held = min(num_tokens, layer.sliding_window) if layer.sliding_window else num_tokens
        return cdiv(held, self.block_size)

    def slot_bytes(self, layer: Layer, kv_dtype: KVDtype, tp: int) -> tuple[int, ...]:
        if isinstance(layer, CompressedLayer):
            raise InputError(_UNREAD.format(what="DeepSeek-V4 compressed-attention"))
        if isinstance(layer, MLALayer) and layer.indexer_head_dim:
            raise InputError(_UNREAD.format(what="sparse-attention indexer"))
        return super().slot_bytes(layer, kv_dtype, tp)

    def describe_rules(self) -> str:
        return f"TensorRT-LLM paged blocks of {self.block_size} tokens (tokens_per_block); MLA latent"
