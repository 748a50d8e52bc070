"""TensorRT-LLM's memory budget (PyTorch backend).

Sources (NVIDIA/TensorRT-LLM; details in docs/engine-research.md):
- ``tensorrt_llm/_torch/pyexecutor/_util.py`` (KvCacheCreator): after an estimation run the KV cache
  gets ``free_gpu_memory_fraction`` (0.9) of the memory left after the peak of weights, activations
  and non-torch memory: kv = (total - peak) x 0.9; max_tokens = kv // bytes per token;
  blocks = max_tokens // tokens_per_block (32).
- Bytes per token: every layer's K and V heads on this rank (``get_cache_size_per_token``); the MLA
  latent is one replicated head. Sliding layers hold at most their window's blocks (cyclic).
"""

from __future__ import annotations

import dataclasses
import math

from kvplan.core.capacity import estimates
from kvplan.core.capacity.budget import Capacity, Components, EngineBudget, Setup, Stage, run_budget
from kvplan.core.capacity.common import FitRequest, FitResult, GiB, resolve_kv_dtype
from kvplan.core.capacity.context import ContextLimit, config_length, rope_factor, rope_type
from kvplan.core.engines import get_engine
from kvplan.core.sizing import size_kv, slot_bytes_per_gpu


# TensorRT-LLM (PyTorch backend) starts with its inferred max_seq_len when the one given is longer, with a
# warning (tensorrt_llm/_torch/pyexecutor/model_engine.py::PyTorchModelEngine._init_max_seq_len, read at
# NVIDIA/TensorRT-LLM@001e67005b4f). Inferred (_infer_max_seq_len_from_config): the top-level config's
# max_position_embeddings (else text_config's, else 2048) times rope_scaling's factor unless the rope type is
# su, longrope, llama3 or yarn, rounded up. Later sources keep the longer value when TLLM_ALLOW_LONG_MAX_MODEL_LEN=1
# (same function; NVIDIA's 1.3.0rc9 deployment guides set it). A model class with its own infer_max_seq_len
# (multimodal models) decides for itself: not derived here.
_TRTLLM_UNSCALED = ("su", "longrope", "llama3", "yarn")


def trtllm_context_limit(context: dict, raw_config: dict) -> ContextLimit | None:
    """TensorRT-LLM's inferred max_seq_len for a model's config (``ModelSpec.context_config``, ``raw_config``)."""
    length = config_length(context, "max_position_embeddings")
    if length is None:
        return None
    limit = ContextLimit(engine="TensorRT-LLM", max_model_len=length, source="max_position_embeddings",
                         override="TLLM_ALLOW_LONG_MAX_MODEL_LEN=1", clamps=True)
    if isinstance(raw_config.get("text_config"), dict):
        return dataclasses.replace(limit, max_model_len=0, source="a multimodal config: the model class infers it")
    scaling = context.get("rope_scaling")
    if scaling is None and rope_factor(context.get("rope_parameters")) not in (None, 1.0):
        return dataclasses.replace(limit, max_model_len=0, source="RoPE factor in rope_parameters")
    factor = rope_factor(scaling)
    if factor is None or factor == 1 or rope_type(scaling) in _TRTLLM_UNSCALED:  # type: ignore[arg-type]
        return limit
    return dataclasses.replace(limit, max_model_len=math.ceil(length * factor),
                               source=f"max_position_embeddings x RoPE factor {factor:g}")


class TRTLLMBudget(EngineBudget):
    engine = "trtllm"
    per_stage = False  # one budget: the most loaded GPU (the largest stage's weights)

    def default_utilization(self, req: FitRequest, profile) -> float:
        return profile.rules.default_free_fraction

    def context_limit(self, req: FitRequest) -> ContextLimit | None:
        return trtllm_context_limit(req.spec.context_config, req.spec.raw_config)

    def prepare(self, req: FitRequest, profile, utilization: float, max_model_len: int):
        return (get_engine("trtllm", block_size=req.block_size) if req.block_size else get_engine("trtllm")), []

    def activation(self, req: FitRequest, setup: Setup, last_stage: bool, *, first_stage: bool = True) -> int:
        # TensorRT-LLM's estimation run uses max_num_tokens (8192 by default, llm_args.py BaseLlmArgs); the
        # sampler rows are kvplan's assumption (256), not TensorRT-LLM's max_batch_size (2048).
        return estimates.activation_peak_bytes(
            req.spec, tokens=req.max_num_batched_tokens or 8192, max_num_seqs=req.max_num_seqs or 256, tp=req.tp,
            act_bytes=resolve_kv_dtype(req.spec, "auto").vector_bytes(1))

    # CUDA graphs: not estimated (the base's 0); a measured figure is subtracted like the other components.

    def kv_memory(self, req: FitRequest, setup: Setup, memory_bytes: int, c: Components) -> int:
        return int((memory_bytes - c.weights - c.activation - c.non_torch - c.cuda_graph) * setup.utilization)

    def capacity(self, req: FitRequest, setup: Setup, stages: list[Stage]) -> Capacity:
        spec, eng, frac, max_len = req.spec, setup.engine, setup.utilization, setup.max_model_len
        (stage,) = stages
        kv, c = stage.kv_bytes, stage.components
        # bytes of one token slot on the most loaded GPU (fixed linear-attention state aside)
        bytes_per_token = slot_bytes_per_gpu(spec, kv_dtype=req.kv_dtype, tp=req.tp, pp=req.pp)
        tokens = max(0, kv) // bytes_per_token if bytes_per_token else 0

        def per_request(length: int) -> int:
            return size_kv(spec, eng, batch=1, seq_len=length, kv_dtype=req.kv_dtype, tp=req.tp, pp=req.pp).per_gpu_bytes

        need = per_request(max_len)
        concurrency = max(0, kv) / need if need else 0.0
        lo, hi = 0, max_len  # the longest context one request can have, up to max_model_len (FitResult)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if per_request(mid) <= kv else (lo, mid - 1)
        reasons = []
        if kv <= 0:
            reasons.append(f"weights {c.weights / GiB:.2f} GiB + activation {c.activation / GiB:.2f} GiB + non-torch "
                           f"{c.non_torch / GiB:.2f} GiB exceed the GPU's {stage.memory_bytes / GiB:.2f} GiB "
                           f"(short by {-kv / frac / GiB:.2f} GiB)")
        elif need > kv:
            reasons.append(f"one request of {max_len:,} tokens needs {need / GiB:.2f} GiB of KV cache, {kv / GiB:.2f} "
                           f"GiB available; the longest that fits: --max-model-len {lo}")
        return Capacity(
            stage=stage, max_model_len=max_len, kv_cache_bytes=max(0, kv), block_size=eng.block_size,
            page_size_bytes=eng.block_size * bytes_per_token, num_blocks=tokens // eng.block_size,
            kv_cache_tokens=tokens, max_concurrency=concurrency, max_model_len_fit=lo, reasons=tuple(reasons),
            settings={"free_gpu_memory_fraction": frac, "tokens_per_block": eng.block_size})


TRTLLM_BUDGET = TRTLLMBudget()


def fit_trtllm(req: FitRequest) -> FitResult:
    return run_budget(req, TRTLLM_BUDGET)
