"""One budget skeleton for every engine's fit: the shared steps, in order, with the engine's rules plugged in.

Each engine's budget (kvplan.core.engines.vllm.budget, sglang, trtllm) takes the same steps:

1. the release's rules (``req.engine_profile()``) and the utilization: the user's, else the engine's default;
2. the longest context asked for (``--max-model-len``, else the model's), as the engine takes it: past the
   model's it refuses to start, lowers it, or is told to allow it (kvplan.core.capacity.context);
3. the engine's settings for this request (``EngineBudget.prepare``: block size, batch defaults, ...);
4. weights per GPU (measured, else counted by kvplan.core.weights);
5. per pipeline stage (or, for an engine that budgets only its most loaded GPU, once): the activation peak,
   non-torch and CUDA-graph memory, each measured when given, else estimated and recorded in ``estimated``;
   then the KV memory: ``--kv-cache-memory-bytes`` when given, else the engine's own formula;
6. the capacity from the engine's own pool: blocks, tokens, concurrency, the longest max_model_len, and why
   it does not fit (``EngineBudget.capacity``, which also picks the binding stage);
7. the concurrency check, the ``unused`` share and the FitResult.

An engine supplies only the parts that truly differ (``EngineBudget``); the rest is written once here.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from functools import partial
from typing import Any

from kvplan.core.capacity import context, estimates
from kvplan.core.capacity.common import (
    Breakdown,
    draft_weight_bytes,
    lora_stage_bytes,
    expert_ranks,
    FitRequest,
    FitResult,
    given_or_estimate,
    model_weights,
    resolve_kv_dtype,
)
from kvplan.core.capacity.context import ContextLimit
from kvplan.core.sizing import pp_stages
from kvplan.core.spec import Layer
from kvplan.core.weights import WeightBytes
from kvplan.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Setup:
    """What the skeleton resolved before the memory: the release, utilization, context and engine settings."""

    profile: Any  # kvplan.core.profiles.EngineProfile
    utilization: float  # gpu_memory_utilization / mem_fraction_static / free_gpu_memory_fraction
    max_model_len: int
    engine: Any = None  # the engine's own settings (EngineBudget.prepare)
    notes: tuple[str, ...] = ()  # the engine's notes about the settings, after the weights' notes


@dataclass(frozen=True, kw_only=True)
class Components:
    """Bytes on one GPU besides the KV cache, measured or estimated."""

    weights: int
    activation: int
    non_torch: int
    cuda_graph: int
    draft: int = 0  # a speculative drafter's weights (vLLM: on the last pipeline stage), beside the model's
    lora: int = 0  # LoRA adapters' slots (vLLM --enable-lora, SGLang --max-loras-per-batch), beside the weights


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One pipeline stage's budget on its GPU (or the most loaded GPU when the engine budgets only that)."""

    index: int
    layers: tuple[Layer, ...]
    memory_bytes: int  # the GPU memory the engine plans this stage with
    components: Components
    kv_bytes: int  # the KV memory (negative: the components do not leave any)


@dataclass(frozen=True, kw_only=True)
class Capacity:
    """What the engine's pool holds, on the binding stage."""

    stage: Stage  # the binding stage
    max_model_len: int  # the configured length, or what the engine chose (vLLM auto-fit)
    kv_cache_bytes: int  # the KV memory shown in the breakdown
    block_size: int
    page_size_bytes: int
    num_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    max_model_len_fit: int  # up to max_model_len (FitResult.max_model_len_fit)
    reasons: tuple[str, ...] = ()  # why it does not fit, before the concurrency check
    check_concurrency: bool = True  # False: requests are not bounded by the KV pool
    unused: int | None = None  # None: what the components and the KV memory leave of the GPU
    settings: dict[str, float | int | str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    usable_blocks: int = 0
    logged_kv_cache_tokens: int = 0
    logged_capacity_rule: str = ""
    pool_plan: Any = None  # the engine's own plan of the pool (vLLM: its VLLMPlan), for the simulators


class EngineBudget:
    """The parts of a budget that differ by engine; the defaults are what the engines share."""

    engine = ""
    per_stage = True  # False: one budget for the most loaded GPU (the largest stage's weights, all layers)
    draft_in_pool = True  # a speculative drafter's layers share the target's KV pool (False: a pool of their own)

    def default_utilization(self, req: FitRequest, profile: Any) -> float:
        raise NotImplementedError

    def context_limit(self, req: FitRequest) -> ContextLimit | None:
        """The longest max_model_len the engine starts with for this model (kvplan.core.capacity.context)."""
        return None

    def prepare(self, req: FitRequest, profile: Any, utilization: float, max_model_len: int) -> tuple[Any, list[str]]:
        """The engine's settings for this request, and notes about them."""
        return None, []

    def stage_memory(self, req: FitRequest, setup: Setup) -> list[int]:
        """Each pipeline stage's GPU memory."""
        return [req.gpu.memory_bytes] * req.pp

    def activation(self, req: FitRequest, setup: Setup, last_stage: bool, *, first_stage: bool = True) -> int:
        """The activation peak of one GPU of a stage (the first and last stages differ under pipeline parallelism)."""
        raise NotImplementedError

    def non_torch(self, req: FitRequest, setup: Setup) -> int:
        return estimates.non_torch_bytes(req.tp, req.pp)

    def kv_dtype_name(self, req: FitRequest) -> str:
        """The KV cache dtype the engine runs with (``auto``: the model's)."""
        return resolve_kv_dtype(req.spec, req.kv_dtype).name

    def loaded_buffers(self, req: FitRequest, setup: Setup) -> int:
        """Buffers the engine allocates with the weights (in what it logs as the model's load), on every GPU."""
        return 0

    def cuda_graph(self, req: FitRequest, setup: Setup) -> int:
        """Estimated CUDA-graph memory (0: the engine's budget does not count it)."""
        return 0

    def kv_memory(self, req: FitRequest, setup: Setup, memory_bytes: int, c: Components) -> int:
        """The KV memory by the engine's formula (``--kv-cache-memory-bytes`` is handled by the skeleton)."""
        raise NotImplementedError

    def capacity(self, req: FitRequest, setup: Setup, stages: list[Stage]) -> Capacity:
        raise NotImplementedError

    def concurrency_reason(self, req: FitRequest, max_model_len: int, concurrency: float) -> str:
        return f"{req.concurrency} concurrent requests of {max_model_len:,} tokens do not fit; {concurrency:.2f} do"


@dataclass(frozen=True, kw_only=True)
class _Start:
    """Steps 1-4: the setup, the engine's decision on the context, and the weights with the notes so far."""

    setup: Setup
    limit: ContextLimit | None
    started: context.Decision
    weights: WeightBytes | None
    notes: list[str]


def run_budget(req: FitRequest, budget: EngineBudget) -> FitResult:
    """The budget skeleton (the module docstring's steps) under ``budget``'s engine rules."""
    start = _start(req, budget)
    estimated: set[str] = set()
    stages = _stage_budgets(req, budget, start, estimated)
    cap = budget.capacity(req, start.setup, stages)
    return _fit_result(req, budget, start, cap, estimated)


def _start(req: FitRequest, budget: EngineBudget) -> _Start:
    """Steps 1-4: the release and utilization, the context the engine starts with, its settings, the weights."""
    spec = req.spec
    profile = req.engine_profile()
    util = req.gpu_memory_utilization or budget.default_utilization(req, profile)
    if not (req.max_model_len or spec.max_model_len):
        raise ConfigError(f"{spec.name} gives no maximum context; pass --max-model-len")
    limit = budget.context_limit(req)
    started = context.decide(limit, asked=req.max_model_len, default=spec.max_model_len,
                             allow=req.allow_long_max_model_len, model_positions=spec.max_model_len)
    max_len = started.max_model_len
    settings, setup_notes = budget.prepare(req, profile, util, max_len)
    setup = Setup(profile=profile, utilization=util, max_model_len=max_len, engine=settings,
                  notes=tuple(setup_notes))
    weights, notes = model_weights(req)
    notes.extend(setup.notes)
    if started.note:
        notes.append(started.note)
    return _Start(setup=setup, limit=limit, started=started, weights=weights, notes=notes)


def _stage_budgets(req: FitRequest, budget: EngineBudget, start: _Start, estimated: set[str]) -> list[Stage]:
    """Step 5: each stage's components (measured, else estimated and recorded in ``estimated``) and KV memory."""
    spec, setup = req.spec, start.setup
    ranges = pp_stages(spec.num_layers, req.pp)
    memory = budget.stage_memory(req, setup)
    # a speculative drafter's attention layers join the last stage's KV cache where the engine's pool holds them
    # (vLLM runs the drafter on the last stage; SGLang's draft has a pool of its own: SGLangBudget.capacity)
    draft_layers = req.drafter.layers if req.drafter is not None and budget.draft_in_pool else ()
    if budget.per_stage:
        units = [(s, spec.layers[r.start:r.stop] + (draft_layers if s == len(ranges) - 1 else ()),
                  s == len(ranges) - 1) for s, r in enumerate(ranges)]
    else:
        units = [(0, tuple(spec.layers) + draft_layers, True)]
    stages = []
    # the estimates are the same on every stage but activation, which depends only on whether the stage is the
    # first or the last: each worked out once
    non_torch = given_or_estimate(req.non_torch_memory, "non_torch", estimated, partial(budget.non_torch, req, setup))
    cuda_graph = given_or_estimate(req.cuda_graph_memory, "cuda_graph", estimated,
                                   partial(budget.cuda_graph, req, setup))
    peaks: dict[tuple[bool, bool], int] = {}
    buffers = 0 if req.weights_memory is not None else budget.loaded_buffers(req, setup)

    def activation(first: bool, last: bool) -> int:
        if (first, last) not in peaks:
            peaks[first, last] = given_or_estimate(req.activation_memory, "activation", estimated,
                                                   partial(budget.activation, req, setup, last, first_stage=first))
        return peaks[first, last]

    for s, layers, last in units:
        adapters = lora_stage_bytes(req, ranges, s if budget.per_stage else None)
        # vLLM loads the drafter and the LoRA slots inside the profiler that logs "Model loading took": a measured
        # --weights-memory holds them already (gpu_model_runner.py::load_model, 0.11.0 and 0.33.0)
        loaded = req.weights_memory is not None and budget.engine == "vllm"
        c = Components(
            weights=_stage_weights(req, budget, start.weights, s) + buffers + (0 if loaded else adapters.base_growth),
            draft=draft_weight_bytes(req, start.weights) if last and not loaded else 0,
            lora=0 if loaded else adapters.buffers,
            activation=activation(s == 0, last),
            non_torch=non_torch,
            cuda_graph=cuda_graph,
        )
        kv = (req.kv_cache_memory_bytes if req.kv_cache_memory_bytes is not None
              else budget.kv_memory(req, setup, memory[s], c))
        stages.append(Stage(index=s, layers=layers, memory_bytes=memory[s], components=c, kv_bytes=kv))
    return stages


def _stage_weights(req: FitRequest, budget: EngineBudget, weights: WeightBytes | None, s: int) -> int:
    if req.weights_memory is not None:
        return req.weights_memory
    assert weights is not None  # model_weights counts them unless they are given
    return weights.per_stage_bytes[s] if budget.per_stage else max(weights.per_stage_bytes)


def _fit_result(req: FitRequest, budget: EngineBudget, start: _Start, cap: Capacity, estimated: set[str]) -> FitResult:
    """Step 7: the concurrency check, the ``unused`` share and the FitResult."""
    started, weights = start.started, start.weights
    reasons = ([started.reason] if started.reason else []) + list(cap.reasons)  # not starting comes first
    concurrency = cap.max_concurrency
    # --concurrency counts requests over every DP rank, each held by one: cdiv(c, dp) on the busiest rank
    if cap.check_concurrency and req.concurrency and concurrency < -(-req.concurrency // req.dp) and not reasons:
        if req.dp == 1:
            reasons.append(budget.concurrency_reason(req, cap.max_model_len, concurrency))
        else:
            busiest = -(-req.concurrency // req.dp)
            reasons.append(f"{req.concurrency} concurrent requests of {cap.max_model_len:,} tokens over {req.dp} DP "
                           f"ranks put {busiest} on the busiest, which needs {busiest / max(concurrency, 1e-9):.2f}x "
                           f"its KV cache; {math.floor(concurrency)} fit a rank, {req.dp * math.floor(concurrency)} "
                           "in all")
    c = cap.stage.components
    unused = cap.unused
    if unused is None:
        unused = max(0, cap.stage.memory_bytes - c.weights - c.draft - c.lora - c.activation - c.non_torch
                     - c.cuda_graph - cap.kv_cache_bytes)
    return FitResult(
        engine=budget.engine, gpu=req.gpu, tp=req.tp, pp=req.pp, kv_dtype=budget.kv_dtype_name(req),
        weight_dtype=weights.format if weights else "given", max_model_len=cap.max_model_len,
        breakdown=Breakdown(weights=c.weights, activation=c.activation, non_torch=c.non_torch,
                            cuda_graph=c.cuda_graph, kv_cache=cap.kv_cache_bytes, unused=unused, draft_weights=c.draft,
                            lora=c.lora),
        kv_cache_memory_bytes=cap.kv_cache_bytes, block_size=cap.block_size, page_size_bytes=cap.page_size_bytes,
        num_blocks=cap.num_blocks, kv_cache_tokens=cap.kv_cache_tokens, max_concurrency=concurrency,
        max_model_len_fit=cap.max_model_len_fit, fits=not reasons, reasons=tuple(reasons),
        estimated=tuple(sorted(estimated)), settings=cap.settings, notes=(*start.notes, *cap.notes),
        params=weights.params if weights else 0, engine_version=start.setup.profile.version,
        usable_blocks=cap.usable_blocks, logged_kv_cache_tokens=cap.logged_kv_cache_tokens,
        logged_capacity_rule=cap.logged_capacity_rule, context_limit=start.limit,
        context_exceeded=started.exceeded, context_override=req.allow_long_max_model_len, pool_plan=cap.pool_plan,
        dp=req.dp, dcp=req.dcp, dp_attention=req.dp_attention,
        expert_parallel_size=(expert_ranks(req) if (req.expert_parallel or req.sglang.whole_experts) and _is_moe(req)
                              else 0),
    )


def _is_moe(req: FitRequest) -> bool:
    arch = req.spec.arch
    return arch is not None and arch.moe is not None
