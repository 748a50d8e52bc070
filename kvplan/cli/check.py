"""``kvplan check budgets.yaml``: capacity budgets as a CI gate (exit 0 pass, 1 fail, 2 invalid)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.table import Table

from kvplan.cli.app import app
from kvplan.cli.format import format_bytes, make_console, print_json
from kvplan.errors import ConfigError

if TYPE_CHECKING:
    from kvplan.core.budgets import Change, LimitResult

console = make_console()
_BYTES = ("max_kv_bytes_per_token", "max_kv_bytes", "max_kv_bytes_per_gpu")


def _show(limit: str, value: float) -> str:
    if limit in _BYTES:
        return format_bytes(int(value))
    if limit == "max_model_len_must_fit":
        return "yes" if value else "no"
    if limit.endswith("_frac"):
        return f"{100 * value:.1f}%"
    return f"{value:,.2f}" if value != int(value) else f"{int(value):,}"


def _load_baseline(path: Path) -> dict[tuple[str, str], float]:
    from kvplan.io.yamlio import load_json

    if not os.path.lexists(path):
        raise ConfigError(f"{path}: no such baseline file")
    data = load_json(path)  # the safe reader: regular files only, size cap, UTF-8, bounded nesting
    try:
        return {(r["budget"], r["limit"]): float(r["value"]) for r in data["results"]}
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{path}: not a `kvplan check --json` output (needs results[].budget/limit/value)") from None


def junit_xml(results: list["LimitResult"]) -> str:
    from xml.sax.saxutils import quoteattr  # imported here: it costs more start-up than all of `kvplan size`

    failures = sum(not r.passed for r in results)
    lines = ['<?xml version="1.0" encoding="UTF-8"?>',
             f'<testsuite name="kvplan-budgets" tests="{len(results)}" failures="{failures}" errors="0">']
    for r in results:
        name = quoteattr(f"{r.budget}: {r.limit}")
        lines.append(f'  <testcase classname={quoteattr(r.budget)} name={name}>')
        if not r.passed:
            msg = quoteattr(f"{r.limit} = {_show(r.limit, r.value)}, limit {_show(r.limit, r.threshold)}")
            lines.append(f"    <failure message={msg}/>")
        lines.append("  </testcase>")
    lines.append("</testsuite>")
    return "\n".join(lines) + "\n"


def _markdown(results: list["LimitResult"], changes: list["Change"]) -> str:
    ok = all(r.passed for r in results)
    out = [f"### kvplan budgets: {'all pass' if ok else 'FAILED'}", "",
           "| budget | limit | value | limit | margin | |", "|---|---|---|---|---|---|"]
    for r in results:
        margin = "" if r.margin_frac is None else f"{100 * r.margin_frac:+.1f}%"
        out.append(f"| {r.budget} | {r.limit} | {_show(r.limit, r.value)} | {_show(r.limit, r.threshold)} | {margin} | "
                   f"{'pass' if r.passed else '**FAIL**'} |")
    worse = [c for c in changes if c.worse]
    if worse:
        out += ["", "Worse since the baseline: " + "; ".join(
            f"{c.budget} {c.limit} {_show(c.limit, c.before)} -> {_show(c.limit, c.after)}" for c in worse)]
    return "\n".join(out) + "\n"


@app.command()
def check(
    budgets_file: Path = typer.Argument(..., metavar="BUDGETS", help="Budgets YAML (see `kvplan schema budgets`)."),
    junit: Optional[Path] = typer.Option(None, "--junit-xml", help="Write one JUnit test case per limit."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="A previous `kvplan check --json` output."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Check capacity budgets: every limit's value, margin and verdict; exit 1 when any fails."""
    from kvplan.core.budgets import compare, judge
    from kvplan.io.budgets import load_budgets, measure

    from kvplan.io.examples import resolve_input

    budgets_file = resolve_input(budgets_file, "budgets")
    spec = load_budgets(budgets_file)
    base = _load_baseline(baseline) if baseline else {}
    results = []
    for b in spec.budgets:
        values, limits = measure(b, budgets_file)
        results += [judge(b.name, key, values[key], limits[key]) for key in limits]
    changes = compare(results, base) if baseline else []
    passed = all(r.passed for r in results)
    if junit:
        try:
            junit.write_text(junit_xml(results), encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--junit-xml {junit}: cannot write ({exc.strerror})") from None
    if os.environ.get("GITHUB_ACTIONS") == "true":
        for r in results:
            if not r.passed:
                typer.echo(f"::error title=kvplan budget {r.budget}::{r.limit} = {_show(r.limit, r.value)}, "
                           f"limit {_show(r.limit, r.threshold)}")
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            with open(summary, "a", encoding="utf-8") as fh:
                fh.write(_markdown(results, changes))
    if as_json:
        print_json(_json(passed, results, changes, bool(baseline)))
    else:
        _render(results, changes, bool(baseline))
    if not passed:
        raise typer.Exit(1)


def _json(passed: bool, results: list["LimitResult"], changes: list["Change"], with_baseline: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "passed": passed,
        "results": [{"budget": r.budget, "limit": r.limit, "kind": r.kind, "value": r.value, "threshold": r.threshold,
                     "margin": r.margin, "margin_frac": r.margin_frac, "passed": r.passed} for r in results],
    }
    if with_baseline:
        out["baseline"] = {"changed": [{"budget": c.budget, "limit": c.limit, "before": c.before, "after": c.after,
                                        "worse": c.worse} for c in changes]}
    return out


def _render(results: list["LimitResult"], changes: list["Change"], with_baseline: bool) -> None:
    table = Table(title="Capacity budgets", title_justify="left")
    for col in ("budget", "limit", "value", "limit value", "margin", "result"):
        table.add_column(col, justify="right" if col in ("value", "limit value", "margin") else "left")
    for r in results:
        margin = "" if r.margin_frac is None else f"{100 * r.margin_frac:+.1f}%"
        table.add_row(r.budget, r.limit, _show(r.limit, r.value), _show(r.limit, r.threshold), margin,
                      "[green]pass[/]" if r.passed else "[bold red]FAIL[/]")
    console.print(table)
    if with_baseline:
        if not changes:
            console.print("no change since the baseline")
        for c in changes:
            tag = "[red]worse[/]" if c.worse else "[green]better[/]"
            console.print(f"{tag}: {c.budget} {c.limit} {_show(c.limit, c.before)} -> {_show(c.limit, c.after)}")
    failed = [r for r in results if not r.passed]
    console.print(f"[bold]{len(results) - len(failed)} passed, {len(failed)} failed[/]" if failed
                  else f"[bold green]all {len(results)} limits pass[/]")
