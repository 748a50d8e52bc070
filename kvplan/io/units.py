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
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]{0,3})\s*$")
# 1 PiB: ~7,000x an H200's 141 GB and beyond any node's memory; a larger size is a typo, and unbounded
# ones (309 digits) overflow float arithmetic further on.
MAX_SIZE_BYTES = 1 << 50


def parse_size(text: str | int, *, what: str = "size") -> int:
    """Integer bytes from ``'80GiB'`` (binary), ``'40GB'`` (decimal) or ``'1024'``."""
    if isinstance(text, bool):
        raise InputError(f"{what}: expected a size like 80GiB or 512KiB (got {text!r})")
    if isinstance(text, int):
        if text < 0:
            raise InputError(f"{what} must not be negative (got {text})")
        if text > MAX_SIZE_BYTES:
            raise InputError(f"{what}: {_short(text)} bytes is over kvplan's 1 PiB limit; give a size like 80GiB")
        return text
    m = _SIZE.match(text) if isinstance(text, str) and len(text) <= 1000 else None
    if not m or m.group(2).lower() not in _UNITS:
        raise InputError(f"{what}: expected a size like 80GiB, 512KiB, 40GB or plain bytes (got {_short(text)})")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value > MAX_SIZE_BYTES:
        raise InputError(f"{what}: {_short(text)} is over kvplan's 1 PiB limit; give a size like 80GiB")
    return int(round(value))


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
