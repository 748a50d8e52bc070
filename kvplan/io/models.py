"""Where model specs come from: bundled YAML, a config.json file or folder, or the local HF cache.

Nothing is ever downloaded and ``trust_remote_code`` is never used: only config.json's keys are read.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from kvplan.core.spec import ModelSpec
from kvplan.errors import ConfigError, InputError
from kvplan.io.hf_config import spec_from_hf_config
from kvplan.io.yamlio import load_json, load_yaml, parse_model


def configs_dir() -> Path:
    """configs/ inside an installed wheel, else beside the package in a source checkout."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "configs", here.parent / "configs"):
        if candidate.is_dir():
            return candidate
    raise ConfigError(f"bundled configs not found beside {here}; reinstall kvplan")


@dataclass(frozen=True)
class BundledModel:
    """One file of configs/models/: a cited subset of the model's config.json.

    The file format's validator of record is ``kvplan.io.schemas.BundledModelFile`` (pydantic,
    unknown keys rejected). A file whose shape is plainly right skips it: building a pydantic model
    costs more start-up time than the rest of ``kvplan size``.
    """

    name: str
    aliases: list[str]
    source: str
    notes: str
    config: dict[str, Any]
    published: dict[str, Any] | None = None  # PublishedFigures: params, source


_BUNDLED_TYPES = {"name": str, "aliases": list, "source": str, "notes": str, "config": dict, "published": dict}
_BUNDLED_REQUIRED = {"name", "source", "config"}


@dataclass(frozen=True)
class BundledEntry:
    name: str
    aliases: tuple[str, ...]
    source: str
    path: Path


@lru_cache(maxsize=1)
def bundled_index() -> dict[str, BundledEntry]:
    """name -> entry for every bundled model."""
    out: dict[str, BundledEntry] = {}
    for path in sorted((configs_dir() / "models").glob("*.yaml")):
        model = _read_bundled(path)
        out[model.name] = BundledEntry(model.name, tuple(model.aliases), model.source, path)
    return out


def _lookup_bundled(ref: str) -> BundledEntry | None:
    key = ref.strip().lower()
    direct = configs_dir() / "models" / f"{key}.yaml"
    if direct.is_file():  # fast path: a bundled name needs only its own file read
        model = _read_bundled(direct)
        return BundledEntry(model.name, tuple(model.aliases), model.source, direct)
    for entry in bundled_index().values():
        if key == entry.name.lower() or key in (a.lower() for a in entry.aliases):
            return entry
    return None


@lru_cache(maxsize=None)
def _read_bundled(path: Path) -> BundledModel:
    data = load_yaml(path)
    plainly_right = (
        isinstance(data, dict)
        and _BUNDLED_REQUIRED <= data.keys() <= _BUNDLED_TYPES.keys()
        and all(isinstance(data[k], t) for k, t in _BUNDLED_TYPES.items() if k in data)
        and all(isinstance(a, str) for a in data.get("aliases", []))
    )
    if not plainly_right:
        from kvplan.io.schemas import BundledModelFile

        data = parse_model(path, BundledModelFile, data).model_dump()
    return BundledModel(
        name=data["name"], aliases=list(data.get("aliases", [])), source=data["source"],
        notes=data.get("notes", ""), config=data["config"], published=data.get("published"),
    )


def bundled_published(entry: BundledEntry) -> dict[str, Any] | None:
    """The published figures a bundled file cites (``published``: params, source), or None."""
    return _read_bundled(entry.path).published


def load_bundled(entry: BundledEntry) -> ModelSpec:
    model = _read_bundled(entry.path)
    return spec_from_hf_config(
        model.config, name=model.name, origin=str(entry.path), source=model.source, provenance=model.notes
    )


def _hf_cache_config(ref: str) -> Path | None:
    """config.json of a hub id already in the local Hugging Face cache (newest snapshot)."""
    if "/" not in ref or ref.startswith((".", "/")):
        return None
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME", os.path.join(os.path.expanduser("~"), ".cache", "huggingface")), "hub"
    )
    snapshots = Path(hub) / f"models--{ref.replace('/', '--')}" / "snapshots"
    if not snapshots.is_dir():
        return None
    found = [p / "config.json" for p in snapshots.iterdir() if (p / "config.json").is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def _from_file(path: Path) -> ModelSpec:
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"{path.parent}: folder has no config.json")
    if path.suffix in (".yaml", ".yml"):
        data = load_yaml(path)
        if isinstance(data, dict) and "config" in data and "name" in data:
            model = _read_bundled(path)
            return spec_from_hf_config(model.config, name=model.name, origin=str(path), source=model.source,
                                       provenance=model.notes)
    else:
        data = load_json(path)
    name = path.parent.name if path.name == "config.json" else path.stem
    return spec_from_hf_config(data, name=name, origin=str(path), source=str(path))


# Suffixes of repo names that change the weights or the packaging, not the cache's shape.
_PACKAGING_SUFFIXES = ("-bnb-4bit", "-bnb-8bit", "-awq", "-gptq-int4", "-gptq-int8", "-gptq", "-fp8", "-fp8-dynamic",
                       "-int4", "-int8", "-gguf", "-mlx", "-hf", "-unsloth")
_QUANTIZED_MARKS = ("bnb", "awq", "gptq", "fp8", "int4", "int8", "gguf")


def _normal(name: str) -> str:
    """``Qwen/Qwen2.5-7B-Instruct`` and ``qwen25_7b_instruct`` compare equal: the repo's basename, lowercase,
    without dots, ``_`` as ``-``."""
    base = name.strip().rstrip("/").rsplit("/", 1)[-1].lower().replace("_", "-")
    return base.replace("meta-llama-", "llama-").replace(".", "")


def _variant_lookup(ref: str) -> tuple[BundledEntry, str] | None:
    """A bundled model whose name or alias is ``ref`` without packaging suffixes (``-bnb-4bit``, ``-AWQ``,
    ``_HF``): the entry and a note saying what was matched and what may differ."""
    key = _normal(ref)
    stripped = key
    changed = True
    while changed:
        changed = False
        for suffix in _PACKAGING_SUFFIXES:
            if stripped.endswith(suffix) and len(stripped) > len(suffix):
                stripped, changed = stripped[: -len(suffix)], True
    if stripped == key and "/" not in ref and not ref.startswith((".", "/", "~")):
        return None  # nothing stripped from a plain name: the exact lookup already failed
    for entry in bundled_index().values():
        if stripped in {_normal(entry.name), *(_normal(a) for a in entry.aliases)}:
            note = f"{ref!r} is not bundled; sized with the bundled {entry.name} ({entry.source}), matched by name"
            if any(mark in key for mark in _QUANTIZED_MARKS):
                note += "; its quantized weights are not known from the name: pass --weight-dtype or its config.json"
            return entry, note
    return None


def _with_note(spec: ModelSpec, note: str) -> ModelSpec:
    return dataclasses.replace(spec, notes=(*spec.notes, note))


def load_model(ref: str) -> ModelSpec:
    """Resolve a model reference: a path, a bundled name or hub alias, a cached hub id, or a name variant
    (quantized or re-packaged) of a bundled model, said in a note."""
    path = Path(ref).expanduser()
    if path.exists():
        return _from_file(path)
    if path.suffix in (".json", ".yaml", ".yml"):
        raise ConfigError(f"{ref}: no such file")
    entry = _lookup_bundled(ref)
    if entry is not None:
        spec = load_bundled(entry)
        if "/" in ref and ref.strip().lower() != entry.name.lower():
            spec = _with_note(spec, f"{ref}: the bundled {entry.name} config ({entry.source})")
        return spec
    cached = _hf_cache_config(ref)
    if cached is not None:
        return spec_from_hf_config(load_json(cached), name=ref, origin=str(cached), source=f"local HF cache: {cached}")
    variant = _variant_lookup(ref)
    if variant is not None:
        return _with_note(load_bundled(variant[0]), variant[1])
    if ref.startswith((".", "/", "~")):
        raise ConfigError(f"{ref}: no such file")
    names = [e.name for e in bundled_index().values()]
    aliases = [a for e in bundled_index().values() for a in e.aliases]
    close = difflib.get_close_matches(ref.lower(), [n.lower() for n in names + aliases], n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise InputError(
        f"unknown model {ref!r}{hint} (see `kvplan models`; a path to a config.json or a hub id in the local "
        "Hugging Face cache also works)"
    )
