"""What a simulation is: the plan (what serves, the pool, the simulator's inputs) and its run, as values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan.core.gpus import GPUSpec
from kvplan.core.profiles import EngineChoice
from kvplan.core.sim.model import AllocatorSpec, RequestArrays, SimConfig, SimResult
from kvplan.core.sim.v1 import V1Inputs, V1Result
from kvplan.core.spec import ModelSpec

EVENT, V1 = "event", "vllm-v1"
SIMULATORS = ("auto", EVENT, V1)
# vLLM V0's default without chunked prefill: max(max_model_len, _DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048)
# (vllm/config.py, SchedulerConfig), so the longest prompt always fits one step.
V0_MIN_BATCHED_TOKENS = 2048


@dataclass(frozen=True, kw_only=True)
class Serving:
    """What serves the workload: the model, the GPU (None: the pool is given) and the engine's release."""

    spec: ModelSpec | None
    gpu: GPUSpec | None
    engine: EngineChoice
    max_model_len: int


@dataclass(frozen=True, kw_only=True)
class Pool:
    """The KV pool, planned once: by the engine's budget (``kvplan fit``) or given in the file."""

    bytes_per_token: int  # KV bytes of one token slot on one GPU (0 when given in tokens without a model)
    pool_bytes: int
    pool_slots: int  # token slots
    plan: Any = None  # vLLM's own plan (kvplan.core.engines.vllm.plan.VLLMPlan): the vllm-v1 simulator's groups
    fit: Any = None  # the FitResult when the engine's budget sized it
    max_num_batched_tokens: int = 0  # the engine's default for this GPU and release, when fit chose it


@dataclass(frozen=True, kw_only=True)
class EventRun:
    requests: RequestArrays
    config: SimConfig
    allocators: tuple[AllocatorSpec, ...]


@dataclass(frozen=True, kw_only=True)
class V1Run:
    inputs: V1Inputs  # vLLM's paged pool (or the first allocator named)
    others: tuple[V1Inputs, ...] = ()  # the same requests under the other allocators named (contiguous)
    block_size: int
    session_turns: tuple[tuple[int, int], ...] = ()  # (previous turn's request, this request)
    rejected: int = 0  # requests whose prompt reaches max_model_len (vLLM rejects them)
    user_requests: int = 0  # requests as the workload counts them (before parallel sampling's fan-out)
    data_parallel_size: int = 1  # vLLM engines behind its load balancer, each with ``inputs``' pool and scheduler
    router: Any = None  # their balancer's rules (kvplan.core.engines.vllm.scheduler_rules.RouterRules) when > 1
    api_servers: int = 1  # the balancers (vLLM's API servers)
    moe: bool = False  # the model has experts (its engines publish their counts and step in lockstep)


@dataclass(frozen=True, kw_only=True)
class SimulationPlan:
    name: str
    origin: str
    simulator: str  # EVENT or V1
    reason: str  # why that simulator
    engine: EngineChoice
    pool: Pool
    notes: tuple[str, ...]
    event: EventRun | None = None
    v1: V1Run | None = None


@dataclass(frozen=True, kw_only=True)
class SimulationRun:
    plan: SimulationPlan
    event: tuple[SimResult, ...] = ()  # one per allocator, in the plan's order
    v1: V1Result | None = None  # vLLM's paged pool (the plan's v1.inputs); data-parallel engines: merged
    v1_others: tuple[V1Result, ...] = ()  # the plan's v1.others
    dp: Any = None  # data-parallel engines: each one's run and requests (kvplan.core.sim.v1.dp.DPResult)
