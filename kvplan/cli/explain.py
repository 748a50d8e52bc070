"""``kvplan explain LOG``: the rendering of ``kvplan.app.explain.explain_log``, as a table or one JSON object."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from kvplan.app.explain import ExplainReport, explain_log
from kvplan.cli.format import format_bytes, make_console, new_table, print_json, print_table
from kvplan.cli.hub import fetched_json, say_fetched
from kvplan.cli.options import (FetchOption, JsonOption, RevisionOption, engine_option, gpu_memory_option, gpu_option,
                                max_model_len_option, max_num_batched_tokens_option, max_num_seqs_option)
from kvplan.cli.root import app

if TYPE_CHECKING:
    from kvplan.core.capacity.explain import ExplainRow

console = make_console()

LogArg = Annotated[Path, typer.Argument(metavar="LOG", help="A vLLM startup log (V0 or V1, any version).")]
ModelOpt = Annotated[Optional[str], typer.Option("--model", "-m", help=(
    "Model to predict for (default: the one the log names, matched to a bundled config)."))]
GpuOpt = Annotated[Optional[str], gpu_option(
    "GPU (default: the catalog GPU whose memory matches the logged total within 2%).")]
GpuMemoryOpt = Annotated[Optional[str], gpu_memory_option(
    "Memory of one GPU as the driver reports it, e.g. 23.99GiB, for a GPU not in the catalog (default: from --gpu "
    "or the log).")]
TensorParallelOpt = Annotated[Optional[int], typer.Option("--tensor-parallel-size", "-tp", help=(
    "Tensor parallel size (default: the log's, else 1)."))]
MaxModelLenOpt = Annotated[Optional[int], max_model_len_option(
    "Context length (default: the log's max_seq_len or concurrency line, else the model's).")]
MaxNumBatchedTokensOpt = Annotated[Optional[int], max_num_batched_tokens_option(
    "Tokens of the profiling batch (default: the log's, else the release's OpenAI-server default; the LLM class "
    "uses more).")]
MaxNumSeqsOpt = Annotated[Optional[int], max_num_seqs_option(
    "Sequences per batch (default: the release's default for the GPU).")]
WeightDtypeOpt = Annotated[str, typer.Option("--weight-dtype", help=(
    "Weight format of the checkpoint the log loads: auto (default: its quantization_config, or fp8 where the log "
    "quantizes online), bf16, fp16, fp8, int8, int4-g128, mxfp4."))]
EngineOpt = Annotated[Optional[str], engine_option(
    "vllm==X.Y.Z: the release that wrote the log (default: the version the log prints).")]


@app.command()
def explain(
    log_path: LogArg,
    *,
    model: ModelOpt = None,
    gpu: GpuOpt = None,
    gpu_memory: GpuMemoryOpt = None,
    tp: TensorParallelOpt = None,
    max_model_len: MaxModelLenOpt = None,
    max_num_batched_tokens: MaxNumBatchedTokensOpt = None,
    max_num_seqs: MaxNumSeqsOpt = None,
    engine: EngineOpt = None,
    weight_dtype: WeightDtypeOpt = "auto",
    as_json: JsonOption = False,
    fetch: FetchOption = None,
    revision: RevisionOption = None,
) -> None:
    """Where a vLLM deployment's memory went, and kvplan's prediction beside each logged figure."""
    report = explain_log(log_path, model=model, gpu=gpu, gpu_memory=gpu_memory, tp=tp, max_model_len=max_model_len,
                         max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, engine=engine,
                         fetch=fetch, revision=revision, weight_dtype=weight_dtype)
    if as_json:
        print_json({**explain_json(report), "fetched": fetched_json(report.hub)})
        return
    say_fetched(report.hub, as_json)
    _render(log_path, report)


def _cell(row: ExplainRow, value: float | None) -> str:
    if value is None:
        return "-"
    if row.unit == "bytes":
        return format_bytes(int(value))
    if row.unit == "x":
        return f"{value:.2f}x"
    return f"{int(value):,}"


def _error(row: ExplainRow, value: float | None) -> str:
    e = row.error_frac(value)
    return "" if e is None else f"{100 * e:+.1f}%"


def _render(log_path: Path, report: ExplainReport) -> None:
    log = report.log
    console.print(f"[bold]{log_path}[/]: vLLM {log.version or '?'} ({log.generation or 'format unknown'}), "
                  f"model {log.model or '?'}, tp {log.tensor_parallel_size or '?'}, "
                  f"max_model_len {log.max_seq_len or '?'}, utilization {log.gpu_memory_utilization or '?'}")
    for note in report.notes:
        console.print(f"[dim]{note}[/]")
    table = new_table("figure", "logged", "kvplan", "err", "replayed", "err", numeric="*",
                      title="Logged figures; kvplan's prediction; replayed = kvplan from the log's own measurements")
    for row in report.rows:
        table.add_row(row.figure, _cell(row, row.logged), _cell(row, row.predicted), _error(row, row.predicted),
                      _cell(row, row.replayed), _error(row, row.replayed))
    print_table(console, table)
    if log.total_gpu_memory_bytes and log.gpu_memory_utilization:
        budget = log.total_gpu_memory_bytes * log.gpu_memory_utilization
        parts = {"weights": log.weights_bytes, "activation": log.activation_bytes, "non-torch": log.non_torch_bytes,
                 "KV cache": log.kv_cache_memory_bytes}
        shown = "; ".join(f"{k} {format_bytes(v)} ({100 * v / budget:.0f}%)" for k, v in parts.items() if v is not None)
        console.print(f"of the {format_bytes(int(budget))} vLLM may use: {shown}")


def explain_json(report: ExplainReport) -> dict[str, Any]:
    """``kvplan explain --json`` less ``fetched``: the keys are a contract (tests/cli/test_explain_cli.py)."""
    log, profile = report.log, report.profile
    return {
        "log": log.path, "vllm_version": log.version, "format": log.generation, "model": log.model,
        "profile": None if profile is None else {"version": profile.version, "display": profile.display,
                                                 "v1": profile.rules.v1, "cuda_graphs": profile.rules.cuda_graphs},
        "gpu": report.gpu.name if report.gpu else None, "gpu_source": report.gpu_source,
        "logged": log.figures(), "notes": list(report.notes),
        "rows": [{"figure": r.figure, "unit": r.unit, "logged": r.logged, "predicted": r.predicted,
                  "predicted_error_frac": r.error_frac(r.predicted), "replayed": r.replayed,
                  "replayed_error_frac": r.error_frac(r.replayed), "replayed_low": r.replayed_low,
                  "replayed_high": r.replayed_high, "replay_miss": r.replay_miss()} for r in report.rows],
    }
