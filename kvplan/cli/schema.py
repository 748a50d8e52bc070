"""``kvplan schema``: the JSON Schema of an input file."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from kvplan.cli.root import app
from kvplan.errors import InputError


@app.command()
def schema(what: Annotated[str, typer.Argument(help="Which file's schema: workload or budgets.")]) -> None:
    """JSON Schema of a kvplan input file."""
    if what == "workload":
        from kvplan.io.workload import workload_schema

        sys.stdout.write(json.dumps(workload_schema(), indent=2) + "\n")
    elif what == "budgets":
        from kvplan.io.budgets import budgets_schema

        sys.stdout.write(json.dumps(budgets_schema(), indent=2) + "\n")
    else:
        raise InputError(f"schema of what? use workload or budgets (got {what!r})")
