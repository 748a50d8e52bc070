"""TensorRT-LLM's memory rules (PyTorch backend, LLM API): one profile.

kv = (total - peak of weights, activations and non-torch memory) x free_gpu_memory_fraction (0.9), in
blocks of tokens_per_block (32): ``tensorrt_llm/llmapi/llm_args.py::KvCacheConfig`` and
``tensorrt_llm/_torch/pyexecutor/_util.py::KvCacheCreator`` (docs/engine-research.md section 3). The
defaults are those of the 1.x KvCacheConfig reference (1.2 and 1.3.0rc27 list the same);
older releases (the TensorRT engine path, 0.x) are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.core.profiles import EngineProfile, chain


@dataclass(frozen=True, kw_only=True)
class TRTLLMRules:
    default_free_fraction: float
    tokens_per_block: int


TRTLLM_PROFILES: tuple[EngineProfile, ...] = chain("trtllm", "TensorRT-LLM", [
    ("1.0", TRTLLMRules(default_free_fraction=0.9, tokens_per_block=32),
     ("the PyTorch backend's KV budget: (total - profiled peak) x free_gpu_memory_fraction 0.9, "
      "tokens_per_block 32 (tensorrt_llm/llmapi/llm_args.py::KvCacheConfig, 1.x)",)),
])
