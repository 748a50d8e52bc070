"""Engine rules: one package per engine (see kvplan.core.engines.registry, and docs/engines.md for each rule's
source). ``get_engine`` builds an engine under a release's profile; ``engine_for`` also applies what the engine does
for a given model (the block size vLLM forces on MLA models, SGLang's NSA pages)."""

from __future__ import annotations

import dataclasses
from typing import Any

from kvplan.core.engines.base import Engine
from kvplan.core.engines.registry import NAMES, entry
from kvplan.core.spec import ModelSpec
from kvplan.errors import InputError

ENGINES = NAMES  # the engine names, in the registry's order
MAX_BLOCK_SIZE = 1 << 16


def engine_class(name: str) -> type[Engine]:
    return entry(name).load("engine")


_ENGINES: dict[tuple[str, int | None, int], tuple[Any, Engine]] = {}


def get_engine(name: str, *, block_size: int | None = None, profile: Any = None) -> Engine:
    """The engine named ``name`` (a bare name: see kvplan.core.profiles.parse_engine for NAME==VERSION),
    with its default block size unless ``block_size`` is given, under ``profile``'s rules (memoized by the
    profile object: engines and profiles are frozen, and a plan asks for the same one thousands of times)."""
    key = (name, block_size, id(profile))
    hit = _ENGINES.get(key)
    if hit is not None and hit[0] is profile:
        return hit[1]
    engine = _make_engine(name, block_size=block_size, profile=profile)
    if len(_ENGINES) > 256:
        _ENGINES.clear()
    _ENGINES[key] = (profile, engine)
    return engine


def _make_engine(name: str, *, block_size: int | None, profile: Any) -> Engine:
    engine = engine_class(name)()
    if block_size is not None:
        if not 1 <= block_size <= MAX_BLOCK_SIZE:
            raise InputError(f"block size must be between 1 and {MAX_BLOCK_SIZE} (got {block_size})")
        engine.check_block_size(block_size, profile)
        engine = dataclasses.replace(engine, block_size=block_size)
    rules = getattr(profile, "rules", None)
    return engine if rules is None else engine.under(rules, block_size=block_size)


def engine_for(spec: ModelSpec, name: str, *, block_size: int | None = None,
               profile: Any = None) -> tuple[Engine, str | None]:
    """The engine with the block size it would use for this model under ``profile`` (the engine's newest
    when None), and a note when that differs from the engine's usual default."""
    chosen, note = engine_class(name)().model_block_size(spec, block_size, profile)
    return get_engine(name, block_size=chosen, profile=profile), note


__all__ = ["ENGINES", "Engine", "engine_for", "get_engine"]
