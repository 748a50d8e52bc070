"""``kvplan validate``: predictions beside real torch runs (CPU anywhere, CUDA where there is one)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.text import Text

from kvplan.cli.root import app
from kvplan.cli.format import format_bytes, make_console, new_table, print_json, print_table
from kvplan.cli.hub import FETCH_OPTION, REVISION_OPTION, fetched_json, say_fetched
from kvplan.cli.options import tokens
from kvplan.errors import InputError

console = make_console()


@app.command()
def validate(
    model: Optional[str] = typer.Argument(None, help=(
        "Bundled name, hub id, or config.json (not with --matrix).")),
    batch: int = typer.Option(1, "--batch", "-b", help="Sequences run at once (default 1)."),
    seq_len: int = typer.Option(64, "--seq-len", "-s", parser=tokens("--seq-len"), help=(
        "Tokens in the cache when it is measured, e.g. 2048 or 2k (default 64).")),
    prompt_len: Optional[int] = typer.Option(None, "--prompt-len", parser=tokens("--prompt-len"), help=(
        "Prefill length; the rest is decoded one token at a time (default seq_len - 8).")),
    dtype: str = typer.Option("auto", "--dtype", help="fp32, bf16 or fp16 (default auto: the model's dtype)."),
    layers: Optional[int] = typer.Option(None, "--layers", help=(
        "Build only the first N layers and scale the whole-model figures (default: all; a model too large "
        "for the device is refused with an N that fits).")),
    device: str = typer.Option("auto", "--device", help="cpu or cuda (default auto: cuda when torch sees one)."),
    tolerance: float = typer.Option(0.05, "--tolerance", help=(
        "Largest relative error that passes (default 0.05, i.e. 5%).")),
    matrix: Optional[Path] = typer.Option(None, "--matrix", help=(
        "A YAML list of cases, e.g. configs/validation/matrix-cpu.yaml (default: the one case given).")),
    report: Optional[Path] = typer.Option(None, "--report", help=(
        "Write validation.md and validation.json into this folder (default: none).")),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of the table (default: table)."),
    fetch: Optional[bool] = FETCH_OPTION,
    revision: Optional[str] = REVISION_OPTION,
) -> None:
    """Run real models with torch and set kvplan's predictions beside the measured memory."""
    from kvplan.validate import require_torch

    require_torch()
    from kvplan.io.models import resolve_model
    from kvplan.validate.matrix import load_matrix, result_dict, write_report
    from kvplan.validate.run import Case, device_description, run_case

    if not 0 <= tolerance < 10:
        raise InputError(f"--tolerance must be between 0 and 10 (got {tolerance})")
    if matrix is not None:
        if model:
            raise InputError("give a MODEL or --matrix, not both")
        if revision:
            raise InputError("--revision goes with one MODEL, not --matrix")
        cases = load_matrix(matrix)
    elif model:
        if batch < 1 or seq_len < 2:
            raise InputError("--batch must be >= 1 and --seq-len >= 2")
        cases = [Case(model=model, batch=batch, seq_len=seq_len, prompt_len=prompt_len, dtype=dtype, layers=layers,
                      device=device)]
    else:
        raise InputError("give a MODEL (e.g. llama3-8b) or --matrix FILE")
    results = []
    fetched = []
    for case in cases:
        resolved = resolve_model(case.model, fetch=fetch, revision=revision)
        say_fetched(resolved.hub, as_json)
        if fetched_json(resolved.hub):
            fetched.append(fetched_json(resolved.hub))
        results += run_case(case, resolved.spec)
    info = device_description()
    failed = [r for r in results if abs(r.error_frac) > tolerance]
    if report is not None:
        path = write_report(report, info, results, tolerance)
        if not as_json:
            console.print(f"report written to {path}")
    if as_json:
        print_json({"device": info, "tolerance": tolerance, "passed": not failed,
                    "cases": [result_dict(r) for r in results], "fetched": fetched})
    else:
        # A heading row per case (model, batch x seq_len, dtype) and its parts under it: fits 80 columns.
        table = new_table("case / part", "layers", "predicted", "measured", "error", "",
                          numeric=("layers", "predicted", "measured", "error"), no_wrap=("",),
                          title=f"Predicted vs measured on {info.get('name')} (torch {info.get('torch')})")
        heading = None
        for r in results:
            case = f"{r.model}, batch {r.batch} x {r.seq_len} tokens, {r.dtype}"
            if case != heading:
                if heading is not None:
                    table.add_section()
                heading = case
                table.add_row(Text(case, style="bold"))
            table.add_row(Text(f"  {r.component}"), str(r.layers), format_bytes(r.predicted_bytes),
                          format_bytes(r.measured_bytes), f"{100 * r.error_frac:+.2f}%",
                          "scaled" if r.scaled else ("[red]FAIL[/]" if abs(r.error_frac) > tolerance else ""))
        print_table(console, table)
    if failed:
        raise typer.Exit(1)
