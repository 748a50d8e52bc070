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


# A length in tokens: digits, optionally k or K for x1024 (8k = 8,192, as engines and model cards write
# context lengths: Llama 3.1's "128K" is 131,072). 15 digits bound int() and are far past any context.
_LENGTH = re.compile(r"^\s*(-?[0-9]{1,15})\s*([kK]?)\s*$")
_FRACTION = re.compile(r"^\s*-?([0-9]*\.[0-9]+|[0-9]+\.)\s*[kK]?\s*$")
_LENGTH_HELP = "give a whole number of tokens, e.g. 8192 or 8k (k = 1024)"


def parse_length(value: str | int, *, what: str, auto: bool = False) -> int:
    """Tokens from ``8192``, ``8k`` or ``32K`` (x1024). Fractions, negatives, zero and other units are
    refused, naming ``what`` (the flag or key). ``auto``: -1 passes (vLLM's "the longest that fits")."""
    m = _LENGTH.match(value) if isinstance(value, str) else None
    if isinstance(value, int) and not isinstance(value, bool):
        tokens = value
    elif m:
        tokens = int(m.group(1)) * (1024 if m.group(2) else 1)
    else:
        text = value if isinstance(value, str) else ""
        why = ("a length is whole tokens, not a fraction" if _FRACTION.match(text) or isinstance(value, float)
               else "more than 15 digits, beyond any context length" if re.match(r"^\s*-?[0-9]{16,}", text)
               else "not a length")
        raise InputError(f"{what}: {why} (got {_short(value)}); {_LENGTH_HELP}")
    if auto and tokens == -1:
        return tokens
    if tokens < 1:
        also = ", or -1 for the longest that fits" if auto else ""
        raise InputError(f"{what} must be positive (got {str(value).strip()}); {_LENGTH_HELP}{also}")
    return tokens


def length_before(value: object, what: str) -> object:
    """A pydantic before-validator's body: a length written as text (``32k``) read by ``parse_length``;
    anything else is left to the field's own integer check and bounds."""
    if not isinstance(value, str):
        return value
    try:
        return parse_length(value, what=what)
    except InputError as exc:
        raise ValueError(str(exc)) from None  # pydantic's one-line message, with the file's key and line
