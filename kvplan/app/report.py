"""One report of a simulation, whichever simulator ran: a row per allocator with the same fields (what ``check``'s
simulation limits read, what every table prints), and one JSON document (``kvplan simulate --json``; its keys are a
contract: docs/workloads.md).

A vllm-v1 run has one row, its allocator's (vLLM's paged pool, ``paged-<block size>``, or a contiguous allocator under
the same scheduler), with the pool's shares as kvplan.core.sim.v1.shares defines them (None where not measured: Mamba
groups), and its own extras beside it: steps, the pool's usage, prefix-cache hits, the CPU tier, latency in steps and
the turns of conversations.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kvplan.app.simulation import SimulationRun
from kvplan.core.sim.stats import Percentiles
from kvplan.core.sim.v1 import V1Result
from kvplan.core.sim.v1.tables import Columns, RequestRecords


@dataclass(frozen=True, kw_only=True)
class AllocatorRow:
    allocator: str
    # shares of the pool over the busy period (None: the simulator does not break the pool down)
    token_states_frac: float | None
    reserved_frac: float | None
    internal_frag_frac: float | None
    external_frag_frac: float | None
    free_frac: float | None
    mean_batch_size: float
    peak_batch_size: int
    preemptions: int
    completed: int
    rejected: int
    rejected_reasons: dict[str, int]
    makespan_steps: int
    makespan_seconds: float | None
    generated_tokens: int
    throughput_tokens_per_s: float | None
    busy_seconds: float | None
    drain_seconds: float | None
    peak_waiting: int | None
    mean_queue_seconds: float | None
    queue_s: Percentiles | None = None  # per completed request, from its arrival
    ttft_s: Percentiles | None = None
    e2e_s: Percentiles | None = None


def allocator_rows(run: SimulationRun) -> list[AllocatorRow]:
    if run.v1 is not None:
        return [_v1_row(run, r) for r in (run.v1, *run.v1_others)]
    return [AllocatorRow(
        allocator=r.allocator, token_states_frac=r.token_states_frac, reserved_frac=r.reserved_frac,
        internal_frag_frac=r.internal_frag_frac, external_frag_frac=r.external_frag_frac, free_frac=r.free_frac,
        mean_batch_size=r.mean_batch_size, peak_batch_size=r.peak_batch_size, preemptions=r.preemptions,
        completed=r.completed, rejected=r.rejected, rejected_reasons=dict(r.rejected_reasons),
        makespan_steps=r.makespan_steps, makespan_seconds=r.makespan_seconds, generated_tokens=r.generated_tokens,
        throughput_tokens_per_s=r.throughput_tokens_per_s, busy_seconds=r.busy_seconds,
        drain_seconds=r.drain_seconds, peak_waiting=r.peak_waiting, mean_queue_seconds=r.mean_queue_seconds,
        queue_s=r.latency.queue_s if r.latency else None, ttft_s=r.latency.ttft_s if r.latency else None,
        e2e_s=r.latency.e2e_s if r.latency else None) for r in run.event]


def rank_rows(run: SimulationRun) -> list[AllocatorRow]:
    """One row per data-parallel engine (its own run over the requests it was sent), named by its rank."""
    assert run.dp is not None
    return [dataclasses.replace(_v1_row(run, r), allocator=f"engine {i}") for i, r in enumerate(run.dp.ranks)]


def last_arrival_s(run: SimulationRun) -> float | None:
    plan = run.plan
    if plan.v1 is not None:
        arrivals = [t for t in Columns.of(plan.v1.inputs.requests).arrival_ps or () if t is not None]
    else:
        assert plan.event is not None
        arrivals = list(plan.event.requests.arrival_ps)
    return max(arrivals) / 1e12 if arrivals else None


def _v1_row(run: SimulationRun, r: V1Result | None = None) -> AllocatorRow:
    """The row of one vllm-v1 run (``r``; None: vLLM's paged pool, the plan's first run)."""
    v, r = run.plan.v1, r if r is not None else run.v1
    assert v is not None and r is not None
    last = last_arrival_s(run) or 0.0
    queued = _queued_s(r.per_request)
    return AllocatorRow(
        allocator=r.allocator or f"paged-{v.block_size}", token_states_frac=r.token_states_frac,
        reserved_frac=r.reserved_frac, internal_frag_frac=r.internal_frag_frac, external_frag_frac=r.external_frag_frac,
        free_frac=r.free_frac, mean_batch_size=r.mean_running, peak_batch_size=r.peak_running,
        preemptions=r.preemptions, completed=v.user_requests - v.rejected, rejected=v.rejected,
        rejected_reasons={"prompt_exceeds_max_model_len": v.rejected} if v.rejected else {},
        makespan_steps=r.schedule_calls, makespan_seconds=r.seconds, generated_tokens=r.generated_tokens,
        throughput_tokens_per_s=r.throughput_tokens_per_s, busy_seconds=r.busy_seconds,
        drain_seconds=max(0.0, r.seconds - last) if r.seconds is not None else None,
        peak_waiting=r.peak_waiting, mean_queue_seconds=sum(queued) / len(queued) if queued else None,
        queue_s=r.queue_s, ttft_s=r.ttft_s, e2e_s=r.e2e_s)


def _pcts(p: Percentiles | None) -> dict[str, float] | None:
    return None if p is None else {"p50": p.p50, "p90": p.p90, "p99": p.p99}


def row_json(row: AllocatorRow) -> dict[str, Any]:
    latency = None if row.e2e_s is None else {
        "queue_s": _pcts(row.queue_s), "ttft_s": _pcts(row.ttft_s), "e2e_s": _pcts(row.e2e_s)}
    return {
        "token_states_frac": row.token_states_frac, "reserved_frac": row.reserved_frac,
        "internal_frag_frac": row.internal_frag_frac, "external_frag_frac": row.external_frag_frac,
        "free_frac": row.free_frac, "mean_batch_size": row.mean_batch_size, "peak_batch_size": row.peak_batch_size,
        "preemptions": row.preemptions, "completed": row.completed, "rejected": row.rejected,
        "rejected_reasons": row.rejected_reasons, "makespan_steps": row.makespan_steps,
        "makespan_seconds": row.makespan_seconds, "generated_tokens": row.generated_tokens,
        "throughput_tokens_per_s": row.throughput_tokens_per_s, "busy_seconds": row.busy_seconds,
        "drain_seconds": row.drain_seconds, "peak_waiting": row.peak_waiting,
        "mean_queue_seconds": row.mean_queue_seconds, "latency": latency,
    }


def simulation_json(run: SimulationRun) -> dict[str, Any]:
    """The JSON document of ``kvplan simulate --json``: the same keys for both simulators, the vllm-v1 extras beside."""
    plan = run.plan
    doc: dict[str, Any] = {"workload": plan.name, "scheduler_model": plan.simulator,
                           "scheduler_model_reason": plan.reason, "engine": plan.engine.name,
                           "engine_version": plan.engine.version,
                           "pool_bytes": plan.pool.pool_bytes, "bytes_per_token": plan.pool.bytes_per_token}
    if plan.event is not None:
        c = plan.event.config
        doc.update(requests=len(plan.event.requests), pool_slots=c.pool_slots, max_model_len=c.max_model_len,
                   max_num_seqs=c.max_num_seqs, max_num_batched_tokens=c.max_num_batched_tokens)
    doc["allocators"] = {row.allocator: row_json(row) for row in allocator_rows(run)}
    if run.v1 is not None:
        doc.update(_v1_extras(run))
    doc["notes"] = run_notes(run)
    return doc


def run_notes(run: SimulationRun) -> list[str]:
    """The plan's notes, and what the runs themselves said (a simulator that measures no memory shares, ...)."""
    said = [n for r in (run.v1, *run.v1_others) if r is not None for n in r.notes]
    return [*run.plan.notes, *dict.fromkeys(n for n in said if n not in run.plan.notes)]


def _v1_extras(run: SimulationRun) -> dict[str, Any]:
    v, r = run.plan.v1, run.v1
    assert v is not None and r is not None
    inp = v.inputs
    sch, lay, t = inp.scheduler, inp.layout, r.tiers
    needed = t.gpu_hit_tokens + t.cpu_hit_tokens + t.recomputed_tokens
    row = _v1_row(run)
    doc: dict[str, Any] = {
        "requests": v.user_requests, "sequences": len(inp.requests),
        "pool_slots": (lay.num_blocks - 1) * v.block_size, "pool_blocks": lay.num_blocks, "block_size": v.block_size,
        "kv_cache_groups": len(lay.groups), "max_model_len": sch.max_model_len, "max_num_seqs": sch.max_num_seqs,
        "max_num_batched_tokens": sch.max_num_batched_tokens, "async_scheduling": sch.async_scheduling,
        "steps": r.steps, "mean_running": r.mean_running, "peak_running": r.peak_running,
        "preemptions": r.preemptions, "mean_kv_usage": r.mean_kv_usage,
        "peak_kv_usage": r.peak_kv_usage_permille / 1000,
        "generated_tokens": r.generated_tokens, "throughput_tokens_per_s": r.throughput_tokens_per_s,
        "busy_seconds": r.busy_seconds, "drain_seconds": row.drain_seconds,
        "prefix_cache": {
            "enabled": sch.enable_prefix_caching,
            "hit_rate": (t.gpu_hit_tokens + t.cpu_hit_tokens) / needed if needed else 0.0,
            "gpu_hit_rate": t.gpu_hit_tokens / needed if needed else 0.0,
            "cpu_hit_rate": t.cpu_hit_tokens / needed if needed else 0.0,
            "gpu_hit_tokens": t.gpu_hit_tokens, "cpu_hit_tokens": t.cpu_hit_tokens,
            "recomputed_tokens": t.recomputed_tokens, "evictions": t.gpu_evicted_blocks,
            "prompt_tokens": r.prompt_tokens, "first_scheduling_hit_rate": r.prefix_hit_rate,
        },
        "latency_s": {"queue": _pcts(r.queue_s), "ttft": _pcts(r.ttft_s), "e2e": _pcts(r.e2e_s)},
        "latency_steps": {"queue": _pcts(r.queue_steps), "ttft": _pcts(r.ttft_steps), "e2e": _pcts(r.e2e_steps)},
        "sessions": {"turn_pairs": len(v.session_turns), "turns_before_previous_answer": late_turns(run)},
    }
    if run.dp is not None:
        doc["data_parallel"] = data_parallel_json(run)
    if inp.offload is not None:
        o = inp.offload
        doc["offload"] = {
            "cpu_bytes": o.cpu_bytes, "bandwidth_bytes_per_s": o.bandwidth_bytes_per_s,
            "bytes_to_cpu": t.bytes_to_cpu, "bytes_from_cpu": t.bytes_from_cpu, "load_seconds": t.load_seconds,
            "store_seconds": t.store_seconds, "capacity_chunks": t.cpu_capacity_chunks,
            "stored_chunks": t.cpu_stored_chunks, "loaded_chunks": t.cpu_loaded_chunks,
            "evicted_chunks": t.cpu_evicted_chunks,
        }
    return doc


def data_parallel_json(run: SimulationRun) -> dict[str, Any]:
    """Each data-parallel engine's share of the traffic and of the figures the run merged (kvplan.core.sim.v1.dp)."""
    v, dp = run.plan.v1, run.dp
    assert v is not None and dp is not None
    router = v.router
    return {
        "size": v.data_parallel_size,
        "router": {"score": router.score.value, "rotate": router.rotate, "api_servers": v.api_servers,
                   "engines_publish_counts": v.moe or router.dense_counts, "interval_s": router.interval_ps / 1e12,
                   "republish_s": router.republish_ps / 1e12},
        "ranks": [{
            "rank": i, "requests": len(rows), "completed": r.completed, "preemptions": r.preemptions,
            "mean_running": r.mean_running, "peak_running": r.peak_running, "mean_kv_usage": r.mean_kv_usage,
            "peak_kv_usage": r.peak_kv_usage_permille / 1000, "peak_waiting": r.peak_waiting,
            "generated_tokens": r.generated_tokens, "throughput_tokens_per_s": r.throughput_tokens_per_s,
            "busy_seconds": r.busy_seconds,
            # an engine sent nothing has no latency (null, not zeros)
            "latency_s": {"queue": _pcts(r.queue_s), "ttft": _pcts(r.ttft_s), "e2e": _pcts(r.e2e_s)} if rows else None,
        } for i, (r, rows) in enumerate(zip(dp.ranks, dp.rows))],
    }


def late_turns(run: SimulationRun) -> int:
    """Turns that arrived before the previous turn's answer was finished (arrivals are fixed up front)."""
    v, r = run.plan.v1, run.v1
    assert v is not None and r is not None
    recs = r.per_request
    late = 0
    for prev, cur in v.session_turns:
        a, b = recs[prev], recs[cur]
        if a.e2e_s is not None and b.e2e_s is not None:
            late += _arrival_s(run, cur) < _arrival_s(run, prev) + a.e2e_s
        else:
            late += b.arrival_step <= a.finish_step
    return late


def _arrival_s(run: SimulationRun, i: int) -> float:
    assert run.plan.v1 is not None
    return (run.plan.v1.inputs.requests[i].arrival_ps or 0) / 1e12  # (a few requests: the late turns)


def _queued_s(records) -> list[float]:  # type: ignore[no-untyped-def]
    """Each request's queue seconds: from the simulator's columns (a million requests) or the records."""
    if isinstance(records, RequestRecords):
        if not records.timed:
            return []
        return [(x - y) / 1e12 for x, y in zip(records.column("first_scheduled_ps"), records.column("arrival_ps"))]
    return [q.queue_s for q in records if q.queue_s is not None]
