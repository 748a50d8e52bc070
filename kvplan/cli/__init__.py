"""kvplan's command line: thin commands over the core, rendered with Rich or as JSON.

Each command module registers its commands on ``app`` when imported. ``from kvplan.cli import app``
imports them all; the console script (``main``) imports only the module of the command being run, so
`kvplan size` does not pay for building every other command.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

# command name -> the module that defines it
COMMAND_MODULES = {
    "size": "size", "models": "models", "show": "models", "examples": "examples",
    "fit": "fit", "gpus": "gpus", "explain": "explain", "simulate": "simulate", "schema": "schema",
    "check": "check", "validate": "validate", "engines": "engines", "plan": "plan",
}
# the order `kvplan --help` lists the commands in (each module registers its own on import)
_ORDER = ("check", "engines", "explain", "fit", "gpus", "plan", "schema", "simulate", "size", "models", "examples",
          "validate")


def load_commands(only: str | None = None) -> Any:
    """The Typer app with every command (or only the module defining ``only``) registered."""
    from kvplan.cli.root import app

    for module in ((COMMAND_MODULES[only],) if only in COMMAND_MODULES else _ORDER):
        importlib.import_module(f"kvplan.cli.{module}")
    return app


def _invoked_command(argv: list[str]) -> str | None:
    """The subcommand the arguments name, when they name one and ask for nothing global."""
    for arg in argv:
        if arg in ("--help", "--version"):
            return None
        if arg.startswith("-"):
            continue  # --debug and the like precede the command
        return arg if arg in COMMAND_MODULES else None
    return None


def main() -> None:
    """The console script and ``python -m kvplan``."""
    from kvplan.cli.root import run

    load_commands(_invoked_command(sys.argv[1:]))
    run()


def __getattr__(name: str) -> Any:  # PEP 562: `from kvplan.cli import app` gives the full app
    if name == "app":
        return load_commands()
    raise AttributeError(name)


__all__ = ["COMMAND_MODULES", "app", "load_commands", "main"]
