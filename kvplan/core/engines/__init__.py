"""Engine rules: one module per engine (see docs/engines.md for each rule's source)."""

from __future__ import annotations

import dataclasses
from typing import Any

import importlib

from kvplan.core.engines.base import Engine
from kvplan.core.spec import MLALayer, ModelSpec
from kvplan.errors import InputError

# name -> (module, class): each engine's module is imported when that engine is used (start-up time)
ENGINES: dict[str, tuple[str, str]] = {
    "ideal": ("ideal", "IdealEngine"),
    "hf": ("hf", "HFEngine"),
    "vllm": ("vllm", "VLLMEngine"),
    "sglang": ("sglang", "SGLangEngine"),
    "trtllm": ("trtllm", "TRTLLMEngine"),
}


def engine_class(name: str) -> type[Engine]:
    module, cls = ENGINES[name]
    return getattr(importlib.import_module(f"kvplan.core.engines.{module}"), cls)

MAX_BLOCK_SIZE = 1 << 16


def get_engine(name: str, *, block_size: int | None = None, profile: Any = None) -> Engine:
    """The engine named ``name`` (a bare name: see kvplan.core.profiles.parse_engine for NAME==VERSION),
    with its default block size unless ``block_size`` is given, under ``profile``'s rules."""
    if name.lower() not in ENGINES:
        raise InputError(f"unknown engine {name!r}; use one of: {', '.join(ENGINES)}")
    engine = engine_class(name.lower())()
    name = name.lower()
    if block_size is not None:
        if not 1 <= block_size <= MAX_BLOCK_SIZE:
            raise InputError(f"block size must be between 1 and {MAX_BLOCK_SIZE} (got {block_size})")
        if name in ("ideal", "hf"):
            raise InputError(f"--block-size applies to paged engines (vllm, sglang, trtllm), not {name}")
        if name == "vllm":  # which sizes start is a rule of the release (kvplan.core.profiles.vllm)
            from kvplan.core.profiles import registry
            from kvplan.core.profiles.vllm import check_block_size

            check_block_size(profile if profile is not None else registry().newest("vllm"), block_size)
        engine = dataclasses.replace(engine, block_size=block_size)
    rules = getattr(profile, "rules", None)
    if name == "vllm" and rules is not None and not rules.hybrid_manager:
        engine = dataclasses.replace(engine, frees_out_of_window=False)
    if name == "hf" and rules is not None:
        engine = dataclasses.replace(engine, mla_latent=rules.mla_latent,
                                     csa_overlap_gate_fp32=rules.csa_overlap_gate_fp32)
    if name == "trtllm" and rules is not None and block_size is None:
        engine = dataclasses.replace(engine, block_size=rules.tokens_per_block)
    return engine


def engine_for(spec: ModelSpec, name: str, *, block_size: int | None = None,
               profile: Any = None) -> tuple[Engine, str | None]:
    """The engine with the block size it would use for this model under ``profile`` (the engine's newest
    when None), and a note when that differs from the engine's usual default."""
    if name.lower() == "vllm" and any(isinstance(x, MLALayer) for x in spec.layers):
        from kvplan.core.profiles.vllm import mla_block

        if profile is None:
            from kvplan.core.profiles import registry

            profile = registry().newest("vllm")
        sparse = any(isinstance(x, MLALayer) and x.indexer_head_dim for x in spec.layers)
        block, note = mla_block(profile.rules, block_size, sparse=sparse)
        if block_size is None and block != engine_class("vllm").block_size:
            note = f"vLLM uses {block}-token blocks for MLA models (FlashMLA)" + (
                "; --block-size overrides" if profile.rules.mla_given_block == "kept" else "")
        if note:
            return get_engine(name, block_size=block, profile=profile), note
    if block_size is None and name.lower() == "sglang" and any(
            isinstance(x, MLALayer) and x.indexer_head_dim for x in spec.layers):
        from kvplan.core.engines.sglang import NSA_PAGE_SIZE

        return get_engine(name, block_size=NSA_PAGE_SIZE, profile=profile), (
            f"SGLang pages sparse-attention (NSA) models by {NSA_PAGE_SIZE} tokens (NSATokenToKVPool)")
    if name.lower() == "sglang" and any(getattr(x, "sliding_window", 0) for x in spec.layers):
        from kvplan.core.engines.sglang import pools_windows

        if not pools_windows(spec):
            return get_engine(name, block_size=block_size, profile=profile), (
                "SGLang pools this architecture's sliding-window layers at full length (it is not in SGLang's "
                "hybrid-SWA list, configs/model_config.py::is_hybrid_swa_model): they hold every token")
    return get_engine(name, block_size=block_size, profile=profile), None


__all__ = ["ENGINES", "Engine", "engine_for", "get_engine"]
