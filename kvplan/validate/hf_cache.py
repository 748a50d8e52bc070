"""Measure what transformers' DynamicCache really holds, byte for byte, on tiny random-weight models.

This is the ground truth for the ``hf`` engine: build ``AutoModelForCausalLM.from_config`` (random
weights, the config's real layer structure), prefill, decode, then add up the bytes of every distinct
tensor storage the cache references (views share a storage, so storages are counted once each).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan.validate import require_torch


@dataclass(frozen=True, kw_only=True)
class CacheMeasurement:
    total_bytes: int
    per_layer_bytes: tuple[int, ...]


def _storages(obj: Any, seen: set[int], out: list[int]) -> int:
    """Bytes of storages reachable from obj (tensors, lists, tuples, dicts) not yet seen."""
    import torch

    if isinstance(obj, torch.Tensor):
        if obj.numel() == 0 and obj.untyped_storage().nbytes() == 0:
            return 0
        storage = obj.untyped_storage()
        key = storage.data_ptr()
        if key in seen:
            return 0
        seen.add(key)
        return storage.nbytes()
    if isinstance(obj, dict):
        return sum(_storages(v, seen, out) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_storages(v, seen, out) for v in obj)
    return 0


def cache_storage_bytes(cache: Any) -> CacheMeasurement:
    """Distinct storage bytes held by each layer of a transformers Cache (and, for a model that keeps its
    linear-attention states beside the cache layers, as MiniMax's ``MiniMaxCache.linear_cache`` does, those
    too, at the same layer index)."""
    seen: set[int] = set()
    per_layer = []
    linear = getattr(cache, "linear_cache", None) or []
    for i in range(max(len(cache.layers), len(linear))):
        held = 0
        # keys/values, linear-attention states, DSA indexer keys (DynamicIndexedLayer) and DeepSeek-V4's
        # compressor state (DeepseekV4HCACache/CSACache: dicts of tensors)
        if i < len(cache.layers):
            for attr in ("keys", "values", "conv_states", "recurrent_states", "indexer_keys", "compressed_kv",
                         "buffer_kv", "buffer_gate", "overlap_kv", "overlap_gate"):
                held += _storages(getattr(cache.layers[i], attr, None), seen, [])
        if i < len(linear):
            held += _storages(linear[i], seen, [])
        per_layer.append(held)
    return CacheMeasurement(total_bytes=sum(per_layer), per_layer_bytes=tuple(per_layer))


# Model types whose modeling file builds a cache class of its own and refuses a DynamicCache
# (transformers v5.23 models/minimax/modeling_minimax.py: MiniMaxModel.forward creates MiniMaxCache).
_OWN_CACHE_TYPES = frozenset({"minimax"})


def build_model(config_dict: dict[str, Any], *, dtype: str = "float32", seed: int = 0) -> Any:
    """A random-weight causal LM from a config dict (no download, no remote code)."""
    require_torch()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    cfg = {k: v for k, v in config_dict.items() if not k.startswith("_")}
    # random weights in the requested dtype: a checkpoint's quantization scheme does not apply
    for key in ("quantization_config", "auto_map", "architectures"):
        cfg.pop(key, None)
    model_type = cfg.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg)
    torch.manual_seed(seed)
    try:
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    except ValueError:
        # multimodal wrappers with no causal-LM class (Kimi-K2.5's kimi_k25): the image-text model, whose text
        # model holds the cache (it decodes from input_ids alone)
        model = AutoModelForImageTextToText.from_config(config, dtype=getattr(torch, dtype))
    return model.eval()


def cache_kwarg(model: Any) -> str:
    """The keyword the model's forward takes its cache by: ``cache`` from transformers 5.24 (``past_key_values`` is
    deprecated there and warns on every call: utils/generic.py), ``past_key_values`` before."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def output_cache(out: Any) -> Any:
    """The cache a forward returned (``out.cache`` from 5.24, ``out.past_key_values`` before)."""
    return out.cache if "cache" in out else out.past_key_values


def measure_decode(model: Any, *, batch: int, prompt_len: int, seq_len: int, seed: int = 0,
                   device: str = "cpu") -> CacheMeasurement:
    """Prefill ``prompt_len`` tokens, decode one token at a time up to ``seq_len`` tokens in the cache,
    and measure the cache storage. ``seq_len`` must exceed ``prompt_len`` (measured after a decode step).
    """
    import torch
    from transformers import DynamicCache

    if seq_len <= prompt_len:
        raise ValueError("seq_len must exceed prompt_len: the cache is measured after a decode step")
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (batch, prompt_len), generator=gen).to(device)
    own = model.config.get_text_config().model_type in _OWN_CACHE_TYPES
    cache = None if own else DynamicCache(config=model.config)  # None: the model creates its own
    key = cache_kwarg(model)
    with torch.no_grad():
        out = model(input_ids=ids, **{key: cache}, use_cache=True)
        cache = output_cache(out)
        for _ in range(seq_len - prompt_len):
            nxt = out.logits[:, -1:].argmax(-1)
            out = model(input_ids=nxt, **{key: cache}, use_cache=True)
            cache = output_cache(out)
    return cache_storage_bytes(cache)
