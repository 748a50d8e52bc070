"""What a CUDA run holds, read from torch's caching allocator around transformers' own calls.

- The KV cache of a real ``generate()``: the bytes the live tensors asked the allocator for after the call (the
  returned cache and token ids still held) less before it, less the token ids and the cache layers' 0-dim
  bookkeeping tensors; ``memory_allocated``'s rounded blocks beside it. Nothing kvplan allocates is counted.
- The peak of a prefill: ``max_memory_allocated`` over one forward of ``tokens`` prompt tokens (the logits of every
  position returned, as a plain forward returns them), less what was held before it.
- The memory pool of a decode step captured with ``torch.cuda.graph``: ``memory_reserved`` after the capture less
  before it (the graph's private pool; the step's inputs and its static cache are allocated before).

``generate_cache`` runs on any device (the CPU tests read its cache's storages); the rest needs CUDA.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

# torch's caching allocator hands out blocks in multiples of 512 bytes (c10/cuda/CUDACachingAllocator.cpp,
# kMinBlockSize); memory_allocated counts the rounded blocks.
ALLOCATOR_ROUND = 512


def allocator_bytes(nbytes: int) -> int:
    """The block the caching allocator holds for a tensor of ``nbytes`` (at least: a cached block up to 1 MiB larger
    is handed out whole, not split: CUDACachingAllocator.cpp, ``should_split``)."""
    return -(-nbytes // ALLOCATOR_ROUND) * ALLOCATOR_ROUND


def requested_bytes() -> int:
    """The bytes the live tensors asked the caching allocator for (``requested_bytes.all.current``: before the
    512-byte rounding and the slack of a reused block, which ``memory_allocated`` counts)."""
    import torch

    return int(torch.cuda.memory_stats().get("requested_bytes.all.current", torch.cuda.memory_allocated()))


def _random_ids(model: Any, batch: int, length: int, *, seed: int, device: str) -> Any:
    import torch

    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.get_text_config().vocab_size
    return torch.randint(0, vocab, (batch, length), generator=gen).to(device)


@dataclass(frozen=True, kw_only=True)
class Generated:
    cache: Any  # the cache generate() returned
    sequences: Any  # the token ids it returned (prompt and new tokens)
    cached_tokens: int  # tokens the cache holds (cache.get_seq_length())


def generate_cache(model: Any, *, batch: int, prompt_len: int, seq_len: int, seed: int = 0,
                   device: str = "cpu") -> Generated:
    """``model.generate`` over a random prompt of ``prompt_len`` tokens, greedy, until the cache holds ``seq_len``
    tokens: generate never feeds back its last token, so it makes ``seq_len - prompt_len + 1`` new ones (no stop
    token: the minimum equals the maximum and no end-of-sequence id is set)."""
    import torch
    from transformers import GenerationConfig

    if seq_len <= prompt_len:
        raise ValueError("seq_len must exceed prompt_len: the cache is measured after a decode step")
    new = seq_len - prompt_len + 1
    config = GenerationConfig(max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True,
                              eos_token_id=None, pad_token_id=0, return_dict_in_generate=True)
    ids = _random_ids(model, batch, prompt_len, seed=seed, device=device)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    cache = out.get("past_key_values") if "past_key_values" in out else out.get("cache")
    if cache is None:
        raise ValueError(f"generate() returned no cache ({type(out).__name__})")
    return Generated(cache=cache, sequences=out.sequences, cached_tokens=int(cache.get_seq_length()))


@dataclass(frozen=True, kw_only=True)
class GeneratedKV:
    requested_bytes: int  # what the cache's tensors asked the allocator for, held after generate() returned
    allocator_bytes: int  # memory_allocated held by the cache: the blocks handed out (rounded, reused blocks whole)
    storage_bytes: int  # the bytes of the cache's distinct tensor storages (the CPU measure), for comparison
    cached_tokens: int


def generate_kv(model: Any, *, batch: int, prompt_len: int, seq_len: int, seed: int = 0) -> GeneratedKV:
    """The KV cache a real ``generate()`` leaves, from the allocator. A small generate first, so that what the
    first calls allocate once and keep (cuBLAS's workspace, lazily built buffers) is not counted as cache."""
    import torch

    from kvplan.validate.hf_cache import cache_storage_bytes

    warm = generate_cache(model, batch=1, prompt_len=4, seq_len=6, seed=seed, device="cuda")
    del warm
    torch.cuda.synchronize()
    asked, blocks = requested_bytes(), torch.cuda.memory_allocated()
    done = generate_cache(model, batch=batch, prompt_len=prompt_len, seq_len=seq_len, seed=seed, device="cuda")
    torch.cuda.synchronize()
    # the prompt ids and their mask are generate_cache's locals, freed on return; the returned ids are held
    ids = done.sequences.untyped_storage().nbytes()
    scalars = _scalar_bytes(done.cache)
    return GeneratedKV(requested_bytes=requested_bytes() - asked - ids - scalars,
                       allocator_bytes=torch.cuda.memory_allocated() - blocks - allocator_bytes(ids),
                       storage_bytes=cache_storage_bytes(done.cache).total_bytes, cached_tokens=done.cached_tokens)


def _scalar_bytes(cache: Any) -> int:
    """Bytes of the 0-dim tensors a cache's layers hold for bookkeeping (transformers 5.24's sliding-window layers keep
    one int64 each): not state, and left out as the CPU measure leaves them out (hf_cache.py, ``_storages``)."""
    import torch

    return sum(v.untyped_storage().nbytes() for layer in (getattr(cache, "layers", None) or [])
               for v in vars(layer).values() if isinstance(v, torch.Tensor) and v.dim() == 0)


def prefill_peak(model: Any, *, batch: int, tokens: int, seed: int = 0) -> int:
    """The allocator's peak over one forward of ``batch`` x ``tokens`` prompt tokens with a fresh cache, less what
    was held before it: the cache it builds, its activations and the logits of every position."""
    import torch

    ids = _random_ids(model, batch, tokens, seed=seed, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    torch.cuda.empty_cache()
    return peak


def _forward_kwargs(model: Any) -> tuple[str, dict[str, Any]]:
    from kvplan.validate.hf_cache import cache_kwarg

    params = inspect.signature(model.forward).parameters
    return cache_kwarg(model), ({"logits_to_keep": 1} if "logits_to_keep" in params else {})


def decode_graph_pool(model: Any, *, batch: int, prompt_len: int, seed: int = 0) -> int:
    """The private memory pool of one decode step captured with ``torch.cuda.graph``: a static cache (transformers'
    ``StaticCache``, the one its own CUDA-graph path uses) holding ``prompt_len`` tokens, the step warmed up on a
    side stream as torch asks, then captured; the pool is the reserved memory the capture adds."""
    import torch
    from transformers import StaticCache

    key, last = _forward_kwargs(model)
    cache = StaticCache(config=model.config, max_cache_len=prompt_len + 8)
    ids = _random_ids(model, batch, prompt_len, seed=seed, device="cuda")
    with torch.no_grad():
        model(input_ids=ids, **{key: cache}, use_cache=True,
              cache_position=torch.arange(prompt_len, device="cuda"), **last)
        step = ids[:, -1:].clone()
        position = torch.tensor([prompt_len], device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                model(input_ids=step, **{key: cache}, use_cache=True, cache_position=position)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # torch.cuda.graph empties the cache as it starts: measure from there
        before = torch.cuda.memory_reserved()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(input_ids=step, **{key: cache}, use_cache=True, cache_position=position)
        torch.cuda.synchronize()
        pool = torch.cuda.memory_reserved() - before
    del out, graph, cache
    torch.cuda.empty_cache()
    return pool
