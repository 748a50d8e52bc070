"""``kvplan simulate`` on the exact vLLM v1 scheduler simulator: which simulator a workload gets, the run,
its JSON and its text report (kvplan/io/workload_v1.py builds the inputs, kvplan.core.sim.v1 runs them)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvplan.cli.format import flag_value, format_bytes, make_console, new_table, print_json, print_table

if TYPE_CHECKING:
    from kvplan.core.sim.v1 import V1Result
    from kvplan.io.workload import Workload
    from kvplan.io.workload_v1 import V1Workload

console = make_console()


def event_or_v1(path: Path, *, engine: str | None, model: str | None, plot: Path | None,
                as_json: bool) -> "Workload | None":
    """The event engine's workload, or None after running and printing the vllm-v1 simulation."""
    import dataclasses

    from kvplan.io.workload import resolve_workload
    from kvplan.io.workload_v1 import EVENT, V1, choose, long_prompt_reason, read_file, resolve_v1

    wf = read_file(path, engine)
    sim, why = choose(wf, path, model)
    if sim == EVENT:
        w = resolve_workload(path, wf=wf)
        longer = "" if model == EVENT else long_prompt_reason(
            wf, [q.prompt for q in w.requests], w.config.max_num_batched_tokens, w.config.max_model_len)
        if not longer:
            return dataclasses.replace(w, notes=(*w.notes, f"simulator: event ({why})",
                                                 *_scheduler_note(wf.serving.engine)))
        sim, why = V1, longer
    v = resolve_v1(path, wf, why)
    run_v1(v, as_json=as_json, plot=plot)
    return None


def _scheduler_note(engine: str) -> tuple[str, ...]:
    """The event engine schedules as vLLM does, whichever engine's budget sized the pool."""
    name = engine.split("==")[0]
    if name == "sglang":
        return (("scheduling follows vLLM's rules (admission by prompt, the newest request preempted); SGLang "
                 "reserves room for future output tokens and retracts instead: docs/engines.md, \"SGLang's "
                 "scheduler\""),)
    if name == "trtllm":
        return (("scheduling follows vLLM's rules; TensorRT-LLM's scheduler (its capacity policy) is not "
                 "modelled"),)
    return ()


def run_v1(v: "V1Workload", *, as_json: bool, plot: Path | None = None) -> None:
    from kvplan.core.sim.v1 import simulate_v1
    from kvplan.errors import KvplanError

    try:
        result = simulate_v1(v.inputs)
    except KvplanError as exc:
        raise type(exc)(f"{v.origin}: {exc}") from None
    doc = v1_json(v, result)
    if as_json:
        print_json(doc)
    else:
        print_v1(v, result, doc)
    if plot is not None:
        from kvplan.cli.plot import plot_v1

        arrivals = [q.arrival_ps for q in v.inputs.requests if q.arrival_ps is not None]
        plot_v1(result, plot, title=v.name, last_arrival_s=max(arrivals) / 1e12 if arrivals else None)
        if not as_json:
            console.print(f"plot written to {plot}")


def _pcts(p) -> dict[str, float] | None:
    return None if p is None else {"p50": p.p50, "p90": p.p90, "p99": p.p99}


def late_turns(v: "V1Workload", r: "V1Result") -> int:
    """Turns that arrived before the previous turn's answer was finished (arrivals are fixed up front)."""
    recs = r.per_request
    late = 0
    for prev, cur in v.session_turns:
        a, b = recs[prev], recs[cur]
        if a.e2e_s is not None and b.e2e_s is not None:
            late += _arrival_s(v, cur) < _arrival_s(v, prev) + a.e2e_s
        else:
            late += b.arrival_step <= a.finish_step
    return late


def _arrival_s(v: "V1Workload", i: int) -> float:
    ps = v.inputs.requests[i].arrival_ps
    return (ps or 0) / 1e12


def v1_json(v: "V1Workload", r: "V1Result") -> dict[str, Any]:
    inp = v.inputs
    sch, lay, t = inp.scheduler, inp.layout, r.tiers
    last_arrival = max((q.arrival_ps or 0) for q in inp.requests) / 1e12
    drain = max(0.0, r.seconds - last_arrival) if r.seconds is not None else None
    needed = t.gpu_hit_tokens + t.cpu_hit_tokens + t.recomputed_tokens
    name = f"paged-{v.block_size}"
    served = {
        "mean_batch_size": r.mean_running, "peak_batch_size": r.peak_running, "preemptions": r.preemptions,
        "completed": v.user_requests - v.rejected, "rejected": v.rejected,
        "rejected_reasons": {"prompt_exceeds_max_model_len": v.rejected} if v.rejected else {},
        "makespan_steps": r.schedule_calls, "makespan_seconds": r.seconds, "generated_tokens": r.generated_tokens,
        "throughput_tokens_per_s": r.throughput_tokens_per_s, "busy_seconds": r.busy_seconds,
        "drain_seconds": drain,
    }
    doc: dict[str, Any] = {
        "workload": v.name, "requests": v.user_requests, "sequences": len(inp.requests),
        "scheduler_model": "vllm-v1",
        "scheduler_model_reason": v.reason,
        "pool_slots": (lay.num_blocks - 1) * v.block_size, "pool_blocks": lay.num_blocks, "block_size": v.block_size,
        "kv_cache_groups": len(lay.groups), "pool_bytes": v.pool_bytes, "bytes_per_token": v.bytes_per_token,
        "max_model_len": sch.max_model_len, "max_num_seqs": sch.max_num_seqs,
        "max_num_batched_tokens": sch.max_num_batched_tokens, "async_scheduling": sch.async_scheduling,
        "allocators": {name: served},
        "steps": r.steps, "mean_running": r.mean_running, "peak_running": r.peak_running,
        "preemptions": r.preemptions, "mean_kv_usage": r.mean_kv_usage,
        "peak_kv_usage": max(r.per_step_kv_usage_permille, default=0) / 1000,
        "generated_tokens": r.generated_tokens, "throughput_tokens_per_s": r.throughput_tokens_per_s,
        "busy_seconds": r.busy_seconds, "drain_seconds": drain,
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
        "sessions": {"turn_pairs": len(v.session_turns), "turns_before_previous_answer": late_turns(v, r)},
        "notes": list(v.notes),
    }
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


def _s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.3f}" if x < 10 else f"{x:,.1f}"


def print_v1(v: "V1Workload", r: "V1Result", doc: dict[str, Any]) -> None:
    inp = v.inputs
    sch, lay = inp.scheduler, inp.layout
    console.print(f"[bold]{v.name}[/]: {doc['requests']:,} requests, vllm-v1 scheduler, KV pool "
                  f"{lay.num_blocks:,} blocks of {v.block_size} tokens"
                  + (f" ({format_bytes(v.pool_bytes)})" if v.pool_bytes else "")
                  + f", max_model_len {flag_value(sch.max_model_len)}, max_num_seqs {flag_value(sch.max_num_seqs)}, "
                  f"max_num_batched_tokens {flag_value(sch.max_num_batched_tokens)}"
                  + (", async scheduling" if sch.async_scheduling else ""), soft_wrap=False)
    for note in v.notes:
        console.print(f"[yellow]note:[/] {note}")
    served = new_table("steps", "running", "peak", "preempt", "done", "KV use", "peak KV", "tok/s", numeric="*",
                       title="What it serves (tok/s: generated tokens per busy second)")
    served.add_row(f"{r.steps:,}", f"{r.mean_running:.1f}", str(r.peak_running), f"{r.preemptions:,}",
                   f"{doc['requests'] - v.rejected:,}", f"{100 * r.mean_kv_usage:.1f}%",
                   f"{100 * doc['peak_kv_usage']:.1f}%",
                   f"{r.throughput_tokens_per_s:,.0f}" if r.throughput_tokens_per_s else "-")
    print_table(console, served)
    if r.busy_seconds is not None:
        console.print(f"busy (something scheduled) / drain (after the last arrival): {r.busy_seconds:,.1f} s / "
                      f"{doc['drain_seconds']:,.1f} s")
    lat = new_table("seconds", "p50", "p90", "p99", numeric="*", title="Latency per request, from its arrival")
    for label, key in (("queue", "queue"), ("first token", "ttft"), ("end to end", "e2e")):
        p = doc["latency_s"][key]
        if p:
            lat.add_row(label, _s(p["p50"]), _s(p["p90"]), _s(p["p99"]))
    if lat.row_count:
        print_table(console, lat)
    pc = doc["prefix_cache"]
    needed = pc["gpu_hit_tokens"] + pc["cpu_hit_tokens"] + pc["recomputed_tokens"]
    tiers = new_table("prompt tokens", "tokens", "share", numeric="*",
                      title="Prompt tokens by source" + ("" if pc["enabled"] else " (no prefix caching)"))
    for label, key in (("GPU prefix cache", "gpu_hit_tokens"), ("CPU tier", "cpu_hit_tokens"),
                       ("computed", "recomputed_tokens")):
        if key == "cpu_hit_tokens" and inp.offload is None:
            continue
        tiers.add_row(label, f"{pc[key]:,}", f"{100 * pc[key] / needed:.1f}%" if needed else "-")
    print_table(console, tiers)
    console.print(f"hit rate {100 * pc['hit_rate']:.1f}%, GPU blocks evicted from the cache {pc['evictions']:,}")
    if "offload" in doc:
        o = doc["offload"]
        console.print(f"offload: {format_bytes(o['bytes_to_cpu'])} to CPU, {format_bytes(o['bytes_from_cpu'])} "
                      f"back ({o['load_seconds']:,.2f} s of loads in the steps), "
                      f"{o['evicted_chunks']:,} CPU chunks evicted of {o['capacity_chunks']:,}")
    late = doc["sessions"]["turns_before_previous_answer"]
    if late:
        console.print(f"[yellow]note:[/] {late:,} of {doc['sessions']['turn_pairs']:,} turns arrived before the "
                      "previous answer finished (arrivals are fixed: raise think_time_s)")
