"""The Typer app and the one place errors become exit codes.

Exit codes: 0 ok, 1 does not fit / over budget (a verdict), 2 bad input, 3 a bug in kvplan (an
unexpected exception: never 1, so a CI script cannot read a crash as a verdict), 130 interrupted,
141 stdout closed early (``kvplan fit ... | head``: the shell's code for SIGPIPE, quietly).
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperGroup

from kvplan import __version__
from kvplan.errors import KvplanError

EXIT_INTERNAL = 3
EXIT_BROKEN_PIPE = 141
_ISSUES = "please report it with the output of `kvplan --debug ...`"


def _broken_pipe() -> None:
    """stdout is gone (a pipe's reader exited): stop quietly, and keep Python from complaining at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (a test runner's stream)
        pass
    raise typer.Exit(EXIT_BROKEN_PIPE)


class _KvplanGroup(TyperGroup):
    """Maps errors to exit codes; ``--debug`` adds the traceback and keeps the code."""

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        try:
            try:
                return super().invoke(ctx)
            finally:
                sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        except KvplanError as exc:
            if _debug(ctx):
                traceback.print_exc()
            for line in str(exc).splitlines() or [type(exc).__name__]:
                typer.echo(f"error: {line}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except BrokenPipeError:
            _broken_pipe()
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except RecursionError:
            if _debug(ctx):
                traceback.print_exc()
            typer.echo("error: the input is nested too deeply to read", err=True)
            raise typer.Exit(2) from None
        except MemoryError:
            typer.echo("error: out of memory: the input asks for more than this machine has", err=True)
            raise typer.Exit(2) from None
        except Exception as exc:  # the last resort: a bug, reported as such
            if _is_usage_error(exc):
                raise
            if _debug(ctx):
                traceback.print_exc()
            typer.echo(f"internal error: {type(exc).__name__}: {exc}".rstrip(": "), err=True)
            typer.echo(f"kvplan hit a bug (exit {EXIT_INTERNAL}); {_ISSUES}", err=True)
            raise typer.Exit(EXIT_INTERNAL) from None


def _debug(ctx: typer.Context) -> bool:
    return bool(ctx.obj and ctx.obj.get("debug"))


def _is_usage_error(exc: Exception) -> bool:
    """Click's own usage errors (bad flag, missing argument) carry exit code 2 and print themselves."""
    return getattr(exc, "exit_code", None) == 2 and hasattr(exc, "show")


app = typer.Typer(
    cls=_KvplanGroup,
    help="KV-cache memory planner for LLM serving: size, fit, simulate, validate, check. "
         "Exit codes: 0 ok, 1 does not fit / over budget, 2 bad input, 3 a bug in kvplan.",
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    invoke_without_command=True,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"kvplan {__version__}")
        raise typer.Exit(0)


DebugOpt = Annotated[bool, typer.Option("--debug", help="Show the traceback of an error (the exit code stays); "
                                                        "default: one line.")]
VersionOpt = Annotated[Optional[bool], typer.Option("--version", callback=_print_version, is_eager=True,
                                                    help="Print kvplan's version and exit.")]


@app.callback()
def _root(ctx: typer.Context, *, debug: DebugOpt = False, version: VersionOpt = None) -> None:
    ctx.obj = {"debug": debug}
    if ctx.invoked_subcommand is None:  # bare `kvplan`: the help page, and success
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


def run() -> None:
    """Run the app with the commands registered so far (kvplan.cli.main registers what is needed)."""
    try:
        app(prog_name="kvplan")
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        sys.exit(EXIT_BROKEN_PIPE)
