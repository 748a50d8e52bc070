"""``sglang``: SGLang's token-level KV pools (page size 1 by default).

Sources (sgl-project/sglang, python/sglang/srt/):
- ``mem_cache/memory_pool.py``: ``MHATokenToKVPool`` holds K and V buffers of
  [size + page_size, head_num, head_dim] per layer; ``MLATokenToKVPool`` holds one buffer of
  kv_lora_rank + qk_rope_head_dim per token per layer.
- ``server_args.py``: ``page_size`` defaults to 1.
- Sliding-window layers (``SWAKVPool`` for hybrid SWA models) keep only the window's tokens.
- Mamba/linear layers (``MambaPool``, sized in ``model_runner_kv_cache_mixin.py:handle_max_mamba_cache``):
  conv state of kernel-1 columns plus the temporal (SSM) state. Dtypes (0.5.10:
  ``configs/mamba_utils.py::mamba2_state_dtype``): conv ``SGLANG_MAMBA_CONV_DTYPE`` (``environ.py``
  default bfloat16, whatever the model dtype), temporal the config's ``mamba_ssm_dtype`` (Qwen3.5:
  float32), float32 when absent. Shapes (``Mamba2StateShape.create``, ``KimiLinearStateShape.create``,
  each model's ``configs/<model>.py::mamba2_cache_params``): as vLLM's, with groups replicated up to tp
  when tp does not divide them (Mamba-2 and gated delta net, whose key heads are its groups). SGLang
  0.5.10 has no MiniMax-Text-01 / M1 model (``python/sglang/srt/models``): lightning layers are sized
  as its pool would hold them, an estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.core.dtypes import KVDtype, get_dtype
from kvplan.core.engines.vllm import PagedEngine
from kvplan.core.spec import LinearLayer


@dataclass(frozen=True, kw_only=True)
class SGLangEngine(PagedEngine):
    name: str = "sglang"
    block_size: int = 1
    strict_tp: bool = True
    # python/sglang/srt/server_args.py ``--kv-cache-dtype`` choices: auto, fp8_e5m2, fp8_e4m3, bf16/bfloat16
    # (fp4_e2m1 in newer releases, not NVIDIA's nvfp4 layout); ``--page-size`` is any positive integer.
    kv_cache_dtypes: tuple[str, ...] = ("bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2")

    replicated_group_families: tuple[str, ...] = ("mamba2", "gated_delta_net")

    def linear_state_dtypes(self, layer: LinearLayer, model_dtype: str) -> tuple[KVDtype, KVDtype]:
        return get_dtype("bf16"), get_dtype(layer.ssm_dtype or "fp32")

    def describe_rules(self) -> str:
        return f"SGLang token pool, page size {self.block_size}; MLA latent; SWA layers keep the window"
