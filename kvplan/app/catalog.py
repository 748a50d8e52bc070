"""What kvplan ships to plan with: the GPU catalog (``kvplan gpus``), the example inputs (``kvplan examples``)
and the engine profiles (``kvplan engines``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # each is read only by the command that lists it
    from kvplan.core.gpus import GPUSpec
    from kvplan.core.profiles import EngineProfile
    from kvplan.io.examples import Example


def gpu_catalog() -> tuple[GPUSpec, ...]:
    """The GPUs ``--gpu`` names (configs/gpus.yaml), memory as the driver reports it."""
    from kvplan.io.gpus import gpu_catalog as catalog

    return catalog()


@dataclass(frozen=True, kw_only=True)
class Examples:
    """The bundled examples, or the text of the one asked for by name."""

    listed: tuple[Example, ...] = ()
    text: str | None = None  # the named example's file, to copy and edit


def find_examples(name: str | None = None) -> Examples:
    """Every bundled example workload and budget file, or the file of the one named ``name``."""
    from kvplan.io.examples import examples, resolve_input
    from kvplan.io.yamlio import read_text

    bundled = examples()
    if name is None:
        return Examples(listed=tuple(bundled))
    kind = next((e.kind for e in bundled if e.name == name), "workload")
    return Examples(text=read_text(resolve_input(name, kind)))  # a device or FIFO named here is refused, not read


@dataclass(frozen=True, kw_only=True)
class EngineProfiles:
    """The release profiles of the engines asked for, oldest first, and how far each engine's source was read."""

    profiles: dict[str, tuple[EngineProfile, ...]]  # engine -> its profiles
    checked_through: dict[str, str]  # engine -> the newest release whose source was read


def engine_profiles(name: str | None = None) -> EngineProfiles:
    """Every engine's profiles, or engine ``name``'s (a version after it, as in ``vllm==0.11.0``, is ignored)."""
    from kvplan.core.profiles import parse_engine, registry

    reg = registry()
    names = list(reg.profiles) if name is None else [parse_engine(name, allowed=tuple(reg.profiles)).name]
    return EngineProfiles(profiles={n: reg.profiles[n] for n in names},
                          checked_through={n: reg.checked_through[n] for n in names})
