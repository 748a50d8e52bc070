"""``kvplan validate``: the rendering of ``kvplan.app.validate.validate_models``; exit 1 when a part misses."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from kvplan.app.validate import ValidateReport, validate_models
from kvplan.cli.format import format_bytes, make_console, new_table, print_json, print_table
from kvplan.cli.hub import fetched_json, say_fetched
from kvplan.cli.options import BatchOption, FetchOption, JsonOption, RevisionOption, tokens
from kvplan.cli.root import app

console = make_console()

ModelOrMatrixArg = Annotated[Optional[str], typer.Argument(help=(
    "Bundled name, hub id, or config.json (not with --matrix; no default: give it or --matrix)."))]
SeqLenOpt = Annotated[int, typer.Option("--seq-len", "-s", parser=tokens("--seq-len"), help=(
    "Tokens in the cache when it is measured, e.g. 2048 or 2k (default 64)."))]
PromptLenOpt = Annotated[Optional[int], typer.Option("--prompt-len", parser=tokens("--prompt-len"), help=(
    "Prefill length; the rest is decoded one token at a time (default seq_len - 8)."))]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="fp32, bf16 or fp16 (default auto: the model's dtype).")]
LayersOpt = Annotated[Optional[int], typer.Option("--layers", help=(
    "Build only the first N layers and scale the whole-model figures (default: all; a model too large for the "
    "device is refused with an N that fits)."))]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu or cuda (default auto: cuda when torch sees one).")]
ToleranceOpt = Annotated[float, typer.Option("--tolerance", help=(
    "Largest relative error that passes (default 0.05, i.e. 5%)."))]
MatrixOpt = Annotated[Optional[Path], typer.Option("--matrix", help=(
    "A YAML list of cases, e.g. configs/validation/matrix-cpu.yaml (default: the one case given)."))]
ReportOpt = Annotated[Optional[Path], typer.Option("--report", help=(
    "Write validation.md and validation.json into this folder (default: none)."))]


@app.command()
def validate(
    model: ModelOrMatrixArg = None,
    *,
    batch: BatchOption = 1,
    seq_len: SeqLenOpt = 64,
    prompt_len: PromptLenOpt = None,
    dtype: DtypeOpt = "auto",
    layers: LayersOpt = None,
    device: DeviceOpt = "auto",
    tolerance: ToleranceOpt = 0.05,
    matrix: MatrixOpt = None,
    report: ReportOpt = None,
    as_json: JsonOption = False,
    fetch: FetchOption = None,
    revision: RevisionOption = None,
) -> None:
    """Run real models with torch and set kvplan's predictions beside the measured memory."""
    done = validate_models(model, batch=batch, seq_len=seq_len, prompt_len=prompt_len, dtype=dtype, layers=layers,
                           device=device, tolerance=tolerance, matrix=matrix, report=report, fetch=fetch,
                           revision=revision)
    for hub in done.hubs:
        say_fetched(hub, as_json)
    if as_json:
        from kvplan.validate.matrix import result_dict

        print_json({"device": done.device, "tolerance": done.tolerance, "passed": not done.failed,
                    "cases": [result_dict(r) for r in done.results],
                    "fetched": [f for f in map(fetched_json, done.hubs) if f]})
    else:
        if done.report_path is not None:
            console.print(f"report written to {done.report_path}")
        _render(done)
    if done.failed:
        raise typer.Exit(1)


def _render(done: ValidateReport) -> None:
    """A heading row per case (model, batch x seq_len, dtype) and its parts under it: fits 80 columns."""
    info = done.device
    table = new_table("case / part", "layers", "predicted", "measured", "error", "",
                      numeric=("layers", "predicted", "measured", "error"), no_wrap=("",),
                      title=f"Predicted vs measured on {info.get('name')} (torch {info.get('torch')})")
    heading = None
    for r in done.results:
        case = f"{r.model}, batch {r.batch} x {r.seq_len} tokens, {r.dtype}"
        if case != heading:
            if heading is not None:
                table.add_section()
            heading = case
            table.add_row(Text(case, style="bold"))
        part = f"  {r.component}" + (f" {r.tokens // 1024}k" if r.tokens and r.tokens % 1024 == 0 else
                                      f" {r.tokens}" if r.tokens else "")
        if r.missing:
            table.add_row(Text(part), str(r.layers), "", "", "", "not measured")
            continue
        verdict = "scaled" if r.scaled else ("[red]FAIL[/]" if not r.passes(done.tolerance) else
                                             "estimate" if r.band_bytes else "")
        table.add_row(Text(part), str(r.layers), format_bytes(r.predicted_bytes), format_bytes(r.measured_bytes),
                      f"{100 * r.error_frac:+.2f}%", verdict)
    print_table(console, table)
    for r in done.results:
        if r.missing:
            console.print(f"{r.model} {r.component}: not measured: {r.missing}")
