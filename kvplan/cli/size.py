"""``kvplan size``: the rendering of ``kvplan.app.size.size_model``, as tables or one JSON object."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from kvplan.app.size import MeasuredSizeReport, SizeReport, size_model
from kvplan.cli.format import (bytes_cell, format_bytes, layers_cell, make_console, new_table, print_json,
                               print_table, summary_table)
from kvplan.cli.hub import fetched_json, say_fetched
from kvplan.cli.options import (LENGTH_HINT, BatchOption, BlockSizeOption, DataParallelOption,
                                DecodeContextParallelOption, FetchOption, JsonOption, KvCacheDtypeOption,
                                ModelArg, PipelineParallelOption, RevisionOption, TensorParallelOption, engine_option,
                                tokens)
from kvplan.cli.root import app
from kvplan.io.speculative import parse_speculative_config
from kvplan.core.engines import ENGINES
from kvplan.core.sizing import GroupSize, SizeResult
from kvplan.core.spec import CompressedLayer, LinearLayer

console = make_console()

ENGINE_HELP = (f"Whose allocation rules: {', '.join(ENGINES)}, optionally pinned to a release, e.g. "
               "vllm==0.11.0 (default ideal: exactly the token states; no version: the newest rules; "
               "`kvplan engines` lists the releases).")
SeqLenOpt = Annotated[Optional[int], typer.Option(
    "--seq-len", "-s", "--max-model-len", parser=tokens("--seq-len"),
    help=f"Tokens per sequence, e.g. {LENGTH_HINT} (default: the model's max context, max_position_embeddings).")]


@app.command()
def size(
    model: ModelArg,
    *,
    batch: BatchOption = 1,
    seq_len: SeqLenOpt = None,
    kv_cache_dtype: KvCacheDtypeOption = "auto",
    tp: TensorParallelOption = 1,
    pp: PipelineParallelOption = 1,
    dp: DataParallelOption = 1,
    dcp: DecodeContextParallelOption = 1,
    engine: Annotated[str, engine_option(ENGINE_HELP)] = "ideal",
    block_size: BlockSizeOption = None,
    speculative_config: Annotated[Optional[str], typer.Option("--speculative-config", help=(
        "A speculative drafter's layers beside the model's, as vLLM takes it, e.g. "
        "'{\"method\": \"mtp\", \"num_speculative_tokens\": 1}' (default: none)."))] = None,
    as_json: JsonOption = False,
    fetch: FetchOption = None,
    revision: RevisionOption = None,
) -> None:
    """KV-cache bytes per token, per sequence, total and per GPU, layer group by layer group."""
    report = size_model(model, batch=batch, seq_len=seq_len, kv_cache_dtype=kv_cache_dtype, tp=tp, pp=pp, dp=dp,
                        dcp=dcp, engine=engine, block_size=block_size, fetch=fetch, revision=revision,
                        speculative=parse_speculative_config(speculative_config))
    if isinstance(report, MeasuredSizeReport):
        if as_json:
            print_json(measured_json(report))
        else:
            _render_measured(report)
        return
    say_fetched(report.hub, as_json)
    if as_json:
        print_json(size_json(report))
        return
    _render_size(report)
    for note in report.engine_notes:
        console.print(f"[yellow]note:[/] {note}")


def size_json(report: SizeReport) -> dict[str, Any]:
    """``kvplan size --json``: the keys are a contract (tests/cli/test_size_cli.py)."""
    r = report.result
    return {
        "model": r.model, "engine": r.engine, "kv_cache_dtype": r.kv_dtype, "batch": r.batch, "seq_len": r.seq_len,
        "seq_len_is_model_max": report.seq_len_is_model_max, "tensor_parallel_size": r.tp,
        "pipeline_parallel_size": r.pp, "data_parallel_size": r.dp, "decode_context_parallel_size": r.dcp,
        "num_gpus": r.num_gpus, "block_size": report.block_size,
        "bytes_per_token": r.bytes_per_token, "bytes_per_token_per_gpu": r.bytes_per_token_per_gpu,
        "bytes_per_sequence": r.bytes_per_sequence, "total_bytes": r.total_bytes, "per_gpu_bytes": r.per_gpu_bytes,
        "token_state_bytes": report.ideal.total_bytes,
        "layers": [{"kind": g.layer.kind.value, "description": g.description, "count": g.count,
                    "layer_indices": list(g.layer_indices), "tokens_held": g.tokens_held_per_layer,
                    "bytes_per_token": g.bytes_per_token, "bytes_per_sequence": g.bytes_per_sequence,
                    "bytes": g.total_bytes, "per_gpu_bytes": g.per_gpu_bytes, "formula": g.formula}
                   for g in r.groups],
        "notes": list(report.notes), "engine_version": report.engine_version, "fetched": fetched_json(report.hub),
        # --speculative-config: the drafter whose KV layers the figures above include (null: none)
        "speculative": ({"method": d.method, "num_speculative_tokens": d.num_speculative_tokens,
                         "draft_kv_layers": d.kv_layers} if (d := report.drafter) is not None else None),
    }


def measured_json(report: MeasuredSizeReport) -> dict[str, Any]:
    """The same keys for a measured cache: what a measurement cannot say (bytes per token) is null."""
    m = report.measured
    return {
        "model": report.model, "engine": "hf", "engine_version": m.transformers_version, "measured": True,
        "kv_cache_dtype": m.dtype, "batch": m.batch, "seq_len": m.seq_len,
        "seq_len_is_model_max": report.seq_len_is_model_max, "tensor_parallel_size": 1, "pipeline_parallel_size": 1,
        "data_parallel_size": 1, "decode_context_parallel_size": 1, "num_gpus": 1, "block_size": 1, "bytes_per_token": None, "bytes_per_token_per_gpu": None,
        "bytes_per_sequence": m.total_bytes // m.batch if m.total_bytes % m.batch == 0 else None,
        "total_bytes": m.total_bytes, "per_gpu_bytes": m.total_bytes, "token_state_bytes": None,
        "layers": [{"kind": "measured", "description": "measured", "count": len(idx), "layer_indices": idx,
                    "bytes": held * len(idx), "per_gpu_bytes": held * len(idx)} for held, idx in m.layer_groups()],
        "notes": list(report.notes), "fetched": None, "speculative": None,
    }


def _render_measured(report: MeasuredSizeReport) -> None:
    m = report.measured
    console.print(f"[bold]{report.model}[/]  engine [cyan]hf[/]: measured, transformers {m.transformers_version} on "
                  "the meta device")
    console.print(f"cache dtype {m.dtype} | batch {m.batch:,} x {m.seq_len:,} tokens"
                  f"{' (the model max context; set --seq-len)' if report.seq_len_is_model_max else ''} | 1 GPU")
    table = new_table("layers", "bytes per layer", "total", numeric=("bytes per layer", "total"), no_wrap=("layers",),
                      title="Per layer group (measured)")
    for held, idx in m.layer_groups():
        table.add_row(layers_cell(idx), format_bytes(held), format_bytes(held * len(idx)))
    print_table(console, table)
    summary = summary_table()
    summary.add_row("total (1 GPU)", bytes_cell(m.total_bytes))
    print_table(console, summary)
    for note in report.notes:
        console.print(f"[yellow]note:[/] {note}")


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' if n > 1 else ''}"


def _render_size(report: SizeReport) -> None:
    r = report.result
    seq_note = " (the model's max context; set --seq-len)" if report.seq_len_is_model_max else ""
    console.print(f"[bold]{r.model}[/]  engine [cyan]{r.engine}[/]: {report.rules}")
    console.print(f"KV dtype {r.kv_dtype} | batch {r.batch:,} x {r.seq_len:,} tokens{seq_note} | "
                  f"tp {r.tp} x pp {r.pp}{f' x dp {r.dp}' if r.dp > 1 else ''} = {_gpus(r.num_gpus)}"
                  + (f", dcp {r.dcp}" if r.dcp > 1 else ""))
    for note in report.model_notes:
        console.print(f"[yellow]note:[/] {note}")
    print_table(console, _groups_table(r))
    print_table(console, _summary(r, report.ideal))
    multi = r.num_gpus > 1
    console.print(f"[bold]formula[/] (bytes per token, one sequence, {_engine_gpus(r)}):" if multi
                  else "[bold]formula[/] (bytes per token, one sequence):")
    for g in r.groups:
        line = _formula_line(g)
        if line:
            console.print(f"  {line}")


def _engine_gpus(r: SizeResult) -> str:
    """What the per-token and per-sequence figures span: every GPU, or one engine's with data parallelism."""
    return f"one engine's {r.tp * r.pp} GPUs" if r.dp > 1 else f"all {r.num_gpus} GPUs"


def _groups_table(r: SizeResult) -> Table:
    multi = r.num_gpus > 1
    held = "held/rank" if r.dcp > 1 else "held/seq"  # decode context parallel: a rank's share of each sequence
    cols = ("layers", "kind", held, "B/token", "per seq", "total", "per GPU") if multi else \
        ("layers", "kind", held, "B/token", "per seq", "total")
    span = f"B/token and per seq: {_engine_gpus(r)}; total: all {r.num_gpus}" if r.dp > 1 else \
        f"B/token, per seq and total: all {r.num_gpus} GPUs"
    table = new_table(*cols, numeric=(held, "B/token", "per seq", "total", "per GPU"), no_wrap=("layers",),
                      title="Per layer group" + (f" ({span})" if multi else ""))
    for g in r.groups:
        held = ("fixed state" if isinstance(g.layer, LinearLayer) and not g.layer.holds_tokens
                else f"{g.tokens_held_per_layer:,}" + (" + state" if isinstance(g.layer, LinearLayer) else ""))
        if isinstance(g.layer, CompressedLayer) and g.layer.compress_ratio:
            held += f" + {g.layer.entries(r.seq_len):,} entries"
        row = [layers_cell(g.layer_indices), g.description, held, format_bytes(g.bytes_per_token),
               format_bytes(g.bytes_per_sequence), format_bytes(g.total_bytes)]
        table.add_row(*row, *([format_bytes(g.per_gpu_bytes)] if multi else []))
    return table


def _summary(r: SizeResult, ideal: SizeResult) -> Table:
    multi = r.num_gpus > 1
    summary = summary_table()
    every = f", {_engine_gpus(r)}" if multi else ""
    summary.add_row("bytes per token" + every, bytes_cell(r.bytes_per_token))
    if multi:
        summary.add_row("bytes per token, per GPU", bytes_cell(r.bytes_per_token_per_gpu))
    summary.add_row("per sequence" + every, bytes_cell(r.bytes_per_sequence))
    summary.add_row(f"total ({_gpus(r.num_gpus)})", bytes_cell(r.total_bytes))
    if multi:
        summary.add_row("per GPU (most loaded)", bytes_cell(r.per_gpu_bytes))
    if ideal.total_bytes != r.total_bytes:
        summary.add_row("token states only (ideal)", bytes_cell(ideal.total_bytes))
        summary.add_row(f"{r.engine} adds", format_bytes(r.total_bytes - ideal.total_bytes))
    return summary


def _formula_line(g: GroupSize) -> str | None:
    """The group's bytes as the formula that gives them (None: a layer that caches nothing)."""
    if isinstance(g.layer, CompressedLayer):
        return f"{g.formula}: {g.bytes_per_sequence:,} B per sequence"
    if g.bytes_per_token and isinstance(g.layer, LinearLayer):  # parallel attention + fixed state (Falcon-H1)
        state = g.bytes_per_sequence - g.bytes_per_token * g.tokens_held_per_layer
        return f"{g.formula} = {g.bytes_per_token:,} B per token + {state:,} B per sequence"
    if g.bytes_per_token:
        return f"{g.formula} = {g.bytes_per_token:,} B"
    if isinstance(g.layer, LinearLayer):
        return f"{g.formula} = {g.bytes_per_sequence:,} B per sequence (does not grow with tokens)"
    return None
