"""``kvplan plan``: the rendering of ``kvplan.app.plan.plan_model``; exit 1 when nothing in the space holds the target."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from kvplan.app.plan import PlanReport, plan_model, plan_with_traffic, workload_target
from kvplan.cli.format import make_console, new_table, print_json, print_table
from kvplan.cli.options import FetchOption, JsonOption, ModelArg, tokens
from kvplan.cli.root import app
from kvplan.io.workload import is_workload_file

console = make_console()

MaxLenOpt = Annotated[Optional[int], typer.Option("--max-model-len", "-s", parser=tokens("--max-model-len"), help=(
    "Tokens a request may hold, e.g. 32768 or 32k (a WORKLOAD: its scheduler's, else the model's)."))]
ConcurrencyOpt = Annotated[Optional[int], typer.Option("--concurrency", "-c", help=(
    "Requests of --max-model-len tokens held at once, over every replica (not with a WORKLOAD)."))]
WorkloadOpt = Annotated[Optional[Path], typer.Option("--workload", help=(
    "A workload file (`kvplan simulate`), or a bundled example's name (`kvplan examples`): the first --top rows "
    "run with its traffic (default: none)."))]
MaxTtftOpt = Annotated[Optional[float], typer.Option("--max-ttft", help=(
    "Seconds to first token at --percentile a simulated row must keep (a WORKLOAD needs this or --max-queue)."))]
MaxQueueOpt = Annotated[Optional[float], typer.Option("--max-queue", help=(
    "Seconds of queueing at --percentile a simulated row must keep."))]
PercentileOpt = Annotated[str, typer.Option("--percentile", help="p50, p90 or p99 (default p99).")]
GpusOpt = Annotated[Optional[str], typer.Option("--gpus", help=(
    "Comma-separated GPU names (`kvplan gpus`) (default: every catalog GPU of 40 GiB or more)."))]
EnginesOpt = Annotated[str, typer.Option("--engine", help=(
    "Engines and releases, comma-separated, e.g. vllm==0.11.0,sglang (default vllm: the newest rules)."))]
KvOpt = Annotated[str, typer.Option("--kv-cache-dtype", help=(
    "KV dtypes to try, comma-separated, e.g. auto,fp8 (default auto: the model's)."))]
WeightOpt = Annotated[str, typer.Option("--weight-dtype", help=(
    "Weight formats to try, e.g. auto,fp8 (default auto: the checkpoint's own; no other unless asked)."))]
MaxGpusOpt = Annotated[int, typer.Option("--max-gpus", help="Most GPUs a deployment may use (default 64).")]
PerNodeOpt = Annotated[int, typer.Option("--gpus-per-node", help=(
    "GPUs in a node; tensor parallelism stays inside one (default 8)."))]
MaxNodesOpt = Annotated[Optional[int], typer.Option("--max-nodes", help="Most nodes (default: as --max-gpus allows).")]
UtilOpt = Annotated[Optional[float], typer.Option("--gpu-memory-utilization", help=(
    "The engine's memory share (default: each release's own)."))]
PriceOpt = Annotated[Optional[str], typer.Option("--price", help=(
    "Price per GPU-hour, e.g. H100-80GB=2.49,H200=3.10: rank by cost (default: by GPU count)."))]
PricesOpt = Annotated[Optional[Path], typer.Option("--prices", help=(
    "A prices file (configs/prices/example-2026-05.yaml is an example, not current prices)."))]
TopOpt = Annotated[int, typer.Option("--top", help="Rows of the ranked front to show (default 10).")]


@app.command()
def plan(
    model: ModelArg,
    *,
    max_model_len: MaxLenOpt = None,
    concurrency: ConcurrencyOpt = None,
    gpus: GpusOpt = None,
    engine: EnginesOpt = "vllm",
    kv_cache_dtype: KvOpt = "auto",
    weight_dtype: WeightOpt = "auto",
    max_gpus: MaxGpusOpt = 64,
    gpus_per_node: PerNodeOpt = 8,
    max_nodes: MaxNodesOpt = None,
    utilization: UtilOpt = None,
    price: PriceOpt = None,
    prices: PricesOpt = None,
    top: TopOpt = 10,
    workload: WorkloadOpt = None,
    max_ttft: MaxTtftOpt = None,
    max_queue: MaxQueueOpt = None,
    percentile: PercentileOpt = "p99",
    as_json: JsonOption = False,
    fetch: FetchOption = None,
) -> None:
    """The cheapest deployments that hold --concurrency requests of --max-model-len tokens, with fit's rules; or
    for a WORKLOAD file, the cheapest one engine that serves its traffic within --max-ttft / --max-queue."""
    if top < 1:
        raise typer.BadParameter(f"--top must be at least 1 (got {top})")
    bounds = _bounds(max_ttft, max_queue, percentile)
    if workload is not None:  # a file, or a bundled example's name (kvplan examples), as simulate takes it
        from kvplan.io.examples import resolve_input

        workload = resolve_input(workload, "workload")
    traffic, replicas = workload, True
    if is_workload_file(model):
        if concurrency is not None or workload is not None:
            raise typer.BadParameter("a WORKLOAD sets the traffic: no --concurrency or --workload with it")
        if not bounds:
            raise typer.BadParameter("a WORKLOAD needs a bound to keep: --max-ttft or --max-queue (seconds)")
        traffic, replicas = Path(model), False
        model, length = workload_target(traffic)
        max_model_len, concurrency = max_model_len or length, 1
    elif max_model_len is None or concurrency is None:
        raise typer.BadParameter("give --max-model-len and --concurrency (or a WORKLOAD file)")
    elif bounds and workload is None:
        raise typer.BadParameter("--max-ttft and --max-queue judge simulated rows: give --workload")
    report = plan_model(model, max_model_len=max_model_len, concurrency=concurrency, gpus=gpus, engines=engine,
                        kv_cache_dtypes=kv_cache_dtype, weight_dtypes=weight_dtype, max_gpus=max_gpus,
                        gpus_per_node=gpus_per_node, max_nodes=max_nodes, gpu_memory_utilization=utilization,
                        price=price, prices_file=prices, fetch=fetch, replicas=replicas)
    if traffic is not None and report.result.ranked:
        report = _simulated(report, traffic, top, bounds, quiet=as_json)
    if as_json:
        print_json(plan_json(report))
    else:
        _render(report, top)
    if not report.result.ranked or (bounds and report.chosen is None):
        raise typer.Exit(1)


def _bounds(ttft: float | None, queue: float | None, percentile: str) -> dict[tuple[str, str], float]:
    if percentile not in ("p50", "p90", "p99"):
        raise typer.BadParameter(f"--percentile must be p50, p90 or p99 (got {percentile!r})")
    for flag, v in (("--max-ttft", ttft), ("--max-queue", queue)):
        if v is not None and not v > 0:
            raise typer.BadParameter(f"{flag} must be a positive number of seconds (got {v})")
    return {k: v for k, v in ((("ttft", percentile), ttft), (("queue", percentile), queue)) if v is not None}


def _simulated(report: PlanReport, traffic: Path, top: int, bounds: dict, *, quiet: bool) -> PlanReport:
    """The rows run with the traffic, a progress bar on a terminal."""
    if quiet or not console.is_terminal:
        return plan_with_traffic(report, traffic, top=top, bounds=bounds)
    from rich.progress import Progress

    res = report.result
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("simulating", total=len(res.fitting) if bounds else min(top, len(res.ranked)))
        return plan_with_traffic(report, traffic, top=top, bounds=bounds,
                                 progress=lambda n: bar.advance(task, n))


def _candidate_json(report: PlanReport, c: Any) -> dict[str, Any]:
    r = c.result
    return {"gpu": c.gpu.name, "num_gpus": c.num_gpus, "nodes": c.nodes(report.space.gpus_per_node),
            "engine": c.engine, "engine_version": r.engine_version, "tensor_parallel_size": c.tp,
            "pipeline_parallel_size": c.pp, "data_parallel_size": c.dp, "enable_expert_parallel": c.expert_parallel,
            "kv_cache_dtype": c.kv_dtype, "weight_dtype": c.weight_dtype, "flags": c.flags,
            "cost_per_hour": c.cost_per_hour, "concurrency": round(c.concurrency, 4),
            "headroom_frac": round(c.headroom(report.target), 4), "kv_cache_tokens": c.all_kv_cache_tokens,
            "borderline": r.borderline, "borderline_why": r.borderline_why or None}


def plan_json(report: PlanReport) -> dict[str, Any]:
    res = report.result
    return {"model": report.model, "max_model_len": report.target.max_model_len,
            "concurrency": report.target.concurrency, "ranked_by": "cost_per_hour" if res.priced else "num_gpus",
            "currency": report.currency, "plans": [_candidate_json(report, c) for c in res.ranked],
            "rejected": [{"gpu": x.gpu.name, "engine": x.engine, "kv_cache_dtype": x.kv_dtype,
                          "weight_dtype": x.weight_dtype, "why": x.why} for x in res.rejected],
            "fits_evaluated": res.fits_evaluated, "candidates": res.candidates, "notes": list(report.notes),
            # the deployments run with a workload's traffic (each as in plans), and which of them (an index into
            # simulated) is the cheapest that kept the bounds
            "simulated": [{**_candidate_json(report, s.candidate), "latency_s": s.latency_s,
                           "completed": s.completed, "rejected": s.rejected, "preemptions": s.preemptions,
                           "skipped": s.skipped or None} for s in report.simulated],
            "chosen": report.chosen,
            "bounds": [{"latency": what, "percentile": pct, "seconds": v} for what, pct, v in report.bounds]}


def _render(report: PlanReport, top: int) -> None:
    res, t = report.result, report.target
    console.print(f"[bold]{report.model}[/]: {t.concurrency} request{'s' if t.concurrency > 1 else ''} of "
                  f"{t.max_model_len:,} tokens at once; "
                  f"{res.candidates:,} deployments from {res.fits_evaluated:,} fits, ranked by "
                  f"{'cost per hour' if res.priced else 'GPU count'}")
    for note in report.notes:
        console.print(f"[yellow]note:[/] {note}")
    if res.ranked:
        money = f" {report.currency}" if report.currency else ""
        columns = ("GPUs", "flags", "engine", *(("cost/h",) if res.priced else ()), "requests", "headroom")
        table = new_table(*columns, numeric=("cost/h", "requests", "headroom"),
                          title="The Pareto front: nothing cheaper holds more")
        for c in res.ranked[:top]:
            cost = (f"{c.cost_per_hour:,.2f}{money}",) if res.priced and c.cost_per_hour is not None else ()
            mark = " *" if c.result.borderline else ""
            table.add_row(f"{c.num_gpus} x {c.gpu.name}", c.flags, f"{c.engine} {c.result.engine_version}",
                          *cost, f"{c.concurrency:.1f}{mark}", f"{100 * c.headroom(t):+.0f}%")
        print_table(console, table)
        if any(c.result.borderline for c in res.ranked[:top]):
            console.print("[dim]* borderline: the margin is within the estimates' error (kvplan fit says which)[/]")
    else:
        console.print("[red]nothing in the space holds the target[/]")
    for x in res.rejected:
        console.print(f"[dim]not {x.gpu.name} ({x.engine}, KV {x.kv_dtype}, weights {x.weight_dtype}):[/] {x.why}")
    if report.simulated:
        _render_simulated(report)


def _render_simulated(report: PlanReport) -> None:
    table = new_table("deployment", "queue p50/p99", "TTFT p50/p99", "e2e p99", "done", "rejected",
                      numeric=("queue p50/p99", "TTFT p50/p99", "e2e p99", "done", "rejected"),
                      title="Simulated with the workload's traffic (seconds)")
    for i, s in enumerate(report.simulated):
        c = s.candidate
        name = f"{c.num_gpus} x {c.gpu.name} {c.flags}" + (" <" if i == report.chosen else "")
        if s.skipped or s.latency_s is None:
            table.add_row(name, s.skipped or "no latency from this simulator", "", "", "", "")
            continue
        q, t, e = (s.latency_s.get(k) or {} for k in ("queue", "ttft", "e2e"))
        table.add_row(name, f"{q.get('p50', 0):.2f}/{q.get('p99', 0):.2f}",
                      f"{t.get('p50', 0):.2f}/{t.get('p99', 0):.2f}", f"{e.get('p99', 0):.1f}", str(s.completed),
                      str(s.rejected))
    print_table(console, table)
    kept = ", ".join(f"{what} {pct} <= {v:g} s" for what, pct, v in report.bounds)
    if report.chosen is not None:
        c = report.simulated[report.chosen].candidate
        cost = f" ({c.cost_per_hour:,.2f} an hour)" if c.cost_per_hour is not None else ""
        console.print(f"[green]the cheapest that keeps {kept}:[/] {c.num_gpus} x {c.gpu.name} {c.flags}{cost}")
    elif report.bounds:
        console.print(f"[red]no deployment in the space keeps {kept}[/]")
