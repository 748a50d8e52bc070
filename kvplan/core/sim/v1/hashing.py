"""Block hashes of a request's tokens, from its segments.

vLLM hashes each full block of ``hash_block_size`` tokens as a chain: hash(parent hash, the block's token
ids) (vllm/v1/core/kv_cache_utils.py::hash_block_tokens, Request.update_block_hashes), so two requests
share a block's hash exactly when their tokens are equal from the first token through that block.
The request sets give tokens as segments whose i-th token is a function of (segment id, i) only, so a
block's tokens are identified by the pieces of segments it covers: (segment id, offset) for a block
inside one segment, (id, offset, length, ...) for a block across a boundary. The key of block j is
the hash of (key of block j - 1, those pieces), its sign bit cleared: per block, never per token.
Python's hash of a tuple of ints is deterministic (PYTHONHASHSEED randomises only str/bytes); a 63-bit
collision is as unlikely as one of vLLM's own hashes.

A request whose first segment no other request starts with shares no block with any other request: every block's
tokens from the first token on begin with that segment. Its keys need not be hashed: ``PrivateKeys`` numbers its
blocks (row, j) below zero, where no hashed key lies, so they equal its own keys of a run before a preemption and
no other request's, as the chained hashes would (a workload of ShareGPT-like requests is all such requests).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

ROOT_KEY = 0x5EED  # the parent of the first block (vLLM: NONE_HASH)
MASK = (1 << 63) - 1  # a hashed key is hash() & MASK, at or above zero: a private key (below zero) meets none
DEAD = -1  # the key of a finished private request's filed block: hashed, in no map (no request can hit it)


def shared_firsts(firsts: Sequence[int]) -> set[int]:
    """The first-segment ids that more than one request starts with (none where they rise, as generated rows'
    do: one pass without a copy)."""
    if all(a < b for a, b in zip(firsts, islice(firsts, 1, None))):
        return set()
    ordered = sorted(firsts)
    return {a for a, b in zip(ordered, islice(ordered, 1, None)) if a == b}


class PrivateKeys:
    """BlockHasher's keys for a request that shares no block (its first segment its own): block j of row i is
    -(i + 1) * 2**32 + j (j < 2**32 - 1: never DEAD), without hashing; ``keys`` is a range, not a list."""

    __slots__ = ("base", "h", "n")

    def __init__(self, row: int, h: int) -> None:
        self.base = -((row + 1) << 32)
        self.h = h
        self.n = 0  # full blocks keyed

    @property
    def keys(self) -> range:
        return range(self.base, self.base + self.n)

    def extend(self, num_tokens: int) -> None:
        """Key every full block of the first ``num_tokens`` tokens."""
        need = num_tokens // self.h
        if need > self.n:
            self.n = need


class BlockHasher:
    """Keys of the full ``h``-token blocks of one request's known tokens, extended as tokens are added."""

    __slots__ = ("h", "keys", "n", "seg_i", "seg_off", "segs")

    def __init__(self, segments: list[tuple[int, int]], h: int) -> None:
        self.segs = [s for s in segments if s[1] > 0]  # prompt segments then the output segment
        self.h = h
        self.keys: list[int] = []
        self.n = 0  # len(keys): the full blocks keyed
        self.seg_i = 0  # where the next block starts
        self.seg_off = 0

    def extend(self, num_tokens: int) -> None:
        """Key every full block of the first ``num_tokens`` tokens."""
        h, keys, segs = self.h, self.keys, self.segs
        need = num_tokens // h
        have = len(keys)
        if have >= need:
            return
        if have + 1 == need:  # one more block, most often inside one segment (a decode's)
            seg, n = segs[self.seg_i]
            off = self.seg_off
            if n - off >= h:
                keys.append(hash((keys[-1] if have else ROOT_KEY, seg, off)) & MASK)
                off += h
                if off == n:
                    self.seg_i += 1
                    off = 0
                self.seg_off = off
                self.n = need
                return
        prev = keys[-1] if keys else ROOT_KEY
        i, off = self.seg_i, self.seg_off
        while len(keys) < need:
            seg, n = segs[i]
            if n - off >= h:  # inside one segment
                prev = hash((prev, seg, off)) & MASK
                off += h
                if off == n:
                    i, off = i + 1, 0
            else:
                pieces = [prev]
                left = h
                while left:
                    seg, n = segs[i]
                    take = min(left, n - off)
                    if take:
                        pieces += (seg, off, take)
                    left -= take
                    off += take
                    if off == n:
                        i, off = i + 1, 0
                prev = hash(tuple(pieces)) & MASK
            keys.append(prev)
        self.seg_i, self.seg_off = i, off
        self.n = need
