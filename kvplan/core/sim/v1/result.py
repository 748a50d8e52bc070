"""What a v1 simulation reports, under the definitions of the reference fixtures (tests/fixtures/vllm_scheduler):

- steps: schedule() calls that scheduled at least one token; mean/peak running and mean KV usage are taken
  over those steps, right after schedule() (len(running); 1 - free / (num_blocks - 1));
- prompt_tokens: the prompts' lengths; cached_tokens: the GPU prefix-cache hit of each request when it was
  first scheduled; prefix_hit_rate = cached_tokens / prompt_tokens;
- per request: the step first scheduled, the step its first token was sampled, the step it finished,
  its preemptions and first-scheduling hit;
- latency in steps from the step a request arrived: queue (to its first scheduling), time to first token and
  end-to-end (to the end of that step, so a one-step request takes 1); in seconds from its arrival with a
  step model (the clock at the start of its first scheduled step, at the end of its first-token and last steps).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvplan.core.sim.stats import Percentiles, percentiles  # noqa: F401  (one for both simulators)


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRecord:
    id: str
    arrival_step: int
    first_scheduled_step: int
    first_token_step: int
    finish_step: int
    num_preemptions: int
    num_cached_tokens: int  # GPU prefix hit at the first scheduling
    num_cpu_tokens: int = 0  # tokens loaded from the CPU tier at the first scheduling
    queue_s: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TierStats:
    """Prompt tokens needed at every admission (readmissions after preemption included), by where they came from."""

    gpu_hit_tokens: int = 0
    cpu_hit_tokens: int = 0
    recomputed_tokens: int = 0
    gpu_evicted_blocks: int = 0  # cached GPU blocks whose hash was dropped for reuse
    cpu_capacity_chunks: int = 0
    cpu_stored_chunks: int = 0
    cpu_loaded_chunks: int = 0
    cpu_evicted_chunks: int = 0
    bytes_to_cpu: int = 0
    bytes_from_cpu: int = 0
    load_seconds: float = 0.0  # added to the steps that load
    store_seconds: float = 0.0  # overlapped with the forward passes


@dataclass(frozen=True, kw_only=True)
class V1Result:
    steps: int
    mean_running: float
    peak_running: int
    preemptions: int
    mean_kv_usage: float
    prompt_tokens: int
    cached_tokens: int
    prefix_hit_rate: float
    completed: int
    generated_tokens: int
    schedule_calls: int  # every schedule() call, empty ones included
    per_request: Sequence[RequestRecord]  # a tuple, or the simulator's columns (kvplan.core.sim.v1.tables)
    per_step_running: tuple[int, ...]
    per_step_kv_usage_permille: tuple[int, ...]
    per_step_scheduled_tokens: tuple[int, ...]
    per_step_waiting: tuple[int, ...] = ()  # waiting requests after schedule(), at each counted step
    per_step_start_ps: tuple[int, ...] = ()  # the clock at each counted step's start (with a step model)
    peak_kv_usage_permille: int = 0  # the largest of per_step_kv_usage_permille, kept when those are not
    peak_waiting: int = 0  # the largest of per_step_waiting, likewise
    tiers: TierStats = field(default_factory=TierStats)
    queue_steps: Percentiles | None = None
    ttft_steps: Percentiles | None = None
    e2e_steps: Percentiles | None = None
    queue_s: Percentiles | None = None
    ttft_s: Percentiles | None = None
    e2e_s: Percentiles | None = None
    seconds: float | None = None  # the clock at the end of the last step
    busy_seconds: float | None = None  # over steps that scheduled something
    throughput_tokens_per_s: float | None = None  # generated tokens per busy second
    notes: tuple[str, ...] = ()
    allocator: str = ""  # paged-<block size> (vLLM's pool) or contiguous-<reservation>
    # the pool's shares averaged over the counted steps (kvplan.core.sim.v1.shares; None: not measured)
    token_states_frac: float | None = None
    reserved_frac: float | None = None
    internal_frag_frac: float | None = None
    external_frag_frac: float | None = None
    free_frac: float | None = None
    # about timeline_points samples: (step, clock ps at its start (0 without a step model), token, reserved,
    # internal, external, free units of the pool)
    timeline: tuple[tuple[int, int, int, int, int, int, int], ...] = ()

    def metrics(self) -> dict[str, float | int]:
        """The fixture's ``metrics`` block."""
        return {"steps": self.steps, "mean_running": self.mean_running, "peak_running": self.peak_running,
                "preemptions": self.preemptions, "mean_kv_usage": self.mean_kv_usage,
                "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "prefix_hit_rate": self.prefix_hit_rate}
