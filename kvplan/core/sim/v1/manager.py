"""vLLM v1's KV cache manager over one block pool shared by KV cache groups (0.33.0).

Sources, vllm/v1/core/:
- kv_cache_manager.py::KVCacheManager.allocate_slots: the full-prompt admission gate (scheduler_reserve_full_isl,
  recycling kinds capped at max_admission_blocks_per_request), then remove_skipped_blocks, the block count,
  the watermark (waiting requests only, when something runs), adopting prefix-hit blocks, new blocks,
  caching the full blocks up to min(computed + new, num_tokens); ``get_computed_blocks``: hits stop at
  num_tokens - 1 (the last token is always recomputed).
- kv_cache_coordinator.py: ``free`` group by group (``find_longest_cache_hit``: hits.py).
- single_type_kv_cache_manager.py: ``get_num_blocks_to_allocate`` (a running request needs cdiv(n, B) - held;
  a new one needs the blocks past max(skipped, hit) plus the evictable hit blocks), ``remove_skipped_blocks``
  (freed back to front until a null block), ``get_num_skipped_tokens`` per kind (sliding: n - W + 1,
  chunked local: n // C * C), ``free`` (tail first); ``find_longest_cache_hit`` per kind is in hits.py.
  Mamba with mamba_cache_mode "none" holds 1 + speculative blocks a request (block_size = max_model_len).
Sync scheduling: no tokens are in flight when a step is scheduled, so blocks are freed on the computed count.
Earlier releases (SchedulerConfig.rules, kvplan.core.engines.vllm.scheduler_rules): no admission gate before
0.19.0, sliding/chunked groups uncapped in it in 0.19.x and capped in every block count in 0.20.0-0.20.1,
the cap on max_num_batched_tokens and window frees on the computed tokens before 0.26.0, freed blocks
appended to the free queue before 0.24.0 (sliding-window frees prepended in 0.23.0).
Not modelled: Mamba "align" mode (prefix caching on hybrid linear models), partial-block hits
(hash_block_size < block_size), EAGLE/MTP drops, cross-attention, encoder inputs.
"""

from __future__ import annotations

from math import lcm

from kvplan.core.engines.vllm.scheduler_rules import FreeOrder, WindowCap
from kvplan.core.sim.v1.hashing import DEAD
from kvplan.core.sim.v1.hits import SpecGroup, longest_hit, spec_groups
from kvplan.core.sim.v1.inputs import CHUNKED, FULL, MAMBA, SLIDING, CacheLayout, SchedulerConfig
from kvplan.core.sim.v1.pool import BlockPool
from kvplan.core.sim.v1.shares import Books
from kvplan.core.sim.v1.state import ReqState
from kvplan.errors import InputError


class KVCacheManager:
    def __init__(self, layout: CacheLayout, sched: SchedulerConfig) -> None:
        self.groups = layout.groups
        self.kinds = [g.kind for g in layout.groups]
        self.sizes = [g.block_size for g in layout.groups]
        self.windows = [g.window for g in layout.groups]
        self.state_blocks = [g.state_blocks for g in layout.groups]
        self.caching = sched.enable_prefix_caching
        self.pool = BlockPool(layout.num_blocks, self.caching, len(layout.groups))
        self.mml = sched.max_model_len
        self._init_books(layout)
        rules = sched.rules
        # vllm/config/vllm.py::VllmConfig.max_in_flight_tokens: a budget per batch in flight (max_concurrent_batches:
        # two with async scheduling, pp or pp + 1 with pipeline stages); one batch's budget before 0.26.0
        in_flight = sched.max_num_batched_tokens * (sched.batches_in_flight if rules.window_cap_in_flight else 1)
        self.caps = [g.admission_cap_blocks(in_flight, self.mml) for g in layout.groups]
        self.watermark_blocks = int(sched.watermark * layout.num_blocks)
        self.reserve_full_isl = sched.reserve_full_isl and rules.full_sequence_gate  # the gate: 0.19.0
        self.gate_capped = rules.window_cap is not WindowCap.NONE  # 0.20.0
        self.always_capped = rules.window_cap is WindowCap.EVERY_ALLOCATION  # 0.20.0-0.20.1
        self.frees_processed = rules.window_frees_processed  # 0.26.0
        self.recycling = [gi for gi, k in enumerate(self.kinds) if k in (SLIDING, CHUNKED)]
        # where unhashed freed blocks go (the order only matters with prefix caching: block ids otherwise)
        order = rules.free_order
        self.skipped_unhashed_first = order is not FreeOrder.APPEND  # remove_skipped_blocks, 0.23.0
        self.finished_unhashed_first = [order is FreeOrder.UNHASHED_FIRST
                                        or (order is FreeOrder.WINDOW_UNHASHED_FIRST and k == SLIDING)
                                        for k in self.kinds]
        self.hash_block = 0
        self.spec_groups: list[SpecGroup] = []
        if self.caching:
            if MAMBA in self.kinds:
                raise InputError("prefix caching on a model with Mamba/linear-attention layers (vLLM's "
                                 "mamba_cache_mode align) is not modelled; disable enable_prefix_caching")
            if len(set(self.sizes)) != 1:
                raise InputError(f"prefix caching with groups of different block sizes {sorted(set(self.sizes))} "
                                 "(partial-block hashes) is not modelled; set sharing.prefix_caching: false to "
                                 "simulate without it")
            self.hash_block = self.sizes[0]
            self.spec_groups = spec_groups(layout)
        # One full-attention group: a private request's blocks (kvplan.core.sim.v1.hashing.PrivateKeys) are filed
        # when it frees them, not as they fill (``_file_deferred``): only it can hit them, and only once preempted.
        # The scheduler turns this off where a CPU tier reads the keys.
        self.deferred = self.caching and self.kinds == [FULL]

    def _init_books(self, layout: CacheLayout) -> None:
        """The memory books (kvplan.core.sim.v1.shares): a pool block is ``unit`` units, a slot of a group of block
        size B unit / B; ``entries``: the table entries (null ones included) in token-slot groups of the requests
        holding blocks; ``internal``: their units no token will fill. A Mamba group's state is not token slots:
        such a pool is not measured."""
        sizes = [b for b, k in zip(self.sizes, self.kinds) if k != MAMBA]
        unit = lcm(*sizes) if sizes else 1
        self.units = [unit // b if k != MAMBA else 0 for b, k in zip(self.sizes, self.kinds)]
        # the null block is never handed out: the pool is num_blocks - 1 blocks, what pool.num_free counts
        self.books = Books(unit=unit, weight=sum(self.units), pool_units=(layout.num_blocks - 1) * unit,
                           capacity=layout.num_blocks - 1, measured=MAMBA not in self.kinds)
        self.entries = self.internal = 0
        self.ext = 0  # external fragmentation: none in a paged pool

    # -- per-kind rules ---------------------------------------------------------------------------
    def skipped_tokens(self, gi: int, n: int) -> int:
        """SingleTypeKVCacheManager.get_num_skipped_tokens of group gi's kind."""
        k = self.kinds[gi]
        if k == SLIDING:
            return max(0, n - self.windows[gi] + 1)
        if k == CHUNKED:
            return n // self.windows[gi] * self.windows[gi]
        return 0  # full attention; Mamba frees (n - 1) // max_model_len = 0 blocks

    def required(self, gi: int, n: int) -> int:
        if self.kinds[gi] == MAMBA:
            return self.state_blocks[gi]
        return -(-n // self.sizes[gi])

    # -- prefix hits ---------------------------------------------------------------------------------
    def find_hit(self, r: ReqState) -> tuple[list[list[int]] | None, int]:
        """The longest prefix-cache hit of a waiting request (KVCacheManager.get_computed_blocks)."""
        if not self.caching:
            return None, 0
        if r.private and r.num_preemptions == 0:  # nothing filed under its keys yet (one full-attention group:
            return [[]], 0  # a chunked group's nulls before the current chunk would count as a hit)
        return longest_hit(self.pool, self.spec_groups, len(self.groups), r.hasher.keys,  # type: ignore[union-attr]
                           r.num_tokens - 1)

    # -- allocation ------------------------------------------------------------------------------------
    def _to_allocate(self, r: ReqState, n: int, hits: list[list[int]] | None, total: int, cap: bool) -> int:
        """Blocks the pool must hand out (coordinator.get_num_blocks_to_allocate)."""
        need = 0
        ref = self.pool.ref
        for gi in range(len(self.groups)):
            req = self.required(gi, n)
            if cap and self.caps[gi] is not None and req > self.caps[gi]:  # type: ignore[operator]
                req = self.caps[gi]  # type: ignore[assignment]
            held = len(r.blocks[gi])
            if r.tracked:
                need += max(req - held, 0)
                continue
            hit = hits[gi] if hits else ()
            skipped = self.skipped_tokens(gi, total) // self.sizes[gi] if self.kinds[gi] != MAMBA else 0
            need += max(req - max(skipped, len(hit) + held), 0)
            for blk in hit[max(0, skipped - held):]:
                if blk and ref[blk] == 0:
                    need += 1
        return need

    def remove_skipped(self, r: ReqState, computed: int) -> None:
        """Free the blocks attention no longer reads, back to front, as null blocks (remove_skipped_blocks);
        note the computed count at which the next block falls behind a window."""
        nxt = 1 << 62
        for gi in self.recycling:
            blocks = r.blocks[gi]
            b, w = self.sizes[gi], self.windows[gi]
            skipped = self.skipped_tokens(gi, computed) // b
            # sliding: (c - w + 1) // b > skipped from c = (skipped + 1) * b + w - 1; chunked: c // w * w reaches
            # (skipped + 1) * b at the next multiple of w
            at = (skipped + 1) * b + w - 1 if self.kinds[gi] == SLIDING else -(-((skipped + 1) * b) // w) * w
            nxt = min(nxt, at)
            i = min(skipped, len(blocks)) - 1
            if i < 0 or blocks[i] == 0:
                continue
            freed = []
            while i >= 0 and blocks[i] != 0:
                freed.append(blocks[i])
                blocks[i] = 0
                i -= 1
            self.pool.free(freed, self.skipped_unhashed_first)
        r.next_free_at = nxt

    def allocate_slots(self, r: ReqState, num_new: int, hits: list[list[int]] | None = None, hit_len: int = 0,
                       ext: int = 0, admitting: bool = False, has_running: bool = True) -> bool:
        """Give r slots for num_new more tokens; False when the pool cannot (nothing is changed then, except
        blocks behind a window, which vLLM frees first either way)."""
        pool = self.pool
        wm = self.watermark_blocks if admitting and has_running else 0
        if r.private and not r.tracked and not hit_len and not ext:  # (one full group: no hit, no hit blocks)
            return self._admit_own(r, num_new, admitting, wm)
        total = min(r.num_computed + hit_len + ext, self.mml)
        if admitting and self.reserve_full_isl:
            full = min(r.num_tokens, self.mml)
            if self._to_allocate(r, full, hits, total, self.gate_capped) + wm > len(pool.plain) + pool.n_cached:
                return False
        need_slot = min(total + num_new, self.mml)
        if self.recycling:  # 0.26.0: on the processed-token basis, as in-flight batches still read the window
            self.remove_skipped(r, max(0, total - r.in_flight) if self.frees_processed else total)
        else:
            r.next_free_at = 1 << 62
        need = self._to_allocate(r, need_slot, hits, total, self.always_capped)
        if need + wm > len(pool.plain) + pool.n_cached:
            return False
        if not r.tracked and (hit_len or ext or (hits and any(hits))):
            self._adopt(r, hits, hit_len, ext)
        cap = 1 << 62
        grew = not r.tracked  # its memory books start at admission
        for gi in range(len(self.groups)):
            blocks = r.blocks[gi]
            new = self.required(gi, need_slot) - len(blocks)
            if new > 0:
                if self.always_capped and new > pool.num_free:
                    self._short(r, new)
                blocks += pool.get_new(new)
                grew = True
            if self.kinds[gi] != MAMBA and len(blocks) * self.sizes[gi] < cap:
                cap = len(blocks) * self.sizes[gi]
        r.cap_tokens = cap
        # its books change when its table grows, or when it computes past its last token (0.11.0's async scheduler)
        if grew or need_slot >= r.prompt_len + r.max_tokens:
            self._book(r, need_slot)
        r.tracked = True
        if self.caching:
            self.cache_blocks(r, min(total + num_new, r.num_tokens))
        return True

    def _admit_own(self, r: ReqState, num_new: int, admitting: bool, wm: int) -> bool:
        """allocate_slots for a private request that holds no blocks and hits none (one full-attention group): the
        gate, the count and the watermark of the general path, as sums (a request admitted, the second most
        frequent pool operation)."""
        pool, block, mml = self.pool, self.sizes[0], self.mml
        free = len(pool.plain) + pool.n_cached
        if admitting and self.reserve_full_isl and -(-min(r.num_tokens, mml) // block) + wm > free:
            return False
        total = min(r.num_computed, mml)
        need_slot = min(total + num_new, mml)
        new = -(-need_slot // block)
        if new + wm > free:
            return False
        r.next_free_at = 1 << 62
        blocks = r.blocks[0]
        blocks += pool.get_new(new)
        r.cap_tokens = len(blocks) * block
        self._book(r, need_slot)
        r.tracked = True
        self.cache_blocks(r, min(total + num_new, r.num_tokens))
        return True

    def admission_short(self, r: ReqState, num: int, free: int) -> bool:
        """Whether allocate_slots(r, num, admitting=True) fails for a waiting request while others run, with
        ``free`` free blocks, where prefix caching is off or r is private and no group frees blocks behind a window:
        its two checks (the whole sequence when the gate is on, then the chunk), without allocating. Fewer free
        blocks fail too. A private request hits only its own blocks, all free: each counts against the free blocks
        as a new one would, so the whole-sequence gate asks the same with or without them."""
        wm = self.watermark_blocks
        if self.reserve_full_isl and self._to_allocate(r, min(r.num_tokens, self.mml), None, 0, self.gate_capped) \
                + wm > free:
            return True
        if r.private:  # with prefix caching: the gate alone is known (a hit lengthens the chunk's slots)
            return False
        return self._to_allocate(r, min(num, self.mml), None, 0, self.always_capped) + wm > free

    def grow(self, r: ReqState, end: int, known: int) -> None:
        """allocate_slots for a running request's next token past its blocks, where every group is full attention
        of one block size and the pool has a block for each group (checked by the caller): a block from the
        front of the free queue per group, in group order, the books and the prefix cache as allocate_slots
        keeps them. ``end``: its computed tokens with this one; ``known``: its known tokens."""
        pool = self.pool
        plain, ref = pool.plain, pool.ref
        for blocks in r.blocks:
            if plain:
                b = plain.popleft()
                ref[b] = 1
                blocks.append(b)
            else:
                blocks += pool.get_new(1)
        cap = r.cap_tokens = len(r.blocks[0]) * self.sizes[0]
        if cap < r.final:  # not its last block: no internal waste yet
            g = len(r.blocks)
            self.entries += g
            r.entries += g
        else:
            self._book(r, end)
        if self.caching:
            if known >= (r.hasher.n + 1) * self.hash_block:  # the keys of its blocks known now
                r.hasher.extend(known)
            self.cache_blocks(r, min(end, known))

    def grow_one(self, r: ReqState, end: int, known: int) -> None:
        """``grow`` where the pool has one group: the same block, books and filings in fewer calls (BlockPool.get_new
        of one block and BlockPool.insert inlined): one per block a decode crosses, the simulator's most frequent
        pool operation."""
        pool = self.pool
        plain = pool.plain
        b = plain.popleft() if plain else pool.take_cached()
        pool.ref[b] = 1
        blocks = r.blocks[0]
        blocks.append(b)
        block = self.sizes[0]
        cap = r.cap_tokens = len(blocks) * block
        if cap < r.final:  # not its last block: no internal waste yet
            self.entries += 1
            r.entries += 1
        else:
            self._book(r, end)
        if self.caching:
            if r.private:  # filed when freed (_file_deferred): the count alone (its keys are extended where read)
                full = (end if end < known else known) // block  # (one group: hash_block = block)
                if full > r.ncached[0]:
                    r.ncached[0] = full
                return
            hasher = r.hasher
            keys = hasher.keys
            if known >= (len(keys) + 1) * block:  # the keys of its blocks known now (BlockHasher.extend)
                hasher.extend(known)
            full = len(keys) * block  # min(end, known, the keyed tokens)
            if end < full:
                full = end
            if known < full:
                full = known
            full //= block
            j = r.ncached[0]
            if full > j:
                key, group, cache = pool.key, pool.group, pool.caches[0]
                while j < full:
                    blk, k = blocks[j], keys[j]
                    if blk and (key[blk] != k or group[blk]):  # BlockPool.insert, inlined
                        key[blk], group[blk] = k, 0
                        held = cache.get(k)
                        if held is None:
                            cache[k] = blk
                        elif held.__class__ is int:
                            cache[k] = [held, blk]
                        else:
                            held.append(blk)
                    j += 1
                r.ncached[0] = full

    def _book(self, r: ReqState, computed: int) -> None:
        """r's table entries and internal fragmentation in the memory books, once it has computed ``computed``
        tokens: past the tokens it will ever compute (the last sampled token's KV is never written; 0.11.0's async
        scheduler computes it, SchedulerRules.async_skip_last_in_flight), in a table that reached its last block."""
        final = r.final
        fill = max(computed, final)
        entries = internal = 0
        for gi, unit in enumerate(self.units):
            if unit:  # a token-slot group
                slots = len(r.blocks[gi]) * self.sizes[gi]
                entries += len(r.blocks[gi])
                if slots >= final:
                    internal += unit * (slots - fill)
        self.entries += entries - r.entries
        self.internal += internal - r.internal
        r.entries, r.internal = entries, internal

    def _short(self, r: ReqState, new: int) -> None:
        """0.20.0-0.20.1 count sliding/chunked groups at the admission cap, yet allocate_new_blocks takes every
        block the tokens need, and BlockPool.get_new_blocks raises when the pool is short: stop as vLLM does."""
        raise InputError(f"request {r.req.id}: vLLM 0.20.0-0.20.1 stops here (vllm/v1/core/block_pool.py::"
                         f"BlockPool.get_new_blocks: {new} blocks asked, {self.pool.num_free} free): its sliding/"
                         "chunked groups were counted at the admission cap in every allocation (fixed in 0.20.2); "
                         "give the pool more blocks or simulate another release")

    def _adopt(self, r: ReqState, hits: list[list[int]] | None, hit_len: int, ext: int) -> None:
        """add_local_computed_blocks (touch the hit, nulls for skipped blocks), then blocks for the tokens a
        connector loads (allocate_external_computed_blocks)."""
        total = hit_len + ext
        for gi in range(len(self.groups)):
            skipped = self.skipped_tokens(gi, total) // self.sizes[gi] if self.kinds[gi] != MAMBA else 0
            hit = hits[gi][skipped:] if hits else []
            self.pool.touch(hit)
            r.blocks[gi] = [0] * skipped + hit
            r.ncached[gi] = len(r.blocks[gi])
        r.mapped = r.ncached[0]
        if ext:
            for gi in range(len(self.groups)):
                if self.kinds[gi] == MAMBA:
                    continue
                skipped = self.skipped_tokens(gi, total)
                if skipped and min(total - skipped, ext) <= 0:
                    continue
                new = max(0, -(-total // self.sizes[gi]) - len(r.blocks[gi]))
                if new:
                    r.blocks[gi] += self.pool.get_new(new)

    def cache_blocks(self, r: ReqState, n: int) -> None:
        """File r's full blocks up to n tokens under their hashes (SingleTypeKVCacheManager.cache_blocks)."""
        if r.private:  # filed when freed (_file_deferred): the count alone
            full = min(n, r.hasher.n * self.hash_block) // self.sizes[0]
            if full > r.ncached[0]:
                r.ncached[0] = full
            return
        keys = r.hasher.keys
        for gi in range(len(self.groups)):
            b = self.sizes[gi]
            full = min(n, len(keys) * self.hash_block) // b
            start = r.ncached[gi]
            if full <= start:
                continue
            blocks = r.blocks[gi]
            insert = self.pool.insert
            for j in range(start, full):
                blk = blocks[j]
                if blk:
                    insert(gi, keys[j], blk)
            r.ncached[gi] = full

    def free(self, r: ReqState) -> None:
        """Release r's blocks group by group, tail first (KVCacheManager.free)."""
        if r.private:  # one group; its blocks held by it alone, its first ncached hashed once filed
            if r.ncached[0] > r.mapped:
                self._file_deferred(r)
            if r.blocks[0]:
                self.pool.release_own(r.blocks[0], r.ncached[0], self.finished_unhashed_first[0])
                r.blocks[0] = []
            r.ncached[0] = 0
        for gi in range(len(self.groups) if not r.private else 0):
            blocks = r.blocks[gi]
            if blocks:
                blocks.reverse()
                self.pool.free(blocks, self.finished_unhashed_first[gi])
            r.blocks[gi] = []
            r.ncached[gi] = 0
        self.entries -= r.entries
        self.internal -= r.internal
        r.entries = r.internal = r.mapped = 0
        r.tracked = False
        r.cap_tokens = r.next_free_at = 0

    def _file_deferred(self, r: ReqState) -> None:
        """File the blocks a private request filled since it was admitted, as it frees them: under its keys where it
        was preempted (it may hit them when admitted again; BlockPool.insert as cache_blocks would have, the same
        map: an older block under a key stays first), marked hashed in no map (DEAD) where it finished (no request
        can hit them; evicting one counts as evicting a cached block). The free queue takes them as vLLM's."""
        blocks, pool = r.blocks[0], self.pool
        if r.finish_step >= 0:
            key = pool.key
            for blk in blocks[r.mapped:r.ncached[0]]:
                key[blk] = DEAD  # (in no group's map)
        else:
            base = r.hasher.base  # type: ignore[union-attr]
            for j in range(r.mapped, r.ncached[0]):
                pool.insert(0, base + j, blocks[j])
        r.mapped = r.ncached[0]

    def cannot_admit(self, r: ReqState) -> str:
        """Why r, at the head of the queue with nothing running, cannot be admitted (an error message)."""
        caps = self.caps if self.gate_capped else [None] * len(self.groups)
        need = sum(min(self.required(gi, min(r.num_tokens, self.mml)), caps[gi] or 1 << 62)
                   for gi in range(len(self.groups)))
        return (f"request {r.req.id} ({r.num_tokens} tokens) can never be admitted: it needs {need} blocks and the "
                f"pool has {self.pool.num_blocks - 1}; give the pool more blocks or shorten the prompt")

    def check(self, running: list[ReqState], waiting) -> None:
        """Every block held is accounted for by reference counts; free blocks are held by nobody; the null block is
        never held; the memory books are the running requests' tables."""
        pool = self.pool
        counts = [0] * pool.num_blocks
        for r in running:
            for blocks in r.blocks:
                for b in blocks:
                    counts[b] += 1
        for r in waiting:
            assert not any(r.blocks), "a waiting request holds blocks"
        assert counts[1:] == pool.ref[1:], "reference counts drifted"  # block 0: null entries in tables
        free = set(pool.plain) | set(pool.cached_order())
        assert 0 not in free, "the null block was freed"
        assert len(free) == pool.num_free, "a block is in the free queue twice"
        for b in free:
            assert pool.ref[b] == 0, f"free block {b} is held"
        held = sum(1 for b in range(1, pool.num_blocks) if pool.ref[b] > 0)
        assert held + pool.num_free == pool.num_blocks - 1, "blocks lost"
        for r in running if self.caching else ():  # allocate_slots files every full block it computed
            filed = min(r.num_computed, r.num_tokens - 1, r.hasher.n * self.hash_block)
            assert all(n >= filed // self.sizes[gi] for gi, n in enumerate(r.ncached) if self.kinds[gi] == FULL), \
                f"request {r.req.id}: full blocks left unfiled"
        for r in running:  # a private request's blocks: nobody else's (KVCacheManager.free, BlockPool.release_own)
            assert not r.private or all(pool.ref[b] == 1 for b in r.blocks[0]), f"request {r.req.id}: a block shared"
        tables = sum(len(r.blocks[gi]) for r in running for gi, k in enumerate(self.kinds) if k != MAMBA)
        assert self.entries == tables, "the table entries' books drifted"
