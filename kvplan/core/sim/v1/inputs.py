"""What a vLLM v1 scheduler simulation is given: the scheduler settings, the KV cache groups sharing one
block pool, the requests as segment lists, an optional CPU offload tier and step-time model.

Rules cite vLLM 0.33.0 (vllm-project/vllm, tag v0.33.0); file::function for each. What changed between
releases 0.11.0 and 0.33.0 is SchedulerConfig.rules (kvplan.core.engines.vllm.scheduler_rules).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvplan.core.engines.base import cdiv
from kvplan.core.engines.vllm.scheduler_rules import SchedulerRules, newest
from kvplan.core.sim.model import AllocatorSpec, StepModel
from kvplan.core.spec import LayerKind
from kvplan.errors import InputError

# Kinds a KV cache group can have (the manager vLLM gives it: single_type_kv_cache_manager.py).
FULL, SLIDING, CHUNKED, MAMBA = 0, 1, 2, 3
KIND_NAMES = {FULL: "full", SLIDING: "sliding_window", CHUNKED: "chunked_local", MAMBA: "mamba"}
HOST_PAGE_BYTES = 4096  # vllm/v1/kv_offload/cpu/shared_offload_region.py: BLOCK_SIZE_ALIGNMENT = mmap.PAGESIZE


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    """vllm/config/scheduler.py::SchedulerConfig (0.33.0 defaults where a field has one)."""

    max_num_seqs: int = 128  # DEFAULT_MAX_NUM_SEQS (the OpenAI server raises it per GPU)
    max_num_batched_tokens: int = 2048  # DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_model_len: int = 8192
    enable_prefix_caching: bool = False
    long_prefill_token_threshold: int = 0
    watermark: float = 0.0  # share of the pool kept free when admitting (0.0: none)
    # Admission checks that the whole prompt fits (scheduler_reserve_full_isl, default True).
    reserve_full_isl: bool = True
    # two batches in flight: each is scheduled before the previous one's output is processed
    # (v1/core/sched/async_scheduler.py, v1/engine/core.py::step_with_batch_queue); vLLM's default since 0.14
    async_scheduling: bool = False
    # pipeline parallelism: the engine keeps VllmConfig.max_concurrent_batches batches in flight, each scheduled
    # while the earlier ones run (v1/engine/core.py::EngineCore.step_with_batch_queue): pp with the synchronous
    # scheduler (a request whose output is in flight is not scheduled again), and with async scheduling on the V1
    # model runner; pp + 1 on the V2 runner, a request's decodes pp schedule() calls apart
    # (v1/core/sched/async_scheduler.py::AsyncScheduler.decode_stagger) (0.26.0-0.33.0: config/vllm.py)
    pipeline_parallel_size: int = 1
    v2_model_runner: bool = False

    @property
    def batches_in_flight(self) -> int:
        """VllmConfig.max_concurrent_batches."""
        pp = self.pipeline_parallel_size
        if self.async_scheduling:
            return pp + 1 if self.v2_model_runner else max(2, pp)
        return pp

    @property
    def decode_stagger(self) -> int:
        """schedule() calls between a request's decodes (0: none)."""
        return self.pipeline_parallel_size if self.async_scheduling and self.v2_model_runner else 0
    # the release's scheduler and KV cache manager rules; default: the newest profile's
    rules: SchedulerRules = field(default_factory=newest)

    def __post_init__(self) -> None:
        if min(self.max_num_seqs, self.max_num_batched_tokens, self.max_model_len) < 1:
            raise InputError("max_num_seqs, max_num_batched_tokens and max_model_len must be >= 1")
        if not 1 <= self.pipeline_parallel_size <= 64:
            raise InputError(f"pipeline_parallel_size must be between 1 and 64 (got {self.pipeline_parallel_size})")
        if self.pipeline_parallel_size > 1 and not self.rules.stale_output_waits:
            raise InputError(f"vLLM {self.rules.release}: pipeline parallelism's batches in flight are simulated "
                             "under vLLM 0.27.0's rules and later (how a preempted request's output still in flight "
                             "is handled was not compared before); pin vllm==0.27.0 or later")
        if self.long_prefill_token_threshold < 0:
            raise InputError(f"long_prefill_token_threshold must be >= 0 (got {self.long_prefill_token_threshold})")
        if not 0.0 <= self.watermark < 1.0:
            raise InputError(f"watermark must be in [0, 1) (got {self.watermark})")
        if self.watermark and not self.rules.watermark:
            raise InputError(f"vLLM {self.rules.release}'s scheduler has no watermark option (added in 0.24.0: "
                             "vllm/config/scheduler.py); leave watermark at 0")
        # vllm/config/scheduler.py::SchedulerConfig.verify_max_model_len
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise InputError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least max_num_seqs "
                             f"({self.max_num_seqs}), as vLLM requires")
        if self.long_prefill_token_threshold > self.max_model_len:
            raise InputError(f"long_prefill_token_threshold ({self.long_prefill_token_threshold}) cannot exceed "
                             f"max_model_len ({self.max_model_len}), as vLLM requires")


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheGroup:
    """One KV cache group (kv_cache_interface.py's spec of its layers)."""

    kind: int  # FULL, SLIDING, CHUNKED or MAMBA
    block_size: int
    window: int = 0  # SLIDING: sliding_window; CHUNKED: attention_chunk_size
    state_blocks: int = 1  # MAMBA: blocks a request holds (MambaSpec, mamba_cache_mode "none": 1 + spec blocks)
    num_layers: int = 0  # reported only

    def __post_init__(self) -> None:
        if self.kind not in KIND_NAMES:
            raise InputError(f"unknown cache group kind {self.kind}")
        if self.block_size < 1 or (self.kind in (SLIDING, CHUNKED) and self.window < 1):
            raise InputError(f"{KIND_NAMES[self.kind]} group needs block_size >= 1 and a window >= 1")

    def admission_cap_blocks(self, in_flight_tokens: int, max_model_len: int) -> int | None:
        """Blocks the full-prompt admission gate charges at most (vllm/v1/kv_cache_interface.py:
        SlidingWindowSpec / ChunkedLocalAttentionSpec.max_admission_blocks_per_request); None: no cap."""
        if self.kind == SLIDING:
            return cdiv(min(self.window - 1 + in_flight_tokens, max_model_len), self.block_size) + 1
        if self.kind == CHUNKED:
            return cdiv(min(self.window + in_flight_tokens, max_model_len), self.block_size)
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheLayout:
    """The block pool (num_blocks, block 0 the null block) and the groups drawing from it."""

    num_blocks: int
    groups: tuple[CacheGroup, ...]
    block_bytes: int = 0  # one pool block across the layers it spans (KVLayout.pool_block_bytes)

    def __post_init__(self) -> None:
        if self.num_blocks < 2:
            raise InputError(f"the pool needs at least 2 blocks (block 0 is vLLM's null block); got {self.num_blocks}")
        if not self.groups:
            raise InputError("a cache layout needs at least one KV cache group")

    @property
    def block_size(self) -> int:
        """The block size the pool is named by (paged-<block size>): its full-attention groups' (DeepSeek-V4's window
        and state groups keep smaller blocks of their own), else the smallest group's."""
        full = [g.block_size for g in self.groups if g.kind == FULL]
        return min(full or [g.block_size for g in self.groups])


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadConfig:
    """vLLM's native CPU offloading (OffloadingConnector with the CPU backend), modelled as in
    kvplan/core/sim/v1/offload.py."""

    cpu_bytes: int  # kv_connector_extra_config cpu_bytes_to_use
    bandwidth_bytes_per_s: float  # host link (PCIe, NVLink-C2C), both directions
    blocks_per_chunk: int = 1  # kv_connector_extra_config blocks_per_chunk (default 1)

    def __post_init__(self) -> None:
        if self.cpu_bytes < 0 or not self.bandwidth_bytes_per_s > 0 or self.blocks_per_chunk < 1:
            raise InputError("offload needs cpu_bytes >= 0, bandwidth > 0 and blocks_per_chunk >= 1")


Segment = tuple[int, int]  # (segment id, tokens): token i of segment s is a function of (s, i) only


@dataclass(frozen=True, slots=True, kw_only=True)
class V1Request:
    """A request: its prompt is the concatenation of ``prompt`` segments; it generates the tokens of
    ``output`` (a segment) one per step, and stops after them (ignoring EOS) or at max_model_len."""

    id: str
    prompt: tuple[Segment, ...]
    output: Segment
    arrival_step: int = 0
    arrival_ps: int | None = None  # arrival in time (needs a step model); overrides arrival_step

    @property
    def prompt_len(self) -> int:
        return sum(n for _, n in self.prompt)


@dataclass(frozen=True, kw_only=True)
class V1Inputs:
    requests: Sequence[V1Request]  # a tuple, or kvplan.core.sim.v1.tables.RequestTable (a million in 50 MB)
    scheduler: SchedulerConfig
    layout: CacheLayout
    offload: OffloadConfig | None = None
    step_model: StepModel | None = None  # seconds per step (kvplan.core.sim.model.StepModel)
    notes: tuple[str, ...] = field(default=())
    # None: vLLM's paged pool; a contiguous AllocatorSpec (kvplan.core.sim.model.allocator_spec) runs the same
    # scheduler over one region per request (kvplan.core.sim.v1.contiguous)
    allocator: AllocatorSpec | None = None


def group_from_bucket(kind: LayerKind, *, block_size: int, window: int, state_blocks: int, num_layers: int,
                      max_model_len: int) -> CacheGroup:
    """A CacheGroup from one of kvplan's vLLM layout buckets (kvplan.core.engines.vllm.plan.Bucket)."""
    if kind is LayerKind.LINEAR:
        return CacheGroup(kind=MAMBA, block_size=max_model_len, state_blocks=state_blocks, num_layers=num_layers)
    if kind is LayerKind.SLIDING:
        return CacheGroup(kind=SLIDING, block_size=block_size, window=window, num_layers=num_layers)
    if kind is LayerKind.CHUNKED:
        return CacheGroup(kind=CHUNKED, block_size=block_size, window=window, num_layers=num_layers)
    return CacheGroup(kind=FULL, block_size=block_size, num_layers=num_layers)  # full and MLA


def layout_from_plan(plan, max_model_len: int) -> CacheLayout:
    """The pool vLLM builds for a kvplan VLLMPlan (kvplan.core.engines.vllm.plan.plan_vllm / plan_stages):
    each bucket's ``num_groups`` groups of its kind and block size, num_blocks, the pool block's bytes."""
    layout = plan.layout
    if layout is None:
        raise InputError("the model holds no KV cache: nothing to simulate")
    groups: list[CacheGroup] = []
    for b in layout.buckets:
        per_group = cdiv(b.num_layers, b.num_groups)
        for _ in range(b.num_groups):
            groups.append(group_from_bucket(b.kind, block_size=b.block_size, window=b.window,
                                            state_blocks=b.state_blocks, num_layers=per_group,
                                            max_model_len=max_model_len))
    return CacheLayout(num_blocks=plan.num_blocks, groups=tuple(groups), block_bytes=layout.pool_block_bytes)
