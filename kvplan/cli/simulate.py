"""``kvplan simulate``: parse the flags, plan and run (kvplan.app.simulate), render (text, JSON, plot)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from kvplan.cli.format import make_console, print_json
from kvplan.cli.options import JsonOption
from kvplan.cli.root import app
from kvplan.errors import ConfigError, InputError

err_console = make_console(stderr=True)
TIMELINE_POINTS = 400
PROGRESS_FROM = 20_000  # requests x allocators below which no progress bar is worth drawing

WorkloadArg = Annotated[Path, typer.Argument(
    metavar="WORKLOAD", help="Workload YAML, or a bundled example's name (kvplan examples); the format: "
                             "docs/workloads.md, kvplan schema workload.")]
AllocatorOpt = Annotated[Optional[list[str]], typer.Option(
    "--allocator", "-a", help="Allocator to simulate, repeatable (contiguous-max, contiguous-pow2, contiguous-oracle, "
                              "paged-B); default: the file's allocators (under vllm-v1 without any: vLLM's "
                              "paged pool).")]
EngineOpt = Annotated[Optional[str], typer.Option(
    "--engine", "-e", help="Engine whose budget sizes the pool, optionally pinned: vllm==0.11.0 (default: the file's "
                           "serving.engine).")]
PlacementOpt = Annotated[Optional[str], typer.Option(
    "--placement", help="Contiguous placement: buddy or first-fit; default: the file's placement (buddy when it names "
                        "none).")]
PlotOpt = Annotated[Optional[Path], typer.Option(
    "--plot", help="Write a PNG: the pool over simulated time per allocator (needs matplotlib); default: no plot.")]
SchedulerOpt = Annotated[Optional[str], typer.Option(
    "--scheduler-model", help="auto, event or vllm-v1 (vLLM v1's scheduler step by step); default: the file's "
                              "scheduler.model (auto).")]


@app.command()
def simulate(
    workload_file: WorkloadArg,
    *,
    allocator: AllocatorOpt = None,
    engine: EngineOpt = None,
    placement: PlacementOpt = None,
    plot: PlotOpt = None,
    as_json: JsonOption = False,
    scheduler_model: SchedulerOpt = None,
) -> None:
    """Replay traffic against contiguous and paged KV allocators and show where the memory goes.

    Shares of the pool are averaged over the busy period; throughput is generated tokens per second
    with at least one request running (busy_seconds), the drain after the last arrival apart.
    """
    from kvplan.app.report import last_arrival_s, simulation_json
    from kvplan.app.simulate import plan_simulation, run_simulation
    from kvplan.io.examples import resolve_input

    _check_plot(plot)
    plan = plan_simulation(resolve_input(workload_file, "workload"), engine=engine, simulator=scheduler_model,
                           allocators=allocator, placement=placement)
    run = _run(plan, progress=not as_json and sys.stderr.isatty(), points=TIMELINE_POINTS if plot else 0,
               per_step=plot is not None)
    if plot is not None:
        from kvplan.cli.plot import plot_run

        plot_run(run, plot, last_arrival_s=last_arrival_s(run))
    if as_json:
        print_json(simulation_json(run))
        return
    from kvplan.cli.simulate_tables import print_run

    print_run(run)
    if plot is not None:
        make_console().print(f"plot written to {plot}")


def _run(plan, *, progress: bool, points: int, per_step: bool):  # type: ignore[no-untyped-def]
    """The run, with a progress bar over the event engine's requests x allocators on a terminal."""
    from kvplan.app.simulate import run_simulation

    total = len(plan.event.requests) * len(plan.event.allocators) if plan.event is not None else 0
    if not progress or total < PROGRESS_FROM:
        return run_simulation(plan, timeline_points=points, workers=None, per_step=per_step)
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    k = len(plan.event.allocators)
    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
               TextColumn("{task.completed:,.0f}/{task.total:,.0f} requests"), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task(f"simulating {k} allocator{'s' * (k > 1)}", total=total)
        return run_simulation(plan, timeline_points=points, workers=None, per_step=per_step,
                              progress=lambda n: bar.update(task, completed=n))


def _check_plot(plot: Optional[Path]) -> None:
    """--plot's needs, checked before any simulation runs: matplotlib, and a folder to write in."""
    if plot is None:
        return
    from kvplan.io.paths import probe, shown

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
