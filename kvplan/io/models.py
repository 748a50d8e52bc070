"""Where model specs come from: bundled YAML, a config.json file or folder, the local HF cache, or (when
asked with ``--fetch`` or ``KVPLAN_FETCH=1``) the Hugging Face Hub, config.json alone (``kvplan.io.hub``).

``trust_remote_code`` is never used and no modeling code is ever downloaded: only config.json's keys are read.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvplan.core.spec import ModelSpec
from kvplan.errors import ConfigError, InputError
from kvplan.io.hf_config import spec_from_hf_config
from kvplan.io.paths import probe, shown, user_path
from kvplan.io.suggest import suggestions
from kvplan.io.yamlio import load_json, load_yaml, parse_model

if TYPE_CHECKING:  # kvplan.io.hub is imported when a reference looks like a hub id (org/name), not before
    from kvplan.io.hub import HubConfig


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
    if _is_bundled_file(key, direct):  # fast path: a bundled name needs only its own file read
        model = _read_bundled(direct)
        return BundledEntry(model.name, tuple(model.aliases), model.source, direct)
    for entry in bundled_index().values():
        if key == entry.name.lower() or key in (a.lower() for a in entry.aliases):
            return entry
    return None


def _is_bundled_file(key: str, path: Path) -> bool:
    """Whether ``key`` names a file of configs/models/; anything else (a path, a name too long for a file,
    a NUL byte) is left to the index, whose names are all short."""
    if "/" in key:
        return False
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


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


_REMOTE_CODE_NOTE = ("config.json names custom modeling code (auto_map: {names}); kvplan reads only the config's "
                     "keys and never downloads or runs that code")


def _remote_code_note(data: Any) -> str | None:
    auto_map = data.get("auto_map") if isinstance(data, dict) else None
    if not auto_map:
        return None
    names = ", ".join(sorted(auto_map)) if isinstance(auto_map, dict) else "given"
    return _REMOTE_CODE_NOTE.format(names=names if len(names) <= 80 else names[:77] + "...")


def _hubio() -> Any:
    from kvplan.io import hub

    return hub


def _from_hub(ref: str, hub: HubConfig) -> ModelSpec:
    data = load_json(hub.path)
    spec = spec_from_hf_config(data, name=ref, origin=str(hub.path),
                               source=f"{ref}@{hub.commit} config.json (Hugging Face cache: {hub.path})")
    if not hub.fetched and not hub.note:
        spec = _with_note(spec, f"{ref} is not bundled: its config.json was read from the local Hugging Face cache "
                                f"(commit {hub.commit[:12]}): {hub.path}; --fetch checks the Hub for a newer one")
    for note in (hub.note, _remote_code_note(data)):
        if note:
            spec = _with_note(spec, note)
    return spec


def _from_file(path: Path, st: os.stat_result) -> ModelSpec:
    if stat.S_ISDIR(st.st_mode):
        path = path / "config.json"
        if probe(path) is None:
            raise ConfigError(f"{shown(path.parent)}: folder has no config.json")
    if path.suffix in (".yaml", ".yml"):
        data = load_yaml(path)
        if isinstance(data, dict) and "config" in data and "name" in data:
            model = _read_bundled(path)
            return spec_from_hf_config(model.config, name=model.name, origin=str(path), source=model.source,
                                       provenance=model.notes)
    else:
        data = load_json(path)
    name = path.parent.name if path.name == "config.json" else path.stem
    spec = spec_from_hf_config(data, name=name, origin=str(path), source=str(path))
    note = _remote_code_note(data)
    return _with_note(spec, note) if note else spec


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


@dataclass(frozen=True)
class ResolvedModel:
    """A model spec and, when its config.json came through the Hugging Face cache, where from."""

    spec: ModelSpec
    hub: HubConfig | None = None


def load_model(ref: str, *, fetch: bool | None = None, revision: str | None = None) -> ModelSpec:
    """Resolve a model reference to its spec (``resolve_model`` without the hub details)."""
    return resolve_model(ref, fetch=fetch, revision=revision).spec


def resolve_model(ref: str, *, fetch: bool | None = None, revision: str | None = None) -> ResolvedModel:
    """Resolve a model reference: a path, a bundled name or hub alias, a hub id in the local HF cache (or
    fetched from the Hub: ``fetch``, default ``KVPLAN_FETCH``), or a name variant (quantized or re-packaged)
    of a bundled model, said in a note. ``revision`` names a hub snapshot, so a hub id is then read from
    the cache or the Hub even where kvplan bundles it."""
    path = user_path(ref)
    st = probe(path)  # a name the OS refuses (too long, permission denied) is a ConfigError here
    if st is not None:
        return ResolvedModel(_from_file(path, st))
    if path.suffix in (".json", ".yaml", ".yml"):
        raise ConfigError(f"{shown(ref)}: no such file")
    hubio = _hubio() if "/" in ref or revision is not None else None
    hub_id = hubio is not None and hubio.looks_like_hub_id(ref)
    if hubio is not None and hubio.check_revision(revision) is not None and not hub_id:
        raise InputError(f"--revision {revision} applies to hub ids (org/name); {ref!r} is not one")
    entry = _lookup_bundled(ref) if revision is None else None
    if entry is not None:
        spec = load_bundled(entry)
        if "/" in ref and ref.strip().lower() != entry.name.lower():
            spec = _with_note(spec, f"{ref}: the bundled {entry.name} config ({entry.source})")
        if fetch and hub_id:
            spec = _with_note(spec, f"nothing fetched: {ref} is bundled; add --revision main to read the Hub's "
                                    "config.json instead")
        return ResolvedModel(spec)
    if hubio is not None and hub_id:
        wants_fetch = hubio.fetch_enabled(fetch)
        hub = hubio.fetch_config(ref, revision) if wants_fetch else hubio.cached_config(ref, revision)
        if hub is not None:
            return ResolvedModel(_from_hub(ref, hub), hub)
        if revision is not None:
            raise InputError(f"{ref} at revision {revision} is not in the local Hugging Face cache "
                             f"({hubio.hub_cache_dir()}); " + hubio.not_cached_hint(ref, revision))
    variant = _variant_lookup(ref)
    if variant is not None:
        note = variant[1] + ("; --fetch reads the repo's own config.json" if hub_id else "")
        return ResolvedModel(_with_note(load_bundled(variant[0]), note))
    if ref.startswith((".", "/", "~")):
        raise ConfigError(f"{shown(ref)}: no such file")
    close = suggestions(ref, [(n, e.name) for e in bundled_index().values() for n in (e.name, *e.aliases)],
                        cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    if hubio is not None and hub_id:
        raise InputError(f"unknown model {ref!r}{hint}: not bundled (see `kvplan models`) and not in the local "
                         f"Hugging Face cache ({hubio.hub_cache_dir()}); " + hubio.not_cached_hint(ref, None))
    fetch_hint = "; --fetch takes a hub id, org/name" if fetch else ""
    raise InputError(
        f"unknown model {ref!r}{hint} (see `kvplan models`; a path to a config.json or a hub id in the local "
        f"Hugging Face cache also works){fetch_hint}"
    )
