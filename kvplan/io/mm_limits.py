"""vLLM's ``--limit-mm-per-prompt`` as a user writes it (the CLI edge): plain data for the fit request."""

from __future__ import annotations

import json

from kvplan.errors import InputError


def parse_mm_limits(text: str | None) -> dict[str, int] | None:
    """vLLM's --limit-mm-per-prompt: a JSON object of modality to a count (or to {"count": N, ...})."""
    if text is None:
        return None
    try:
        raw = json.loads(text)
    except ValueError:
        raw = None
    if not isinstance(raw, dict):
        raise InputError(f"--limit-mm-per-prompt takes a JSON object, as vLLM does, e.g. '{{\"image\": 2}}' "
                         f"(got {text!r})")
    limits = {}
    for modality, value in raw.items():
        count = value.get("count") if isinstance(value, dict) else value
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InputError(f"--limit-mm-per-prompt: {modality} needs a count of 0 or more (got {value!r})")
        limits[str(modality)] = count
    return limits
