"""``hf``: what Hugging Face transformers' ``DynamicCache`` holds while decoding.

Source: transformers v5.23 ``src/transformers/cache_utils.py``.

- ``DynamicLayer`` (full attention) concatenates each step's K/V: S tokens of storage.
- ``DynamicSlidingWindowLayer`` (sliding *and* chunked layers: ``DYNAMIC_LAYER_TYPE_MAPPING`` maps
  ``chunked_attention`` to it with ``sliding_window = attention_chunk_size``) concatenates the new
  token onto the kept window and then keeps a *view* of the last W-1 tokens. The view keeps the whole
  concatenated tensor alive, so after a decode step the storage is min(S, W) tokens. Chunked layers
  therefore hold a sliding window of C tokens, not the current chunk.
- MLA (``models/deepseek_v3/modeling_deepseek_v3.py``, ``DeepseekV3Attention.forward``: "Cache
  read / write is performed while latent KV is still compressed"): the cache's keys are the
  kv_lora_rank latent and its values the shared RoPE key, one head each, so the latent is what is
  held. (transformers 4.x decompressed first and cached per-head K and V: 128 x (192 + 128)
  elements per token per layer for DeepSeek-V3; ``kvplan show`` prints that expanded figure.)
- Falcon with ``new_decoder_architecture`` (40B/180B) broadcasts its K/V heads to every query head
  before caching (``models/falcon/modeling_falcon.py``): 128 heads cached for Falcon-40B, not 8.
- DeepSeek Sparse Attention (``models/deepseek_v32/modeling_deepseek_v32.py``, ``DeepseekV32Indexer``;
  ``DynamicIndexedLayer``): the lightning indexer's keys (``index_head_dim``, the model dtype) are concatenated
  per token beside the latent, ``indexer_keys`` [batch, tokens, index_head_dim]. GLM-5's "shared" layers
  (``models/glm_moe_dsa``) have no indexer and cache none.
- DeepSeek-V4 (``models/deepseek_v4/modeling_deepseek_v4.py``, ``DeepseekV4HCACache``/``DeepseekV4CSACache``):
  the window is a ``DynamicSlidingWindowLayer`` whose keys and values are one tensor (K=V): min(S, W) tokens of
  head_dim; a layer without a compressor (compress ratio 0) gets the plain ``DynamicSlidingWindowLayer``, which
  stores the same K=V states twice, as keys and as values. Compressed entries (``compressed_kv``) and the CSA indexer's (at index_head_dim) are concatenated:
  floor(S / m). The compressor's buffer is a *view* of the last concatenation, so after a decode step it holds
  ((S - 1) mod m) + 1 tokens of kv and gate (2 x head_dim each with CSA's overlap); CSA also keeps the last
  closed window's first half (``overlap_kv``/``overlap_gate``, m x head_dim each) once a window has closed. From
  5.24 the overlap gates are float32 (``position_bias`` is a float32 parameter added to the gate before
  ``update_overlap_state`` keeps it; kvplan.core.engines.hf.profiles), 5.23 kept them in the model dtype.
- Linear attention (``LinearAttentionLayer``): conv state of the full kernel width (the cache pads
  the prefill to ``conv_kernel_size`` columns) plus the recurrent state. The gated-delta-net
  recurrent state is float32 whatever the model dtype: ``torch_chunk_gated_delta_rule`` in
  ``models/qwen3_next/modeling_qwen3_next.py`` computes in float32 and returns that state.
- The other mixers, each checked byte for byte (tests/validate/test_hf_cache_hybrid.py): Kimi Delta
  Attention keeps its recurrent state in float32 (``models/kimi_linear/modeling_kimi_linear.py``
  casts ``last_recurrent_state.to(torch.float32)`` before ``update_recurrent_state``); Mamba-2
  (``models/nemotron_h``, ``granitemoehybrid``, ``falcon_h1``, ``bamba``) caches the scan's final
  state, which the chunked scan returns in float32; Qwen3.5's gated delta net is Qwen3-Next's (float32); Jamba's
  Mamba-1 scan (``models/jamba/modeling_jamba.py``, the torch ``selective_scan``) builds ``deltaB_u`` in float32
  and caches its final ``ssm_state`` through ``update_recurrent_state`` as it is: float32 (5.23 and 5.24 alike).
  MiniMax lightning attention keeps its K^T V matrix in the model dtype in ``MiniMaxCache.linear_cache``
  (``models/minimax/modeling_minimax.py``, a cache of its own, not ``DynamicCache``); LFM2's short
  convolutions keep only the conv state (``models/lfm2/modeling_lfm2.py``, ``Lfm2ShortConv``).
- Falcon-H1 caches attention and Mamba-2 in one "hybrid" layer
  (``LinearAttentionAndFullAttentionLayer``): both counted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kvplan.core.dtypes import KVDtype, get_dtype
from kvplan.core.engines.base import Engine
from kvplan.core.spec import AttentionLayer, CompressedLayer, Layer, LinearLayer, ModelSpec

# Mixers whose recurrent state transformers keeps in float32 whatever the model dtype (see above).
_FP32_STATE_FAMILIES = frozenset({"gated_delta_net", "kda", "mamba2", "mamba"})


@dataclass(frozen=True, kw_only=True)
class HFEngine(Engine):
    name: str = "hf"
    linear_conv_keeps_full_kernel: bool = True
    # The newest profile's rules (kvplan.core.engines.hf.profiles); get_engine sets them from the release's profile.
    csa_overlap_gate_fp32: bool = True

    def under(self, rules: Any, *, block_size: int | None) -> HFEngine:
        return dataclasses.replace(self, mla_latent=rules.mla_latent, csa_overlap_gate_fp32=rules.csa_overlap_gate_fp32)

    def prepare(self, spec: ModelSpec) -> ModelSpec:
        if "hf_kv_broadcast" not in spec.quirks:
            return spec
        layers = tuple(
            dataclasses.replace(layer, num_kv_heads=spec.num_attention_heads) if isinstance(layer, AttentionLayer) else layer
            for layer in spec.layers
        )
        return dataclasses.replace(spec, layers=layers)

    def linear_state_dtypes(self, layer: LinearLayer, model_dtype: str) -> tuple[KVDtype, KVDtype]:
        conv, state = super().linear_state_dtypes(layer, model_dtype)
        if layer.family in _FP32_STATE_FAMILIES:
            state = get_dtype("fp32")
        return conv, state

    def slots_held(self, layer: Layer, num_tokens: int) -> int:
        """Sliding and chunked layers are both DynamicSlidingWindowLayer: the last ``window`` tokens' storage."""
        if layer.window:
            return min(num_tokens, layer.window)
        return super().slots_held(layer, num_tokens)

    def compressed_sequence_bytes(self, layer: CompressedLayer, num_tokens: int, kv_dtype: KVDtype,
                                  model_dtype: str) -> int:
        """DeepSeek-V4 in transformers after a decode step (see the module docstring); everything in the model
        dtype."""
        vec = kv_dtype.vector_bytes
        held = min(num_tokens, layer.window) * vec(layer.head_dim)
        m = layer.compress_ratio
        if not m:
            return 2 * held  # plain DynamicSlidingWindowLayer: keys and values, two copies of K=V
        entries = layer.entries(num_tokens)
        held += entries * (vec(layer.head_dim) + (vec(layer.indexer_head_dim) if layer.indexer_head_dim else 0))
        buffered = (num_tokens - 1) % m + 1
        held += 2 * buffered * vec(layer.compressor_channels)
        if layer.indexer_head_dim:
            held += 2 * buffered * vec(2 * layer.indexer_head_dim)
        if layer.overlap and entries:  # the last closed window's first half: kv, and gate (float32 from 5.24)
            gate = get_dtype("fp32").vector_bytes if self.csa_overlap_gate_fp32 else vec
            held += m * (vec(layer.head_dim) + gate(layer.head_dim))
            if layer.indexer_head_dim:
                held += m * (vec(layer.indexer_head_dim) + gate(layer.indexer_head_dim))
        return held

    def describe_rules(self) -> str:
        return "transformers DynamicCache: full layers S tokens, sliding/chunked min(S, W), MLA latent"
