"""``fit``: dispatch to the engine's budget, and what to change when it does not fit."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvplan.core.capacity.common import FitRequest, FitResult, check_request
from kvplan.core.engines import get_engine
from kvplan.core.engines.registry import SERVING, entry
from kvplan.core.spec import AttentionLayer
from kvplan.errors import InputError, KvplanError

FITTERS = SERVING  # the engines whose memory budget `fit` plans (kvplan.core.engines.registry)

# what_if proposes tensor parallelism within one node: 8 GPUs on NVLink (HGX/DGX H100, H200, B200 boards);
# beyond that tp crosses nodes, which is a different deployment, not a flag to try.
MAX_TP_IN_NODE = 8
# fewest_gpus searches deployments up to 8 such nodes: pipeline stages span nodes, tensor parallelism stays in one.
MAX_GPUS = 8 * MAX_TP_IN_NODE
# The utilization what_if proposes: kvplan's choice, not an engine default; above it the engines warn or
# fail on fragmentation and on other processes' memory (vLLM's own docs suggest raising toward 0.95).
HIGH_UTILIZATION = 0.95


def fit(req: FitRequest) -> FitResult:
    if req.engine not in FITTERS:
        raise InputError(f"fit knows the budgets of {', '.join(FITTERS)}; not {req.engine!r}")
    check_request(req)
    # the release's block sizes, the engine's KV dtypes
    get_engine(req.engine, block_size=req.block_size, profile=req.engine_profile()).check_kv_dtype(req.kv_dtype)
    return entry(req.engine).load("budget")(req)  # a max_model_len past the model's: the engine's rule (capacity.context)


def with_borderline(req: FitRequest, result: FitResult) -> FitResult:
    """Mark the verdict borderline when the estimates' error bands could flip it (kvplan.core.capacity.margins)."""
    from kvplan.core.capacity import margins

    flips = []
    for direction in (-1, 1):
        alt = margins.shifted(req, result, direction)
        if alt is None:
            return result
        try:
            flips.append(fit(alt).fits != result.fits)
        except KvplanError:
            flips.append(False)
    if not any(flips):
        return result
    settle = " ".join(margins.FLAGS[name] for name in result.estimated if name in margins.FLAGS)
    why = (f"{'fits' if result.fits else 'does not fit'} only while the estimated "
           f"{', '.join(n.replace('_', '-') for n in result.estimated)} memory is within its error band; "
           f"settle it with measured figures: {settle} (from a startup log: `kvplan explain LOG`)")
    return dataclasses.replace(result, borderline=True, borderline_why=why)


@dataclass(frozen=True, kw_only=True)
class WhatIf:
    change: str
    result: FitResult | None
    error: str = ""


def _tp_allowed(req: FitRequest, tp: int) -> bool:
    spec = req.spec
    if spec.num_attention_heads % tp:
        return False
    for layer in spec.layers:
        if isinstance(layer, AttentionLayer):
            kv = layer.num_kv_heads
            if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
                return False
    return True


def _with_tp(req: FitRequest, tp: int) -> FitRequest:
    """``req`` at another tensor-parallel size; measured per-GPU weights are rescaled with it (they were
    measured at req.tp: each GPU then holds req.tp / tp of them), and a measured KV memory is dropped."""
    changes: dict = {"tp": tp}
    if req.weights_memory is not None:
        changes["weights_memory"] = req.weights_memory * req.tp // tp
    if req.kv_cache_memory_bytes is not None:
        changes["kv_cache_memory_bytes"] = None
    return dataclasses.replace(req, **changes)


def _refused_length(req: FitRequest, base: FitResult) -> int:
    """The engine's own longest max_model_len when it refuses to start with the one asked for, else 0."""
    limit = base.context_limit
    if base.context_exceeded and limit is not None and limit.max_model_len and not limit.clamps \
            and not req.allow_long_max_model_len:
        return int(limit.max_model_len)
    return 0


def what_if(req: FitRequest, base: FitResult) -> list[WhatIf]:
    """Alternatives a user can try, each fitted with the same rules."""
    options: list[tuple[str, FitRequest]] = []
    refused = _refused_length(req, base)
    if refused:  # the engine does not start: only the length (or its override) changes that
        shorter = min(refused, base.max_model_len_fit) if base.max_model_len_fit else refused
        options.append((f"--max-model-len {shorter}", dataclasses.replace(req, max_model_len=shorter)))
        options.append(("--allow-long-max-model-len", dataclasses.replace(req, allow_long_max_model_len=True)))
        return _fitted(options)
    if base.kv_dtype not in ("fp8_e4m3", "fp8_e5m2", "fp8_ds_mla", "int4", "nvfp4"):
        options.append(("--kv-cache-dtype fp8", dataclasses.replace(req, kv_dtype="fp8")))
    for tp in (req.tp * 2, req.tp * 4):
        if tp <= MAX_TP_IN_NODE and _tp_allowed(req, tp):
            label = f"--tensor-parallel-size {tp}" + (" (measured weights scaled)" if req.weights_memory else "")
            options.append((label, _with_tp(req, tp)))
    if 0 < base.max_model_len_fit < base.max_model_len:
        options.append((f"--max-model-len {base.max_model_len_fit}",
                        dataclasses.replace(req, max_model_len=base.max_model_len_fit)))
    if base.breakdown.cuda_graph and not req.enforce_eager and (_graphs_in_budget(req) or any(
            r.startswith("CUDA graphs") for r in base.reasons)):
        options.append(("--enforce-eager", dataclasses.replace(req, enforce_eager=True, cuda_graph_memory=None)))
    util = next((v for k, v in base.settings.items()
                 if k in ("gpu_memory_utilization", "mem_fraction_static", "free_gpu_memory_fraction")), None)
    if util is not None and float(util) < HIGH_UTILIZATION:
        options.append((f"--gpu-memory-utilization {HIGH_UTILIZATION}",
                        dataclasses.replace(req, gpu_memory_utilization=HIGH_UTILIZATION)))
    if req.weights_memory is None and req.weight_dtype in ("auto", "bf16", "fp16") and base.weight_dtype in ("bf16", "fp16"):
        options.append(("--weight-dtype fp8 (an FP8 checkpoint)", dataclasses.replace(req, weight_dtype="fp8")))
    return _fitted(options)


def _fitted(options: list[tuple[str, FitRequest]]) -> list[WhatIf]:
    out = []
    for label, alt in options:
        try:
            out.append(WhatIf(change=label, result=fit(alt)))
        except KvplanError as exc:
            out.append(WhatIf(change=label, result=None, error=str(exc)))
    return out


@dataclass(frozen=True, kw_only=True)
class FewestGPUs:
    """The smallest tp x pp deployment that fits with the same settings (None: none up to ``searched_up_to``)."""

    tp: int = 0
    pp: int = 0
    result: FitResult | None = None
    searched_up_to: int = MAX_GPUS
    max_tp: int = MAX_TP_IN_NODE

    @property
    def change(self) -> str:
        return f"-tp {self.tp} -pp {self.pp}" if self.result else ""  # kvplan's (and vLLM's) short flags


def fewest_gpus(req: FitRequest, base: FitResult, alternatives: list[WhatIf]) -> FewestGPUs | None:
    """When neither the deployment nor any single change fits: the fewest GPUs that do, as tp x pp.

    Counts grow one GPU at a time from the given tp x pp; at each count the largest tensor-parallel size
    first (up to MAX_TP_IN_NODE), as the engines split heads (``_tp_allowed``: tp divides the attention heads,
    and divides the KV heads or is a multiple of them; docs/engines.md "Tensor parallelism", vLLM's
    QKVParallelLinear), with pipeline stages over the layers (pp <= layers).
    Measured per-GPU weights are rescaled with the GPU count, a measured KV memory and per-rank memories are
    dropped. None when something already fits, or when the engine refuses the length (more GPUs do not help)."""
    if base.fits or _refused_length(req, base) or any(w.result is not None and w.result.fits for w in alternatives):
        return None
    if req.dp > 1:  # the search shapes one engine (tp x pp); how many engines side by side is the user's choice
        return None
    start = req.tp * req.pp
    for n in range(start + 1, MAX_GPUS + 1):
        if base.breakdown.weights * start > n * req.gpu.memory_bytes:
            continue  # the weights alone, split evenly (what is replicated only adds), overfill every GPU
        for tp in sorted((t for t in range(1, MAX_TP_IN_NODE + 1) if n % t == 0), reverse=True):
            pp = n // tp
            if pp > req.spec.num_layers or not _tp_allowed(req, tp):
                continue
            changes: dict = {"tp": tp, "pp": pp, "gpu_memory_per_rank": None, "kv_cache_memory_bytes": None}
            if req.weights_memory is not None:
                changes["weights_memory"] = req.weights_memory * start // n
            try:
                result = fit(dataclasses.replace(req, **changes))
            except KvplanError:
                continue
            if result.fits:
                return FewestGPUs(tp=tp, pp=pp, result=result)
    return FewestGPUs()


def _graphs_in_budget(req: FitRequest) -> bool:
    """Whether CUDA-graph memory comes out of the KV budget: vLLM from 0.20 (before, graphs are captured
    from the slack after the KV cache is sized and --enforce-eager frees nothing for it)."""
    return req.engine == "vllm" and req.engine_profile().rules.cuda_graphs.subtracted
