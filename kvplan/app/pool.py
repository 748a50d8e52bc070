"""The pool a simulation runs on, planned once, and each simulator's inputs.

The pool is the engine's own (``kvplan fit``'s FitResult, whose ``pool_plan`` is vLLM's plan of its cache groups and
blocks), or the one the file gives (``serving.kv_pool_bytes`` / ``kv_pool_tokens``). The vllm-v1 simulator runs
those groups and blocks; the event engine runs the same pool as token slots.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kvplan.app.requests import V1Requests
from kvplan.app.simulation import V0_MIN_BATCHED_TOKENS, EventRun, Pool, Serving, V1Run
from kvplan.core.engines.vllm.budget import in_flight
from kvplan.core.sim.model import Preemption, RequestArrays, SimConfig, StepModel, allocator_spec
from kvplan.core.sim.v1 import OffloadConfig, SchedulerConfig, V1Inputs, layout_from_plan
from kvplan.core.spec import LinearLayer
from kvplan.errors import ConfigError, KvplanError
from kvplan.io.units import parse_size
from kvplan.io.workload import WorkloadFile

GiB = 1 << 30


def plan_pool(wf: WorkloadFile, path: Path, serving: Serving, notes: list[str], *, wanted: str) -> Pool:
    """The KV pool: the file's, or the engine's budget for the model on the GPU (one ``fit``)."""
    from kvplan.core.sizing import slot_bytes_per_gpu

    s, spec = wf.serving, serving.spec
    bpt = slot_bytes_per_gpu(spec, kv_dtype=s.kv_cache_dtype, tp=s.tensor_parallel_size,
                             pp=s.pipeline_parallel_size) if spec is not None else 0
    size = parse_size(s.kv_pool_bytes, what="serving.kv_pool_bytes") if s.kv_pool_bytes is not None else None
    if s.kv_pool_tokens is None and spec is not None and bpt == 0:
        raise ConfigError(f"{path}: {spec.name} holds no per-token KV cache (no attention layers); "
                          "give serving.kv_pool_tokens")
    if s.kv_pool_tokens is None and size is None:
        return _fitted_pool(wf, path, serving, notes, bpt, wanted=wanted)
    slots = s.kv_pool_tokens if s.kv_pool_tokens is not None else size // bpt  # type: ignore[operator]
    size = size if size is not None else slots * bpt
    if slots < 1:
        raise ConfigError(f"{path}: the KV pool holds no token ({size:,} B); give more memory or a smaller model")
    plan = _given_plan(wf, path, serving, size) if wanted == "vllm-v1" else None
    return Pool(bytes_per_token=bpt, pool_bytes=size, pool_slots=slots, plan=plan)


def _fitted_pool(wf: WorkloadFile, path: Path, serving: Serving, notes: list[str], bpt: int, *, wanted: str) -> Pool:
    from kvplan.core.capacity.common import FitRequest
    from kvplan.core.capacity.fit import fit

    s, spec, gpu, choice = wf.serving, serving.spec, serving.gpu, serving.engine
    if spec is None:
        raise ConfigError(f"{path}: serving needs a model (or kv_pool_tokens) to size the KV pool")
    if gpu is None:
        raise ConfigError(f"{path}: serving needs a gpu (or kv_pool_bytes / kv_pool_tokens)")
    v1 = wanted == "vllm-v1"
    caching = v1_prefix_caching(wf, serving, []) if v1 else False
    linear = any(isinstance(layer, LinearLayer) for layer in spec.layers)
    try:
        f = fit(FitRequest(spec=spec, gpu=gpu, engine=choice.name, profile=choice.profile, tp=s.tensor_parallel_size,
                           pp=s.pipeline_parallel_size, dp=s.data_parallel_size,
                           expert_parallel=s.enable_expert_parallel, kv_dtype=s.kv_cache_dtype,
                           gpu_memory_utilization=s.gpu_memory_utilization, max_model_len=serving.max_model_len,
                           max_num_seqs=v1_max_num_seqs(wf, serving, []) if v1 else wf.scheduler.max_num_seqs,
                           max_num_batched_tokens=v1_batched_tokens(wf, serving, []) if v1
                           else wf.scheduler.max_num_batched_tokens,
                           async_scheduling=wf.scheduler.async_scheduling if v1 else None,
                           mamba_cache_mode="align" if (v1 and linear and caching) else "none"))
    except KvplanError as exc:
        raise type(exc)(f"{path}: {exc}") from None
    each = f" in each of the {s.data_parallel_size} data-parallel engines" if s.data_parallel_size > 1 else ""
    notes.append(f"KV pool from `kvplan fit` ({choice.name} {choice.version} rules): "
                 f"{f.kv_cache_memory_bytes / GiB:.2f} GiB per GPU, {f.kv_cache_tokens:,} KV cache tokens{each}")
    if bpt and f.kv_cache_memory_bytes // bpt != f.kv_cache_tokens:
        notes.append(f"the pool's bytes over {bpt:,} B per token would give {f.kv_cache_memory_bytes // bpt:,} token "
                     f"slots; the engine counts {f.kv_cache_tokens:,} (whole blocks of its layout)")
    if f.kv_cache_tokens < 1:
        raise ConfigError(f"{path}: the KV pool holds no token ({f.kv_cache_memory_bytes:,} B); give more memory or "
                          "a smaller model")
    return Pool(bytes_per_token=bpt, pool_bytes=f.kv_cache_memory_bytes, pool_slots=f.kv_cache_tokens,
                plan=f.pool_plan, fit=f, max_num_batched_tokens=int(f.settings.get("max_num_batched_tokens", 0)))


def _given_plan(wf: WorkloadFile, path: Path, serving: Serving, size: int):  # type: ignore[no-untyped-def]
    """vLLM's plan of a pool of ``size`` bytes the file gives (no budget)."""
    from kvplan.core.engines.vllm.plan import plan_vllm

    s, spec = wf.serving, serving.spec
    if spec is None or serving.engine.name != "vllm":
        return None
    from kvplan.core.sizing import pp_stages

    linear = any(isinstance(layer, LinearLayer) for layer in spec.layers)
    mnbt = v1_batched_tokens(wf, serving, [])
    try:
        # the bytes are one GPU's: the layers of the largest pipeline stage (every stage has as many blocks)
        stage = max(pp_stages(spec.num_layers, s.pipeline_parallel_size), key=len)
        return plan_vllm(spec.layers[stage.start:stage.stop], size, serving.max_model_len, serving.engine.profile,
                         model_dtype=spec.dtype,
                         in_flight_tokens=mnbt, kv_dtype=s.kv_cache_dtype, tp=s.tensor_parallel_size,
                         mamba_cache_mode="align" if (linear and v1_prefix_caching(wf, serving, [])) else "none")
    except KvplanError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def step_model(wf: WorkloadFile, path: Path, serving: Serving, pool: Pool, notes: list[str]) -> StepModel:
    """Seconds per step: the file's constant, or a roofline (weights and KV read over the GPU's bandwidth, prefill
    compute over its bf16 TFLOP/s)."""
    spec, gpu, s = serving.spec, serving.gpu, wf.serving
    if wf.step_time.model == "constant" or spec is None or gpu is None or not gpu.hbm_bandwidth_bytes_per_s:
        if wf.step_time.seconds is None:
            raise ConfigError(f"{path}: step_time.seconds is needed (a roofline needs serving.model and a catalog gpu)")
        return StepModel(base_ps=round(wf.step_time.seconds * 10**12), per_token_ps=0, per_prefill_token_ps=0,
                         stages=s.pipeline_parallel_size)  # a stage's time with pipeline parallelism
    from kvplan.core.capacity.common import FitRequest, model_weights
    from kvplan.core.weights import count_params

    bw = gpu.hbm_bandwidth_bytes_per_s
    weights = pool.fit.breakdown.weights if pool.fit is not None else None
    params = 0
    if spec.arch is not None:
        wb, _ = model_weights(FitRequest(spec=spec, gpu=gpu, tp=s.tensor_parallel_size, pp=s.pipeline_parallel_size,
                                         dp=s.data_parallel_size, expert_parallel=s.enable_expert_parallel))
        weights = weights if weights is not None else (wb.per_gpu_bytes if wb else 0)
        params = count_params(spec, spec.arch).active(spec.arch.moe)
    prefill_ps = 0
    if gpu.bf16_dense_tflops:
        gpus = s.tensor_parallel_size * s.pipeline_parallel_size
        prefill_ps = round(2 * params / gpus / (gpu.bf16_dense_tflops * 1e12) * 1e12)
    else:
        notes.append(f"{gpu.name} has no bf16 TFLOP/s in the catalog: prefill compute is not timed "
                     "(steps take the weight and KV reads only)")
    # one stage's weights and KV per GPU: a step is a stage's time, a batch takes pp of them (StepModel.stages)
    return StepModel(base_ps=round((weights or 0) / bw * 1e12), per_token_ps=round(pool.bytes_per_token / bw * 1e12),
                     per_prefill_token_ps=prefill_ps, stages=s.pipeline_parallel_size)


# -- the event engine -----------------------------------------------------------------------------------------
def plan_event(wf: WorkloadFile, path: Path, serving: Serving, pool: Pool, plain: RequestArrays | None,
               notes: list[str], allocators: list[str] | None, placement: str | None) -> EventRun:
    spec, sh = serving.spec, wf.sharing
    assert plain is not None  # needs_segments workloads are vllm-v1's (choose_simulator)
    if spec is not None and any(layer.kind.value in ("sliding", "chunked", "linear", "compressed")
                                for layer in spec.layers):
        notes.append("the event simulator holds every token in every attention layer (sliding windows, fixed "
                     "linear-attention states and DeepSeek-V4's compressed entries are not modelled)")
    n_max = max(sh.parallel_sampling, sh.beam_width)
    if n_max > wf.scheduler.max_num_seqs:
        raise ConfigError(f"{path}: {n_max} sequences per request exceed scheduler.max_num_seqs "
                          f"{wf.scheduler.max_num_seqs}")
    if sh.beam_width > 1:
        notes.append("beam search is modelled as beam_width sequences sharing the prompt (beams do not fork)")
    mnbt = wf.scheduler.max_num_batched_tokens or max(serving.max_model_len, V0_MIN_BATCHED_TOKENS)
    config = SimConfig(pool_slots=pool.pool_slots, max_num_seqs=wf.scheduler.max_num_seqs, max_num_batched_tokens=mnbt,
                       max_model_len=serving.max_model_len, step=step_model(wf, path, serving, pool, notes),
                       shared_prefix=sh.shared_prefix_tokens, prefix_caching=sh.prefix_caching,
                       preemption=Preemption(wf.scheduler.preemption))
    where = placement or wf.placement
    names = allocators or list(wf.allocators)
    return EventRun(requests=plain, config=config, allocators=tuple(allocator_spec(a, placement=where) for a in names))


# -- the vllm-v1 simulator ------------------------------------------------------------------------------------
def v1_batched_tokens(wf: WorkloadFile, serving: Serving, notes: list[str]) -> int:
    """scheduler.max_num_batched_tokens, or the OpenAI server's default for the GPU and release (said in a note)."""
    if wf.scheduler.max_num_batched_tokens is not None:
        return wf.scheduler.max_num_batched_tokens
    from kvplan.core.engines.vllm.profiles import batch_defaults

    choice = serving.engine
    mnbt = batch_defaults(choice.profile.rules, serving.gpu, serving.max_model_len)[0] if serving.gpu else 2048
    notes.append(f"max_num_batched_tokens {mnbt}: the OpenAI server's default for this GPU in vLLM {choice.version} "
                 "(vllm/engine/arg_utils.py); set scheduler.max_num_batched_tokens to change it")
    return mnbt


def v1_max_num_seqs(wf: WorkloadFile, serving: Serving, notes: list[str]) -> int:
    """scheduler.max_num_seqs, or the OpenAI server's default for the GPU and release (said in a note)."""
    if "max_num_seqs" in wf.scheduler.model_fields_set or serving.gpu is None:
        return wf.scheduler.max_num_seqs
    from kvplan.core.engines.vllm.profiles import default_seqs

    choice = serving.engine
    seqs = default_seqs(choice.profile.rules, serving.gpu, serving.max_model_len, v1_batched_tokens(wf, serving, []))
    notes.append(f"max_num_seqs {seqs}: the OpenAI server's default for this GPU in vLLM {choice.version} "
                 "(vllm/engine/arg_utils.py); set scheduler.max_num_seqs to change it")
    return seqs


def v1_prefix_caching(wf: WorkloadFile, serving: Serving, notes: list[str]) -> bool:
    """sharing.prefix_caching, but off by default for a model with linear-attention (Mamba) layers."""
    linear = serving.spec is not None and any(isinstance(layer, LinearLayer) for layer in serving.spec.layers)
    if linear and wf.sharing.prefix_caching and "prefix_caching" not in wf.sharing.model_fields_set:
        notes.append("prefix caching is off: the vllm-v1 simulator does not model it for linear-attention "
                     "(Mamba) layers (vLLM's mamba_cache_mode align)")
        return False
    return wf.sharing.prefix_caching


def _v1_checks(wf: WorkloadFile, path: Path, serving: Serving) -> None:
    s = wf.serving
    if serving.engine.name != "vllm":
        raise ConfigError(f"{path}: the vllm-v1 simulator needs serving.engine: vllm (got {s.engine})")
    kinds = {layer.kind.value for layer in serving.spec.layers} & {"sliding", "chunked", "linear", "compressed"} \
        if serving.spec is not None else set()
    if s.pipeline_parallel_size > 1 and kinds:
        raise ConfigError(f"{path}: pipeline parallelism with {'/'.join(sorted(kinds))} layers: vLLM groups the "
                          "whole model's layers for the scheduler while kvplan plans each stage's; simulate it at "
                          "pipeline_parallel_size: 1")
    if wf.sharing.beam_width > 1:
        raise ConfigError(f"{path}: vLLM v1's scheduler has no beam search; set sharing.beam_width: 1")
    if serving.spec is None:
        raise ConfigError(f"{path}: the vllm-v1 simulator needs serving.model (its KV cache groups)")


def plan_v1(wf: WorkloadFile, path: Path, serving: Serving, pool: Pool, plain: RequestArrays | None,
            notes: list[str], why: str, allocators: list[str] | None = None, placement: str | None = None) -> V1Run:
    """The scheduler (the release's rules), the pool's cache groups (the pool ``plan_pool`` planned) and the requests
    as segments."""
    from kvplan.core.engines.vllm.scheduler_rules import scheduler_notes

    _v1_checks(wf, path, serving)
    sch, choice = wf.scheduler, serving.engine
    mnbt = v1_batched_tokens(wf, serving, notes)
    caching = v1_prefix_caching(wf, serving, notes)
    pp = wf.serving.pipeline_parallel_size
    flight = in_flight(choice.profile.rules, serving.spec, mnbt, pp, sch.async_scheduling)
    async_ = flight.async_scheduling
    if sch.async_scheduling is None and async_ and pp == 1:
        notes.append("async scheduling on (vLLM's default from 0.14.0: two batches in flight); set "
                     "scheduler.async_scheduling: false for the synchronous scheduler")
    if pp > 1:
        notes.append(_pipeline_note(pp, async_=async_, v2=flight.v2_runner, constant=wf.step_time.model == "constant"))
    try:
        layout = layout_from_plan(pool.plan, serving.max_model_len)
        scheduler = SchedulerConfig(max_num_seqs=v1_max_num_seqs(wf, serving, notes), max_num_batched_tokens=mnbt,
                                    max_model_len=serving.max_model_len, enable_prefix_caching=caching,
                                    long_prefill_token_threshold=sch.long_prefill_token_threshold,
                                    async_scheduling=async_, pipeline_parallel_size=pp,
                                    v2_model_runner=flight.v2_runner, rules=choice.profile.rules.scheduler)
        notes.extend(scheduler_notes(choice.profile, layout, caching=caching))
        offload = _offload(wf)
    except KvplanError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    gen = V1Requests(wf, path, serving.max_model_len, notes)
    requests = gen.build(plain)
    if not requests:
        raise ConfigError(f"{path}: every request's prompt reaches max_model_len {serving.max_model_len}: nothing "
                          "to simulate")
    if sch.preemption != "recompute":
        notes.append("vLLM v1 preempts by recompute only: scheduler.preemption swap is not used")
    block = layout.block_size
    notes.append(f"simulator: vllm-v1 ({why}); pool: {layout.num_blocks:,} blocks of {block} tokens in "
                 f"{len(layout.groups)} KV cache group(s), from vLLM {choice.version}'s plan as `kvplan fit`")
    inputs = V1Inputs(requests=requests, scheduler=scheduler, layout=layout, offload=offload,
                      step_model=step_model(wf, path, serving, pool, notes), notes=tuple(notes))
    runs = _v1_allocators(wf, path, inputs, block, allocators, placement, notes)
    dp, moe = wf.serving.data_parallel_size, _moe(serving)
    router = choice.profile.rules.scheduler.router
    servers = 1
    if dp > 1:
        if len(runs) > 1 or (runs[0].allocator is not None and not runs[0].allocator.paged):
            raise ConfigError(f"{path}: data-parallel engines are simulated with vLLM's paged pool only; compare "
                              "allocators on one engine (data_parallel_size: 1)")
        from kvplan.core.profiles import Version
        from kvplan.core.sim.v1.dp import api_servers

        if Version.parse(choice.version) < Version.parse("0.10.0"):
            raise ConfigError(f"{path}: vLLM {choice.version}'s data-parallel serving is not modelled (kvplan reads "
                              "vLLM's load balancer from 0.10.0); pin vllm==0.10.0 or later")
        try:
            servers = api_servers(router, dp, wf.serving.api_server_count)
        except KvplanError as exc:
            raise ConfigError(f"{path}: serving: {exc}") from None
        notes.extend(_dp_notes(serving, dp, servers, moe))
        runs = (dataclasses.replace(runs[0], notes=tuple(notes)),)
    return V1Run(inputs=runs[0], others=runs[1:], block_size=block, session_turns=tuple(gen.turn_links),
                 rejected=gen.rejected, user_requests=gen.user_requests or len(requests) + gen.rejected,
                 data_parallel_size=dp, router=router, api_servers=servers, moe=moe)


def _pipeline_note(pp: int, *, async_: bool, v2: bool, constant: bool) -> str:
    """How vLLM's engine loop keeps pipeline stages busy (VllmConfig.max_concurrent_batches, 0.26.0-0.33.0)."""
    if async_ and v2:
        how = (f"async scheduling on the V2 model runner: {pp + 1} batches in flight, a request's decodes {pp} steps "
               "apart (v1/core/sched/async_scheduler.py::AsyncScheduler.decode_stagger)")
    else:
        how = (f"{pp} batches in flight, " + ("async scheduling on the V1 model runner" if async_ else
               "the synchronous scheduler: a request's next token is scheduled once its last one is back")
               + " (v1/engine/core.py::EngineCore.step_with_batch_queue)")
    step = "step_time.seconds is one stage's time" if constant else "each step is a stage's time"
    return f"pipeline parallel {pp}, {how}; {step}, a batch leaves the last stage {pp} steps after it enters"


def _moe(serving: Serving) -> bool:
    spec = serving.spec
    return spec is not None and spec.arch is not None and spec.arch.moe is not None


def _dp_notes(serving: Serving, dp: int, servers: int, moe: bool) -> list[str]:
    """How the data-parallel engines are simulated, and what of vLLM's runs is not."""
    rules, version = serving.engine.profile.rules.scheduler, serving.engine.version
    r = rules.router
    ties = "ties by a scan whose start moves on each request" if r.rotate else "ties to the scan's first engine"
    notes = [f"data parallel: {dp} engines, each its own scheduler and pool; vLLM {version}'s load balancer "
             f"(v1/engine/core_client.py::DPLBAsyncMPClient) sends each request as it arrives to the lowest "
             f"{r.score.value}, from the counts the coordinator publishes (every 100 ms when changed, else 5 s) and "
             f"its own since; {ties}"]
    if version.startswith("0.10.0"):
        notes.append("vLLM 0.10.0's balancer compared [waiting, running] as a list and republished every 4 s: "
                     "simulated with 0.10.1's rule (waiting x 4 + running), every 5 s")
    if servers > 1:
        notes.append(f"{servers} API servers, each its own balancer (vLLM's default from 0.15.0, api_server_count "
                     "to change it): requests reach them in turn (kvplan's assumption: the kernel spreads "
                     "connections over them)")
    if not (moe or r.dense_counts):
        notes.append(f"vLLM {version}: a dense model's engines publish no counts (0.14.0-0.26.0), so the "
                     "balancer sees zeros and sends requests round-robin")
    if moe or r.dense_lockstep:
        notes.append(f"{'an MoE model' if moe else 'every model'}'s data-parallel engines step in lockstep in vLLM "
                     f"{version} (idle ones run dummy batches; each step lasts as long as the busiest "
                     "engine's): kvplan times each engine's steps on its own, so its latencies are a lower bound")
    return notes


def _v1_allocators(wf: WorkloadFile, path: Path, inputs: V1Inputs, block: int, allocators: list[str] | None,
                   placement: str | None, notes: list[str]) -> tuple[V1Inputs, ...]:
    """One run per allocator, vLLM's paged pool first: the allocators --allocator or the file names (the file's
    default list is the event engine's comparison; without one named, vLLM's pool alone). A contiguous allocator
    runs the same requests under the same scheduler, without prefix caching (a region cannot share a prefix)."""

    names = allocators or (list(wf.allocators) if "allocators" in wf.model_fields_set else [f"paged-{block}"])
    specs = list({a.name: a for a in (allocator_spec(n, placement=placement or wf.placement) for n in names)}.values())
    wrong = [a.name for a in specs if a.paged and a.block_size != block]
    if wrong:
        raise ConfigError(f"{path}: vLLM plans blocks of {block} tokens for this model, so its pool is paged-{block} "
                          f"(not {', '.join(wrong)}); name paged-{block}, or run other block sizes with "
                          "--scheduler-model event")
    contiguous = [a for a in specs if not a.paged]
    if contiguous and inputs.scheduler.enable_prefix_caching:
        notes.append("contiguous regions cannot share a prefix: the contiguous allocators run without prefix "
                     "caching (vLLM's paged pool with it)")
    if contiguous and inputs.offload is not None:
        raise ConfigError(f"{path}: the CPU offload tier moves vLLM's blocks; the contiguous allocators have none: "
                          "drop them from allocators or drop offload")
    plain = dataclasses.replace(inputs.scheduler, enable_prefix_caching=False)
    return tuple(inputs if a.paged else dataclasses.replace(inputs, scheduler=plain, allocator=a, notes=tuple(notes))
                 for a in sorted(specs, key=lambda a: not a.paged))


def _offload(wf: WorkloadFile) -> OffloadConfig | None:
    if wf.offload is None:
        return None
    cpu_bytes, bandwidth = wf.offload.bytes()
    return OffloadConfig(cpu_bytes=cpu_bytes, bandwidth_bytes_per_s=float(bandwidth),
                         blocks_per_chunk=wf.offload.blocks_per_chunk)
