"""Measure what transformers' DynamicCache really holds, byte for byte, on tiny random-weight models.

This is the ground truth for the ``hf`` engine: build ``AutoModelForCausalLM.from_config`` (random
weights, the config's real layer structure), prefill, decode, then add up the bytes of every distinct
tensor storage the cache references (views share a storage, so storages are counted once each).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from kvplan.validate import require_torch


@dataclass(frozen=True, kw_only=True)
class CacheMeasurement:
    total_bytes: int
    per_layer_bytes: tuple[int, ...]


def _storages(obj: Any, seen: set[int], depth: int = 0) -> int:
    """Bytes of the tensor storages reachable from obj (a tensor; a list, tuple or dict of them; or an object's
    attributes) that are not in ``seen`` yet. Views share their storage, so a storage counts once; it is keyed by
    its StorageImpl (``_cdata``), which, unlike ``data_ptr()``, also tells meta-device storages apart."""
    import torch

    if isinstance(obj, torch.Tensor):
        if obj.dim() == 0:  # bookkeeping scalars (DynamicSlidingWindowLayer._sliding_window_tensor), not state
            return 0
        storage = obj.untyped_storage()
        if storage.nbytes() == 0 or storage._cdata in seen:
            return 0
        seen.add(storage._cdata)
        return storage.nbytes()
    if depth > 4 or obj is None or isinstance(obj, (str, bytes, int, float, bool, torch.dtype, torch.device)):
        return 0
    if isinstance(obj, dict):
        return sum(_storages(v, seen, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_storages(v, seen, depth + 1) for v in obj)
    attrs = getattr(obj, "__dict__", None)
    return sum(_storages(v, seen, depth + 1) for v in attrs.values()) if attrs else 0


def cache_storage_bytes(cache: Any) -> CacheMeasurement:
    """Distinct storage bytes held by each layer of a transformers Cache: every tensor a layer object holds (keys,
    values, linear-attention states, DSA indexer keys, DeepSeek-V4's compressor dicts...), so a layer kind kvplan
    has not seen is counted too. A model that keeps states beside the cache layers (MiniMax's
    ``MiniMaxCache.linear_cache``) has them counted at the same layer index, and anything else the cache object
    holds is added to the total (``per_layer_bytes`` then sums to less)."""
    seen: set[int] = set()
    per_layer = []
    layers = list(getattr(cache, "layers", None) or [])
    linear = list(getattr(cache, "linear_cache", None) or [])
    for i in range(max(len(layers), len(linear))):
        held = _storages(layers[i], seen) if i < len(layers) else 0
        if i < len(linear):
            held += _storages(linear[i], seen)
        per_layer.append(held)
    rest = _storages(cache, seen)  # a cache without per-layer objects (or tensors kept beside them)
    return CacheMeasurement(total_bytes=sum(per_layer) + rest, per_layer_bytes=tuple(per_layer))


# Model types whose modeling file builds a cache class of its own and refuses a DynamicCache
# (transformers v5.23 models/minimax/modeling_minimax.py: MiniMaxModel.forward creates MiniMaxCache).
_OWN_CACHE_TYPES = frozenset({"minimax"})


_SPECIAL_FLOATS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def _special_floats(value: Any) -> Any:
    """A config.json value as transformers reads it: since 5.x ``to_json_string`` writes inf and NaN as
    ``{"__float__": "Infinity"}`` (configuration_utils.py, ``_encode_special_floats``) and its JSON loading turns
    them back into floats (Mamba-2's ``time_step_limit`` is ``[0.0, Infinity]`` by default)."""
    if isinstance(value, dict):
        if len(value) == 1 and value.get("__float__") in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[value["__float__"]]
        return {k: _special_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_special_floats(v) for v in value]
    return value


def build_model(config_dict: dict[str, Any], *, dtype: str = "float32", seed: int = 0, device: str = "cpu") -> Any:
    """A random-weight causal LM from a config dict (no download, no remote code); on ``device="meta"`` no weight
    is allocated at all (shapes and dtypes only)."""
    require_torch()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    cfg = {k: _special_floats(v) for k, v in config_dict.items() if not k.startswith("_")}
    # random weights in the requested dtype: a checkpoint's quantization scheme does not apply
    for key in ("quantization_config", "auto_map", "architectures"):
        cfg.pop(key, None)
    model_type = cfg.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg)
    torch.manual_seed(seed)
    with torch.device(device):
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
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def output_cache(out: Any) -> Any:
    """The cache a forward returned (``out.cache`` from 5.24, ``out.past_key_values`` before)."""
    for key in ("cache", "past_key_values"):
        if key in out:
            return out[key]
    raise ValueError(f"the model's forward returns no cache ({type(out).__name__} has none)")


def measure_decode(model: Any, *, batch: int, prompt_len: int, seq_len: int, seed: int = 0,
                   device: str = "cpu", model_makes_cache: bool = False) -> CacheMeasurement:
    """Prefill ``prompt_len`` tokens, decode one token at a time up to ``seq_len`` tokens in the cache,
    and measure the cache storage. ``seq_len`` must exceed ``prompt_len`` (measured after a decode step).
    ``model_makes_cache``: pass no cache and keep the one the model's forward makes (whatever its class).
    """
    import torch
    from transformers import DynamicCache

    if seq_len <= prompt_len:
        raise ValueError("seq_len must exceed prompt_len: the cache is measured after a decode step")
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (batch, prompt_len), generator=gen).to(device)
    own = model_makes_cache or model.config.get_text_config().model_type in _OWN_CACHE_TYPES
    cache = None if own else DynamicCache(config=model.config)  # None: the model creates its own
    key = cache_kwarg(model)
    # the prefill needs the last position's logits only (the LM head over every prompt token is most of its time)
    last = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    with torch.no_grad():
        out = model(input_ids=ids, **{key: cache}, use_cache=True, **last)
        cache = output_cache(out)
        for _ in range(seq_len - prompt_len):
            nxt = out.logits[:, -1:].argmax(-1)
            out = model(input_ids=nxt, **{key: cache}, use_cache=True)
            cache = output_cache(out)
    return cache_storage_bytes(cache)
