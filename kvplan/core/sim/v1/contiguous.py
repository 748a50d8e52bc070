"""Contiguous allocators under vLLM v1's scheduler (issue 20, point 1): the same scheduling rules as the paged pool
(token budget, chunked prefill, max_num_seqs, async scheduling, the release's rules, the step-time model), so a
comparison changes the allocator and nothing else.

- A request reserves one region when it is first scheduled, and again when it is re-admitted after a preemption:
  ``AllocatorSpec.reservation_slots`` (contiguous-max: max_model_len; contiguous-pow2: the prompt plus the output
  rounded up to a power of two, at most max_model_len; contiguous-oracle: prompt + output, the output as it will
  run: max_tokens, or up to max_model_len), the rule the event engine applies, so a name means the same in both.
- The region is placed by kvplan/core/sim/placement.py: ``buddy`` rounds it up to a power of two, ``first-fit``
  places it exactly. Admission stops at the first waiting request whose region cannot be placed, as vLLM's stops
  at the first it cannot allocate (the watermark, where set, is kept free as vLLM keeps it).
- The region covers every token the request will compute, so a running request never asks for memory: the paged
  pool's preemption path is never taken (preemption in vLLM v1 comes only from a failed allocation).
- The region is freed when the request finishes (or is preempted).
- The pool is the same memory: num_blocks x block_size slots as one region (the null block is a paged-pool detail).

Refused: prefix caching and a CPU tier (a region is one request's own: no block of it is shared, filed or loaded),
and any layout but one full-attention (or MLA) group (sliding-window, chunked-local and Mamba groups are per-group
pools whose frees a single region per request cannot express).
"""

from __future__ import annotations

from itertools import pairwise

from kvplan.core.sim.model import AllocatorSpec, next_pow2
from kvplan.core.sim.placement import make_placement
from kvplan.core.sim.v1.inputs import FULL, KIND_NAMES, CacheLayout, SchedulerConfig
from kvplan.core.sim.v1.shares import Books
from kvplan.core.sim.v1.state import ReqState
from kvplan.errors import InputError


class RegionPool:
    """What the scheduler reads of a pool: free slots (``num_free``) and usage (the share of the slots in regions)."""

    __slots__ = ("evicted", "num_blocks", "num_free", "slots")

    def __init__(self, num_blocks: int, slots: int) -> None:
        self.num_blocks = num_blocks
        self.slots = slots
        self.num_free = slots
        self.evicted = 0  # nothing is cached, so nothing is evicted

    def usage(self) -> float:
        return 1.0 - self.num_free / self.slots


def refuse(layout: CacheLayout, sched: SchedulerConfig, alloc: AllocatorSpec, offload: bool) -> None:
    """What a contiguous allocator cannot run, each with why."""
    name = alloc.name
    groups = layout.groups
    if len(groups) != 1 or groups[0].kind != FULL:
        kinds = ", ".join(KIND_NAMES[g.kind] for g in groups)
        raise InputError(f"{name} runs on a pool of one full-attention (or MLA) KV cache group; this model has "
                         f"{len(groups)} ({kinds}): a sliding-window, chunked-local or Mamba group frees or holds "
                         "blocks on its own, which one region per request cannot express; compare it paged only")
    if sched.enable_prefix_caching:
        raise InputError(f"{name} cannot share a region through prefix caching: set enable_prefix_caching false "
                         "for the contiguous run (and for the paged run it is compared with, for the same requests)")
    if offload:
        raise InputError(f"{name} has no CPU tier: a region is one request's own, no block of it is stored or "
                         "loaded; leave offload out for the contiguous run")


class ContiguousManager:
    """The KV cache manager's interface (allocate_slots, free, find_hit) over one region per request."""

    def __init__(self, layout: CacheLayout, sched: SchedulerConfig, alloc: AllocatorSpec, *, offload: bool) -> None:
        refuse(layout, sched, alloc, offload)
        slots = layout.num_blocks * layout.groups[0].block_size
        self.pool = RegionPool(layout.num_blocks, slots)
        self.place = make_placement(alloc.placement, slots)
        self.spec = alloc
        self.buddy = alloc.placement == "buddy"
        self.mml = sched.max_model_len
        self.watermark_slots = int(sched.watermark * slots)
        self.hash_block = 0  # no prefix caching
        self.deferred = False  # (KVCacheManager.deferred: no prefix caching here)
        self.reserve_full_isl = True  # a region covers the whole request
        self.regions: dict[int, tuple[int, int]] = {}  # request index -> (offset, slots placed)
        # memory books (kvplan.core.sim.v1.shares): a unit is a slot; entries: the slots placed
        self.books = Books(unit=1, weight=1, pool_units=slots, capacity=slots, measured=True)
        self.entries = self.internal = 0
        self.ext = 0  # free slots at the last admission that found no place for a region that many slots hold

    def region(self, r: ReqState) -> tuple[int, int]:
        """(slots reserved, slots placed) for r."""
        out = min(r.max_tokens, self.mml - r.prompt_len)  # the request stops at max_model_len
        reserved = self.spec.reservation_slots(r.prompt_len, out, self.mml)
        return reserved, next_pow2(reserved) if self.buddy else reserved

    def screen(self, states: list[ReqState]) -> None:
        """Refuse requests whose region exceeds the empty pool: FCFS would wait behind them forever."""
        slots = self.pool.slots
        big = [(r, region) for r in states if (region := self.region(r))[1] > slots]
        if big:
            r, (reserved, placed) = max(big, key=lambda x: x[1][1])
            rounded = f", {placed} placed by the buddy allocator" if placed != reserved else ""
            raise InputError(f"{self.spec.name} ({self.spec.placement}): {len(big)} request(s) need a region larger "
                             f"than the pool of {slots} slots, the largest {r.req.id} ({reserved} slots reserved"
                             f"{rounded}); none of them could ever be admitted: leave such requests out, give the "
                             "pool more blocks or use first-fit placement")

    def find_hit(self, r: ReqState) -> tuple[None, int]:
        return None, 0

    def allocate_slots(self, r: ReqState, num_new: int, hits=None, hit_len: int = 0, ext: int = 0,
                       admitting: bool = False, has_running: bool = True) -> bool:
        """Place r's region when it is admitted; a running request's region already holds every token."""
        fill = r.num_computed + num_new  # its tokens computed by the end of the step
        final = r.final  # the last sampled token's KV is never written
        if r.tracked:
            if fill > final:  # 0.11.0's async scheduler computes one more token: its slot is used, not waste
                internal = r.entries - fill
                self.internal += internal - r.internal
                r.internal = internal
            return True
        _, placed = self.region(r)
        free = self.pool.num_free
        if placed + (self.watermark_slots if has_running else 0) > free:
            self.ext = 0
            return False
        off = self.place.allocate(placed)
        if off is None:
            self.ext = free  # room enough in total, none in one piece: the event engine's external fragmentation
            return False
        self.regions[r.index] = (off, placed)
        self.pool.num_free = free - placed
        internal = placed - max(final, fill)
        self.entries += placed
        self.internal += internal
        r.entries, r.internal = placed, internal
        r.cap_tokens = placed  # the scheduler's fast path: nothing to allocate while the tokens fit
        r.next_free_at = 1 << 62
        r.tracked = True
        return True

    def admission_short(self, r: ReqState, num: int, free: int) -> bool:
        """Whether a waiting request's region is larger than the free slots (allocate_slots fails before placing
        it, with no external fragmentation counted) while others run."""
        return self.region(r)[1] + self.watermark_slots > free

    def free(self, r: ReqState) -> None:
        held = self.regions.pop(r.index, None)
        if held is not None:
            self.place.free(held[0])
            self.pool.num_free += held[1]
        self.entries -= r.entries
        self.internal -= r.internal
        r.entries = r.internal = 0
        r.tracked = False
        r.cap_tokens = r.next_free_at = 0

    def cannot_admit(self, r: ReqState) -> str:
        reserved, placed = self.region(r)
        return (f"request {r.req.id} ({r.num_tokens} tokens) can never be admitted: {self.spec.name} places "
                f"{placed} slots for it ({reserved} reserved) and the pool has {self.pool.slots}")

    def check(self, running: list[ReqState], waiting) -> None:
        """Regions are held by running requests only, never overlap, hold every computed token, and the free slots
        are the pool less them."""
        spans = sorted(self.regions.values())
        for (a, n), (b, _) in pairwise(spans):
            assert a + n <= b, "two regions overlap"
        assert {r.index for r in running} == set(self.regions), "a region without a running request, or the reverse"
        for r in running:
            assert r.num_computed <= self.regions[r.index][1], "a request outgrew its region"
        for r in waiting:
            assert r.index not in self.regions, "a waiting request holds a region"
        assert self.pool.num_free == self.pool.slots - sum(n for _, n in spans) == self.place.free_slots()
