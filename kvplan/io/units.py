"""Byte sizes written by people: ``80GiB``, ``512KiB``, ``14.99GiB``, ``40GB``, or plain bytes."""

from __future__ import annotations

import re

from kvplan.errors import InputError

_UNITS = {
    "": 1, "b": 1,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int, *, what: str = "size") -> int:
    """Integer bytes from ``'80GiB'`` (binary), ``'40GB'`` (decimal) or ``'1024'``."""
    if isinstance(text, bool):
        raise InputError(f"{what}: expected a size like 80GiB or 512KiB (got {text!r})")
    if isinstance(text, int):
        if text < 0:
            raise InputError(f"{what} must not be negative (got {text})")
        return text
    m = _SIZE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise InputError(f"{what}: expected a size like 80GiB, 512KiB, 40GB or plain bytes (got {text!r})")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    return int(round(value))
