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

from dataclasses import dataclass

from kvplan.core.dtypes import KVDtype, get_dtype
from kvplan.core.engines.base import Engine, cdiv
from kvplan.core.spec import Layer, LinearLayer


@dataclass(frozen=True, kw_only=True)
class PagedEngine(Engine):
    """Blocks of ``block_size`` slots; sliding/chunked layers free the blocks they no longer need."""

    frees_out_of_window: bool = True  # vLLM before 0.9.1 (no hybrid manager) keeps every block

    def blocks_held(self, layer: Layer, num_tokens: int) -> int:
        """Blocks for ``num_tokens`` tokens, less the whole blocks the layer's kind skips (vLLM swaps those for
        the null block: the skipped tokens' full blocks, ``single_type_kv_cache_manager.py``)."""
        if num_tokens == 0 or not layer.holds_tokens:
            return 0
        blocks = cdiv(num_tokens, self.block_size)
        if not self.frees_out_of_window:
            return blocks
        return blocks - layer.skipped_tokens(num_tokens) // self.block_size

    def slots_held(self, layer: Layer, num_tokens: int) -> int:
        return self.blocks_held(layer, num_tokens) * self.block_size


@dataclass(frozen=True, kw_only=True)
class VLLMEngine(PagedEngine):
    name: str = "vllm"
    block_size: int = 16
    strict_tp: bool = True
    # vllm/config/cache.py: ``BlockSize = Literal[1, 8, 16, 32, 64, 128, 256]``; ``CacheDType``: auto,
    # bfloat16, fp8, fp8_e4m3, fp8_e5m2 (plus backend formats kvplan sizes as fp8). fp16/fp32 caches
    # come from ``auto`` with a model of that dtype. fp8_ds_mla (0.11.0+) and the per-token-head formats
    # (0.20.0+) have their own page layouts; the release's profile says which it has (layout_kv_dtypes).
    kv_cache_dtypes: tuple[str, ...] = ("bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla",
                                        "fp8_per_token_head", "int8_per_token_head")
    block_sizes: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256)
    replicated_group_families: tuple[str, ...] = ("mamba2",)

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

    def describe_rules(self) -> str:
        windows = ("sliding/chunked layers free out-of-window blocks" if self.frees_out_of_window
                   else "sliding layers keep every block (no hybrid KV cache manager)")
        return f"vLLM paged blocks of {self.block_size} tokens; {windows}"
