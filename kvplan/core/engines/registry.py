"""The one list of engines: each one's name, its page rules, its release profiles and its memory budget.

Every other place that needs to know which engines exist (``--engine`` choices, ``fit``'s budgets, the profile
registry, ``kvplan engines``) reads this list. An engine's rules live in its own package
(``kvplan/core/engines/<name>/``: ``pages.py`` what a token slot and a block hold, ``profiles.py`` the rules of each
release range, ``budget.py`` the memory budget ``fit`` plans, ``plan.py`` where the engine plans its pool in more
steps). Modules are named, not imported, so that ``kvplan size`` loads only the engine it uses.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from kvplan.errors import InputError


@dataclass(frozen=True, kw_only=True)
class EngineEntry:
    name: str
    display: str
    engine: str  # "module:Class": the page rules (kvplan.core.engines.base.Engine)
    profiles: str = ""  # "module:NAME": its release profiles (kvplan.core.profiles.chain); "": no releases
    budget: str = ""  # "module:function": the memory budget `fit` plans (FitRequest -> FitResult); "": none
    checked_through: str = ""  # the newest release whose source was read

    def load(self, what: str) -> Any:
        module, name = getattr(self, what).split(":")
        return getattr(importlib.import_module(module), name)


_E = "kvplan.core.engines"
ENTRIES: tuple[EngineEntry, ...] = (
    EngineEntry(name="ideal", display="ideal", engine=f"{_E}.ideal:IdealEngine"),
    # transformers: 5.23 and 5.24, sources and the byte-for-byte tests
    EngineEntry(name="hf", display="transformers", engine=f"{_E}.hf.pages:HFEngine",
                profiles=f"{_E}.hf.profiles:HF_PROFILES", checked_through="5.24.0"),
    # every sdist 0.6.2-0.33.0
    EngineEntry(name="vllm", display="vLLM", engine=f"{_E}.vllm.pages:VLLMEngine",
                profiles=f"{_E}.vllm.profiles:VLLM_PROFILES", budget=f"{_E}.vllm.budget:fit_vllm",
                checked_through="0.33.0"),
    # sdists up to 0.5.10 (later ones are wheels only)
    EngineEntry(name="sglang", display="SGLang", engine=f"{_E}.sglang.pages:SGLangEngine",
                profiles=f"{_E}.sglang.profiles:SGLANG_PROFILES", budget=f"{_E}.sglang.budget:fit_sglang",
                checked_through="0.5.10"),
    # the 1.x KvCacheConfig reference
    EngineEntry(name="trtllm", display="TensorRT-LLM", engine=f"{_E}.trtllm.pages:TRTLLMEngine",
                profiles=f"{_E}.trtllm.profiles:TRTLLM_PROFILES", budget=f"{_E}.trtllm.budget:fit_trtllm",
                checked_through="1.2.1"),
)
BY_NAME: dict[str, EngineEntry] = {e.name: e for e in ENTRIES}
NAMES: tuple[str, ...] = tuple(BY_NAME)
SERVING: tuple[str, ...] = tuple(e.name for e in ENTRIES if e.budget)  # engines with a memory budget (fit, simulate)
VERSIONED: tuple[str, ...] = tuple(e.name for e in ENTRIES if e.profiles)


def entry(name: str) -> EngineEntry:
    found = BY_NAME.get(name.lower())
    if found is None:
        raise InputError(f"unknown engine {name!r}; use one of: {', '.join(NAMES)}")
    return found
