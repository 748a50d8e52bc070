"""``kvplan plan``: the cheapest deployments that hold a target, searched with ``fit``'s rules (kvplan.core.plan)
over the GPUs, engine releases, KV dtypes and weight formats asked for."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvplan.core.units import GiB
from kvplan.errors import InputError

if TYPE_CHECKING:
    from kvplan.core.plan import PlanResult, Space, Target

MIN_DEFAULT_GPU_BYTES = 40 * GiB  # the default space: every catalog GPU of at least this much memory


@dataclass(frozen=True, kw_only=True)
class Simulated:
    candidate: Any  # kvplan.core.plan.Candidate: the deployment simulated
    latency_s: dict | None = None  # {"queue" | "ttft" | "e2e": {"p50", "p90", "p99"}} (simulate --json's latency_s)
    completed: int = 0
    rejected: int = 0
    preemptions: int = 0
    skipped: str = ""  # why the row was not simulated


@dataclass(frozen=True, kw_only=True)
class PlanReport:
    model: str  # the spec's name
    model_ref: str  # as given (a bundled name, hub id or config.json), what a simulated workload names
    target: Target
    space: Space
    result: PlanResult
    currency: str | None = None
    notes: tuple[str, ...] = ()
    simulated: tuple[Simulated, ...] = ()  # the rows run with a workload's traffic (--workload, or a WORKLOAD)
    chosen: int | None = None  # the cheapest simulated deployment that kept the bounds (index into simulated)
    bounds: tuple[tuple[str, str, float], ...] = ()  # (queue|ttft, percentile, seconds) the simulated rows must keep


def _split(text: str | None) -> list[str]:
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def _check_settings(kv: list[str], weights: list[str], utilization: float | None) -> None:
    """What every fit would refuse, refused once (exit 2) rather than read as "nothing holds the target"."""
    from kvplan.core.dtypes import get_dtype
    from kvplan.core.weights import get_weight_format

    for name in kv:
        if name != "auto":
            get_dtype(name)
    for name in weights:
        if name != "auto":
            get_weight_format(name)
    if utilization is not None and not 0 < utilization <= 1:
        raise InputError(f"--gpu-memory-utilization must be in (0, 1] (got {utilization})")


def plan_model(model: str, *, max_model_len: int, concurrency: int, gpus: str | None = None,
               engines: str = "vllm", kv_cache_dtypes: str = "auto", weight_dtypes: str = "auto",
               max_gpus: int = 64, gpus_per_node: int = 8, max_nodes: int | None = None,
               gpu_memory_utilization: float | None = None, price: str | None = None,
               prices_file: Path | None = None, prices: dict[str, float] | None = None,
               fetch: bool | None = None, replicas: bool = True) -> PlanReport:
    """Search the deployments of ``model`` holding ``concurrency`` requests of ``max_model_len`` tokens at once;
    prices from ``price`` (``GPU=PRICE,...``), ``prices_file`` and ``prices`` (a budget's), the flag's last."""
    from kvplan.core.capacity.common import FitRequest
    from kvplan.core.capacity.fit import FITTERS
    from kvplan.core.plan import Space, Target, search
    from kvplan.core.profiles import parse_engine
    from kvplan.io.gpus import get_gpu, gpu_catalog
    from kvplan.io.models import resolve_model
    from kvplan.io.prices import canonical_prices, parse_prices

    if concurrency < 1 or max_model_len < 1:
        raise InputError("--concurrency and --max-model-len must be at least 1")
    if not 1 <= max_gpus <= 1024 or not 1 <= gpus_per_node <= 64 or (max_nodes is not None and max_nodes < 1):
        raise InputError("--max-gpus must be 1 to 1024, --gpus-per-node 1 to 64 and --max-nodes at least 1")
    choices = [parse_engine(e, allowed=tuple(FITTERS)) for e in _split(engines) or ["vllm"]]
    kv_list, weight_list = _split(kv_cache_dtypes) or ["auto"], _split(weight_dtypes) or ["auto"]
    _check_settings(kv_list, weight_list, gpu_memory_utilization)
    given, currency = parse_prices(price, prices_file)
    prices = {**canonical_prices(prices or {}, "prices"), **given}
    chosen = list({g.name: g for g in ([get_gpu(g) for g in _split(gpus)] if gpus else [
        g for g in gpu_catalog() if g.memory_bytes >= MIN_DEFAULT_GPU_BYTES])}.values())  # aliases once
    notes = []
    if prices:
        unpriced = [g.name for g in chosen if g.name not in prices]
        if unpriced:
            chosen = [g for g in chosen if g.name in prices]
            notes.append(f"no price for {', '.join(unpriced)}: left out of the priced plan")
        if not chosen:
            raise InputError("the prices name none of the GPUs searched; price them, or plan without prices")
    space = Space(gpus=tuple(chosen), engines=tuple((c.name, c.profile) for c in choices),
                  kv_dtypes=tuple(kv_list), weight_dtypes=tuple(weight_list), max_gpus=max_gpus,
                  gpus_per_node=gpus_per_node, max_nodes=max_nodes, gpu_memory_utilization=gpu_memory_utilization,
                  replicas=replicas)
    spec = resolve_model(model, fetch=fetch).spec
    base = FitRequest(spec=spec, gpu=chosen[0], engine=choices[0].name, profile=choices[0].profile,
                      allow_long_max_model_len=False)
    target = Target(max_model_len=max_model_len, concurrency=concurrency)
    result = search(base, space, target, prices)
    return PlanReport(model=spec.name, model_ref=model, target=target, space=space, result=result, currency=currency,
                      notes=(*spec.notes, *(c.note for c in choices if c.note), *notes))


# -- simulated: the front's first rows run through `simulate` with a workload's traffic ----------------------------
def _serving_update(report: PlanReport, c) -> dict:  # type: ignore[no-untyped-def]
    """The workload's serving block for one deployment (what `simulate` needs of it)."""
    return {"model": report.model_ref, "gpu": c.gpu.name, "gpu_memory": None,
            "engine": f"{c.engine}=={c.result.engine_version}", "tensor_parallel_size": c.tp,
            "pipeline_parallel_size": c.pp, "data_parallel_size": c.dp, "enable_expert_parallel": c.expert_parallel,
            "kv_cache_dtype": c.kv_dtype,
            "gpu_memory_utilization": report.space.gpu_memory_utilization, "kv_pool_bytes": None,
            "kv_pool_tokens": None}


def _simulate_one(job: tuple[str, dict, int]) -> tuple[dict | None, int, int, int, str]:
    """One deployment's simulation, in a worker process: (latency_s, completed, rejected, preemptions, why not)."""
    from kvplan.app.report import allocator_rows, simulation_json
    from kvplan.app.simulate import plan_workload, run_simulation
    from kvplan.errors import KvplanError
    from kvplan.io.workload import read_workload

    path, update, max_model_len = job
    try:
        wf = read_workload(Path(path), None)
        wf = wf.model_copy(update={"serving": wf.serving.model_copy(update=update),
                                   "scheduler": wf.scheduler.model_copy(update={"max_model_len": max_model_len})})
        run = run_simulation(plan_workload(wf, Path(path)))
        doc, row = simulation_json(run), allocator_rows(run)[0]
    except KvplanError as exc:
        return None, 0, 0, 0, str(exc)
    return doc.get("latency_s"), row.completed, row.rejected, row.preemptions, ""


def _not_simulable(c) -> str:  # type: ignore[no-untyped-def]
    if c.engine != "vllm" and (c.pp > 1 or c.dp > 1):
        return (f"not simulated: {c.engine}'s pipeline stages and data-parallel ranks (simulate runs vLLM's batch "
                "queue and load balancer only)")
    if c.asked_weights != "auto":
        return "not simulated: a workload's serving block takes no weight format"
    return ""


def simulate_candidates(report: PlanReport, workload: Path, candidates: list, *,
                        workers: int | None = None) -> list[Simulated]:
    """Run ``workload``'s traffic on each deployment, in parallel processes, at the plan's max_model_len; one
    `simulate` cannot run is listed with why (SGLang's replicas or stages, layer groups over stages, a weight
    format)."""
    import os
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(str(workload), _serving_update(report, c), report.target.max_model_len)
            for c in candidates if not _not_simulable(c)]
    workers = max(1, min(len(jobs), workers or os.cpu_count() or 1))
    results: list = []
    if jobs and workers == 1:
        results = list(map(_simulate_one, jobs))
    elif jobs:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_simulate_one, jobs))
    ran = iter(results)
    out = []
    for c in candidates:
        why = _not_simulable(c)
        if why:
            out.append(Simulated(candidate=c, skipped=why))
            continue
        latency, completed, rejected, preemptions, error = next(ran)
        out.append(Simulated(candidate=c, latency_s=latency, completed=completed, rejected=rejected,
                             preemptions=preemptions, skipped=error))
    return out


def meets(sim: Simulated, bounds: dict[tuple[str, str], float]) -> bool:
    """Whether a simulated deployment keeps every bound ((queue|ttft|e2e, p50|p90|p99) -> seconds) and rejected
    nothing."""
    if sim.skipped or sim.latency_s is None or sim.rejected:
        return False
    for (what, pct), limit in bounds.items():
        got = (sim.latency_s.get(what) or {}).get(pct)
        if got is None or got > limit:
            return False
    return True


def plan_with_traffic(report: PlanReport, workload: Path, *, top: int, bounds: dict[tuple[str, str], float],
                      workers: int | None = None, progress: Any = None) -> PlanReport:
    """``workload``'s traffic on the plan's deployments: with ``bounds``, every deployment that holds the target in
    cost order (not only the front: latency does not follow KV capacity), ``top`` at a time, until the cheapest that
    keeps them; without, the front's first ``top`` rows."""
    import dataclasses

    pool = list(report.result.fitting if bounds else report.result.ranked[:top])
    step = max(1, top)
    done: list[Simulated] = []
    chosen = None
    for start in range(0, len(pool), step):
        batch = pool[start:start + step]
        done += simulate_candidates(report, workload, batch, workers=workers)
        if progress is not None:
            progress(len(batch))
        if bounds:
            chosen = next((i for i, s in enumerate(done) if meets(s, bounds)), None)
            if chosen is not None:
                break
    return dataclasses.replace(report, simulated=tuple(done), chosen=chosen,
                               bounds=tuple((what, pct, v) for (what, pct), v in bounds.items()))


def workload_target(path: Path) -> tuple[str, int]:
    """A workload file's model and max_model_len (the scheduler's, else the model's)."""
    from kvplan.io.models import resolve_model
    from kvplan.io.workload import read_workload

    wf = read_workload(path, None)
    if not wf.serving.model:
        raise InputError(f"{path}: `kvplan plan WORKLOAD` needs serving.model (the model to plan for)")
    length = wf.scheduler.max_model_len or resolve_model(wf.serving.model).spec.max_model_len
    return wf.serving.model, length
