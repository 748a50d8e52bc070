"""Engine rules: one module per engine (see docs/engines.md for each rule's source)."""

from __future__ import annotations

import dataclasses

from kvplan.core.engines.base import Engine
from kvplan.core.engines.hf import HFEngine
from kvplan.core.engines.ideal import IdealEngine
from kvplan.core.engines.sglang import SGLangEngine
from kvplan.core.engines.trtllm import TRTLLMEngine
from kvplan.core.engines.vllm import VLLMEngine
from kvplan.core.spec import MLALayer, ModelSpec
from kvplan.errors import InputError

ENGINES: dict[str, type[Engine]] = {
    "ideal": IdealEngine,
    "hf": HFEngine,
    "vllm": VLLMEngine,
    "sglang": SGLangEngine,
    "trtllm": TRTLLMEngine,
}

MAX_BLOCK_SIZE = 1 << 16


def get_engine(name: str, *, block_size: int | None = None) -> Engine:
    """The engine named ``name``, with its default block size unless ``block_size`` is given."""
    try:
        cls = ENGINES[name.lower()]
    except KeyError:
        raise InputError(f"unknown engine {name!r}; use one of: {', '.join(ENGINES)}") from None
    engine = cls()
    name = name.lower()
    if block_size is not None:
        if not 1 <= block_size <= MAX_BLOCK_SIZE:
            raise InputError(f"block size must be between 1 and {MAX_BLOCK_SIZE} (got {block_size})")
        if name in ("ideal", "hf"):
            raise InputError(f"--block-size applies to paged engines (vllm, sglang, trtllm), not {name}")
        if engine.block_sizes and block_size not in engine.block_sizes:
            raise InputError(f"{name} has no block size {block_size}; use one of "
                             f"{', '.join(map(str, engine.block_sizes))}")
        engine = dataclasses.replace(engine, block_size=block_size)
    return engine


# vLLM on CUDA forces the KV block size of MLA models to 64 (FlashMLA; vllm/platforms/cuda.py).
VLLM_MLA_BLOCK_SIZE = 64


def engine_for(spec: ModelSpec, name: str, *, block_size: int | None = None) -> tuple[Engine, str | None]:
    """The engine with the block size it would use for this model, and a note when that differs
    from the engine's usual default."""
    if block_size is None and name.lower() == "vllm" and any(isinstance(x, MLALayer) for x in spec.layers):
        return get_engine(name, block_size=VLLM_MLA_BLOCK_SIZE), (
            f"vLLM uses {VLLM_MLA_BLOCK_SIZE}-token blocks for MLA models (FlashMLA); --block-size overrides")
    return get_engine(name, block_size=block_size), None


__all__ = ["ENGINES", "Engine", "engine_for", "get_engine"]
