"""``sglang``: SGLang's token-level KV pools (page size 1 by default).

Sources (sgl-project/sglang, python/sglang/srt/):
- ``mem_cache/memory_pool.py``: ``MHATokenToKVPool`` holds K and V buffers of
  [size + page_size, head_num, head_dim] per layer; ``MLATokenToKVPool`` holds one buffer of
  kv_lora_rank + qk_rope_head_dim per token per layer.
- ``server_args.py``: ``page_size`` defaults to 1.
- Sliding-window layers (``SWAKVPool`` for hybrid SWA models) keep only the window's tokens.
- Mamba/linear layers (``MambaPool``, sized in ``model_runner_kv_cache_mixin.py:handle_max_mamba_cache``):
  conv state of kernel-1 columns in the model dtype plus the temporal (SSM) state in
  ``mamba_ssm_dtype``, float32 by default.
- Cross-layer KV sharing (Gemma 3n, Gemma 4; read in 0.5.23): a KV-shared layer's ``RadixAttention`` is
  given its target's ``layer_id`` and never saves K/V (``models/gemma3n_causal.py``,
  ``models/gemma4_causal.py``), but the pools still hold a buffer for every one of the
  ``num_hidden_layers`` (``model_executor/model_runner_components/layer_setup.py::_compute_model_num_layers``;
  ``configs/model_config.py::get_hybrid_layer_ids`` puts the shared sliding layers in the SWA pool by
  ``layer_types``): the shared layers' bytes are allocated though unused, sized as the layer they read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvplan.core.dtypes import KVDtype, get_dtype
from kvplan.core.engines.vllm import PagedEngine
from kvplan.core.spec import Layer, LinearLayer, ModelSpec, NoCacheLayer


def allocated_layers(spec: ModelSpec, layers: tuple[Layer, ...]) -> tuple[Layer, ...]:
    """``layers`` as SGLang's pools allocate them: a KV-shared layer gets a buffer shaped as the layer it reads."""
    return tuple(spec.layers[x.reads_layer] if isinstance(x, NoCacheLayer) and 0 <= x.reads_layer < len(spec.layers)
                 else x for x in layers)


@dataclass(frozen=True, kw_only=True)
class SGLangEngine(PagedEngine):
    name: str = "sglang"
    block_size: int = 1
    strict_tp: bool = True
    # python/sglang/srt/server_args.py ``--kv-cache-dtype`` choices: auto, fp8_e5m2, fp8_e4m3, bf16/bfloat16
    # (fp4_e2m1 in newer releases, not NVIDIA's nvfp4 layout); ``--page-size`` is any positive integer.
    kv_cache_dtypes: tuple[str, ...] = ("bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2")

    def prepare(self, spec: ModelSpec) -> ModelSpec:
        layers = allocated_layers(spec, spec.layers)
        return spec if layers == spec.layers else dataclasses.replace(spec, layers=layers)

    def linear_state_dtypes(self, layer: LinearLayer, model_dtype: str) -> tuple[KVDtype, KVDtype]:
        conv, _ = super().linear_state_dtypes(layer, model_dtype)
        return conv, get_dtype("fp32")

    def describe_rules(self) -> str:
        return f"SGLang token pool, page size {self.block_size}; MLA latent; SWA layers keep the window"
