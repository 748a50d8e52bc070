"""``kvplan simulate``'s text report: the header, the notes, then the tables of the rows every simulator reports
(kvplan.app.report) and, for a vllm-v1 run, its own (prompt tokens by source, the CPU tier, late turns)."""

from __future__ import annotations

from kvplan.app.report import (AllocatorRow, allocator_rows, data_parallel_json, late_turns, run_notes,
                               simulation_json)
from kvplan.app.simulation import SimulationRun
from kvplan.cli.format import flag_value, format_bytes, make_console, new_table, print_table

console = make_console()


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _secs(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if x < 10 else f"{x:,.1f}" if x < 1000 else f"{x:,.0f}"


def print_run(run: SimulationRun) -> None:
    rows = allocator_rows(run)
    _header(run)
    if any(r.token_states_frac is not None for r in rows):
        _memory(rows)
    _service(run, rows)
    _latency(rows)
    if run.dp is not None:
        _ranks(run)
    if run.v1 is not None:
        _v1_tiers(run)
    for r in rows:
        if r.rejected_reasons:
            reasons = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in sorted(r.rejected_reasons.items()))
            console.print(f"[yellow]{r.allocator} rejected[/] {reasons}")
        if r.peak_waiting is not None and r.peak_waiting > r.peak_batch_size * 4 and r.mean_queue_seconds is not None:
            console.print(f"[yellow]{r.allocator}:[/] backlog of up to {r.peak_waiting:,} waiting requests "
                          f"(mean wait {r.mean_queue_seconds:,.1f} s): arrivals exceed what this pool serves")


def _header(run: SimulationRun) -> None:
    plan = run.plan
    pool = f" ({format_bytes(plan.pool.pool_bytes)})" if plan.pool.pool_bytes else ""
    if plan.v1 is not None:
        sch, lay = plan.v1.inputs.scheduler, plan.v1.inputs.layout
        count = plan.v1.user_requests
        what = f"vllm-v1 scheduler, KV pool {lay.num_blocks:,} blocks of {plan.v1.block_size} tokens{pool}"
        limits = (sch.max_model_len, sch.max_num_seqs, sch.max_num_batched_tokens)
        tail = ", async scheduling" if sch.async_scheduling else ""
    else:
        assert plan.event is not None
        c = plan.event.config
        count = len(plan.event.requests)
        what = f"KV pool {c.pool_slots:,} token slots{pool}"
        limits = (c.max_model_len, c.max_num_seqs, c.max_num_batched_tokens)
        tail = ""
    console.print(f"[bold]{plan.name}[/]: {count:,} requests, {what}, max_model_len {flag_value(limits[0])}, "
                  f"max_num_seqs {flag_value(limits[1])}, max_num_batched_tokens {flag_value(limits[2])}{tail}",
                  soft_wrap=False)
    for note in run_notes(run):
        console.print(f"[yellow]note:[/] {note}")


def _memory(rows: list[AllocatorRow]) -> None:
    memory = new_table("allocator", "tokens", "reserved", "int frag", "ext frag", "free", numeric="*",
                       no_wrap=("allocator",),
                       title="Where the KV memory goes: share of the pool over the busy period")
    for r in rows:
        memory.add_row(r.allocator, _pct(r.token_states_frac), _pct(r.reserved_frac), _pct(r.internal_frag_frac),
                       _pct(r.external_frag_frac), _pct(r.free_frac))
    print_table(console, memory)


def _service(run: SimulationRun, rows: list[AllocatorRow]) -> None:
    service = new_table("allocator", "batch", "peak", "preempt", "done", "rejected", "tok/s", numeric="*",
                        no_wrap=("allocator",), title="What it serves (tok/s: generated tokens per busy second)")
    for row in rows:
        service.add_row(row.allocator, f"{row.mean_batch_size:.1f}", str(row.peak_batch_size), f"{row.preemptions:,}",
                        f"{row.completed:,}", f"{row.rejected:,}",
                        f"{row.throughput_tokens_per_s:,.0f}" if row.throughput_tokens_per_s else "-")
    print_table(console, service)
    if run.v1 is not None:
        doc = simulation_json(run)
        console.print(f"{rows[0].allocator}: {run.v1.steps:,} steps, KV cache usage {100 * run.v1.mean_kv_usage:.1f}% "
                      f"(peak {100 * doc['peak_kv_usage']:.1f}%)")
    busy = [(r.allocator, r.busy_seconds, r.drain_seconds) for r in rows if r.busy_seconds is not None]
    if busy:
        console.print("busy (a request running) / drain (after the last arrival), seconds: "
                      + ", ".join(f"{a} {b:,.1f} / {d or 0:,.1f}" for a, b, d in busy))


def _latency(rows: list[AllocatorRow]) -> None:
    latency = new_table("allocator", "latency", "p50", "p90", "p99", numeric=("p50", "p90", "p99"),
                        no_wrap=("allocator", "latency"), title="Latency per request, seconds")
    for r in rows:
        if r.e2e_s is None:
            continue
        for k, (name, p) in enumerate((("queue", r.queue_s), ("TTFT", r.ttft_s), ("e2e", r.e2e_s))):
            latency.add_row(r.allocator if k == 0 else "", name, _secs(p.p50 if p else None),
                            _secs(p.p90 if p else None), _secs(p.p99 if p else None))
    if latency.rows:
        print_table(console, latency)
        console.print("from arrival: queue to admission, TTFT to the end of the prefill step, e2e to completion")


def _ranks(run: SimulationRun) -> None:
    dp = data_parallel_json(run)
    table = new_table("rank", "requests", "batch", "preempt", "KV use", "peak", "TTFT p50", "p99", numeric="*",
                      title=f"Data-parallel engines ({dp['size']}): KV use and TTFT seconds per engine")
    for r in dp["ranks"]:
        ttft = (r["latency_s"] or {}).get("ttft") or {}
        table.add_row(str(r["rank"]), f"{r['requests']:,}", f"{r['mean_running']:.1f}", f"{r['preemptions']:,}",
                      _pct(r["mean_kv_usage"]), _pct(r["peak_kv_usage"]), _secs(ttft.get("p50")),
                      _secs(ttft.get("p99")))
    print_table(console, table)


def _v1_tiers(run: SimulationRun) -> None:
    doc = simulation_json(run)
    pc = doc["prefix_cache"]
    needed = pc["gpu_hit_tokens"] + pc["cpu_hit_tokens"] + pc["recomputed_tokens"]
    tiers = new_table("prompt tokens", "tokens", "share", numeric="*",
                      title="Prompt tokens by source" + ("" if pc["enabled"] else " (no prefix caching)"))
    offload = run.plan.v1.inputs.offload if run.plan.v1 is not None else None
    for label, key in (("GPU prefix cache", "gpu_hit_tokens"), ("CPU tier", "cpu_hit_tokens"),
                       ("computed", "recomputed_tokens")):
        if key == "cpu_hit_tokens" and offload is None:
            continue
        tiers.add_row(label, f"{pc[key]:,}", f"{100 * pc[key] / needed:.1f}%" if needed else "-")
    print_table(console, tiers)
    console.print(f"hit rate {100 * pc['hit_rate']:.1f}%, GPU blocks evicted from the cache {pc['evictions']:,}")
    if "offload" in doc:
        o = doc["offload"]
        console.print(f"offload: {format_bytes(o['bytes_to_cpu'])} to CPU, {format_bytes(o['bytes_from_cpu'])} "
                      f"back ({o['load_seconds']:,.2f} s of loads in the steps), "
                      f"{o['evicted_chunks']:,} CPU chunks evicted of {o['capacity_chunks']:,}")
    late = late_turns(run)
    if late:
        console.print(f"[yellow]note:[/] {late:,} of {doc['sessions']['turn_pairs']:,} turns arrived before the "
                      "previous answer finished (arrivals are fixed: raise think_time_s)")
