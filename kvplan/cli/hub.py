"""``--fetch`` and ``--revision``, shared by every command that takes a MODEL, and the line that says what
was fetched (stderr in text mode; the ``fetched`` key with ``--json``). The fetching is ``kvplan.io.hub``'s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from kvplan.cli.options import FETCH_HELP, REVISION_HELP

if TYPE_CHECKING:  # kvplan.io.hub is imported when a hub id is resolved
    from kvplan.io.hub import HubConfig

# One OptionInfo each, shared by the commands (Typer reads them, never changes them).
FETCH_OPTION: Any = typer.Option(None, "--fetch/--no-fetch", help=FETCH_HELP)
REVISION_OPTION: Any = typer.Option(None, "--revision", help=REVISION_HELP)


def fetched_json(hub: HubConfig | None) -> dict[str, Any] | None:
    """The ``fetched`` key: what the Hub answered in this run (null when it was not asked)."""
    return hub.as_dict() if hub is not None and hub.fetched else None


def say_fetched(hub: HubConfig | None, as_json: bool) -> None:
    """Text mode: one line on stderr saying what was fetched, so stdout stays the command's own output."""
    if hub is not None and hub.fetched and not as_json:
        typer.echo(hub.describe(), err=True)
