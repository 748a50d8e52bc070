"""Readers for architectures whose cache layout the generic reader in ``kvplan.io.hf_config`` cannot
describe: each module names the ``model_type`` values it reads and returns the layers (and, where the
generic weight count does not fit, the architecture shape).

A module defines ``MODEL_TYPES`` (a tuple of config ``model_type`` values), ``layers(cfg, model_type,
*, hidden, num_heads, notes) -> list[Layer]`` and optionally ``arch(cfg, model_type, *, layers, hidden)
-> ArchShape | None``. ``cfg`` is hf_config's typed reader (every read checked and bounded).
"""

from __future__ import annotations

import importlib
from types import ModuleType

# Module per group of families; imported only when a config of one of its model types is read, so
# the model types are listed here (each module's MODEL_TYPES must equal its entry; tested).
_MODULE_TYPES: dict[str, tuple[str, ...]] = {
    # MLA with sparse-attention indexers and MLA descendants
    "kvplan.io.families.mla": ("deepseek_v32", "glm_moe_dsa", "longcat_flash", "kimi_k2", "deepseek_v4"),

    # hybrids of attention with linear-attention / state-space mixers
    "kvplan.io.families.hybrid": (
        "kimi_linear", "minimax", "minimax_text_01", "minimax_m1", "nemotron_h", "granitemoehybrid", "bamba",
        "falcon_h1", "lfm2", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text",
    ),

    # softmax attention with per-layer shapes and cross-layer KV sharing
    "kvplan.io.families.attention": ("gemma4", "gemma4_text", "gemma3n", "gemma3n_text", "olmo3", "seed_oss",
                                     "hunyuan_v1_moe", "hunyuan_v1_dense", "hunyuan", "minimax_m2", "glm4_moe"),
}


FAMILY_TYPES: frozenset[str] = frozenset(t for types in _MODULE_TYPES.values() for t in types)


def family_module(model_type: str) -> ModuleType | None:
    """The family module that reads ``model_type``, or None for the generic reader."""
    for module, types in _MODULE_TYPES.items():
        if model_type in types:
            return importlib.import_module(module)
    return None
