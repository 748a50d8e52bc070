"""``check``: each budget's limits measured with the rules of ``size``, ``fit`` and ``simulate`` (the simulation
limits through kvplan.app.simulate's own plan and run, so a budget measures exactly what ``kvplan simulate``
prints), and judged (kvplan.core.budgets)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvplan.core.units import GiB
from kvplan.errors import ConfigError, InputError
from kvplan.io.budgets import FIT_LIMITS, PLAN_LIMITS, SIMULATION_LIMITS, SIZE_LIMITS, Budget


@dataclass(frozen=True, kw_only=True)
class Measured:
    """Each named limit's measured value and threshold (sizes in bytes), and what the measurement
    says about why a value is what it is (shown beside a failing limit)."""

    values: dict[str, float]
    thresholds: dict[str, float]
    reasons: dict[str, str] = field(default_factory=dict)


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def _bytes(n: float | None) -> str:
    """Exact bytes with separators, and GiB from 1 GiB: ``524,288 B``, ``4,294,967,296 B (4.00 GiB)``."""
    n = int(n or 0)
    return f"{n:,} B ({_gib(n)})" if n >= GiB else f"{n:,} B"


def measure(budget: Budget, origin: Path) -> Measured:
    """Measure every limit the budget names with the rules of `kvplan size`, `fit` and `simulate`. A limit's
    reason (shown when it fails) starts with its own measured value and bound: ``474,336 KV cache tokens <
    500,000: ...``."""
    from kvplan.io.models import load_model

    asked = {k: v for k, v in budget.require.model_dump().items() if v is not None}
    out: dict[str, float] = {}
    why: dict[str, str] = {}
    if budget.model and asked.keys() - set(SIMULATION_LIMITS):
        spec = load_model(budget.model)
        if asked.keys() & set(SIZE_LIMITS):
            _measure_size(budget, spec, asked, out, why)
        if asked.keys() & set(FIT_LIMITS):
            _measure_fit(budget, spec, asked, out, why)
        if asked.keys() & set(PLAN_LIMITS):
            _measure_plan(budget, spec, asked, out, why)
    if asked.keys() & set(SIMULATION_LIMITS):
        _measure_simulation(budget, origin, asked, out, why)
    thresholds = {key: float(limit) for key, limit in asked.items()}  # sizes are bytes already (Require._bytes)
    return Measured(values={key: float(out[key]) for key in asked}, thresholds=thresholds,
                    reasons={key: why[key] for key in asked if key in why})


def _measure_size(budget: Budget, spec: Any, asked: dict[str, Any], out: dict[str, float], why: dict[str, str]) -> None:
    from kvplan.app.size import sizing_dtype
    from kvplan.core.engines import engine_for
    from kvplan.core.sizing import size_kv

    choice = budget.engine_choice()
    tp, pp = budget.tensor_parallel_size, budget.pipeline_parallel_size
    max_len = budget.max_model_len or spec.max_model_len
    seq_len = budget.seq_len or max_len
    dcp, dp = budget.decode_context_parallel_size, budget.data_parallel_size
    if (dcp > 1 or dp > 1 or budget.enable_expert_parallel) and choice.name not in ("vllm", "sglang") or (
            dcp > 1 and choice.name != "vllm") or (budget.enable_dp_attention and choice.name != "sglang"):
        raise InputError(f"budget {budget.name}: data_parallel_size and enable_expert_parallel are modelled for vLLM "
                         "and SGLang, decode_context_parallel_size for vLLM, enable_dp_attention for SGLang; "
                         f"not for {choice.name}")
    from kvplan.core.spec_decode import with_drafter

    spec = with_drafter(spec, _extras(budget, spec, choice).drafter)  # a drafter's KV layers hold tokens too
    engine, _ = engine_for(spec, choice.name, profile=choice.profile)
    if dcp > 1:
        from kvplan.core.engines.vllm.dcp import check_dcp

        check_dcp(spec, choice.profile.rules, choice.version, tp=tp, dcp=dcp, kv_dtype=budget.kv_cache_dtype)
    # one GPU holds its rank's share of the batch (cdiv(batch, dp)), each sequence's tokens spread over dcp ranks in
    # blocks of their own (size_kv); with SGLang's DP attention the ranks are groups of tp // dp inside the tp GPUs
    dp_attention = budget.enable_dp_attention and dp > 1
    sized, stored = sizing_dtype(spec, choice, engine, budget.kv_cache_dtype)
    r = size_kv(spec, engine, batch=budget.batch, seq_len=seq_len, kv_dtype=sized, tp=tp, pp=pp,
                dp=1 if dp_attention else dp, dcp=dcp)
    r = dataclasses.replace(r, kv_dtype=stored) if stored else r
    mine = r if not dp_attention else size_kv(
        spec, engine, batch=-(-budget.batch // dp), seq_len=seq_len, kv_dtype=sized,
        tp=tp // dp if tp % dp == 0 else tp, pp=pp)
    per_gpu = mine.per_gpu_bytes
    out.update(max_kv_bytes_per_token=r.bytes_per_token, max_kv_bytes=r.total_bytes, max_kv_bytes_per_gpu=per_gpu)
    halves = "; kv_cache_dtype: fp8 halves it" if r.kv_dtype in ("bf16", "fp16") else ""
    why["max_kv_bytes_per_token"] = (f"{_bytes(r.bytes_per_token)} per token > "
                                     f"{_bytes(asked.get('max_kv_bytes_per_token'))}: {spec.name} stores "
                                     f"{r.kv_dtype} KV{halves}")
    why["max_kv_bytes"] = (f"{_bytes(r.total_bytes)} > {_bytes(asked.get('max_kv_bytes'))}: {budget.batch:,} x "
                           f"{seq_len:,} tokens at {_bytes(r.bytes_per_token)} per token ({r.kv_dtype}) with "
                           f"{budget.engine}'s allocation{halves}")
    mla = any(layer.kind.value == "mla" for layer in spec.layers)  # the latent whole on every tp rank
    fewer = ("more tensor_parallel_size lowers it" if not mla else "more decode_context_parallel_size lowers it"
             if choice.name == "vllm" else "data_parallel_size with enable_dp_attention lowers it"
             if choice.name == "sglang" else "fp8 KV lowers it")
    share = f" ({-(-budget.batch // dp):,} on each of {dp} DP ranks)" if dp > 1 else ""
    why["max_kv_bytes_per_gpu"] = (f"{_bytes(per_gpu)} on one GPU > "
                                   f"{_bytes(asked.get('max_kv_bytes_per_gpu'))}: "
                                   f"{budget.batch:,} x {seq_len:,} tokens{share} take {_bytes(r.total_bytes)} "
                                   f"over {r.num_gpus} GPU(s)"
                                   f"{f' and {dcp} DCP ranks' if dcp > 1 else ''}; {fewer}")


def _measure_plan(budget: Budget, spec: Any, asked: dict[str, Any], out: dict[str, float], why: dict[str, str]) -> None:
    """What `kvplan plan` finds for the budget's model and target (its gpu alone, when named): the fewest GPUs
    (unpriced, so every GPU type counts) for max_gpus, the cheapest at the budget's prices for max_cost_per_hour."""
    from kvplan.app.plan import plan_model

    max_len = budget.max_model_len or spec.max_model_len
    target = f"{budget.concurrency} requests of {max_len:,} tokens"
    for limit, prices in (("max_gpus", None), ("max_cost_per_hour", budget.prices)):
        if limit not in asked:
            continue
        report = plan_model(budget.model or spec.name, max_model_len=max_len, concurrency=budget.concurrency or 1,
                            gpus=budget.gpu, engines=budget.engine, kv_cache_dtypes=budget.kv_cache_dtype,
                            gpu_memory_utilization=budget.gpu_memory_utilization, prices=prices or {})
        if not report.result.ranked:  # nothing holds it: past any limit, with the closest attempts
            out[limit] = NOTHING_HOLDS
            closest = "; ".join(x.why for x in report.result.rejected[:2])
            why[limit] = f"no deployment kvplan plan searches holds {target}: {closest}"
            continue
        top = report.result.ranked[0]
        plan = f"{top.num_gpus} x {top.gpu.name} ({top.flags})"
        if limit == "max_gpus":
            out[limit] = top.num_gpus
            why[limit] = f"{top.num_gpus} GPUs > {asked[limit]}: the fewest that hold {target}: {plan}"
        else:
            out[limit] = top.cost_per_hour or 0.0
            why[limit] = (f"{top.cost_per_hour or 0:,.2f} an hour > {asked[limit]}: the cheapest that holds {target}: "
                          f"{plan}")


# a plan limit's value when no deployment holds the target: past any limit a budget can state, and finite (JSON)
NOTHING_HOLDS = 1e12


def _extras(budget: Budget, spec: Any, choice: Any) -> Any:
    """The budget's drafter and LoRA slots, as `kvplan fit` builds them from the same flags."""
    from kvplan.app.fit import LoRAFlags, SGLangFlags, extras
    from kvplan.io.speculative import parse_speculative_config

    try:
        return extras(spec, choice, speculative=parse_speculative_config(budget.speculative_config),
                      pp=budget.pipeline_parallel_size,
                      sglang_speculative=(SGLangFlags(algorithm=budget.speculative_algorithm,
                                                      draft_model=budget.speculative_draft_model_path)
                                          if budget.speculative_algorithm else None),
                      lora=(LoRAFlags(max_loras=budget.max_loras, max_rank=budget.max_lora_rank)
                            if budget.enable_lora else None))
    except InputError as exc:  # the flags' names as a budget spells them
        text = str(exc)
        for flag, key in (("--speculative-config", "speculative_config"),
                          ("--speculative-algorithm", "speculative_algorithm"), ("--enable-lora", "enable_lora"),
                          ("--speculative-draft-model-path", "speculative_draft_model_path")):
            text = text.replace(flag, key)
        raise InputError(text) from None


def _measure_fit(budget: Budget, spec: Any, asked: dict[str, Any], out: dict[str, float], why: dict[str, str]) -> None:
    from kvplan.core.capacity.common import FitRequest, SGLangArgs
    from kvplan.core.capacity.fit import fit
    from kvplan.core.engines import engine_for
    from kvplan.core.sizing import size_kv
    from kvplan.io.gpus import get_gpu

    choice = budget.engine_choice()
    tp, pp = budget.tensor_parallel_size, budget.pipeline_parallel_size
    gpu = get_gpu(budget.gpu, memory=budget.gpu_memory)
    # No concurrency asked of fit: its reasons are then the deployment's own (no KV memory, one request
    # too long), not the min_max_concurrency verdict, which is judged here with the other limits.
    dp, dcp = budget.data_parallel_size, budget.decode_context_parallel_size
    ext = _extras(budget, spec, choice)
    req = FitRequest(spec=spec, gpu=gpu, engine=choice.name, profile=choice.profile, tp=tp, pp=pp, dp=dp,
                     expert_parallel=budget.enable_expert_parallel, dcp=dcp,
                     dp_attention=budget.enable_dp_attention, kv_dtype=budget.kv_cache_dtype,
                     gpu_memory_utilization=budget.gpu_memory_utilization, max_model_len=budget.max_model_len,
                     allow_long_max_model_len=budget.allow_long_max_model_len, drafter=ext.drafter,
                     sglang_spec=ext.sglang_spec, lora=ext.lora,
                     num_speculative_tokens=ext.num_speculative_tokens or 0,
                     sglang=SGLangArgs(a2a_backend=budget.moe_a2a_backend,
                                       redundant_experts=budget.ep_num_redundant_experts,
                                       dense_tp=budget.moe_dense_tp_size, dp_lm_head=budget.enable_dp_lm_head,
                                       max_total_tokens=budget.max_total_tokens))
    f = fit(req)
    from kvplan.core.spec_decode import with_drafter

    drafted = with_drafter(spec, ext.drafter)
    per_request = size_kv(drafted, engine_for(drafted, choice.name, profile=choice.profile)[0], batch=budget.batch,
                          seq_len=f.max_model_len,
                          kv_dtype=budget.kv_cache_dtype, tp=tp, pp=pp).per_gpu_bytes
    per_request = -(-per_request // dcp)  # each sequence's tokens spread over dcp ranks
    b = f.breakdown
    busy = b.weights + b.draft_weights + b.lora + b.activation + b.non_torch + b.cuda_graph + per_request
    headroom = 1 - busy / gpu.memory_bytes
    # over every DP rank: each engine holds its own (FitResult.dp)
    out.update(min_kv_cache_tokens=f.all_kv_cache_tokens, min_max_concurrency=round(f.all_concurrency, 4),
               max_model_len_must_fit=float(f.fits),
               min_headroom_frac=round(headroom, 6))
    fit_says = "; ".join(f.reasons)
    cache = (f"{_gib(f.kv_cache_memory_bytes)} of KV cache per GPU on {gpu.name} x {f.num_gpus} after weights "
             f"{_gib(b.weights)}, activation {_gib(b.activation)}, non-torch {_gib(b.non_torch)}, CUDA graphs "
             f"{_gib(b.cuda_graph)}")
    because = fit_says or cache
    want = asked.get("min_max_concurrency") or 0
    why["min_kv_cache_tokens"] = (f"{f.all_kv_cache_tokens:,} KV cache tokens < "
                                  f"{asked.get('min_kv_cache_tokens') or 0:,.0f}: {because}")
    each = f" ({f.max_concurrency:.2f} on each of {dp} ranks)" if dp > 1 else ""
    busiest = -(-int(want) // dp) if dp > 1 else want
    need = (f" need {busiest / f.max_concurrency:.2f}x the KV cache" + (f" ({busiest} on the busiest rank)"
                                                                         if dp > 1 else "")
            if f.max_concurrency else " do not fit")
    why["min_max_concurrency"] = (f"max concurrency {f.all_concurrency:.2f}{each} < {want:g}: {want:g} requests of "
                                  f"{f.max_model_len:,} tokens{need}; {because}")
    why["max_model_len_must_fit"] = (f"max_model_len {f.max_model_len} does not fit: " + (
        fit_says or f"the longest that fits: max_model_len {f.max_model_len_fit}"))
    why["min_headroom_frac"] = (
        f"headroom {100 * headroom:.1f}% < {100 * (asked.get('min_headroom_frac') or 0):.1f}%: "
        f"weights {_gib(b.weights)} + activation {_gib(b.activation)} + non-torch {_gib(b.non_torch)} + "
        f"CUDA graphs {_gib(b.cuda_graph)} + KV of {budget.batch:,} x {f.max_model_len:,} tokens "
        f"{_gib(per_request)} = {_gib(busy)} of {_gib(gpu.memory_bytes)} per GPU")


def _measure_simulation(budget: Budget, origin: Path, asked: dict[str, Any], out: dict[str, float],
                        why: dict[str, str]) -> None:
    """The simulation limits, from the run `kvplan simulate` makes of the budget's workload (the same plan: the
    simulator it chooses, the pool `fit` plans), read off the budget's allocator's row."""
    from kvplan.app.report import allocator_rows
    from kvplan.app.simulate import plan_simulation, run_simulation

    run = run_simulation(plan_simulation(_workload_path(budget, origin), allocators=[budget.allocator]))
    rows = {row.allocator: row for row in allocator_rows(run)}
    sim = rows.get(budget.allocator)
    if sim is None:
        raise ConfigError(f"{origin}: budget {budget.name!r}: the workload runs on the {run.plan.simulator} simulator, "
                          f"which reports {', '.join(rows)}, not {budget.allocator}; set allocator: "
                          f"{next(iter(rows))}")
    if sim.token_states_frac is not None:
        out["min_token_states_frac"] = round(sim.token_states_frac, 6)
    elif "min_token_states_frac" in asked:
        raise ConfigError(f"{origin}: budget {budget.name!r}: min_token_states_frac: the {run.plan.simulator} "
                          "simulator does not break the pool down into token states and fragmentation")
    out.update(max_preemptions=sim.preemptions, max_rejected=sim.rejected, min_completed=sim.completed)
    rejected = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in sorted(sim.rejected_reasons.items()))
    outcome = (f"{sim.completed:,} completed, {sim.rejected:,} rejected" + (f" ({rejected})" if rejected else "")
               + f", {sim.preemptions:,} preemptions")
    if sim.token_states_frac is not None:
        why["min_token_states_frac"] = (
            f"token states {100 * sim.token_states_frac:.1f}% < "
            f"{100 * (asked.get('min_token_states_frac') or 0):.1f}%: "
            f"{sim.allocator}: reserved {100 * (sim.reserved_frac or 0):.1f}%, internal fragmentation "
            f"{100 * (sim.internal_frag_frac or 0):.1f}%, external {100 * (sim.external_frag_frac or 0):.1f}%, "
            f"free {100 * (sim.free_frac or 0):.1f}% of the KV pool")
    for key, value, op in (("max_preemptions", sim.preemptions, ">"), ("max_rejected", sim.rejected, ">"),
                           ("min_completed", sim.completed, "<")):
        what = key.split("_", 1)[1]
        why[key] = f"{value:,} {what} {op} {asked.get(key) or 0:,.0f}: {sim.allocator}: {outcome}"


def _workload_path(budget: Budget, origin: Path) -> Path:
    """The budget's workload: a path relative to the budgets file, or a bundled workload's name."""
    from kvplan.io.examples import resolve_input
    from kvplan.io.paths import probe

    assert budget.workload is not None
    path = Path(budget.workload)
    path = path if path.is_absolute() else origin.parent / path
    try:
        return resolve_input(path if probe(path) is not None else budget.workload, "workload")
    except ConfigError as exc:
        raise ConfigError(f"{origin}: budget {budget.name!r}: workload {exc}") from None
