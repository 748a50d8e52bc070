"""kvplan's command line: thin commands over the core, rendered with Rich or as JSON."""

from kvplan.cli import check as _check  # noqa: F401  (registers commands)
from kvplan.cli import engines as _engines  # noqa: F401
from kvplan.cli import explain as _explain  # noqa: F401
from kvplan.cli import fit as _fit  # noqa: F401
from kvplan.cli import simulate as _simulate  # noqa: F401
from kvplan.cli import size as _size  # noqa: F401
from kvplan.cli import validate as _validate  # noqa: F401
from kvplan.cli.app import app, main

__all__ = ["app", "main"]
