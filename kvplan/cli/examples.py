"""``kvplan examples``: the bundled example workloads and budgets, or one of them to copy."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from kvplan.app.catalog import find_examples
from kvplan.cli.format import make_console, new_table, print_json, print_table
from kvplan.cli.options import JsonOption
from kvplan.cli.root import app

console = make_console()


@app.command()
def examples(
    name: Annotated[Optional[str], typer.Argument(help="An example's name: print its file, to copy and edit "
                                                       "(default: list them all).")] = None,
    *,
    as_json: JsonOption = False,
) -> None:
    """The bundled example workloads and budgets; `kvplan simulate NAME` and `kvplan check NAME` take their names."""
    found = find_examples(name)
    if found.text is not None:
        sys.stdout.write(found.text)
        return
    rows = [{"kind": e.kind, "name": e.name, "path": str(e.path), "summary": e.summary} for e in found.listed]
    if as_json:
        print_json({"examples": rows})
        return
    table = new_table("name", "kind", "what it is", no_wrap=("name",),
                      title="Bundled examples: give the name where a file is expected")
    for row in rows:
        table.add_row(row["name"], row["kind"], row["summary"])
    print_table(console, table)
    console.print("kvplan examples NAME > my.yaml   # a copy to edit")
