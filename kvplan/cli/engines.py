"""``kvplan engines``: the engine profiles kvplan knows, what changed when, and the source of each rule."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Optional

import typer

from kvplan.cli.root import app
from kvplan.cli.format import make_console, new_table, print_json, print_table

console = make_console()


def _without_source(change: str) -> str:
    """The change without its trailing citation, e.g. '(0.6.3: vllm/worker/worker.py::...)'."""
    return re.sub(r"\s*\((?:\d+\.\d+[^:()]*|[a-z_./]+\.py[^()]*):[^()]*(?:\([^()]*\)[^()]*)*\)\s*$", "", change)


def _profile_json(p: Any) -> dict[str, Any]:
    return {"version": p.version, "until": str(p.until) if p.until else None, "label": p.label,
            "changes": list(p.changes), "rules": dataclasses.asdict(p.rules)}


@app.command()
def engines(
    name: Optional[str] = typer.Argument(None, help="One engine (vllm, sglang, trtllm, hf): every profile in full "
                                                    "(default: all engines, one line per profile)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: each profile's range, changes and rules."),
) -> None:
    """Engine profiles: each release range whose memory rules kvplan models, what changed, and the source."""
    from kvplan.core.profiles import parse_engine, registry

    reg = registry()
    names = list(reg.profiles)
    if name is not None:
        names = [parse_engine(name, allowed=tuple(reg.profiles)).name]
    if as_json:
        print_json({"engines": {n: {"checked_through": reg.checked_through[n], "newest": reg.newest(n).version,
                                    "profiles": [_profile_json(p) for p in reg.profiles[n]]} for n in names}})
        return
    if name is None:
        table = new_table("engine", "from", "what changed first", no_wrap=("engine", "from"),
                          title="Engine profiles (`kvplan engines NAME` for every change and its source)")
        for n in names:
            for p in reg.profiles[n]:
                table.add_row(n, p.version, _without_source(p.changes[0]))
        print_table(console, table)
        console.print("pin one with --engine NAME==VERSION (e.g. vllm==0.11.0); without a version the newest "
                      "profile applies. Sources read: " + ", ".join(f"{n} through {reg.checked_through[n]}"
                                                                      for n in names))
        return
    profiles = reg.profiles[names[0]]
    console.print(f"[bold]{profiles[0].display}[/]: {len(profiles)} profiles, sources read through "
                  f"{reg.checked_through[names[0]]} (docs/engine-versions-research.md)")
    for p in profiles:
        console.print(f"\n[bold]{p.label}[/]")
        for change in p.changes:
            console.print(f"  - {change}")
        blocks = getattr(p.rules, "block_sizes", None)  # a rule every vLLM profile states, changed or not
        if blocks is not None:
            console.print(f"  block sizes on CUDA: {blocks.describe()}")
