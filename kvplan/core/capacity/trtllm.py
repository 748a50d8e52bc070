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

from kvplan.core.capacity import estimates
from kvplan.core.capacity.common import (
    Breakdown,
    FitRequest,
    FitResult,
    GiB,
    given_or_estimate,
    model_weights,
    resolve_kv_dtype,
)
from kvplan.core.engines import get_engine
from kvplan.core.sizing import pp_stages, size_kv, slot_bytes_per_gpu
from kvplan.errors import ConfigError



def fit_trtllm(req: FitRequest) -> FitResult:
    spec, gpu = req.spec, req.gpu
    frac = req.gpu_memory_utilization or req.engine_profile().rules.default_free_fraction
    max_len = req.max_model_len or spec.max_model_len
    if max_len <= 0:
        raise ConfigError(f"{spec.name} gives no maximum context; pass --max-model-len")
    eng = get_engine("trtllm", block_size=req.block_size) if req.block_size else get_engine("trtllm")
    weights, notes = model_weights(req)
    estimated: set[str] = set()
    # TensorRT-LLM's estimation run uses max_num_tokens (8192 by default, llm_args.py BaseLlmArgs); the
    # sampler rows are kvplan's assumption (256), not TensorRT-LLM's max_batch_size (2048).
    a = given_or_estimate(req.activation_memory, "activation", estimated, lambda: estimates.activation_peak_bytes(
        spec, tokens=req.max_num_batched_tokens or 8192, max_num_seqs=req.max_num_seqs or 256, tp=req.tp,
        act_bytes=resolve_kv_dtype(spec, "auto").vector_bytes(1)))
    nt = given_or_estimate(req.non_torch_memory, "non_torch", estimated, lambda: estimates.non_torch_bytes(req.tp, req.pp))
    cg = req.cuda_graph_memory or 0
    pp_stages(spec.num_layers, req.pp)  # validates pp against the layers
    w = req.weights_memory if req.weights_memory is not None else max(weights.per_stage_bytes)  # type: ignore[union-attr]
    kv = req.kv_cache_memory_bytes if req.kv_cache_memory_bytes is not None else int((gpu.memory_bytes - w - a - nt - cg) * frac)
    # bytes of one token slot on the most loaded GPU (fixed linear-attention state aside)
    bytes_per_token = slot_bytes_per_gpu(spec, kv_dtype=req.kv_dtype, tp=req.tp, pp=req.pp)
    tokens = max(0, kv) // bytes_per_token if bytes_per_token else 0
    blocks = tokens // eng.block_size

    def per_request(length: int) -> int:
        return size_kv(spec, eng, batch=1, seq_len=length, kv_dtype=req.kv_dtype, tp=req.tp, pp=req.pp).per_gpu_bytes

    need = per_request(max_len)
    concurrency = max(0, kv) / need if need else 0.0
    lo, hi = 0, max(spec.max_model_len, max_len)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if per_request(mid) <= kv else (lo, mid - 1)
    reasons = []
    if kv <= 0:
        reasons.append(f"weights {w / GiB:.2f} GiB + activation {a / GiB:.2f} GiB + non-torch {nt / GiB:.2f} GiB "
                       f"exceed the GPU's {gpu.memory_bytes / GiB:.2f} GiB (short by {-kv / frac / GiB:.2f} GiB)")
    elif need > kv:
        reasons.append(f"one request of {max_len:,} tokens needs {need / GiB:.2f} GiB of KV cache, {kv / GiB:.2f} GiB "
                       f"available; the longest that fits is {lo:,}")
    if req.concurrency and concurrency < req.concurrency and not reasons:
        reasons.append(f"{req.concurrency} concurrent requests of {max_len:,} tokens do not fit; {concurrency:.2f} do")
    kv_shown = max(0, kv)
    return FitResult(
        engine="trtllm", gpu=gpu, tp=req.tp, pp=req.pp, kv_dtype=resolve_kv_dtype(spec, req.kv_dtype).name,
        weight_dtype=weights.format if weights else "given", max_model_len=max_len,
        breakdown=Breakdown(weights=w, activation=a, non_torch=nt, cuda_graph=cg, kv_cache=kv_shown,
                            unused=max(0, gpu.memory_bytes - w - a - nt - cg - kv_shown)),
        kv_cache_memory_bytes=kv_shown, block_size=eng.block_size, page_size_bytes=eng.block_size * bytes_per_token,
        num_blocks=blocks, kv_cache_tokens=tokens, max_concurrency=concurrency, max_model_len_fit=lo,
        fits=not reasons, reasons=tuple(reasons), estimated=tuple(sorted(estimated)),
        settings={"free_gpu_memory_fraction": frac, "tokens_per_block": eng.block_size}, notes=tuple(notes),
        engine_version=req.engine_profile().version,
        params=weights.params if weights else 0,
    )
