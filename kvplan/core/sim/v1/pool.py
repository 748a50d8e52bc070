"""vLLM v1's block pool: free queue order, the null block, prefix-cache map and eviction.

vllm/v1/core/block_pool.py (0.33.0), class BlockPool, and kv_cache_utils.py::FreeKVCacheBlockQueue:
- block 0 is popped from the free queue at start-up and becomes the null block: never handed out,
  its ref count not kept (BlockPool.__init__);
- the queue starts in block-id order; ``free_blocks`` prepends blocks without a hash (reused first,
  LIFO) and appends hashed blocks (evicted last, in the order freed: LRU); ``get_new_blocks`` pops
  from the front and drops the hash of a cached block it pops (``_maybe_evict_cached_block``);
  ``touch`` takes a ref-0 cached block out of the queue (a prefix hit).
So every unhashed free block sits ahead of every hashed one: the queue is modelled as a deque of
unhashed blocks followed by a deque of hashed ones, which gives the same blocks in the same order with O(1)
operations; a hashed block taken out of the middle (a hit) stays in its deque as a stale copy, counted in
``stale`` and skipped when the front reaches it (a block's copies are stale but its newest while it is free,
all of them while it is held); once the stale copies outnumber the blocks the deque is rebuilt without them.
Before 0.24.0 (SchedulerRules.free_order) freed blocks were appended whether hashed or not
(``free(..., unhashed_first=False)``): they go to the second deque, behind the deque of blocks never used or
prepended, and a block taken from it loses its hash only if it has one.
- a finished private request's filed blocks (KVCacheManager._file_deferred) are hashed under DEAD, in no map;
- the cache map keeps every block cached under a hash; ``get_one_block`` returns the first inserted
  (BlockHashToBlockMap: a hash may map to several blocks, duplicates are not merged).
- usage = 1 - free / (num_blocks - 1) (``get_usage``; free counts evictable cached blocks).
"""

from __future__ import annotations

from collections import deque

from kvplan.core.sim.v1.hashing import DEAD


class BlockPool:
    __slots__ = ("cached_free", "caches", "caching", "evicted", "group", "key", "n_cached", "n_stale", "num_blocks",
                 "plain", "ref", "stale")

    def __init__(self, num_blocks: int, caching: bool, num_groups: int = 1) -> None:
        self.num_blocks = num_blocks
        self.ref = [0] * num_blocks
        self.key: list[int | None] = [None] * num_blocks  # the prefix key a cached block is filed under
        self.group = [0] * num_blocks  # ... in this group's map
        self.plain: deque[int] = deque(range(1, num_blocks))  # free, unhashed, front first
        self.cached_free: deque[int] = deque()  # free, hashed, LRU first (with stale copies: cached_order)
        self.stale = [0] * num_blocks  # per block, its copies in cached_free that are stale (it was hit since)
        self.n_cached = 0  # the blocks in cached_free
        self.n_stale = 0  # the stale copies in it (dropped once there are more than blocks: ``touch``)
        # per group: key -> block (or blocks, first inserted first)
        self.caches: list[dict[int, int | list[int]]] = [{} for _ in range(num_groups)]
        self.evicted = 0  # cached blocks whose hash was dropped to reuse them
        self.caching = caching

    @property
    def num_free(self) -> int:
        return len(self.plain) + self.n_cached

    def cached_order(self) -> list[int]:
        """The hashed free blocks, first evicted first."""
        skip, out = self.stale.copy(), []
        for b in self.cached_free:
            if skip[b]:
                skip[b] -= 1
            else:
                out.append(b)
        return out

    def take_cached(self) -> int:
        """The front hashed free block, out of the queue, its hash dropped (_maybe_evict_cached_block); the caller
        sets its reference count (get_new, and KVCacheManager.grow_one where no unhashed block is free)."""
        cached, stale = self.cached_free, self.stale
        b = cached.popleft()
        while stale[b]:
            stale[b] -= 1
            self.n_stale -= 1
            b = cached.popleft()
        self.n_cached -= 1
        k = self.key[b]
        if k is not None:  # blocks freed unhashed to the back before 0.24.0 have none
            if k == DEAD:
                self.key[b] = None
            else:
                self._drop_hash(b)
            self.evicted += 1
        return b

    def usage(self) -> float:
        total = self.num_blocks - 1
        return 1.0 - self.num_free / total if total else 0.0

    def get_new(self, n: int) -> list[int]:
        """n blocks from the front of the free queue, each with ref 1 (caller checked num_free)."""
        plain, ref = self.plain, self.ref
        out = []
        take = min(n, len(plain))
        for _ in range(take):
            b = plain.popleft()
            ref[b] = 1
            out.append(b)
        for _ in range(n - take):
            b = self.take_cached()
            ref[b] = 1
            out.append(b)
        return out

    def _drop_hash(self, b: int) -> None:
        k = self.key[b]
        self.key[b] = None
        cache = self.caches[self.group[b]]
        held = cache.get(k)  # type: ignore[arg-type]
        if held == b:
            del cache[k]  # type: ignore[arg-type]
        elif isinstance(held, list):
            held.remove(b)
            if len(held) == 1:
                cache[k] = held[0]  # type: ignore[index]

    def touch(self, blocks: list[int]) -> None:
        ref = self.ref
        for b in blocks:
            if b == 0:
                continue
            if ref[b] == 0:
                self.stale[b] += 1
                self.n_stale += 1
                self.n_cached -= 1
            ref[b] += 1
        if self.n_stale > self.num_blocks:  # a hit a request while the unhashed blocks last: keep the queue bounded
            self.cached_free = deque(self.cached_order())
            self.stale = [0] * self.num_blocks
            self.n_stale = 0

    def free(self, ordered: list[int], unhashed_first: bool = True) -> None:
        """Release one reference of each block, in eviction priority order (first evicted first); blocks
        without a hash go to the front of the queue, or with ``unhashed_first=False`` (pool::free_blocks up to
        0.22.1, a full attention group's finished blocks in 0.23.0) to the back like the hashed ones."""
        ref, key, cached = self.ref, self.key, self.cached_free
        first = []
        n = len(cached)
        for b in ordered:
            if b == 0:
                continue
            ref[b] -= 1
            if ref[b] == 0:
                if not self.caching or (key[b] is None and unhashed_first):
                    first.append(b)
                else:
                    cached.append(b)
        self.n_cached += len(cached) - n
        if first:
            self.plain.extendleft(reversed(first))

    def release_own(self, table: list[int], hashed: int, unhashed_first: bool) -> None:
        """``free`` of a table's blocks tail first, where each is held once and the first ``hashed`` have keys, the
        rest none (a private request's: KVCacheManager.free): the same queue without a test a block."""
        ref = self.ref
        for b in table:
            ref[b] = 0
        if unhashed_first:
            if hashed < len(table):
                self.plain.extendleft(table[hashed:])  # the tail first at the front
            self.cached_free.extend(reversed(table[:hashed]))
            self.n_cached += hashed
        else:
            self.cached_free.extend(reversed(table))
            self.n_cached += len(table)

    def lookup(self, g: int, k: int) -> int | None:
        held = self.caches[g].get(k)
        if held is None or held.__class__ is int:
            return held  # type: ignore[return-value]
        return held[0]  # type: ignore[index]

    def insert(self, g: int, k: int, b: int) -> None:
        """File a full block of group g under its key (BlockPool._insert_block_hash)."""
        if self.key[b] == k and self.group[b] == g:
            return
        self.key[b] = k
        self.group[b] = g
        cache = self.caches[g]
        held = cache.get(k)
        if held is None:
            cache[k] = b
        elif held.__class__ is int:
            cache[k] = [held, b]  # type: ignore[list-item]
        else:
            held.append(b)  # type: ignore[union-attr]
