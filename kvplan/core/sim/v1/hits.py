"""The longest prefix-cache hit of a waiting request, as vLLM 0.33.0 finds it.

vllm/v1/core/kv_cache_coordinator.py: ``find_longest_cache_hit`` of the Unitary coordinator (one spec) and of the
Hybrid one (groups of one spec looked up together, full attention first, then the fixed point over the kinds:
each kind may shorten the hit, until none does); single_type_kv_cache_manager.py: per kind, full attention left
to right, sliding window right to left for cdiv(W - 1, B) contiguous blocks, chunked local attention every block
before the current chunk computed (null). Hits stop at num_tokens - 1 (the last token is always recomputed).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvplan.core.sim.v1.inputs import FULL, SLIDING, CacheLayout
from kvplan.core.sim.v1.pool import BlockPool


class SpecGroup:
    """Groups of one spec, looked up together (HybridKVCacheCoordinator.verify_and_split_kv_cache_groups)."""

    __slots__ = ("block_size", "ids", "kind", "window")

    def __init__(self, kind: int, block_size: int, window: int, ids: list[int]) -> None:
        self.kind, self.block_size, self.window, self.ids = kind, block_size, window, ids


def spec_groups(layout: CacheLayout) -> list[SpecGroup]:
    """The layout's groups by spec, full attention first (the order of the groups otherwise kept)."""
    by_spec: dict[tuple[int, int, int], list[int]] = {}
    for gi, g in enumerate(layout.groups):
        by_spec.setdefault((g.kind, g.block_size, g.window), []).append(gi)
    specs = [SpecGroup(k, b, w, ids) for (k, b, w), ids in by_spec.items()]
    specs.sort(key=lambda s: s.kind != FULL)  # (stable)
    return specs


def longest_hit(pool: BlockPool, specs: list[SpecGroup], num_groups: int, keys: Sequence[int],
                max_len: int) -> tuple[list[list[int]], int]:
    """The blocks of each group that hit, and the tokens they hold, of a request whose block keys are ``keys``
    (a list, or a private request's range), at most ``max_len`` tokens."""
    hits: list[list[int] | None] = [None] * num_groups
    lens = [0] * num_groups
    if len(specs) == 1:  # UnitaryKVCacheCoordinator, or groups of one spec
        sg = specs[0]
        blocks, hit = _find(pool, sg, keys, max_len)
        for gi, bl in zip(sg.ids, blocks):
            hits[gi] = bl
        return hits, hit  # type: ignore[return-value]
    hit_len = max_len
    simple = len(specs) == 2 and specs[0].kind == FULL
    while True:
        curr = hit_len
        for sg in specs:
            first = sg.ids[0]
            if sg.kind == FULL and hits[first] is not None:
                curr = min(curr, lens[first])
                continue
            blocks, curr = _find(pool, sg, keys, curr)
            for gi, bl in zip(sg.ids, blocks):
                hits[gi], lens[gi] = bl, curr
        if curr >= hit_len:
            break
        hit_len = curr
        if simple:
            break
    for sg in specs:
        if sg.kind == FULL:
            keep = -(-hit_len // sg.block_size)
            for gi in sg.ids:
                del hits[gi][keep:]  # type: ignore[index]
    return [h if h is not None else [] for h in hits], hit_len


def _find(pool: BlockPool, sg: SpecGroup, keys: Sequence[int], max_len: int) -> tuple[list[list[int]], int]:
    """find_longest_cache_hit of one spec's manager; blocks per group of the spec, hit tokens."""
    lookup = pool.lookup
    ids, b = sg.ids, sg.block_size
    max_blocks = max_len // b
    out: list[list[int]] = [[] for _ in ids]
    if sg.kind == FULL and len(ids) == 1:  # the common case, without a list a block
        cache, o = pool.caches[ids[0]], out[0]
        for j in range(min(max_blocks, len(keys))):
            held = cache.get(keys[j])
            if held is None:
                break
            o.append(held if held.__class__ is int else held[0])  # type: ignore[index]
        return out, len(o) * b
    if sg.kind == FULL:
        _extend_hits(pool, out, ids, keys, 0, min(max_blocks, len(keys)))
        return out, len(out[0]) * b
    if sg.kind == SLIDING:
        need = -(-(sg.window - 1) // b)
        out = [[0] * max_blocks for _ in ids]
        run = 0
        found = False
        for i in range(max_blocks - 1, -1, -1):
            k = keys[i]
            got = [lookup(gi, k) for gi in ids]
            if None in got:
                run = 0
                continue
            for o, blk in zip(out, got):
                o[i] = blk  # type: ignore[call-overload]
            run += 1
            if run >= need:
                for o in out:
                    del o[i + run:]
                found = True
                break
        if not found:
            for o in out:
                del o[run:]
        return out, len(out[0]) * b
    # chunked local attention: every block before the current chunk is computed (null)
    start = (max_len // sg.window * sg.window) // b if max_len > 0 else 0
    out = [[0] * start for _ in ids]
    _extend_hits(pool, out, ids, keys, start, min(max_blocks, len(keys)))
    return out, len(out[0]) * b


def _extend_hits(pool: BlockPool, out: list[list[int]], ids: list[int], keys: Sequence[int], start: int,
                 stop: int) -> None:
    """Append to each group's list the blocks cached under keys[start:stop], up to the first key some group
    of the spec misses (a hit must hold in every group: full and chunked-local managers)."""
    lookup = pool.lookup
    for j in range(start, stop):
        k = keys[j]
        got = [lookup(gi, k) for gi in ids]
        if None in got:
            break
        for o, blk in zip(out, got):
            o.append(blk)  # type: ignore[arg-type]
