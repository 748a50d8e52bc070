"""Engine profiles: the memory rules of one engine over a range of its releases.

Engines change their memory rules every few releases, so kvplan plans with the rules of the release the
user runs. A profile holds one range's rules (budget, defaults, block layout, what the startup log
prints), says what changed when it began, and cites the release's source. A new release that changes
a rule is one new profile (the previous one with that rule replaced) plus its tests.

``--engine vllm==0.11.0`` picks the newest profile at or below 0.11.0; ``--engine vllm`` the newest
profile kvplan knows. Engines without releases (``ideal``) take no version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import total_ordering
from typing import Any

from kvplan.errors import InputError


@total_ordering
@dataclass(frozen=True)
class Version:
    """A release number: ``0.8.5.post1``, ``0.7.3.dev233+gad5a35c2`` and ``0.8.2+cu124`` read as 0.8.5,
    0.7.3 and 0.8.2 (pre-release and local suffixes do not change the rules kvplan models)."""

    parts: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> Version:
        m = re.match(r"^\s*v?(\d+(?:\.\d+){0,3})", str(text))
        if not m:
            raise InputError(f"cannot read a release number from {text!r}; write it like 0.11.0")
        parts = tuple(int(p) for p in m.group(1).split("."))
        while len(parts) > 1 and parts[-1] == 0:
            parts = parts[:-1]
        return cls(parts)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self.parts < other.parts

    def __str__(self) -> str:
        return ".".join(map(str, (*self.parts, 0, 0)[: max(3, len(self.parts))]))


@dataclass(frozen=True, kw_only=True)
class EngineProfile:
    """One engine's rules from release ``since`` up to (not including) the next profile's."""

    engine: str  # vllm, sglang, trtllm, hf
    since: Version
    rules: Any  # the engine's rules dataclass (VLLMRules, SGLangRules, ...)
    changes: tuple[str, ...]  # what changed at ``since``, each with its source
    until: Version | None = None  # set by the registry: the next profile's ``since``
    display: str = ""  # "vLLM", "SGLang", ...

    @property
    def version(self) -> str:
        """The profile's name in output and JSON: its first release."""
        return str(self.since)

    @property
    def label(self) -> str:
        span = f"{self.since}" + (f" to before {self.until}" if self.until else " and later")
        return f"{self.display or self.engine} {span}"

    def covers(self, v: Version) -> bool:
        return self.since <= v and (self.until is None or v < self.until)


@dataclass(frozen=True)
class Registry:
    profiles: dict[str, tuple[EngineProfile, ...]] = field(default_factory=dict)
    checked_through: dict[str, str] = field(default_factory=dict)  # the newest release whose source was read

    def newest(self, engine: str) -> EngineProfile:
        return self.profiles[engine][-1]


def chain(engine: str, display: str, entries: list[tuple[str, Any, tuple[str, ...]]]) -> tuple[EngineProfile, ...]:
    """Profiles from (since, rules, changes) in release order; each ``until`` is the next one's ``since``."""
    versions = [Version.parse(v) for v, _, _ in entries]
    if versions != sorted(versions) or len(set(versions)) != len(versions):
        raise AssertionError(f"{engine} profiles must be in strictly increasing release order")
    return tuple(
        EngineProfile(engine=engine, display=display, since=v, rules=rules, changes=changes,
                      until=versions[i + 1] if i + 1 < len(versions) else None)
        for i, (v, (_, rules, changes)) in enumerate(zip(versions, entries))
    )


def _registry() -> Registry:
    from kvplan.core.engines.registry import ENTRIES

    versioned = [e for e in ENTRIES if e.profiles]
    return Registry({e.name: e.load("profiles") for e in versioned},
                    {e.name: e.checked_through for e in versioned})


_REGISTRY: Registry | None = None


def registry() -> Registry:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _registry()
    return _REGISTRY


@dataclass(frozen=True, kw_only=True)
class EngineChoice:
    """What ``--engine NAME[==VERSION]`` resolved to."""

    name: str  # ideal, hf, vllm, sglang, trtllm
    profile: EngineProfile | None  # None for engines without releases (ideal)
    asked: str | None  # the version the user wrote, if any
    note: str | None  # what kvplan chose and why, when it is not exactly what was asked

    @property
    def version(self) -> str | None:
        return self.profile.version if self.profile else None


VERSIONLESS = ("ideal",)  # the engines without releases (kvplan.core.engines.registry: no profiles)


def parse_engine(text: str, *, allowed: tuple[str, ...] | None = None) -> EngineChoice:
    """``vllm``, ``vllm==0.11.0`` (also ``vllm@0.11``): the engine and the profile of that release."""
    m = re.match(r"^\s*([A-Za-z][A-Za-z0-9_-]*)\s*(?:(?:==|@)\s*(\S+))?\s*$", text)
    if not m:
        raise InputError(f"--engine {text!r}: write NAME or NAME==VERSION, e.g. vllm==0.11.0")
    name, version = m.group(1).lower(), m.group(2) or ""
    if name in VERSIONLESS and not version and (allowed is None or name in allowed):
        return EngineChoice(name=name, profile=None, asked=None, note=None)  # `size`'s default: no registry needed
    known = allowed or ("ideal", *registry().profiles)
    if name not in known:
        raise InputError(f"unknown engine {name!r}; use one of: {', '.join(known)} (optionally NAME==VERSION, "
                         "e.g. vllm==0.11.0; see `kvplan engines`)")
    if name in VERSIONLESS:
        if version:
            raise InputError(f"{name} has no releases to pin; use --engine {name}")
        return EngineChoice(name=name, profile=None, asked=None, note=None)
    profiles = registry().profiles[name]
    checked = Version.parse(registry().checked_through[name])
    if not version:
        newest = profiles[-1]
        return EngineChoice(name=name, profile=newest, asked=None,
                            note=f"no {name} version given: the newest rules kvplan knows, {newest.display} "
                                 f"{newest.version} and later (read through {checked}); pin a release with "
                                 f"--engine {name}==X.Y.Z")
    v = Version.parse(version)
    if v < profiles[0].since:
        raise InputError(f"{name} {version} is older than the oldest profile kvplan has ({profiles[0].version}); "
                         f"profiles: {', '.join(p.version for p in profiles)}")
    chosen = next(p for p in profiles if p.covers(v))
    note = None if v == chosen.since else (f"{name} {version}: the rules of the {chosen.version} profile "
                                           f"({chosen.label}) apply")
    if checked < v:
        note = (f"{name} {version} is newer than {checked}, the newest release kvplan read: the {chosen.version} "
                "profile's rules are assumed unchanged")
    return EngineChoice(name=name, profile=chosen, asked=version, note=note)
