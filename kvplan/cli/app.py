"""The Typer app and the one place errors become exit codes (0 ok, 1 does not fit, 2 bad input)."""

from __future__ import annotations

import sys

import click
import typer
from typer.core import TyperGroup

from kvplan.errors import KvplanError


class _KvplanGroup(TyperGroup):
    """Turns a KvplanError into one line on stderr and its exit code; ``--debug`` shows the traceback."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except KvplanError as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            for line in str(exc).splitlines() or [type(exc).__name__]:
                click.echo(f"error: {line}", err=True)
            raise typer.Exit(exc.exit_code) from None


app = typer.Typer(
    cls=_KvplanGroup,
    help="KV-cache memory planner for LLM serving: size, fit, simulate, validate, check.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    ctx: typer.Context,
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
) -> None:
    ctx.obj = {"debug": debug}


def main() -> None:
    """The console script (the commands register themselves when ``kvplan.cli`` is imported)."""
    try:
        app(prog_name="kvplan")
    except KeyboardInterrupt:
        sys.exit(130)
