"""``kvplan engines``: the engine profiles kvplan knows, what changed when, and the source of each rule."""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated, Any, Optional

import typer

from kvplan.app.catalog import EngineProfiles, engine_profiles
from kvplan.cli.format import make_console, new_table, print_json, print_table
from kvplan.cli.options import JsonOption
from kvplan.cli.root import app

console = make_console()


@app.command()
def engines(
    name: Annotated[Optional[str], typer.Argument(help="One engine (vllm, sglang, trtllm, hf): every profile in full "
                                                       "(default: all engines, one line per profile).")] = None,
    *,
    as_json: JsonOption = False,
) -> None:
    """Engine profiles: each release range whose memory rules kvplan models, what changed, and the source."""
    found = engine_profiles(name)
    if as_json:
        print_json({"engines": {n: {"checked_through": found.checked_through[n], "newest": profiles[-1].version,
                                    "profiles": [_profile_json(p) for p in profiles]}
                                for n, profiles in found.profiles.items()}})
    elif name is None:
        _render_all(found)
    else:
        _render_one(found)


def _without_source(change: str) -> str:
    """The change without its trailing citation, e.g. '(0.6.3: vllm/worker/worker.py::...)'."""
    return re.sub(r"\s*\((?:\d+\.\d+[^:()]*|[a-z_./]+\.py[^()]*):[^()]*(?:\([^()]*\)[^()]*)*\)\s*$", "", change)


def _profile_json(p: Any) -> dict[str, Any]:
    return {"version": p.version, "until": str(p.until) if p.until else None, "label": p.label,
            "changes": list(p.changes), "rules": dataclasses.asdict(p.rules)}


def _render_all(found: EngineProfiles) -> None:
    table = new_table("engine", "from", "what changed first", no_wrap=("engine", "from"),
                      title="Engine profiles (`kvplan engines NAME` for every change and its source)")
    for n, profiles in found.profiles.items():
        for p in profiles:
            table.add_row(n, p.version, _without_source(p.changes[0]))
    print_table(console, table)
    console.print("pin one with --engine NAME==VERSION (e.g. vllm==0.11.0); without a version the newest "
                  "profile applies. Sources read: " + ", ".join(f"{n} through {checked}"
                                                                for n, checked in found.checked_through.items()))


def _render_one(found: EngineProfiles) -> None:
    (name, profiles), = found.profiles.items()
    console.print(f"[bold]{profiles[0].display}[/]: {len(profiles)} profiles, sources read through "
                  f"{found.checked_through[name]} (docs/engine-versions-research.md)")
    for p in profiles:
        console.print(f"\n[bold]{p.label}[/]")
        for change in p.changes:
            console.print(f"  - {change}")
        blocks = getattr(p.rules, "block_sizes", None)  # a rule every vLLM profile states, changed or not
        if blocks is not None:
            console.print(f"  block sizes on CUDA: {blocks.describe()}")
