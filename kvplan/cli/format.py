"""Byte formatting for people: binary units, labelled. JSON keeps integer bytes."""

from __future__ import annotations

import json
import sys
from typing import Any

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(num_bytes: int | float) -> str:
    """``2147483648`` -> ``2.00 GiB``; below 1 KiB plain bytes."""
    value = float(num_bytes)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value):,} B" if unit == "B" else f"{value:,.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def bytes_cell(num_bytes: int) -> str:
    """Exact bytes and the binary-unit figure: ``524,288 B (512.00 KiB)``."""
    if num_bytes < 1024:
        return f"{num_bytes:,} B"
    return f"{num_bytes:,} B ({format_bytes(num_bytes)})"


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")
