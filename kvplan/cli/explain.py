"""``kvplan explain LOG``: rebuild a vLLM startup log's memory budget and set kvplan beside it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from kvplan.cli.app import app
from kvplan.cli.format import format_bytes, make_console, new_table, print_json, print_table
from kvplan.errors import KvplanError

if TYPE_CHECKING:  # imported when the command runs, keeping `kvplan size` start-up small
    from kvplan.core.capacity.common import FitResult
    from kvplan.core.capacity.explain import ExplainRow
    from kvplan.core.gpus import GPUSpec
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


def _gpu_for(log: VLLMLog, gpu: Optional[str]) -> GPUSpec | None:
    from kvplan.core.gpus import GPUSpec
    from kvplan.io.gpus import closest_gpu_by_memory, get_gpu

    if gpu:
        return get_gpu(gpu)
    if log.total_gpu_memory_bytes:
        return closest_gpu_by_memory(log.total_gpu_memory_bytes) or GPUSpec(
            name="as logged", memory_bytes=log.total_gpu_memory_bytes, source="log")
    return None


def _predict(log: VLLMLog, model: Optional[str], gpu: GPUSpec | None, tp: Optional[int] = None,
             engine: Optional[str] = None) -> tuple[FitResult | None, FitResult | None, list[str]]:
    from kvplan.core.capacity.common import FitRequest
    from kvplan.core.capacity.fit import fit
    from kvplan.io.models import load_model

    notes: list[str] = []
    ref = model or log.model
    if ref is None or gpu is None:
        notes.append("no prediction: " + ("the log names no model (no 'Initializing ... LLM engine' line); "
                                           "pass --model NAME" if ref is None
                                           else "the log gives no GPU memory (pass --gpu)"))
        return None, None, notes
    try:
        spec = load_model(ref)
    except KvplanError as exc:
        notes.append(f"no prediction for {ref}: {exc} (pass --model with a bundled name or config.json)")
        return None, None, notes
    if engine:
        from kvplan.core.profiles import parse_engine
        from kvplan.core.profiles.vllm import v0_variant

        choice = parse_engine(engine, allowed=("vllm",))
        profile = v0_variant(choice.profile) if log.generation == "V0" else choice.profile
        if choice.note and choice.asked:
            notes.append(choice.note)
    else:
        from kvplan.core.profiles.vllm import for_log

        profile, assumed = for_log(log.version, log.generation)
        if assumed:
            notes.append(assumed)
    kv_dtype = log.kv_cache_dtype if log.kv_cache_dtype and log.kv_cache_dtype != "auto" else "auto"
    max_len = log.max_seq_len or log.concurrency_tokens
    req = FitRequest(spec=spec, gpu=gpu, engine="vllm", tp=tp or log.tensor_parallel_size or 1,
                     pp=log.pipeline_parallel_size or 1, kv_dtype=kv_dtype,
                     gpu_memory_utilization=log.gpu_memory_utilization,
                     max_model_len=max_len, block_size=log.block_size, enforce_eager=bool(log.enforce_eager),
                     max_num_batched_tokens=log.max_num_batched_tokens, profile=profile)
    predicted = fit(req)
    replayed = None
    if log.kv_cache_memory_bytes is not None:
        replayed = fit(dataclasses.replace(
            req, kv_cache_memory_bytes=log.kv_cache_memory_bytes, weights_memory=log.weights_bytes,
            activation_memory=log.activation_bytes, non_torch_memory=log.non_torch_bytes,
            cuda_graph_memory=log.cuda_graph_bytes))
    notes.append(f"predicted for {spec.name} on {gpu.name}, tp {req.tp}, max_model_len {predicted.max_model_len:,}, "
                 f"with the rules of {profile.display} {profile.version}")
    return predicted, replayed, notes


@app.command()
def explain(
    log_path: Path = typer.Argument(..., metavar="LOG", help="A vLLM startup log (V0 or V1, any version)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model to predict for (default: the one the "
                                                                    "log names, matched to a bundled config)."),
    gpu: Optional[str] = typer.Option(None, "--gpu", "-g", help="GPU (default: the catalog GPU whose memory "
                                                                "matches the logged total within 2%)."),
    tp: Optional[int] = typer.Option(None, "--tensor-parallel-size", "-tp", help="Tensor parallel size (default: "
                                                                               "the log's, else 1)."),
    engine: Optional[str] = typer.Option(None, "--engine", "-e", help="vllm==X.Y.Z: the release that wrote the log "
                                                                      "(default: the version the log prints)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
) -> None:
    """Where a vLLM deployment's memory went, and kvplan's prediction beside each logged figure."""
    from kvplan.core.capacity.explain import explain_rows
    from kvplan.io.vllm_log import read_vllm_log

    log = read_vllm_log(log_path)
    gpu_spec = _gpu_for(log, gpu)
    predicted, replayed, notes = _predict(log, model, gpu_spec, tp, engine)
    rows = explain_rows(log.figures(), predicted, replayed)
    if as_json:
        print_json(_json(log, gpu_spec, rows, notes))
        return
    console.print(f"[bold]{log_path}[/]: vLLM {log.version or '?'} ({log.generation or 'format unknown'}), "
                  f"model {log.model or '?'}, tp {log.tensor_parallel_size or '?'}, "
                  f"max_model_len {log.max_seq_len or '?'}, utilization {log.gpu_memory_utilization or '?'}")
    for note in notes:
        console.print(f"[dim]{note}[/]")
    table = new_table("figure", "logged", "kvplan", "err", "replayed", "err", numeric="*",
                      title="Logged figures; kvplan's prediction; replayed = kvplan from the log's own budget")
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


def _json(log: VLLMLog, gpu: GPUSpec | None, rows: list[ExplainRow], notes: list[str]) -> dict[str, Any]:
    return {
        "log": log.path, "vllm_version": log.version, "format": log.generation, "model": log.model,
        "gpu": gpu.name if gpu else None, "logged": log.figures(), "notes": notes,
        "rows": [{"figure": r.figure, "unit": r.unit, "logged": r.logged, "predicted": r.predicted,
                  "predicted_error_frac": r.error_frac(r.predicted), "replayed": r.replayed,
                  "replayed_error_frac": r.error_frac(r.replayed)} for r in rows],
    }
