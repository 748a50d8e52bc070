"""``kvplan explain LOG``: rebuild a vLLM startup log's memory budget and set kvplan beside it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from kvplan.cli.root import app
from kvplan.cli.format import format_bytes, make_console, new_table, print_json, print_table
from kvplan.cli.hub import FETCH_OPTION, REVISION_OPTION, fetched_json, say_fetched
from kvplan.cli.options import tokens
from kvplan.errors import HubError, KvplanError

if TYPE_CHECKING:  # imported when the command runs, keeping `kvplan size` start-up small
    from kvplan.core.capacity.common import FitRequest, FitResult
    from kvplan.core.capacity.explain import ExplainRow, Replay
    from kvplan.core.gpus import GPUSpec
    from kvplan.io.hub import HubConfig
    from kvplan.io.vllm_log import VLLMLog

console = make_console()


def _cell(row: ExplainRow, value: float | None) -> str:
    if value is None:
        return "-"
    if row.unit == "bytes":
        return format_bytes(int(value))
    if row.unit == "x":
        return f"{value:.2f}x"
    return f"{int(value):,}"


def _gpu_for(log: VLLMLog, gpu: Optional[str], gpu_memory: Optional[str] = None) -> GPUSpec | None:
    from kvplan.core.gpus import GPUSpec
    from kvplan.io.gpus import closest_gpu_by_memory, get_gpu

    if gpu or gpu_memory:
        return get_gpu(gpu, memory=gpu_memory)
    if log.total_gpu_memory_bytes:
        return closest_gpu_by_memory(log.total_gpu_memory_bytes) or GPUSpec(
            name="as logged", memory_bytes=log.total_gpu_memory_bytes, source="log")
    return None


def _profile(log: VLLMLog, engine: Optional[str], notes: list[str]) -> Any:
    if engine:
        from kvplan.core.profiles import Version, parse_engine
        from kvplan.core.engines.vllm.profiles import v0_variant
        from kvplan.errors import InputError

        choice = parse_engine(engine, allowed=("vllm",))
        asked = choice.profile.since if not choice.asked else Version.parse(choice.asked)
        if log.generation == "V0" and not asked < Version.parse("0.11.0"):
            raise InputError(f"--engine {engine}: the log is from vLLM's V0 engine, which 0.11 removed; name the "
                             "release that wrote it (0.6 to 0.10)")
        if log.generation == "V1" and asked < Version.parse("0.7.0"):
            raise InputError(f"--engine {engine}: the log is from vLLM's V1 engine, which begins in 0.7; name the "
                             "release that wrote it")
        if choice.note and choice.asked:
            notes.append(choice.note)
        return v0_variant(choice.profile) if log.generation == "V0" else choice.profile
    from kvplan.core.engines.vllm.profiles import for_log

    profile, assumed = for_log(log.version, log.generation)
    if assumed:
        notes.append(assumed)
    return profile


def _replay(req: FitRequest, log: VLLMLog) -> Replay:
    """kvplan's arithmetic fed the log's own figures (kvplan/core/capacity/explain.py says which)."""
    from kvplan.core.capacity.explain import LOGGED_GIB_HALF_UNIT, Replay
    from kvplan.core.capacity.fit import fit
    from kvplan.core.gpus import GPUSpec
    from kvplan.core.units import GiB

    measured = dataclasses.replace(req, weights_memory=log.weights_bytes, activation_memory=log.activation_bytes,
                                   non_torch_memory=log.non_torch_bytes,
                                   cuda_graph_memory=log.cuda_graph_estimate_bytes or log.cuda_graph_bytes)
    budget = None
    subtracts = req.engine_profile().rules.cuda_graphs == "subtracted"
    if (log.total_gpu_memory_bytes and log.gpu_memory_utilization and None not in (
            log.weights_bytes, log.activation_bytes, log.non_torch_bytes)
            and (log.cuda_graph_estimate_bytes is not None or not subtracts)):
        gpu = GPUSpec(name="as logged", memory_bytes=log.total_gpu_memory_bytes, source="log")
        budget = fit(dataclasses.replace(measured, gpu=gpu, gpu_memory_utilization=log.gpu_memory_utilization))
    if log.kv_cache_memory_bytes is None:
        return Replay(budget=budget)
    kv = log.kv_cache_memory_bytes
    half = int(LOGGED_GIB_HALF_UNIT * GiB)

    def at(kv_bytes: int) -> FitResult:
        return fit(dataclasses.replace(measured, kv_cache_memory_bytes=kv_bytes))

    return Replay(budget=budget, kv=at(kv), kv_low=at(kv - half), kv_high=at(kv + half))


def _predict(log: VLLMLog, model: Optional[str], gpu: GPUSpec | None, tp: Optional[int] = None,
             engine: Optional[str] = None, max_num_seqs: Optional[int] = None,
             fetch: Optional[bool] = None, revision: Optional[str] = None, hub: Optional[list[HubConfig]] = None,
             ) -> tuple[FitResult | None, Replay, list[str], Any]:
    from kvplan.core.capacity.common import FitRequest
    from kvplan.core.capacity.explain import Replay
    from kvplan.core.capacity.fit import fit
    from kvplan.io.models import resolve_model

    notes: list[str] = []
    ref = model or log.model
    if ref is None or gpu is None:
        notes.append("no prediction: " + ("the log names no model (no 'Initializing ... LLM engine' line); "
                                           "pass --model NAME" if ref is None
                                           else "the log gives no GPU memory (pass --gpu or --gpu-memory)"))
        return None, Replay(), notes, None
    try:
        resolved = resolve_model(ref, fetch=fetch, revision=revision)
    except HubError:
        raise  # a fetch that was asked for and failed is an error, not a missing prediction
    except KvplanError as exc:
        notes.append(f"no prediction for {ref}: {exc} (pass --model with a bundled name or config.json)")
        return None, Replay(), notes, None
    spec = resolved.spec
    if hub is not None and resolved.hub is not None:
        hub.append(resolved.hub)
    if log.dtype and log.dtype != spec.dtype and log.dtype in ("float32", "float16", "bfloat16"):
        # the engine's dtype (e.g. opt-125m's float16 upcast to float32 on a GPU without fp16 support) sets
        # both the weights and the KV cache
        notes.append(f"the log runs {spec.name} in {log.dtype} (the config says {spec.dtype})")
        spec = dataclasses.replace(spec, dtype=log.dtype)
    profile = _profile(log, engine, notes)
    kv_dtype = log.kv_cache_dtype if log.kv_cache_dtype and log.kv_cache_dtype != "auto" else "auto"
    max_len = log.max_seq_len or log.concurrency_tokens
    req = FitRequest(spec=spec, gpu=gpu, engine="vllm", tp=tp or log.tensor_parallel_size or 1,
                     pp=log.pipeline_parallel_size or 1, kv_dtype=kv_dtype,
                     gpu_memory_utilization=log.gpu_memory_utilization,
                     max_model_len=max_len, block_size=log.block_size, enforce_eager=bool(log.enforce_eager),
                     max_num_batched_tokens=log.max_num_batched_tokens, max_num_seqs=max_num_seqs, profile=profile,
                     # the log's max_model_len is the one vLLM started with: past the model's, the variable was set
                     allow_long_max_model_len=True)
    predicted = fit(req)
    replay = _replay(req, log)
    notes.append(f"predicted for {spec.name} on {gpu.name}, tp {req.tp}, max_model_len {predicted.max_model_len}, "
                 f"with the rules of {profile.display} {profile.version}")
    return predicted, replay, notes, profile


@app.command()
def explain(
    log_path: Path = typer.Argument(..., metavar="LOG", help="A vLLM startup log (V0 or V1, any version)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model to predict for (default: the one the "
                                                                    "log names, matched to a bundled config)."),
    gpu: Optional[str] = typer.Option(None, "--gpu", "-g", help="GPU (default: the catalog GPU whose memory "
                                                                "matches the logged total within 2%)."),
    gpu_memory: Optional[str] = typer.Option(None, "--gpu-memory", help="Memory of one GPU as the driver reports "
                                                                        "it, e.g. 23.99GiB, for a GPU not in the "
                                                                        "catalog (default: from --gpu or the log)."),
    tp: Optional[int] = typer.Option(None, "--tensor-parallel-size", "-tp", help="Tensor parallel size (default: "
                                                                               "the log's, else 1)."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", parser=tokens("--max-model-len"),
                                                help="Context length (default: the log's max_seq_len or "
                                                     "concurrency line, else the model's)."),
    max_num_batched_tokens: Optional[int] = typer.Option(
        None, "--max-num-batched-tokens", parser=tokens("--max-num-batched-tokens"),
        help="Tokens of the profiling batch (default: the log's, else the release's OpenAI-server default; the "
             "LLM class uses more)."),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help="Sequences per batch (default: the "
                                                                            "release's default for the GPU)."),
    engine: Optional[str] = typer.Option(None, "--engine", "-e", help="vllm==X.Y.Z: the release that wrote the log "
                                                                      "(default: the version the log prints)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
    fetch: Optional[bool] = FETCH_OPTION,
    revision: Optional[str] = REVISION_OPTION,
) -> None:
    """Where a vLLM deployment's memory went, and kvplan's prediction beside each logged figure."""
    from kvplan.core.capacity.explain import explain_rows
    from kvplan.io.vllm_log import read_vllm_log

    log = read_vllm_log(log_path)
    gpu_spec = _gpu_for(log, gpu, gpu_memory)
    if max_num_batched_tokens is not None:
        log.max_num_batched_tokens = max_num_batched_tokens
    if max_model_len is not None:
        log.max_seq_len = max_model_len
    hub: list[HubConfig] = []
    predicted, replay, notes, profile = _predict(log, model, gpu_spec, tp, engine, max_num_seqs, fetch=fetch,
                                                 revision=revision, hub=hub)
    rows = explain_rows(log.figures(), predicted, replay)
    if as_json:
        print_json({**_json(log, gpu_spec, rows, notes, profile), "fetched": fetched_json(hub[0] if hub else None)})
        return
    say_fetched(hub[0] if hub else None, as_json)
    console.print(f"[bold]{log_path}[/]: vLLM {log.version or '?'} ({log.generation or 'format unknown'}), "
                  f"model {log.model or '?'}, tp {log.tensor_parallel_size or '?'}, "
                  f"max_model_len {log.max_seq_len or '?'}, utilization {log.gpu_memory_utilization or '?'}")
    for note in notes:
        console.print(f"[dim]{note}[/]")
    table = new_table("figure", "logged", "kvplan", "err", "replayed", "err", numeric="*",
                      title="Logged figures; kvplan's prediction; replayed = kvplan from the log's own measurements")
    for row in rows:
        def err(v: float | None) -> str:
            e = row.error_frac(v)
            return "" if e is None else f"{100 * e:+.1f}%"
        table.add_row(row.figure, _cell(row, row.logged), _cell(row, row.predicted), err(row.predicted),
                      _cell(row, row.replayed), err(row.replayed))
    print_table(console, table)
    if log.total_gpu_memory_bytes and log.gpu_memory_utilization:
        budget = log.total_gpu_memory_bytes * log.gpu_memory_utilization
        parts = {"weights": log.weights_bytes, "activation": log.activation_bytes, "non-torch": log.non_torch_bytes,
                 "KV cache": log.kv_cache_memory_bytes}
        shown = "; ".join(f"{k} {format_bytes(v)} ({100 * v / budget:.0f}%)" for k, v in parts.items() if v is not None)
        console.print(f"of the {format_bytes(int(budget))} vLLM may use: {shown}")


def _json(log: VLLMLog, gpu: GPUSpec | None, rows: list[ExplainRow], notes: list[str], profile: Any) -> dict[str, Any]:
    return {
        "log": log.path, "vllm_version": log.version, "format": log.generation, "model": log.model,
        "profile": None if profile is None else {"version": profile.version, "display": profile.display,
                                                 "v1": profile.rules.v1, "cuda_graphs": profile.rules.cuda_graphs},
        "gpu": gpu.name if gpu else None, "logged": log.figures(), "notes": notes,
        "rows": [{"figure": r.figure, "unit": r.unit, "logged": r.logged, "predicted": r.predicted,
                  "predicted_error_frac": r.error_frac(r.predicted), "replayed": r.replayed,
                  "replayed_error_frac": r.error_frac(r.replayed), "replayed_low": r.replayed_low,
                  "replayed_high": r.replayed_high, "replay_miss": r.replay_miss()} for r in rows],
    }
