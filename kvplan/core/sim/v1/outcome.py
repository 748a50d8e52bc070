"""A finished v1 simulation's V1Result (kvplan.core.sim.v1.result) from the loop's tallies, the per-step figures
kept, the pool's shares and the requests' records (kvplan.core.sim.v1.tables.RequestRecords)."""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.core.sim.v1.result import Percentiles, TierStats, V1Result, percentiles
from kvplan.core.sim.v1.shares import Shares, TimelinePoint
from kvplan.core.sim.v1.tables import RequestRecords


@dataclass(frozen=True, slots=True, kw_only=True)
class Tally:
    """The loop's sums over the run (kvplan.core.sim.v1.scheduler)."""

    steps: int
    run_sum: int
    peak: int
    preemptions: int
    usage: float  # the mean usage over counted steps
    completed: int
    generated: int
    calls: int  # schedule() calls
    clock: int  # picoseconds at the end of the last step
    busy_ps: int
    gpu_hit: int
    cpu_hit: int
    recomputed: int
    peak_usage: int  # permille
    peak_waiting: int


def v1_result(sim, t: Tally, per_step: tuple[list[int], ...], memory: Shares | None,  # type: ignore[no-untyped-def]
              timeline: tuple[TimelinePoint, ...]) -> V1Result:
    inputs, records = sim.inputs, sim.records
    if records.written != len(records):  # pragma: no cover - a guard, not a path
        raise AssertionError(f"{len(records) - records.written} requests never finished")
    timed = inputs.step_model is not None
    prompt_tokens = sum(sim.columns.prompt)
    cached = sum(records.column("cached_tokens"))
    busy = t.busy_ps / 1e12 if timed else None
    ps_running, ps_usage, ps_tokens, ps_waiting, ps_start = per_step
    return V1Result(
        steps=t.steps, mean_running=t.run_sum / t.steps if t.steps else 0.0, peak_running=t.peak,
        preemptions=t.preemptions, mean_kv_usage=t.usage, prompt_tokens=prompt_tokens, cached_tokens=cached,
        prefix_hit_rate=cached / prompt_tokens if prompt_tokens else 0.0, completed=t.completed,
        generated_tokens=t.generated, schedule_calls=t.calls, per_request=records,
        per_step_running=tuple(ps_running), per_step_kv_usage_permille=tuple(ps_usage),
        per_step_scheduled_tokens=tuple(ps_tokens), per_step_waiting=tuple(ps_waiting),
        per_step_start_ps=tuple(ps_start), peak_kv_usage_permille=t.peak_usage, peak_waiting=t.peak_waiting,
        tiers=_tiers(sim, t), **latency(records, timed), seconds=t.clock / 1e12 if timed else None, busy_seconds=busy,
        throughput_tokens_per_s=t.generated / busy if busy else None, notes=inputs.notes + _notes(sim, memory),
        allocator=_allocator_name(inputs), timeline=timeline,
        **({f: getattr(memory, f) for f in Shares.__slots__} if memory is not None else {}))


def latency(records: RequestRecords, timed: bool) -> dict[str, Percentiles | None]:
    """V1Result's latency percentiles over every request recorded: in steps from the step it arrived (to the end of
    its first-token and last steps, so a one-step request takes 1), and in seconds from its arrival where timed."""
    col = records.column
    arrival, first, token, finish = (col(f) for f in ("arrival_step", "first_scheduled_step", "first_token_step",
                                                      "finish_step"))
    out: dict[str, Percentiles | None] = dict(
        queue_steps=percentiles(x - y for x, y in zip(first, arrival)),
        ttft_steps=percentiles(x - y + 1 for x, y in zip(token, arrival)),
        e2e_steps=percentiles(x - y + 1 for x, y in zip(finish, arrival)), queue_s=None, ttft_s=None, e2e_s=None)
    if timed:
        a = col("arrival_ps")
        for name, f in (("queue_s", "first_scheduled_ps"), ("ttft_s", "first_token_ps"), ("e2e_s", "finish_ps")):
            out[name] = percentiles((x - y) / 1e12 for x, y in zip(col(f), a))
    return out


def _tiers(sim, t: Tally) -> TierStats:  # type: ignore[no-untyped-def]
    cpu = sim.cpu
    bw = cpu.bandwidth if cpu else 1.0
    return TierStats(
        gpu_hit_tokens=t.gpu_hit, cpu_hit_tokens=t.cpu_hit, recomputed_tokens=t.recomputed,
        gpu_evicted_blocks=sim.mgr.pool.evicted,
        cpu_capacity_chunks=cpu.capacity if cpu else 0, cpu_stored_chunks=cpu.stored_chunks if cpu else 0,
        cpu_loaded_chunks=cpu.loaded_chunks if cpu else 0, cpu_evicted_chunks=cpu.evicted_chunks if cpu else 0,
        bytes_to_cpu=cpu.bytes_stored if cpu else 0, bytes_from_cpu=cpu.bytes_loaded if cpu else 0,
        load_seconds=cpu.bytes_loaded / bw if cpu else 0.0, store_seconds=cpu.bytes_stored / bw if cpu else 0.0)


def _allocator_name(inputs) -> str:  # type: ignore[no-untyped-def]
    alloc = inputs.allocator
    if alloc is not None and not alloc.paged:
        return alloc.name
    return f"paged-{inputs.layout.block_size}"


def _notes(sim, memory: Shares | None) -> tuple[str, ...]:  # type: ignore[no-untyped-def]
    if memory is None and not sim.mgr.books.measured:
        return (("memory shares not measured: a Mamba/linear-attention group holds a per-sequence state, not "
                 "token slots"),)
    return ()
