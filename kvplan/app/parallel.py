"""The event engine's allocators run side by side: one forked process per usable CPU for large workloads.

Workers inherit the requests through ``fork`` (copy-on-write) instead of pickling a million of them, and each writes
its count of finished requests into its own slot of a shared array, which the parent reads ten times a second to
report progress.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from kvplan.app.simulation import EventRun
from kvplan.core.sim.model import SimResult

PARALLEL_FROM_REQUESTS = 20_000  # below this, one process is faster than starting workers
_SHARED: dict[str, Any] = {}  # the run and progress counters, inherited by forked workers


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity: a container or `taskset` may allow fewer than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _run_shared(index: int) -> SimResult:
    from kvplan.core.sim.engine import simulate

    run, done = _SHARED["run"], _SHARED["done"]

    def report(n: int) -> None:
        done[index] = n  # this worker's slot only: no lock needed

    return simulate(run.requests, run.config, run.allocators[index], timeline_points=_SHARED["points"],
                    progress=report)


def run_allocators(run: EventRun, *, workers: int | None = None, progress: Callable[[int], None] | None = None,
                   timeline_points: int = 0) -> list[SimResult]:
    """Each allocator over the same requests, in ``run.allocators``' order (``workers`` None: the usable CPUs)."""
    import multiprocessing

    from kvplan.core.sim.engine import simulate

    k = len(run.allocators)
    workers = min(k, usable_cpus() if workers is None else workers)
    if workers > 1 and "fork" in multiprocessing.get_all_start_methods() and len(run.requests) >= PARALLEL_FROM_REQUESTS:
        ctx = multiprocessing.get_context("fork")
        done = ctx.Array("q", k, lock=False)
        _SHARED.update(run=run, points=timeline_points, done=done)
        # longest first, so that no worker is left with a long one at the end: paged allocators (preemptions),
        # then contiguous ones, contiguous-max last (every reservation the same size: the cheapest to place)
        order = sorted(range(k), key=lambda i: (not run.allocators[i].paged, run.allocators[i].reservation == "max"))
        try:
            with ctx.Pool(workers) as pool:
                pending = pool.map_async(_run_shared, order, chunksize=1)
                while not pending.ready():
                    pending.wait(0.1)
                    if progress is not None:
                        progress(sum(done))
                by_index = dict(zip(order, pending.get()))
        finally:
            _SHARED.clear()
        return [by_index[i] for i in range(k)]
    results = []
    for finished, allocator in enumerate(run.allocators):
        base = finished * len(run.requests)
        report = None if progress is None else (lambda n, base=base: progress(base + n))
        results.append(simulate(run.requests, run.config, allocator, timeline_points=timeline_points,
                                progress=report))
    return results
