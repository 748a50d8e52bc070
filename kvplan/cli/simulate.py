"""``kvplan simulate`` and ``kvplan schema``."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from kvplan.cli.root import app
from kvplan.cli.format import flag_value, format_bytes, make_console, new_table, print_json, print_table
from kvplan.errors import ConfigError, InputError

if TYPE_CHECKING:
    from kvplan.core.sim.model import SimResult
    from kvplan.io.workload import Workload

console = make_console()
err_console = make_console(stderr=True)
PARALLEL_FROM_REQUESTS = 20_000  # below this, one process is faster than starting workers
TIMELINE_POINTS = 400


_SHARED: dict[str, Any] = {}  # the workload and progress counters, inherited by forked workers instead of pickled


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity: a container or `taskset` may allow fewer than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _run_shared(index: int) -> "SimResult":
    from kvplan.core.sim.engine import simulate

    w, done = _SHARED["workload"], _SHARED["done"]

    def report(n: int) -> None:
        done[index] = n  # this worker's slot only: no lock needed

    return simulate(w.requests, w.config, w.allocators[index], timeline_points=_SHARED["points"], progress=report)


def run_all(w: "Workload", *, progress: bool, points: int) -> list["SimResult"]:
    """Each allocator over the same requests; in forked processes (one per usable CPU) for large workloads.

    The progress bar counts finished requests (completed or rejected) over all allocators: workers
    write their count into a shared array, which the parent reads ten times a second.
    """
    import multiprocessing

    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    from kvplan.core.sim.engine import simulate

    k = len(w.allocators)
    total = len(w.requests) * k
    workers = min(k, usable_cpus())
    fork_ok = "fork" in multiprocessing.get_all_start_methods()
    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
               TextColumn("{task.completed:,.0f}/{task.total:,.0f} requests"), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True, disable=not progress) as bar:
        task = bar.add_task(f"simulating {k} allocator{'s' * (k > 1)}", total=total)
        if workers > 1 and fork_ok and len(w.requests) >= PARALLEL_FROM_REQUESTS:
            ctx = multiprocessing.get_context("fork")
            done = ctx.Array("q", k, lock=False)
            _SHARED.update(workload=w, points=points, done=done)
            # longest first, so that no worker is left with a long one at the end: paged allocators (preemptions),
            # then contiguous ones, contiguous-max last (every reservation the same size: the cheapest to place)
            order = sorted(range(k), key=lambda i: (not w.allocators[i].paged, w.allocators[i].reservation == "max"))
            try:
                with ctx.Pool(workers) as pool:
                    pending = pool.map_async(_run_shared, order, chunksize=1)
                    while not pending.ready():
                        pending.wait(0.1)
                        bar.update(task, completed=sum(done))
                    by_index = dict(zip(order, pending.get()))
            finally:
                _SHARED.clear()
            return [by_index[i] for i in range(k)]
        results = []
        finished = 0
        for a in w.allocators:
            results.append(simulate(w.requests, w.config, a, timeline_points=points,
                                    progress=lambda n, base=finished: bar.update(task, completed=base + n)))
            finished += len(w.requests)
    return results


def result_json(r: "SimResult") -> dict[str, Any]:
    return {
        "token_states_frac": r.token_states_frac, "reserved_frac": r.reserved_frac,
        "internal_frag_frac": r.internal_frag_frac, "external_frag_frac": r.external_frag_frac,
        "free_frac": r.free_frac, "mean_batch_size": r.mean_batch_size, "peak_batch_size": r.peak_batch_size,
        "preemptions": r.preemptions, "completed": r.completed, "rejected": r.rejected,
        "rejected_reasons": r.rejected_reasons, "makespan_steps": r.makespan_steps,
        "makespan_seconds": r.makespan_seconds, "generated_tokens": r.generated_tokens,
        "throughput_tokens_per_s": r.throughput_tokens_per_s, "busy_seconds": r.busy_seconds,
        "drain_seconds": r.drain_seconds, "peak_waiting": r.peak_waiting,
        "mean_queue_seconds": r.mean_queue_seconds,
        "latency": latency_json(r),
    }


def latency_json(r: "SimResult") -> dict[str, dict[str, float]] | None:
    """Per-request latency percentiles in seconds (None when no request completed)."""
    if r.latency is None:
        return None
    lat = r.latency
    return {key: {"p50": p.p50, "p90": p.p90, "p99": p.p99}
            for key, p in (("queue_s", lat.queue_s), ("ttft_s", lat.ttft_s), ("e2e_s", lat.e2e_s))}


@app.command()
def simulate(
    workload_file: Path = typer.Argument(..., metavar="WORKLOAD", help="Workload YAML, or a bundled example's name "
                                         "(kvplan examples); the format: docs/workloads.md, kvplan schema workload."),
    allocator: Optional[list[str]] = typer.Option(None, "--allocator", "-a", help="Allocator to simulate, repeatable "
                                                  "(contiguous-max, contiguous-pow2, contiguous-oracle, paged-B); "
                                                  "default: the file's allocators."),
    engine: Optional[str] = typer.Option(None, "--engine", "-e", help="Engine whose budget sizes the pool, "
                                                                    "optionally pinned: vllm==0.11.0 (default: "
                                                                    "the file's serving.engine)."),
    placement: Optional[str] = typer.Option(None, "--placement", help="Contiguous placement: buddy or first-fit; "
                                            "default: the file's placement (buddy when it names none)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG: memory timeline and breakdown per "
                                        "allocator (needs matplotlib); default: no plot."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of tables; default: tables."),
    scheduler_model: Optional[str] = typer.Option(None, "--scheduler-model", help="auto, event or vllm-v1 (vLLM "
                                                  "v1's scheduler step by step); default: the file's scheduler.model "
                                                  "(auto)."),
) -> None:
    """Replay traffic against contiguous and paged KV allocators and show where the memory goes.

    Shares of the pool are averaged over the busy period; throughput is generated tokens per second
    with at least one request running (busy_seconds), the drain after the last arrival apart.
    """
    import dataclasses

    from kvplan.cli.simulate_v1 import event_or_v1
    from kvplan.core.sim.model import allocator_spec
    from kvplan.io.examples import resolve_input
    from kvplan.io.paths import probe, shown

    if plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise InputError("--plot needs matplotlib: pip install -e '.[plot]'") from None
        try:
            folder = probe(plot.parent)
        except ConfigError as exc:
            raise InputError(f"--plot {exc}") from None
        if folder is None or not stat.S_ISDIR(folder.st_mode):
            raise InputError(f"--plot {shown(plot)}: folder {shown(plot.parent)} does not exist")
    event = event_or_v1(resolve_input(workload_file, "workload"), engine=engine, model=scheduler_model, plot=plot,
                        as_json=as_json)
    if event is None:
        return  # the vllm-v1 simulator ran and printed
    w = event
    if allocator or placement:
        names = allocator or [a.name for a in w.allocators]
        where = placement or (w.allocators[0].placement if w.allocators else "buddy")
        w = dataclasses.replace(w, allocators=[allocator_spec(a, placement=where) for a in names])
    show_progress = not as_json and sys.stderr.isatty() and len(w.requests) * len(w.allocators) >= 20_000
    results = run_all(w, progress=show_progress, points=TIMELINE_POINTS if plot else 0)
    if plot is not None:
        from kvplan.cli.plot import plot_simulation

        arrivals = getattr(w.requests, "arrival_ps", None) or [r.arrival_ps for r in w.requests]
        plot_simulation(results, plot, title=w.name, last_arrival_s=max(arrivals) / 1e12 if len(arrivals) else None)
    if as_json:
        print_json({
            "workload": w.name, "requests": len(w.requests), "scheduler_model": "event",
            "pool_slots": w.config.pool_slots,
            "pool_bytes": w.pool_bytes, "bytes_per_token": w.bytes_per_token,
            "max_model_len": w.config.max_model_len, "max_num_seqs": w.config.max_num_seqs,
            "max_num_batched_tokens": w.config.max_num_batched_tokens,
            "allocators": {r.allocator: result_json(r) for r in results}, "notes": list(w.notes),
        })
        return
    _print_tables(w, results)
    if plot is not None:
        console.print(f"plot written to {plot}")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _secs(x: float) -> str:
    return f"{x:.3f}" if x < 10 else f"{x:,.1f}" if x < 1000 else f"{x:,.0f}"


def _print_tables(w: "Workload", results: list["SimResult"]) -> None:
    c = w.config
    console.print(f"[bold]{w.name}[/]: {len(w.requests):,} requests, KV pool {c.pool_slots:,} token slots"
                  + (f" ({format_bytes(w.pool_bytes)})" if w.pool_bytes else "")
                  + f", max_model_len {flag_value(c.max_model_len)}, max_num_seqs {flag_value(c.max_num_seqs)}, "
                  f"max_num_batched_tokens {flag_value(c.max_num_batched_tokens)}", soft_wrap=False)
    for note in w.notes:
        console.print(f"[yellow]note:[/] {note}")
    memory = new_table("allocator", "tokens", "reserved", "int frag", "ext frag", "free", numeric="*",
                       no_wrap=("allocator",),
                       title="Where the KV memory goes: share of the pool over the busy period")
    for r in results:
        memory.add_row(r.allocator, _pct(r.token_states_frac), _pct(r.reserved_frac), _pct(r.internal_frag_frac),
                       _pct(r.external_frag_frac), _pct(r.free_frac))
    print_table(console, memory)
    service = new_table("allocator", "batch", "peak", "preempt", "done", "rejected", "tok/s", numeric="*",
                        no_wrap=("allocator",), title="What it serves (tok/s: generated tokens per busy second)")
    for r in results:
        service.add_row(r.allocator, f"{r.mean_batch_size:.1f}", str(r.peak_batch_size), f"{r.preemptions:,}",
                        f"{r.completed:,}", f"{r.rejected:,}", f"{r.throughput_tokens_per_s:,.0f}")
    print_table(console, service)
    console.print("busy (a request running) / drain (after the last arrival), seconds: "
                  + ", ".join(f"{r.allocator} {r.busy_seconds:,.1f} / {r.drain_seconds:,.1f}" for r in results))
    latency = new_table("allocator", "latency", "p50", "p90", "p99", numeric=("p50", "p90", "p99"),
                        no_wrap=("allocator", "latency"),
                        title="Latency per request, seconds")
    for r in results:
        if r.latency is None:
            continue
        for k, (name, p) in enumerate((("queue", r.latency.queue_s), ("TTFT", r.latency.ttft_s),
                                       ("e2e", r.latency.e2e_s))):
            latency.add_row(r.allocator if k == 0 else "", name, _secs(p.p50), _secs(p.p90), _secs(p.p99))
    if latency.rows:
        print_table(console, latency)
        console.print("from arrival: queue to admission, TTFT to the end of the prefill step, e2e to completion")
    for r in results:
        if r.rejected_reasons:
            reasons = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in sorted(r.rejected_reasons.items()))
            console.print(f"[yellow]{r.allocator} rejected[/] {reasons}")
        if r.peak_waiting > r.peak_batch_size * 4:
            console.print(f"[yellow]{r.allocator}:[/] backlog of up to {r.peak_waiting:,} waiting requests "
                          f"(mean wait {r.mean_queue_seconds:,.1f} s): arrivals exceed what this pool serves")


@app.command()
def schema(
    what: str = typer.Argument(..., help="Which file's schema: workload or budgets."),
) -> None:
    """JSON Schema of a kvplan input file."""
    if what == "workload":
        from kvplan.io.workload import workload_schema

        sys.stdout.write(json.dumps(workload_schema(), indent=2) + "\n")
    elif what == "budgets":
        from kvplan.io.budgets import budgets_schema

        sys.stdout.write(json.dumps(budgets_schema(), indent=2) + "\n")
    else:
        raise InputError(f"schema of what? use workload or budgets (got {what!r})")
