"""The RoPE cos/sin caches vLLM allocates while it loads a model, read from config.json.

vLLM 0.19.0 (``vllm/model_executor/layers/rotary_embedding/``): ``get_rope`` builds one ``RotaryEmbedding`` per
distinct (head size, rotary dim, max_position, rope parameters, dtype) and shares it across layers
(``_ROPE_DICT``); each registers ``cos_sin_cache``, positions x rotary_dim in the model dtype
(``base.py::RotaryEmbedding.__init__``, ``cache.to(dtype)``), a buffer on every GPU that "Model loading took"
includes. Its positions, by ``rope_type`` (``__init__.py::get_rope`` and each class's ``_compute_cos_sin_cache``):

- default, ``llama3``, ``mrope``: ``max_position_embeddings``;
- ``linear``, ``dynamic``: ``max_position_embeddings`` x factor (``linear_scaling_rope.py``,
  ``dynamic_ntk_scaling_rope.py``: "the original max position" times the factor);
- ``yarn``, ``deepseek_yarn``: ``original_max_position_embeddings`` x factor (``yarn_scaling_rope.py``,
  ``deepseek_scaling_rope.py``).

The rotary dim is the head dim times ``partial_rotary_factor`` (MLA: ``qk_rope_head_dim``). Gemma 3's sliding
layers take a second, unscaled RoPE at ``rope_local_base_freq`` (``gemma3.py::Gemma3Attention``). Models
without RoPE (learned or ALiBi positions) have none. Measured: Llama-3.1-8B's 32 MiB is the -0.03 GiB kvplan's
weights missed on the llm-d-planner 0.19.0 starts; Llama 4 Scout's 10,485,760 positions make 2.5 GiB a GPU.
"""

from __future__ import annotations

from typing import Any

from kvplan.core.spec import AttentionLayer, Layer, MLALayer

# Families whose positions are not rotary: learned absolute (GPT-2, OPT, BigCode), ALiBi (BLOOM, MPT)
NO_ROPE = frozenset({"gpt2", "opt", "bloom", "mpt", "gpt_bigcode", "jais"})


def _params(cfg: dict[str, Any]) -> dict[str, Any]:
    """The rope parameters, as transformers 4.x (``rope_scaling``) or 5.x (``rope_parameters``) spells them."""
    for key in ("rope_parameters", "rope_scaling"):
        value = cfg.get(key)
        if isinstance(value, dict):
            return value
    return {}


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else default


def _positions(cfg: dict[str, Any], params: dict[str, Any]) -> int:
    """The cache's rows for one RoPE instance (the module docstring's rules)."""
    max_pos = int(_number(cfg.get("max_position_embeddings"), 0))
    kind = str(params.get("rope_type") or params.get("type") or "default")
    factor = _number(params.get("factor"), 1.0)
    if kind in ("linear", "dynamic"):
        return int(max_pos * factor)
    if kind in ("yarn", "deepseek_yarn"):
        original = int(_number(params.get("original_max_position_embeddings"), max_pos))
        return int(original * factor)
    return max_pos


def _rotary_dim(cfg: dict[str, Any], layers: tuple[Layer, ...]) -> int:
    mla = next((x for x in layers if isinstance(x, MLALayer)), None)
    if mla is not None:
        return mla.qk_rope_head_dim
    attn = next((x for x in layers if isinstance(x, AttentionLayer)), None)
    if attn is None:
        return 0
    factor = _number(cfg.get("partial_rotary_factor", cfg.get("rotary_pct")), 1.0)
    return int(attn.k_head_dim * min(factor, 1.0))


def rope_cache_elems(cfg: dict[str, Any], model_type: str, layers: tuple[Layer, ...]) -> int:
    """Elements of the cos/sin caches one GPU holds (0: no RoPE, or a config that does not say enough)."""
    if model_type in NO_ROPE or cfg.get("position_embedding_type") in ("absolute", "alibi") or cfg.get("alibi"):
        return 0
    rot = _rotary_dim(cfg, layers)
    if not rot or not cfg.get("max_position_embeddings"):
        return 0
    params = _params(cfg)
    elems = _positions(cfg, params) * rot
    if model_type in ("gemma3", "gemma3_text") and any(isinstance(x, AttentionLayer) and x.window for x in layers):
        elems += int(_number(cfg.get("max_position_embeddings"), 0)) * rot  # the sliding layers' unscaled RoPE
    return elems
