"""YAML/JSON loading with errors that name the file, the key and the line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pydantic is imported only when a file is validated (it costs start-up time)
    from pydantic import BaseModel, ValidationError

import yaml

from kvplan.errors import ConfigError

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None


def load_yaml(path: Path) -> Any:
    text = read_text(path)
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}:{where}: not valid YAML: {problem}") from None


def load_json(path: Path) -> Any:
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: line {exc.lineno}: not valid JSON: {exc.msg}") from None


def yaml_key_lines(path: Path) -> dict[tuple[str | int, ...], int]:
    """Map each key path of a YAML mapping to its 1-based line, for error messages."""
    try:
        root = yaml.compose(read_text(path), Loader=_Loader)
    except yaml.YAMLError:
        return {}
    lines: dict[tuple[str | int, ...], int] = {}

    def walk(node: Any, prefix: tuple[str | int, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                k = (*prefix, key.value)
                lines[k] = key.start_mark.line + 1
                walk(value, k)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines[(*prefix, i)] = item.start_mark.line + 1
                walk(item, (*prefix, i))

    walk(root, ())
    return lines


def validation_message(path: Path, exc: "ValidationError", data_lines: dict | None = None) -> str:
    """One line per problem: ``file.yaml: line 4: requests.rate: must be > 0 (got -3)``."""
    out = []
    for err in exc.errors():
        loc = tuple(err["loc"])
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
            msg = "unknown key"
        got = err.get("input")
        got_txt = f" (got {got!r})" if err["type"] not in ("missing", "extra_forbidden") and not isinstance(got, (dict, list)) else ""
        out.append(f"{path}:{where} {dotted}: {msg}{got_txt}")
    return "\n".join(out)


def parse_model(path: Path, model: "type[BaseModel]", data: Any) -> "BaseModel":
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as exc:
        lines = yaml_key_lines(path) if path.suffix in (".yaml", ".yml") else None
        raise ConfigError(validation_message(path, exc, lines)) from None
