"""Safe input reading, and YAML/JSON loading with errors that name the file, the key and the line.

Every file kvplan reads (config.json, YAML, traces, vLLM logs, baselines, matrices) goes through
``open_regular``: regular files only (a FIFO would block ``open`` forever, ``/dev/zero`` never ends),
a size cap, and UTF-8 checked with the line and byte offset of the first bad byte. YAML is scanned as
an event stream before it is built, so deep nesting (libyaml's composer recurses in C: 50,000 ``[``
crash it) and alias bombs (a 1 KB "billion laughs" expands to 10^9 nodes) are refused first.
"""

from __future__ import annotations

import difflib
import json
import os
import stat
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:  # pydantic is imported only when a file is validated (it costs start-up time)
    from pydantic import BaseModel, ValidationError

import yaml

from kvplan.core.units import GiB
from kvplan.errors import ConfigError
from kvplan.io.paths import os_error, probe, shown

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

MiB = 1 << 20
# Whole-file reads (config.json, YAML). The largest real config.json files (id2label maps of vision
# models) are a few hundred KiB and kvplan's own YAML files a few KiB: 16 MiB is ~50x the first.
MAX_FILE_BYTES = 16 * MiB
# Files read line by line (traces, vLLM logs): memory stays one line, so the cap only bounds time.
MAX_STREAM_BYTES = 8 * GiB
# One line of a trace or log: vLLM's longest line (the engine config) is a few KiB.
MAX_LINE_BYTES = 1 * MiB
# YAML/JSON nesting: kvplan's files nest at most ~6 levels (budgets[].scenarios[].limits).
MAX_DEPTH = 64
# Nodes of a YAML document with every alias expanded: kvplan's largest files hold a few thousand.
MAX_YAML_NODES = 200_000


def _size(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n} bytes"


def open_regular(path: Path, *, max_bytes: int = MAX_FILE_BYTES) -> BinaryIO:
    """Open a regular file for binary reading, refusing anything else before it can block."""
    st = probe(path)  # what the OS refuses (permission, a name too long, a NUL byte) is a ConfigError
    if st is None:
        raise ConfigError(f"{shown(path)}: no such file")
    _check_stat(path, st, max_bytes)
    try:
        # O_NONBLOCK: should a FIFO be swapped in after the stat, open() still returns at once.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise os_error(path, exc) from None
    try:
        _check_stat(path, os.fstat(fd), max_bytes)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _check_stat(path: Path, st: os.stat_result, max_bytes: int) -> None:
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        raise ConfigError(f"{path}: is a folder, not a file")
    if not stat.S_ISREG(mode):
        kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise ConfigError(f"{path}: is {kind}; give a regular file")
    if st.st_size > max_bytes:
        raise ConfigError(f"{path}: is {_size(st.st_size)}, over kvplan's {_size(max_bytes)} limit for this input")


def _not_text(path: Path, line: int, offset: int, why: str) -> ConfigError:
    return ConfigError(f"{path}: line {line}: not UTF-8 text ({why} at byte offset {offset})")


def _decode(path: Path, data: bytes, line: int, offset: int) -> str:
    """``data`` (starting on ``line`` at file offset ``offset``) as text, or an error naming the byte."""
    nul = data.find(b"\0")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = exc.start if nul < 0 else min(nul, exc.start)
        why = "NUL byte" if bad == nul else f"byte 0x{data[bad]:02x}"
        raise _not_text(path, line + data.count(b"\n", 0, bad), offset + bad, why) from None
    if nul >= 0:
        raise _not_text(path, line + data.count(b"\n", 0, nul), offset + nul, "NUL byte, binary data")
    return text


def read_text(path: Path, *, max_bytes: int = MAX_FILE_BYTES) -> str:
    """A whole (small) file as text: regular file, at most ``max_bytes``, UTF-8."""
    with open_regular(path, max_bytes=max_bytes) as fh:
        try:
            data = fh.read(max_bytes + 1)
        except OSError as exc:
            raise os_error(path, exc) from None
    if len(data) > max_bytes:  # grew after the stat
        raise ConfigError(f"{path}: is over kvplan's {_size(max_bytes)} limit for this input")
    return _decode(path, data.removeprefix(b"\xef\xbb\xbf"), 1, 0)


def iter_lines(path: Path, *, max_bytes: int = MAX_STREAM_BYTES,
               max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without its newline), read lazily: stopping early reads no further."""
    with open_regular(path, max_bytes=max_bytes) as fh:
        offset = 0
        number = 0
        while True:
            try:
                raw = fh.readline(max_line_bytes + 1)
            except OSError as exc:
                raise os_error(path, exc) from None
            if not raw:
                return
            number += 1
            if len(raw) > max_line_bytes:
                raise ConfigError(f"{path}: line {number} is longer than {_size(max_line_bytes)}; "
                                  "is this the right file?")
            if offset > max_bytes:
                raise ConfigError(f"{path}: is over kvplan's {_size(max_bytes)} limit for this input")
            text = _decode(path, raw[3:] if number == 1 and raw.startswith(b"\xef\xbb\xbf") else raw, number, offset)
            offset += len(raw)
            yield number, text.rstrip("\r\n")


def _scan_yaml(path: Path, text: str) -> None:
    """Refuse deep nesting and alias bombs from the event stream, before any tree is built.

    Each collection's size counts its aliases expanded (an alias adds its anchor's size), so the
    "billion laughs" is caught after reading its ~100 events, not after expanding 10^9 nodes.
    """
    sizes: dict[str, int] = {}  # anchor -> expanded node count
    stack: list[list[Any]] = []  # [anchor, nodes so far]
    total = 0

    def add(n: int, mark: Any) -> None:
        nonlocal total
        if stack:
            stack[-1][1] += n
        else:
            total += n
        if (stack[-1][1] if stack else total) > MAX_YAML_NODES:
            raise ConfigError(f"{path}: line {mark.line + 1}: more than {MAX_YAML_NODES:,} YAML nodes once aliases "
                              "are expanded (an alias bomb?); write the values out")

    try:
        for ev in yaml.parse(text, Loader=_Loader):
            if isinstance(ev, yaml.CollectionStartEvent):
                stack.append([ev.anchor, 1])
                if len(stack) > MAX_DEPTH:
                    raise ConfigError(f"{path}: line {ev.start_mark.line + 1}: nested deeper than {MAX_DEPTH} levels; "
                                      "kvplan's inputs nest a few levels")
            elif isinstance(ev, yaml.CollectionEndEvent):
                anchor, n = stack.pop()
                if anchor is not None:
                    sizes[anchor] = n
                add(n, ev.start_mark)
            elif isinstance(ev, yaml.ScalarEvent):
                if ev.anchor is not None:
                    sizes[ev.anchor] = 1
                add(1, ev.start_mark)
            elif isinstance(ev, yaml.AliasEvent):
                if any(anchor == ev.anchor for anchor, _ in stack):
                    raise ConfigError(f"{path}: line {ev.start_mark.line + 1}: alias *{ev.anchor} refers to a "
                                      "collection that contains it; kvplan's inputs cannot be recursive")
                add(sizes.get(ev.anchor, 1), ev.start_mark)
    except yaml.YAMLError:
        return  # load_yaml reports it with its line


def load_yaml(path: Path) -> Any:
    text = read_text(path)
    _scan_yaml(path, text)
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}:{where}: not valid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to read") from None


def parse_json(text: str, where: str, *, line: int | None = None) -> Any:
    """JSON text read into Python, or a ConfigError naming ``where`` (and the line: ``line`` for one line of a
    JSONL file, else the decoder's)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: line {line or exc.lineno}: not valid JSON: {exc.msg}") from None
    except RecursionError:
        at = f" line {line}:" if line else ""
        raise ConfigError(f"{where}:{at} nested too deeply to read (kvplan's inputs nest a few levels)") from None


def load_json(path: Path) -> Any:
    data = parse_json(read_text(path), str(path))
    _check_json_depth(path, data)
    return data


def _check_json_depth(path: Path, data: Any) -> None:
    """Iteratively (no recursion) refuse JSON nested deeper than MAX_DEPTH."""
    todo: list[tuple[Any, int]] = [(data, 1)]
    while todo:
        node, depth = todo.pop()
        if isinstance(node, (dict, list)):
            if depth > MAX_DEPTH:
                raise ConfigError(f"{path}: nested deeper than {MAX_DEPTH} levels; kvplan's inputs nest a few levels")
            todo.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))


def yaml_key_lines(path: Path) -> dict[tuple[str | int, ...], int]:
    """Map each key path of a YAML mapping to its 1-based line, for error messages.

    Each node is visited once (an alias's subtree is listed under its anchor only), so the walk is
    linear in the file, not in its alias-expanded tree.
    """
    try:
        root = yaml.compose(read_text(path), Loader=_Loader)
    except (yaml.YAMLError, ConfigError, RecursionError):
        return {}
    lines: dict[tuple[str | int, ...], int] = {}
    seen: set[int] = set()
    todo: list[tuple[Any, tuple[str | int, ...]]] = [(root, ())]
    while todo:
        node, prefix = todo.pop()
        if id(node) in seen or len(prefix) > MAX_DEPTH:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                k = (*prefix, key.value)
                lines.setdefault(k, key.start_mark.line + 1)
                todo.append((value, k))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines.setdefault((*prefix, i), item.start_mark.line + 1)
                todo.append((item, (*prefix, i)))
    return lines


def validation_message(path: Path, exc: "ValidationError", data_lines: dict | None = None,
                       model: "type[BaseModel] | None" = None) -> str:
    """One line per problem: ``file.yaml: line 4: requests.rate: must be > 0 (got -3)``; an unknown key
    gets the nearest known one (``did you mean `require`?``) when ``model`` is given, and then a missing
    key that the suggestion names is not reported again."""
    errors = exc.errors()
    hints: dict[int, str] = {}
    suggested: set[tuple[Any, ...]] = set()
    for i, err in enumerate(errors):
        if err["type"] == "extra_forbidden" and model is not None and err["loc"]:
            loc = tuple(err["loc"])
            known = _known_keys(model, loc)
            close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
            if close:
                hints[i] = f"; did you mean `{close[0]}`?"
                suggested.add((*loc[:-1], close[0]))
            elif known and len(known) <= 16:
                hints[i] = f" (known here: {', '.join(known)})"
    out = []
    for i, err in enumerate(errors):
        loc = tuple(err["loc"])
        if err["type"] == "missing" and loc in suggested:
            continue  # the unknown key's "did you mean" names it
        dotted = ".".join(str(p) for p in loc) or "(top level)"
        line = None
        if data_lines:
            for n in range(len(loc), 0, -1):
                line = data_lines.get(loc[:n])
                if line:
                    break
        where = f" line {line}:" if line else ""
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key" + hints.get(i, "")
        got = err.get("input")
        got_repr = repr(got)
        got_repr = got_repr if len(got_repr) <= 80 else got_repr[:77] + "..."
        got_txt = f" (got {got_repr})" if err["type"] not in ("missing", "extra_forbidden") and not isinstance(got, (dict, list)) else ""
        out.append(f"{path}:{where} {dotted}: {msg}{got_txt}")
    return "\n".join(out)


def _known_keys(model: "type[BaseModel]", loc: tuple[Any, ...]) -> list[str]:
    """The keys accepted beside the unknown key at ``loc``: the fields of the model(s) that hold it."""
    models = [model]
    for part in loc[:-1]:
        inner = [t for m in models if isinstance(part, str) and part in m.model_fields
                 for t in _models_in(m.model_fields[part].annotation)]
        if inner:
            models = inner
        elif isinstance(part, str):  # a union member's tag ("lognormal") or class name: narrow to it
            models = [m for m in models if part == m.__name__ or part in _literal_values(m)] or models
        # an int is a list index: the list's item models are the current ones already
    return sorted({f.alias or name for m in models for name, f in m.model_fields.items()})


def _models_in(annotation: Any) -> list[Any]:
    """The pydantic models an annotation holds, through Optional, Union, list, dict and Annotated."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _literal_values(model: Any) -> set[Any]:
    return {v for f in model.model_fields.values() if typing.get_origin(f.annotation) is typing.Literal
            for v in typing.get_args(f.annotation)}


def parse_model(path: Path, model: "type[BaseModel]", data: Any) -> "BaseModel":
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = yaml_key_lines(path) if path.suffix in (".yaml", ".yml") else None
        raise ConfigError(validation_message(path, exc, lines, model)) from None
