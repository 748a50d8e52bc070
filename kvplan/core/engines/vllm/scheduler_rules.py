"""vLLM's v1 scheduler and KV cache manager, release by release: each behaviour that changed between 0.11.0
and 0.33.0 and moves a simulation of plain text requests (given prompts, outputs and arrivals).

Every consecutive pair of releases was diffed (docs/engine-versions-research.md, "The v1 scheduler by
release"); each field below names the release that changed it and the file::function (paths under
``vllm/``: sched = ``v1/core/sched/scheduler.py``, kvm = ``v1/core/kv_cache_manager.py``, stm =
``v1/core/single_type_kv_cache_manager.py``, pool = ``v1/core/block_pool.py``, kvi =
``v1/kv_cache_interface.py``). ``kvplan.core.sim.v1`` branches on these fields; the profiles that carry
them are in ``profiles.py`` (``VLLMRules.scheduler``). Releases before 0.11.0 take 0.11.0's rules: their v1
schedulers were not diffed (the event engine simulates the V0 releases).

Changes read and left out because they do not move a plain-text simulation under kvplan's engine loop
(two batches in flight with async scheduling, the GPU busy while the next batch is scheduled):
- 0.27.0 (sched::_preempt_request, schedule, update_from_output ``is_stale``): a preempted request's
  in-flight output is marked stale and the request skipped in the waiting loop until it lands. Before,
  the placeholders were kept and resolved by the same output. Either way the output lands before the
  next schedule() (the victim is never in the batch being scheduled), so nothing differs.
- 0.14.0 (kvm::allocate_slots ``total_computed_tokens``): sliding-window hit blocks outside the window
  dropped at admission; find_longest_cache_hit already returns them as null blocks, so counts agree.
- 0.11.1 chunked-local blocks kept up to the cached count with prefix caching, 0.12.0/0.22.0 hybrid
  groups of unequal block sizes, 0.16.0-0.31.0 Mamba ``align`` mode: cases kvplan's simulator refuses or
  that CUDA's defaults exclude (the hybrid manager is off for chunked-local attention).
- 0.26.0 (v1/engine/core.py::EngineCore.step_with_batch_queue): the next batch is scheduled without
  waiting for ``not future.done()``; on a busy GPU the old condition held, which kvplan assumes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class WindowCap(str, Enum):
    """How the whole-sequence admission gate counts a sliding-window or chunked-local group's blocks (a str
    Enum: `kvplan engines --json` prints the value)."""

    NONE = "none"  # every block of the full length (0.19.x; before 0.19 there is no gate)
    # kvi::SlidingWindowSpec / ChunkedLocalAttentionSpec.max_admission_blocks_per_request caps the blocks
    # required in stm::SingleTypeKVCacheManager.get_num_blocks_to_allocate on EVERY call (0.20.0-0.20.1):
    # a running request past the cap asks for no blocks, so it never preempts, yet allocate_new_blocks
    # still takes them (pool::BlockPool.get_new_blocks raises when the pool is short).
    EVERY_ALLOCATION = "every allocation"
    # only when kvm::can_fit_full_sequence (0.21: allocate_slots' full_sequence_must_fit) asks:
    # get_num_blocks_to_allocate(apply_admission_cap=True) (0.20.2)
    ADMISSION = "admission"


class FreeOrder(str, Enum):
    """Where freed blocks without a prefix-cache hash enter the free queue (allocation pops its front)."""

    APPEND = "append"  # pool::BlockPool.free_blocks appends every freed block (0.11.0-0.22.1)
    # stm::SingleTypeKVCacheManager.remove_skipped_blocks (blocks behind a window, any kind) and
    # SlidingWindowManager.free prepend the unhashed ones (BlockPool.free_blocks(prepend=True)); a full
    # attention group's finished blocks are still appended (0.23.0)
    WINDOW_UNHASHED_FIRST = "window unhashed first"
    UNHASHED_FIRST = "unhashed first"  # pool::BlockPool.free_blocks: unhashed prepended, hashed appended (0.24.0)


class Score(str, Enum):
    """How the balancer scores an engine, the lowest taken (a str Enum: `kvplan engines --json` prints the value).
    cc = v1/engine/core_client.py::DPLBAsyncMPClient.get_core_engine_for_request."""

    QUEUE = "waiting x 4 + running"  # 0.10.1 (cc L1144); 0.10.0 compared [waiting, running] as a list: not modelled
    # max(client_count x in flight, waiting + running), plus waiting x 6 x max(0, KV usage - 0.5) where any wait;
    # in flight: this balancer's requests sent to the engine and not finished (0.27.0: cc L1493-1501, L1518)
    IN_FLIGHT = "max(in flight, waiting + running) + KV pressure on waiting"


@dataclass(frozen=True, kw_only=True)
class RouterRules:
    """One release's load balancer between data-parallel engines (kvplan.core.sim.v1.dp; the sources read:
    docs/engines.md, "vLLM's load balancer")."""

    score: Score
    # the scan's start moves on one engine after each request (0.25.0: cc L1442); before, it stays at
    # len(engines) x client_index // client_count, so ties go to the same engine
    rotate: bool
    # the engines of a dense (non-MoE) model publish their waiting and running counts: every DP engine was a
    # DPEngineCoreProc, which publishes, before 0.14.0; from 0.14.0 a dense model's engines are plain EngineCoreProcs
    # (v1/engine/core.py::EngineCoreProc.run_engine_core), which publish from 0.27.0 (EngineCoreProc.run_busy_loop):
    # in between the balancer sees zeros, and only its own additions spread the requests (round-robin)
    dense_counts: bool
    # a dense model's engines step in lockstep (dummy batches when idle) before 0.14.0 (core.py::run_engine_core)
    dense_lockstep: bool
    # `vllm serve -dp N` starts N API servers, each a balancer of its own (client_count N), from 0.15.0
    # (entrypoints/cli/serve.py: api_server_count defaults to data_parallel_size); before, one
    servers_per_engine: bool
    interval_ps: int = 100 * 10**9  # v1/engine/coordinator.py: min_stats_update_interval_ms = 100, when changed
    republish_ps: int = 5 * 10**12  # ... else every 5 s (coordinator.py: `wait_for = ... else 5000`), which also
    # drops the balancer's own additions


@dataclass(frozen=True, kw_only=True)
class SchedulerRules:
    """One release's scheduler and KV cache manager, as far as plain text requests can tell."""

    release: str  # the release these rules start at (a later release keeps them until the next change)
    # config/vllm.py::VllmConfig.__post_init__ turns async scheduling on when not set (0.14.0)
    async_default: bool
    # sched::schedule skips a running request whose last token is in flight (0.11.1: num_new_tokens capped
    # at min(prompt + max_tokens, max_model_len) - 1 - computed; 0.12.0: `continue`); 0.11.0 scheduled one
    # more decode for it, whose output is dropped (the request has finished by then)
    async_skip_last_in_flight: bool
    # sched::schedule admits a waiting or preempted request only if its whole current sequence
    # (min(num_tokens, max_model_len), less prefix hits) fits in the free blocks: scheduler_reserve_full_isl,
    # default True (0.19.0: config/scheduler.py, kvm::KVCacheManager.can_fit_full_sequence); before, only
    # the chunk being scheduled had to fit
    full_sequence_gate: bool
    window_cap: WindowCap  # 0.20.0: EVERY_ALLOCATION; 0.20.2: ADMISSION
    # the cap's tokens: max_in_flight_tokens = max_concurrent_batches x max_num_batched_tokens (2 x with
    # async) instead of max_num_batched_tokens (0.26.0: config/vllm.py::VllmConfig.max_in_flight_tokens,
    # stm::get_manager_for_kv_cache_spec); the memory plan sizes sliding layers the same way
    window_cap_in_flight: bool
    # kvm::KVCacheManager.allocate_slots frees blocks behind a window on the processed tokens,
    # remove_skipped_blocks(total_computed - num_in_flight_tokens) (0.26.0): with async scheduling, a batch
    # later; before, on the computed tokens
    window_frees_processed: bool
    free_order: FreeOrder  # 0.23.0: WINDOW_UNHASHED_FIRST; 0.24.0: UNHASHED_FIRST
    # config/scheduler.py watermark (share of the pool kept free at admission), default 0.0 (0.24.0)
    watermark: bool
    # sched::schedule applies long_prefill_token_threshold only when len(running) + len(waiting) > 1
    # (0.31.0); before, to every chunk, a request alone too
    threshold_needs_company: bool
    # engine/arg_utils.py::_set_default_chunked_prefill_and_prefix_caching_args turns prefix caching on for
    # hybrid Mamba/linear-attention models (mamba_cache_mode align) (0.28.0). kvplan does not model align
    # mode: such runs are refused with prefix caching, and noted without it.
    hybrid_prefix_caching_default: bool
    # config/cache.py prefix_cache_retention_interval default 0: sliding-window and Mamba groups cache only
    # checkpoint blocks (stm::SlidingWindowManager.reachable_block_mask, kv_cache_coordinator.py::
    # replay_boundaries) (0.29.0). Not modelled: kvplan caches every full block, as 0.11-0.28 do; noted.
    window_checkpoint_caching: bool
    # sched::schedule passes over a waiting request whose output from before its preemption is still in flight
    # (num_stale_output_tokens; it keeps its place at the front) and admits the ones behind it (0.27.0:
    # sched::_preempt_request, schedule's waiting loop). It matters with three or more batches in flight (pipeline
    # parallelism): with two the output lands before the next schedule(). Before, not compared: kvplan refuses
    # more than two batches in flight there.
    stale_output_waits: bool = False
    # v1/engine/core_client.py::DPLBAsyncMPClient.get_core_engine_for_request: how the front end sends each request
    # to one of the data-parallel engines (kvplan.core.sim.v1.dp)
    router: RouterRules = RouterRules(score=Score.QUEUE, rotate=False, dense_counts=True, dense_lockstep=True,
                                      servers_per_engine=False)


V1_BASELINE = SchedulerRules(
    release="0.11.0", async_default=False, async_skip_last_in_flight=False, full_sequence_gate=False,
    window_cap=WindowCap.NONE, window_cap_in_flight=False, window_frees_processed=False,
    free_order=FreeOrder.APPEND, watermark=False, threshold_needs_company=False,
    hybrid_prefix_caching_default=False, window_checkpoint_caching=False)


def newest() -> SchedulerRules:
    """The newest release's rules (what a SchedulerConfig without rules simulates)."""
    from kvplan.core.engines.vllm.profiles import VLLM_PROFILES

    return VLLM_PROFILES[-1].rules.scheduler


def scheduler_notes(profile, layout, *, caching: bool) -> list[str]:
    """What a simulation under ``profile`` (a vLLM EngineProfile) of a pool ``layout``
    (kvplan.core.sim.v1.CacheLayout) says about the scheduler: which release's rules it follows, and what of
    them kvplan does not model for this model and settings."""
    from kvplan.core.engines.vllm.profiles import VLLM_PROFILES
    from kvplan.core.profiles import Version
    from kvplan.core.sim.v1.inputs import CHUNKED, MAMBA, SLIDING

    rules: SchedulerRules = profile.rules.scheduler
    same = [p for p in VLLM_PROFILES if p.rules.scheduler == rules]
    later = [p for p in VLLM_PROFILES if p.since > same[-1].since]
    span = f"{rules.release} to before {later[0].version}" if later else f"{rules.release} and later"
    notes = [f"scheduler: vLLM {rules.release}'s rules ({span}; kvplan/core/engines/vllm/scheduler_rules.py)"]
    if profile.since < Version.parse(rules.release):
        notes[0] += (f"; vLLM {profile.version}'s v1 scheduler was not compared: the oldest rules kvplan "
                     "has are used")
    kinds = {g.kind for g in layout.groups}
    if rules.window_checkpoint_caching and caching and kinds & {SLIDING, CHUNKED}:
        notes.append(f"vLLM {rules.release} caches only checkpoint blocks of sliding-window groups "
                     "(prefix_cache_retention_interval 0); kvplan caches every full block, as 0.11-0.28 do, so "
                     "prefix hits on this model may be overstated")
    if rules.hybrid_prefix_caching_default and MAMBA in kinds and not caching:
        notes.append(f"vLLM {rules.release} turns prefix caching on by default for hybrid models (Mamba "
                     "align mode), which kvplan does not model: simulated as with --no-enable-prefix-caching")
    return notes
