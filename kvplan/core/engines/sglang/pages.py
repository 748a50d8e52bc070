"""``sglang``: SGLang's token-level KV pools (page size 1 by default).

Sources (sgl-project/sglang, python/sglang/srt/):
- ``mem_cache/memory_pool.py``: ``MHATokenToKVPool`` holds K and V buffers of
  [size + page_size, head_num, head_dim] per layer; ``MLATokenToKVPool`` holds one buffer of
  kv_lora_rank + qk_rope_head_dim per token per layer.
- ``server_args.py``: ``page_size`` defaults to 1.
- Sliding-window layers keep only the window's tokens (``SWAKVPool``) **only for the architectures SGLang
  lists as hybrid SWA** (``configs/model_config.py::is_hybrid_swa_model``: 0.5.10 lists Llama 4, gpt-oss,
  MiMo-V2-Flash and Step-3.5; 0.5.23 adds Gemma 4, Granite SWA, DeepSeek-V4, ... and any text config with
  ``is_hybrid_swa``). Every other model's sliding layers (Gemma 2/3/3n, Mistral, OLMo 3, Phi-3) get a buffer
  of the full pool in ``MHATokenToKVPool`` like a full-attention layer: kvplan sizes them as full layers.
- Mamba/linear layers (``MambaPool``, sized in ``model_runner_kv_cache_mixin.py:handle_max_mamba_cache``):
  conv state of kernel-1 columns plus the temporal (SSM) state. Dtypes (0.5.10:
  ``configs/mamba_utils.py::mamba2_state_dtype``): conv ``SGLANG_MAMBA_CONV_DTYPE`` (``environ.py``
  default bfloat16, whatever the model dtype), temporal the config's ``mamba_ssm_dtype`` (Qwen3.5:
  float32), float32 when absent. Shapes (``Mamba2StateShape.create``, ``KimiLinearStateShape.create``,
  each model's ``configs/<model>.py::mamba2_cache_params``): as vLLM's, with groups replicated up to tp
  when tp does not divide them (Mamba-2 and gated delta net, whose key heads are its groups). SGLang
  0.5.10 has no MiniMax-Text-01 / M1 model (``python/sglang/srt/models``): lightning layers are sized
  as its pool would hold them, an estimate.
- Cross-layer KV sharing (Gemma 3n, Gemma 4; read in 0.5.23): a KV-shared layer's ``RadixAttention`` is
  given its target's ``layer_id`` and never saves K/V (``models/gemma3n_causal.py``,
  ``models/gemma4_causal.py``), but the pools still hold a buffer for every one of the
  ``num_hidden_layers`` (``model_executor/model_runner_components/layer_setup.py::_compute_model_num_layers``;
  ``configs/model_config.py::get_hybrid_layer_ids`` puts the shared sliding layers in the SWA pool by
  ``layer_types``): the shared layers' bytes are allocated though unused, sized as the layer they read.
- DeepSeek Sparse Attention (0.5.10 ``mem_cache/memory_pool.py::NSATokenToKVPool``): beside the latent, one
  ``index_k_with_scale_buffer`` per layer of 128 fp8 values + 4 B of fp32 scale (uint8, 132 B a token); the
  page size is forced to 64 (``assert self.page_size == 64`` on CUDA). With an fp8 KV cache the latent is stored
  as 512 fp8 + 4 fp32 scales + 64 bf16 RoPE values = 656 B
  (``model_executor/model_runner_kv_cache_mixin.py::calculate_mla_kv_cache_dim``).
- DeepSeek-V4: SGLang 0.5.10 has no DeepSeek-V4 model (no ``deepseek_v4`` in its source); kvplan refuses it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kvplan.core.dtypes import INDEXER_FP8, KVDtype, get_dtype

from kvplan.core.engines.base import PagedEngine
from kvplan.core.spec import (AttentionLayer, CompressedLayer, Layer, LayerKind, LinearLayer, MLALayer, ModelSpec,
                              NoCacheLayer)
from kvplan.errors import InputError

NSA_PAGE_SIZE = 64  # NSATokenToKVPool: page_size 64 on CUDA (0.5.10 mem_cache/memory_pool.py)


# configs/model_config.py::is_hybrid_swa_model (0.5.23 wheel; the first four are 0.5.10's whole list): the
# architectures whose sliding layers SGLang pools apart with their window.
HYBRID_SWA_ARCHS = frozenset({
    "Llama4ForConditionalGeneration", "GptOssForCausalLM", "MiMoV2FlashForCausalLM", "Step3p5ForCausalLM",
    "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM", "DeepseekV4ForCausalLM", "Step3p7ForConditionalGeneration",
    "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration",
    "LagunaForCausalLM", "InklingForConditionalGeneration",
})


def pools_windows(spec: ModelSpec) -> bool:
    """Whether SGLang keeps sliding layers to their window for this model (its hybrid-SWA list, or a text config
    that opts in with ``is_hybrid_swa``)."""
    archs = spec.raw_config.get("architectures") if isinstance(spec.raw_config, dict) else None
    text = spec.raw_config.get("text_config") if isinstance(spec.raw_config, dict) else None
    opted_in = isinstance(text, dict) and text.get("is_hybrid_swa") is True
    return opted_in or spec.raw_config.get("is_hybrid_swa") is True or (
        isinstance(archs, list) and any(a in HYBRID_SWA_ARCHS for a in archs))


def allocated_layers(spec: ModelSpec, layers: tuple[Layer, ...]) -> tuple[Layer, ...]:
    """``layers`` as SGLang's pools allocate them: a KV-shared layer gets a buffer shaped as the layer it reads;
    a sliding layer of a model outside SGLang's hybrid-SWA list gets a full-length buffer."""
    shared = tuple(spec.layers[x.reads_layer] if isinstance(x, NoCacheLayer) and 0 <= x.reads_layer < len(spec.layers)
                   else x for x in layers)
    if pools_windows(spec):
        return shared
    return tuple(dataclasses.replace(x, kind=LayerKind.FULL, window=0)
                 if isinstance(x, AttentionLayer) and x.kind is LayerKind.SLIDING else x for x in shared)


@dataclass(frozen=True, kw_only=True)
class SGLangEngine(PagedEngine):
    name: str = "sglang"
    block_size: int = 1
    strict_tp: bool = True
    # python/sglang/srt/server_args.py ``--kv-cache-dtype`` choices: auto, fp8_e5m2, fp8_e4m3, bf16/bfloat16
    # (fp4_e2m1 in newer releases, not NVIDIA's nvfp4 layout); ``--page-size`` is any positive integer.
    kv_cache_dtypes: tuple[str, ...] = ("bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2")

    def model_block_size(self, spec: ModelSpec, block_size: int | None, profile: Any) -> tuple[int | None, str | None]:
        """Sparse-attention (NSA) models are paged by NSA_PAGE_SIZE; a sliding-window model SGLang does not pool
        as hybrid SWA keeps every token (a note, the block size unchanged)."""
        if block_size is None and any(isinstance(x, MLALayer) and x.indexer_head_dim for x in spec.layers):
            return NSA_PAGE_SIZE, (f"SGLang pages sparse-attention (NSA) models by {NSA_PAGE_SIZE} tokens "
                                   "(NSATokenToKVPool)")
        if any(getattr(x, "sliding_window", 0) for x in spec.layers) and not pools_windows(spec):
            return block_size, ("SGLang pools this architecture's sliding-window layers at full length (it is not in "
                                "SGLang's hybrid-SWA list, configs/model_config.py::is_hybrid_swa_model): they hold "
                                "every token")
        return block_size, None

    def prepare(self, spec: ModelSpec) -> ModelSpec:
        layers = allocated_layers(spec, spec.layers)
        return spec if layers == spec.layers else dataclasses.replace(spec, layers=layers)
    replicated_group_families: tuple[str, ...] = ("mamba2", "gated_delta_net")

    def linear_state_dtypes(self, layer: LinearLayer, model_dtype: str) -> tuple[KVDtype, KVDtype]:
        return get_dtype("bf16"), get_dtype(layer.ssm_dtype or "fp32")

    def indexer_slot_bytes(self, layer: MLALayer | CompressedLayer, kv_dtype: KVDtype) -> int:
        return INDEXER_FP8.vector_bytes(layer.indexer_head_dim) if layer.indexer_head_dim else 0

    def slot_bytes(self, layer: Layer, kv_dtype: KVDtype, tp: int) -> tuple[int, ...]:
        if isinstance(layer, CompressedLayer):
            raise InputError("SGLang 0.5.10 has no DeepSeek-V4 model; use --engine vllm (or ideal, hf)")
        if isinstance(layer, MLALayer) and layer.indexer_head_dim and kv_dtype.name == "fp8_e4m3":
            kv_dtype = get_dtype("fp8_ds_mla")  # NSA's scaled fp8 latent: 656 B (calculate_mla_kv_cache_dim)
        return super().slot_bytes(layer, kv_dtype, tp)

    def compressed_sequence_bytes(self, layer: CompressedLayer, num_tokens: int, kv_dtype: KVDtype,
                                  model_dtype: str) -> int:
        raise InputError("SGLang 0.5.10 has no DeepSeek-V4 model; use --engine vllm (or ideal, hf)")

    def describe_rules(self) -> str:
        return f"SGLang token pool, page size {self.block_size}; MLA latent; sliding layers keep the window only for its hybrid-SWA architectures"
