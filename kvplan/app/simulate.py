"""``simulate`` and the simulation limits of ``check``: one path from a workload file to a report.

parse (kvplan.io.workload: the file, validated) -> ``plan_simulation`` (here: the model, GPU and engine loaded, the
simulator chosen by one rule, the pool planned once by the engine's own plan as ``kvplan fit`` makes it, the
requests built) -> ``run_simulation`` (the simulator) -> kvplan.app.report (one report, one JSON, one plot).
``kvplan check`` calls the same two functions, so a budget measures exactly what ``kvplan simulate`` prints.

Which simulator (``choose_simulator``): ``vllm-v1`` replays vLLM's V1 scheduler and KV cache manager step by step;
``event`` (kvplan's event-driven engine) compares contiguous and paged allocators over huge workloads. A workload
file or ``--scheduler-model`` may name either; ``auto`` takes vllm-v1 whenever the event engine's assumptions break.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from kvplan.app.pool import plan_event, plan_pool, plan_v1
from kvplan.app.requests import needs_segments, plain_requests
from kvplan.app.simulation import EVENT, SIMULATORS, V0_MIN_BATCHED_TOKENS, V1, Serving, SimulationPlan, SimulationRun
from kvplan.core.engines.registry import SERVING
from kvplan.core.profiles import parse_engine
from kvplan.core.sim.model import RequestArrays
from kvplan.errors import ConfigError, InputError, KvplanError
from kvplan.io.workload import WorkloadFile, read_workload


def plan_simulation(path: Path, *, engine: str | None = None, simulator: str | None = None,
                    allocators: list[str] | None = None, placement: str | None = None) -> SimulationPlan:
    """Everything a run needs, decided once: ``engine`` overrides serving.engine, ``simulator`` scheduler.model,
    ``allocators``/``placement`` the file's (event engine)."""
    return plan_workload(read_workload(path, engine), path, simulator=simulator, allocators=allocators,
                         placement=placement)


def plan_workload(wf: WorkloadFile, path: Path, *, simulator: str | None = None, allocators: list[str] | None = None,
                  placement: str | None = None) -> SimulationPlan:
    """``plan_simulation`` of a workload already read (``path``: where its relative paths start; `kvplan plan`
    replaces the serving block with each deployment it simulates)."""
    serving = _serving(wf, path)
    notes: list[str] = [serving.engine.note] if serving.engine.note else []  # the release asked, the profile taken
    wanted, why = choose_simulator(wf, path, serving, simulator)
    plain = None if needs_segments(wf) else plain_requests(wf, path, max_model_len=serving.max_model_len, notes=notes)
    mnbt = wf.scheduler.max_num_batched_tokens or max(serving.max_model_len, V0_MIN_BATCHED_TOKENS)
    if wanted == EVENT and plain is not None and (longer := _long_prompts(wf, serving, plain, mnbt, simulator)):
        wanted, why = V1, longer
    pool = plan_pool(wf, path, serving, notes, wanted=wanted)
    base = dict(name=wf.name or path.stem, origin=str(path), reason=why, engine=serving.engine)
    if wanted == V1:
        v1 = plan_v1(wf, path, serving, pool, plain, notes, why, allocators, placement)
        return SimulationPlan(**base, simulator=V1, pool=pool, notes=tuple(notes), v1=v1)
    notes.append(f"simulator: event ({why})")
    notes.extend(_scheduler_note(serving.engine.name))
    event = plan_event(wf, path, serving, pool, plain, notes, allocators, placement)
    return SimulationPlan(**base, simulator=EVENT, pool=pool, notes=tuple(notes), event=event)


def run_simulation(plan: SimulationPlan, *, progress: Callable[[int], None] | None = None,
                   timeline_points: int = 0, workers: int | None = 1, per_step: bool = False) -> SimulationRun:
    """The planned simulator over the planned requests (``workers`` > 1, or None for every usable CPU: the event
    engine's allocators in forked processes; ``progress`` gets the requests finished over all allocators;
    ``per_step``: vllm-v1 keeps every step's figures, which only a plot draws)."""
    if plan.v1 is not None and plan.v1.data_parallel_size > 1:
        from kvplan.core.sim.v1.dp import simulate_dp

        try:
            v = plan.v1
            dp = simulate_dp(v.inputs, v.data_parallel_size, v.router, moe=v.moe, servers=v.api_servers,
                             per_step=per_step, timeline_points=timeline_points)
        except KvplanError as exc:
            raise type(exc)(f"{plan.origin}: {exc}") from None
        return SimulationRun(plan=plan, v1=dp.merged, dp=dp)
    if plan.v1 is not None:
        from kvplan.core.sim.v1 import simulate_v1

        results = []
        for inputs in (plan.v1.inputs, *plan.v1.others):
            try:
                results.append(simulate_v1(inputs, timeline_points=timeline_points, per_step=per_step))
            except KvplanError as exc:
                who = f"{inputs.allocator.name}: " if inputs.allocator is not None else ""
                raise type(exc)(f"{plan.origin}: {who}{exc}") from None
        return SimulationRun(plan=plan, v1=results[0], v1_others=tuple(results[1:]))
    assert plan.event is not None
    from kvplan.app.parallel import run_allocators

    results = run_allocators(plan.event, workers=workers, progress=progress, timeline_points=timeline_points)
    return SimulationRun(plan=plan, event=tuple(results))


# -- what serves ----------------------------------------------------------------------------------------------
def _serving(wf: WorkloadFile, path: Path) -> Serving:
    from kvplan.io.gpus import get_gpu
    from kvplan.io.models import load_model

    s = wf.serving
    try:
        spec = load_model(s.model) if s.model else None
        gpu = get_gpu(s.gpu, memory=s.gpu_memory) if (s.gpu or s.gpu_memory) else None
    except KvplanError as exc:
        raise type(exc)(f"{path}: serving: {exc}") from None
    max_len = wf.scheduler.max_model_len or (spec.max_model_len if spec else 0)
    if max_len < 2:
        raise ConfigError(f"{path}: scheduler.max_model_len is required when serving.model gives none")
    if wf.sharing.shared_prefix_tokens >= max_len:
        raise ConfigError(f"{path}: sharing.shared_prefix_tokens ({wf.sharing.shared_prefix_tokens}) must be below "
                          f"max_model_len ({max_len}): every prompt includes the prefix")
    return Serving(spec=spec, gpu=gpu, engine=parse_engine(s.engine, allowed=SERVING), max_model_len=max_len)


def _scheduler_note(engine: str) -> tuple[str, ...]:
    """The event engine schedules as vLLM does, whichever engine's budget sized the pool."""
    if engine == "sglang":
        return (("scheduling follows vLLM's rules (admission by prompt, the newest request preempted); SGLang "
                 "reserves room for future output tokens and retracts instead: docs/engines.md, \"SGLang's "
                 "scheduler\""),)
    if engine == "trtllm":
        return (("scheduling follows vLLM's rules; TensorRT-LLM's scheduler (its capacity policy) is not "
                 "modelled"),)
    return ()


# -- which simulator ------------------------------------------------------------------------------------------
def choose_simulator(wf: WorkloadFile, path: Path, serving: Serving, override: str | None) -> tuple[str, str]:
    """(simulator, why): ``override`` (--scheduler-model) or scheduler.model, else the rule of ``auto``:

    - a vLLM release whose default engine is V1 (0.8.0 and later): vllm-v1, vLLM's own scheduler and KV cache
      manager under that release's rules, whatever the workload;
    - a V0 release of vLLM, SGLang or TensorRT-LLM: the event engine (whole prompts per step, as V0 scheduled;
      SGLang's and TensorRT-LLM's schedulers follow vLLM's rules there, said in a note), unless the workload needs
      what only vllm-v1 models (then vllm-v1 for vLLM, a refusal for the others; a prompt longer than the token
      budget, which needs chunked prefill, is checked once the requests exist)."""
    wanted = override or wf.scheduler.model
    if wanted not in SIMULATORS:
        raise InputError(f"--scheduler-model must be auto, event or vllm-v1 (got {wanted!r})")
    needs = _v1_needs(wf, serving)
    if wanted == EVENT:
        if needs:
            raise ConfigError(f"{path}: scheduler.model event cannot simulate {needs[0]}; use vllm-v1 or auto")
        return EVENT, "scheduler.model: event"
    if wanted == V1:
        return V1, "scheduler.model: vllm-v1"
    choice = serving.engine
    if choice.name == "vllm" and choice.profile.rules.v1:
        return V1, (f"auto: vLLM {choice.version} schedules with its V1 engine" + (f"; {'; '.join(needs)}"
                                                                                 if needs else ""))
    if needs and choice.name != "vllm":
        raise ConfigError(f"{path}: only vLLM v1's scheduler simulates {needs[0]}; set serving.engine: "
                          f"vllm (got {wf.serving.engine})")
    if needs:
        return V1, (f"auto: {'; '.join(needs)} (vLLM {choice.version} is a V0 release: its own scheduler is not "
                    "modelled; V1's is)")
    if choice.name == "vllm":
        return EVENT, (f"auto: vLLM {choice.version} is a V0 release (V1 became the default in 0.8.0): whole "
                       "prompts per step")
    return EVENT, f"auto: {choice.profile.display if choice.profile else choice.name} serving"


def _v1_needs(wf: WorkloadFile, serving: Serving) -> list[str]:
    r = wf.requests
    needs = []
    if r.sessions is not None:
        needs.append("multi-turn sessions (prefix caching across turns)")
    if r.documents is not None:
        needs.append("shared documents (prefix caching)")
    if r.trace_format in ("conversation", "mooncake"):
        needs.append(f"a {r.trace_format} trace (prefix caching of shared blocks)")
    if wf.offload is not None:
        needs.append("a CPU offload tier")
    if wf.scheduler.async_scheduling:
        needs.append("async scheduling (two batches in flight)")
    if wf.serving.data_parallel_size > 1:
        needs.append("data-parallel engines (vLLM's load balancer)")
    kinds = sorted({layer.kind.value for layer in serving.spec.layers} & {"sliding", "chunked", "linear"}
                   ) if serving.spec else []
    if kinds:
        needs.append(f"{'/'.join(kinds)} layers (a pool per KV cache group)")
    return needs


def _long_prompts(wf: WorkloadFile, serving: Serving, plain: RequestArrays, mnbt: int, override: str | None) -> str:
    """Why auto turns to vllm-v1 for plain requests: prompts longer than the token budget that vLLM accepts
    (shorter than max_model_len) need chunked prefill."""
    if serving.engine.name != "vllm" or (override or wf.scheduler.model) != "auto":
        return ""
    max_len = serving.max_model_len
    longer = sum(mnbt < q.prompt < max_len for q in plain)
    if not longer:
        return ""
    return (f"auto: {longer} prompt(s) longer than max_num_batched_tokens {mnbt} (vLLM v1 chunks their prefill "
            "over several steps)")
