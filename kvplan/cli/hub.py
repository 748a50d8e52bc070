"""What ``--fetch`` fetched, told once: one line on stderr in text mode, the ``fetched`` key with ``--json``. The
options are ``kvplan.cli.options``' ``FetchOption`` and ``RevisionOption``; the fetching is ``kvplan.io.hub``'s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:  # kvplan.io.hub is imported when a hub id is resolved
    from kvplan.io.hub import HubConfig


def fetched_json(hub: HubConfig | None) -> dict[str, Any] | None:
    """The ``fetched`` key: what the Hub answered in this run (null when it was not asked)."""
    return hub.as_dict() if hub is not None and hub.fetched else None


def say_fetched(hub: HubConfig | None, as_json: bool) -> None:
    """Text mode: one line on stderr saying what was fetched, so stdout stays the command's own output."""
    if hub is not None and hub.fetched and not as_json:
        typer.echo(hub.describe(), err=True)
