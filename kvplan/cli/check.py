"""``kvplan check budgets.yaml``: capacity budgets as a CI gate (exit 0 pass, 1 fail, 2 invalid).

Under GitHub Actions (``GITHUB_ACTIONS=true``) each failing limit is also an ``::error`` workflow
command on stderr (stdout stays the report, so ``--json > capacity.json`` is pure JSON), with the
budget file's path and the line of the failing limit so it shows on the pull request's diff, and a
Markdown table goes to ``$GITHUB_STEP_SUMMARY``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from kvplan.cli.root import app
from kvplan.cli.format import format_bytes, make_console, new_table, print_json, print_table
from kvplan.errors import ConfigError, KvplanError

if TYPE_CHECKING:
    from kvplan.core.budgets import Change, LimitResult

console = make_console()
_BYTES = ("max_kv_bytes_per_token", "max_kv_bytes", "max_kv_bytes_per_gpu")
# Characters XML 1.0 forbids (https://www.w3.org/TR/xml/#charsets): C0 controls but tab, LF and CR;
# surrogates; U+FFFE and U+FFFF. A budget name holding one would make the JUnit report unreadable.
_XML_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _visible(text: str, keep: str = "") -> str:
    """Control characters (but those in ``keep``) as ``\\xNN``: a name in a log cannot move the cursor,
    colour the terminal, or start a line of its own (where the runner would read a workflow command)."""
    return _CONTROL.sub(lambda m: m.group() if m.group() in keep else f"\\x{ord(m.group()):02x}", text)


def _show(limit: str, value: float) -> str:
    if limit in _BYTES:
        return format_bytes(int(value))
    if limit == "max_model_len_must_fit":
        return "yes" if value else "no"
    if limit.endswith("_frac"):
        return f"{100 * value:.1f}%"
    return f"{value:,.2f}" if value != int(value) else f"{int(value):,}"  # a figure: budgets are YAML, not flags


def _verdict(r: "LimitResult") -> str:
    """``min_kv_cache_tokens: 474,336 KV cache tokens < 500,000: ...``: the failing limit and its reason, which
    starts with the limit's own value and bound (kvplan.app.check.measure); without one, the two numbers."""
    if r.reason:
        return f"{r.limit}: {r.reason}"
    return f"{r.limit} = {_show(r.limit, r.value)}, limit {_show(r.limit, r.threshold)}"


def _load_baseline(path: Path) -> dict[tuple[str, str], float]:
    from kvplan.io.yamlio import load_json

    if not os.path.lexists(path):
        raise ConfigError(f"{path}: no such baseline file")
    data = load_json(path)  # the safe reader: regular files only, size cap, UTF-8, bounded nesting
    try:
        return {(r["budget"], r["limit"]): float(r["value"]) for r in data["results"]}
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{path}: not a `kvplan check --json` output (needs results[].budget/limit/value)") from None


# --- GitHub workflow commands -------------------------------------------------------------------
# Escaping as the runner's own toolkit does (actions/toolkit packages/core/src/command.ts,
# escapeData and escapeProperty): without it a newline in a budget name starts a new command.

def escape_data(text: str) -> str:
    text = _visible(text, keep="\r\n")  # the runner decodes only %25, %0D, %0A (and %3A, %2C in properties)
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(message: str, *, title: str, file: str | None = None, line: int | None = None) -> str:
    props = [f"file={escape_property(file)}"] if file else []
    if file and line:
        props.append(f"line={line}")
    props.append(f"title={escape_property(title)}")
    return f"::error {','.join(props)}::{escape_data(message)}"


def _annotation_path(path: Path) -> str:
    """The budget file as GitHub names it on a diff: relative to the workspace when it lies inside."""
    workspace = os.environ.get("GITHUB_WORKSPACE")
    if workspace:
        try:
            return path.resolve().relative_to(Path(workspace).resolve()).as_posix()
        except (ValueError, OSError):
            pass
    return path.as_posix()


def _limit_lines(path: Path, names: list[str]) -> dict[tuple[str, str], int]:
    """(budget, limit) -> line of the limit's key, else of the budget's name, else of the budget."""
    from kvplan.core.budgets import LIMIT_KINDS
    from kvplan.io.yamlio import yaml_key_lines

    lines = yaml_key_lines(path)
    out = {}
    for i, name in enumerate(names):
        for limit in LIMIT_KINDS:
            line = (lines.get(("budgets", i, "require", limit)) or lines.get(("budgets", i, "name"))
                    or lines.get(("budgets", i)))
            if line:
                out[(name, limit)] = line
    return out


# --- reports ------------------------------------------------------------------------------------

def _xml_text(text: str) -> str:
    return _XML_FORBIDDEN.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else "\ufffd", text)


def junit_xml(results: list["LimitResult"]) -> str:
    from xml.sax.saxutils import escape, quoteattr  # imported here: it costs more start-up than all of `kvplan size`

    def attr(text: str) -> str:
        return quoteattr(_xml_text(text), {"\n": "&#10;", "\r": "&#13;", "\t": "&#9;"})

    failures = sum(not r.passed for r in results)
    lines = ['<?xml version="1.0" encoding="UTF-8"?>',
             f'<testsuite name="kvplan-budgets" tests="{len(results)}" failures="{failures}" errors="0">']
    for r in results:
        lines.append(f'  <testcase classname={attr(r.budget)} name={attr(f"{r.budget}: {r.limit}")}>')
        if not r.passed:
            lines.append(f"    <failure message={attr(_verdict(r))}>{escape(_xml_text(_verdict(r)))}</failure>")
        lines.append("  </testcase>")
    lines.append("</testsuite>")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """A Markdown table cell: a ``|`` or a line break in a name must not end the cell or the row."""
    return _visible(" ".join(text.replace("|", "\\|").splitlines()))


def _markdown(results: list["LimitResult"], changes: list["Change"]) -> str:
    ok = all(r.passed for r in results)
    out = [f"### kvplan budgets: {'all pass' if ok else 'FAILED'}", "",
           "| budget | limit | value | limit | margin | | why |", "|---|---|---|---|---|---|---|"]
    for r in results:
        margin = "" if r.margin_frac is None else f"{100 * r.margin_frac:+,.1f}%"
        out.append(f"| {_cell(r.budget)} | {r.limit} | {_show(r.limit, r.value)} | {_show(r.limit, r.threshold)} | "
                   f"{margin} | {'pass' if r.passed else '**FAIL**'} | {_cell(r.reason)} |")
    worse = [c for c in changes if c.worse]
    if worse:
        out += ["", "Worse since the baseline: " + "; ".join(
            f"{_cell(c.budget)} {c.limit} {_show(c.limit, c.before)} -> {_show(c.limit, c.after)}" for c in worse)]
    return "\n".join(out) + "\n"


BudgetsArg = Annotated[Path, typer.Argument(
    metavar="BUDGETS", help="Budgets YAML (see `kvplan schema budgets`), or a bundled one by name: `kvplan check "
                            "example`.")]
JunitOpt = Annotated[Optional[Path], typer.Option(
    "--junit-xml", help="Also write a JUnit XML report here, one test case per limit (default: none).")]
BaselineOpt = Annotated[Optional[Path], typer.Option(
    "--baseline", help="A previous `kvplan check --json` output; report what changed and what got worse (default: "
                       "none).")]
CheckJsonOpt = Annotated[bool, typer.Option(
    "--json", help="Print the results as one JSON document on stdout, for a later --baseline (default: a table).")]


@app.command()
def check(
    budgets_file: BudgetsArg,
    *,
    junit: JunitOpt = None,
    baseline: BaselineOpt = None,
    as_json: CheckJsonOpt = False,
) -> None:
    """Check capacity budgets: every limit's value, margin and verdict; exit 1 when any fails.

    Under GitHub Actions failing limits are also error annotations (on stderr) at the budget file's
    line, and a Markdown table is added to the job summary.
    """
    from kvplan.core.budgets import compare, judge
    from kvplan.app.check import measure
    from kvplan.io.budgets import load_budgets
    from kvplan.io.examples import resolve_input

    budgets_file = resolve_input(budgets_file, "budgets")
    spec = load_budgets(budgets_file)
    base = _load_baseline(baseline) if baseline else {}
    results = []
    for b in spec.budgets:
        try:
            m = measure(b, budgets_file)
        except KvplanError as exc:
            where = f"{budgets_file}: budget {b.name!r}: "
            raise type(exc)(str(exc) if str(exc).startswith(str(budgets_file)) else where + str(exc)) from None
        results += [judge(b.name, key, m.values[key], m.thresholds[key], m.reasons.get(key, "")) for key in m.thresholds]
    changes = compare(results, base) if baseline else []
    passed = all(r.passed for r in results)
    if junit:
        try:
            junit.write_text(junit_xml(results), encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--junit-xml {junit}: cannot write ({exc.strerror})") from None
    if os.environ.get("GITHUB_ACTIONS") == "true":
        _github(budgets_file, [b.name for b in spec.budgets], results, changes)
    if as_json:
        print_json(_json(passed, results, changes, bool(baseline)))
    else:
        _render(results, changes, bool(baseline))
    if not passed:
        raise typer.Exit(1)


def _github(path: Path, names: list[str], results: list["LimitResult"], changes: list["Change"]) -> None:
    lines = _limit_lines(path, names)
    where = _annotation_path(path)
    for r in results:
        if not r.passed:
            typer.echo(annotation(_verdict(r), title=f"kvplan budget {r.budget}", file=where,
                                  line=lines.get((r.budget, r.limit))), err=True)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as fh:
                fh.write(_markdown(results, changes))
        except OSError as exc:
            raise ConfigError(f"GITHUB_STEP_SUMMARY {summary}: cannot write ({exc.strerror})") from None


def _json(passed: bool, results: list["LimitResult"], changes: list["Change"], with_baseline: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "passed": passed,
        "results": [{"budget": r.budget, "limit": r.limit, "kind": r.kind, "value": r.value, "threshold": r.threshold,
                     "margin": r.margin, "margin_frac": r.margin_frac, "passed": r.passed, "reason": r.reason}
                    for r in results],
    }
    if with_baseline:
        out["baseline"] = {"changed": [{"budget": c.budget, "limit": c.limit, "before": c.before, "after": c.after,
                                        "worse": c.worse} for c in changes]}
    return out


def _render(results: list["LimitResult"], changes: list["Change"], with_baseline: bool) -> None:
    from rich.text import Text

    # One heading row per budget, its limits under it: five columns keep every digit at 80 columns.
    table = new_table("budget / limit", "value", "threshold", "margin", "result", title="Capacity budgets",
                      numeric=("value", "threshold", "margin"), no_wrap=("result",))
    budget = None
    for r in results:
        if r.budget != budget:
            if budget is not None:
                table.add_section()
            budget = r.budget
            table.add_row(Text(_visible(r.budget), style="bold"))
        margin = "" if r.margin_frac is None else f"{100 * r.margin_frac:+,.1f}%"
        table.add_row(Text(f"  {r.limit}"), _show(r.limit, r.value), _show(r.limit, r.threshold), margin,
                      "[green]pass[/]" if r.passed else "[bold red]FAIL[/]")
    print_table(console, table)
    for r in results:
        if not r.passed and r.reason:
            console.print(Text(f"{_visible(r.budget)}: {r.limit}: {_visible(r.reason)}"))
    if with_baseline:
        if not changes:
            console.print("no change since the baseline")
        for c in changes:
            tag = "[red]worse[/]" if c.worse else "[green]better[/]"
            console.print(tag + ": ", Text(f"{_visible(c.budget)} {c.limit} {_show(c.limit, c.before)} -> "
                                           f"{_show(c.limit, c.after)}"), sep="")
    failed = [r for r in results if not r.passed]
    console.print(f"[bold]{len(results) - len(failed)} passed, {len(failed)} failed[/]" if failed
                  else f"[bold green]all {len(results)} limits pass[/]")
