"""Bundled example inputs, reachable by name after any install: ``kvplan simulate vllm-paper-sharegpt``,
``kvplan check example``. A name is looked up only when no file of that name exists."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvplan.errors import ConfigError
from kvplan.io.models import configs_dir
from kvplan.io.paths import probe, shown, user_path

# kind -> the folder of configs/ that holds its examples
_FOLDERS = {"workload": "workloads", "budgets": "budgets"}


@dataclass(frozen=True)
class Example:
    kind: str
    name: str
    path: Path
    summary: str


def _summary(path: Path) -> str:
    """The first sentence of the file's opening comment (its own description), else its name."""
    words: list[str] = []
    try:
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                text = line.strip()
                if not text.startswith("#"):
                    break
                words.append(text.lstrip("# ").strip())
    except OSError:
        pass
    comment = " ".join(words)
    end = comment.find(". ")
    return (comment[: end + 1] if end > 0 else comment) or path.stem


def examples(kind: str | None = None) -> list[Example]:
    """Every bundled example of ``kind`` (workload or budgets), or of both."""
    out = []
    for k, folder in _FOLDERS.items():
        if kind not in (None, k):
            continue
        for path in sorted((configs_dir() / folder).glob("*.yaml")):
            out.append(Example(kind=k, name=path.stem, path=path, summary=_summary(path)))
    return out


def resolve_input(ref: str | Path, kind: str) -> Path:
    """A file path as given, or the bundled example of that name."""
    path = user_path(ref)
    if probe(path) is not None:  # what the OS refuses (permission, a name too long) is a ConfigError
        return path
    name = str(ref).strip()
    for ex in examples(kind):
        if name in (ex.name, ex.path.name):
            return ex.path
    known = ", ".join(ex.name for ex in examples(kind)) or "none"
    raise ConfigError(f"{shown(ref)}: no such file, and no bundled {kind} example of that name "
                      f"(bundled: {known}; see `kvplan examples`)")
