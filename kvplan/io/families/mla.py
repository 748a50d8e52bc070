"""Family readers: see kvplan.io.families."""

from __future__ import annotations

MODEL_TYPES: tuple[str, ...] = ()
