"""Request traces: CSV and JSONL rows read lazily and bounded (kvplan.io.yamlio's safe readers), as plain rows.

- ``read_trace``: (arrival seconds, prompt tokens, output tokens) per row; the Azure LLM inference trace's
  ``TIMESTAMP,ContextTokens,GeneratedTokens`` works as is.
- ``conversation_rows``: multi-turn JSONL, one row per turn {session_id, turn, timestamp (s), input_tokens (the whole
  prompt), output_tokens}.
- ``mooncake_rows``: Mooncake's FAST'25 traces {timestamp (ms), input_length, output_length, hash_ids of 512-token
  blocks}.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from kvplan.errors import ConfigError
from kvplan.io.paths import probe, shown
from kvplan.io.yamlio import iter_lines, parse_json

_ARRIVAL_KEYS = ("arrival", "arrival_time", "arrival_s", "timestamp", "time")
_PROMPT_KEYS = ("prompt_tokens", "input_tokens", "contexttokens", "prompt_len", "input_len")
_OUTPUT_KEYS = ("output_tokens", "generated_tokens", "generatedtokens", "output_len")


def _pick(row: dict[str, str], keys: tuple[str, ...]) -> str | None:
    lower = {k.lower().strip(): v for k, v in row.items() if k is not None}
    for key in keys:
        if key in lower:
            return lower[key]
    return None


# Bounds on trace values: arrivals within 10^12 s (unix time is 1.7e9 s), token counts below 2^31
# (the longest contexts served are 10M tokens, Llama 4 Scout, x200), rows as many as requests.count.
_MAX_TRACE_SECONDS = 1e12
MAX_TRACE_TOKENS = 1 << 31
MAX_TRACE_ROWS = 10_000_000


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        text = value.strip()
        try:
            if "." in text:  # the Azure trace has 7 fractional digits; datetime takes 6
                head, frac = text.split(".", 1)
                if not (frac.isascii() and frac.isdigit()):
                    raise ValueError(value)
                seconds = datetime.fromisoformat(head).timestamp() + float("0." + frac)
            else:
                seconds = datetime.fromisoformat(text).timestamp()
        except (OverflowError, OSError):
            raise ValueError(value) from None
    if not math.isfinite(seconds) or abs(seconds) > _MAX_TRACE_SECONDS:
        raise ValueError(value)
    return seconds


def tokens(value: str) -> int:
    text = value.strip()
    if len(text) > 12:  # int() of a 5,000-digit string is slow and then absurd anyway
        raise ValueError(value)
    return int(text)


def csv_rows(path: Path) -> Iterator[tuple[int, dict[str | None, str]]]:
    """(line number, row) of a CSV with a header, read lazily."""
    current = 0

    def lines() -> Iterator[str]:
        nonlocal current
        for number, line in iter_lines(path):
            current = number
            yield line

    try:
        reader = csv.DictReader(lines())
        if not reader.fieldnames:
            raise ConfigError(f"{path}: empty trace")
        for row in reader:
            yield current, row
    except csv.Error as exc:
        raise ConfigError(f"{path}: line {current}: not valid CSV: {exc}") from None


def jsonl_rows(path: Path) -> Iterator[tuple[int, dict]]:
    for number, line in iter_lines(path):
        if not line.strip():
            continue
        row = parse_json(line, str(path), line=number)
        if not isinstance(row, dict):
            raise ConfigError(f"{path}: line {number}: expected a JSON object per line (got {type(row).__name__})")
        yield number, row


def read_trace(path: Path, limit: int | None = None) -> list[tuple[float, int, int]]:
    """(arrival seconds from the first request, prompt tokens, output tokens), one per row.

    Rows are read lazily: with ``limit`` the rest of the file is never read.
    """
    rows: Iterator[tuple[int, dict]] = (
        jsonl_rows(path) if path.suffix in (".jsonl", ".ndjson") else csv_rows(path))  # type: ignore[assignment]
    out: list[tuple[float, int, int]] = []
    t0 = None
    for line, row in rows:
        if limit and len(out) >= limit:
            break
        if len(out) >= MAX_TRACE_ROWS:
            raise ConfigError(f"{path}: more than {MAX_TRACE_ROWS:,} rows; set requests.limit to use the first N")
        row = {str(k): "" if v is None else str(v) for k, v in row.items() if k is not None}
        a, p, o = _pick(row, _ARRIVAL_KEYS), _pick(row, _PROMPT_KEYS), _pick(row, _OUTPUT_KEYS)
        if a is None or p is None or o is None:
            raise ConfigError(f"{path}: line {line}: needs an arrival time ({'/'.join(_ARRIVAL_KEYS[:2])}), prompt "
                              f"tokens ({'/'.join(_PROMPT_KEYS[:3])}) and output tokens ({'/'.join(_OUTPUT_KEYS[:2])})")
        try:
            t = _seconds(a)
        except ValueError:
            raise ConfigError(f"{path}: line {line}: cannot read arrival {a[:40]!r}: not a finite time in seconds (within "
                              f"{_MAX_TRACE_SECONDS:.0e}) or an ISO date") from None
        try:
            prompt, output = tokens(p), tokens(o)
        except ValueError:
            raise ConfigError(f"{path}: line {line}: cannot read token counts: must be whole numbers "
                              f"(got prompt {p[:40]!r}, output {o[:40]!r})") from None
        if not (0 <= prompt < MAX_TRACE_TOKENS and 0 <= output < MAX_TRACE_TOKENS):
            raise ConfigError(f"{path}: line {line}: token counts must be in 0..{MAX_TRACE_TOKENS - 1} "
                              f"(got {prompt}, {output})")
        t0 = t if t0 is None else t0
        out.append((t - t0, prompt, output))
    if not out:
        raise ConfigError(f"{path}: the trace has no requests")
    return out


def trace_file(origin: Path, trace: str) -> Path:
    """``requests.trace`` of the workload file ``origin``: absolute, or relative to the file's folder."""
    path = Path(trace) if Path(trace).is_absolute() else origin.parent / trace
    try:
        found = probe(path) is not None
    except ConfigError as exc:  # the OS refused the path: say which file named it
        raise ConfigError(f"{origin}: requests.trace: {exc}") from None
    if not found:
        raise ConfigError(f"{origin}: requests.trace: {shown(path)}: no such file")
    return path


def trace_format(path: Path) -> str:
    """mooncake (hash_ids), conversation (a session id) or requests, from a JSONL trace's first row."""
    if path.suffix not in (".jsonl", ".ndjson"):
        return "requests"
    for _, row in jsonl_rows(path):
        keys = {str(k).lower() for k in row}
        if "hash_ids" in keys:
            return "mooncake"
        if keys & {"session_id", "conversation_id", "session"}:
            return "conversation"
        return "requests"
    return "requests"

# Rows of a conversation or Mooncake trace: each becomes a request of its own, as many as a workload may have
# (kvplan.io.workload.MAX_COUNT).
MAX_REQUEST_ROWS = 1_000_000


def _lower_rows(path: Path, limit: int | None) -> Iterator[tuple[int, dict]]:
    for k, (line, row) in enumerate(jsonl_rows(path)):
        if limit and k >= limit:
            return
        if k >= MAX_REQUEST_ROWS:
            raise ConfigError(f"{path}: more than {MAX_REQUEST_ROWS:,} rows; set requests.limit")
        yield line, {str(key).lower(): v for key, v in row.items()}


def conversation_rows(path: Path, limit: int | None = None) -> list[tuple[str, int, float, int, int]]:
    """(session id, turn, timestamp seconds, input tokens (the whole prompt), output tokens) per JSONL row."""
    rows = []
    for line, row in _lower_rows(path, limit):
        sid = _first(row, ("session_id", "conversation_id", "session"))
        turn = _first(row, ("turn", "turn_id", "round"))
        ts = _first(row, ("timestamp", "arrival_time", "arrival", "time"))
        inp = _first(row, ("input_tokens", "prompt_tokens", "input_length"))
        outp = _first(row, ("output_tokens", "generated_tokens", "output_length"))
        if None in (sid, ts, inp, outp):
            raise ConfigError(f"{path}: line {line}: a conversation row needs session_id, timestamp (seconds), "
                              "input_tokens (the whole prompt) and output_tokens")
        rows.append((str(sid), _num(turn if turn is not None else line, path, line, "turn"),
                     _num(ts, path, line, "timestamp", real=True), _num(inp, path, line, "input_tokens"),
                     _num(outp, path, line, "output_tokens")))
    if not rows:
        raise ConfigError(f"{path}: the trace has no requests")
    return rows


def mooncake_rows(path: Path, limit: int | None = None) -> list[tuple[float, int, int, list[int]]]:
    """(timestamp seconds, input length, output length, hash ids) per row of a Mooncake trace."""
    rows = []
    for line, row in _lower_rows(path, limit):
        ids, ts = row.get("hash_ids"), row.get("timestamp")
        inp, outp = row.get("input_length"), row.get("output_length")
        if not isinstance(ids, list) or None in (ts, inp, outp):
            raise ConfigError(f"{path}: line {line}: a Mooncake row needs timestamp (ms), input_length, "
                              "output_length and hash_ids (a list)")
        if not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
            bad = next(h for h in ids if not isinstance(h, int) or isinstance(h, bool))
            raise ConfigError(f"{path}: line {line}: hash_ids must be integers (got {str(bad)[:20]!r})")
        rows.append((_num(ts, path, line, "timestamp", real=True) / 1000, _num(inp, path, line, "input_length"),
                     _num(outp, path, line, "output_length"), ids))
    if not rows:
        raise ConfigError(f"{path}: the trace has no requests")
    return rows


def _first(row: dict, keys: tuple[str, ...]):
    for k in keys:
        if k in row and row[k] is not None:
            return row[k]
    return None


def _num(value, path: Path, line: int, what: str, *, real: bool = False):
    try:
        x = float(value) if real else int(value)
        if isinstance(value, bool) or (not real and float(value) != x):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{path}: line {line}: {what} must be a {'number' if real else 'whole number'} "
                          f"(got {str(value)[:30]!r})") from None
    if not (0 <= x < (1 << 40)):
        raise ConfigError(f"{path}: line {line}: {what} must be between 0 and 2^40 (got {str(value)[:30]})")
    return x
