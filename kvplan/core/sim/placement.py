"""Address-space allocators that place contiguous KV reservations, so external fragmentation comes
out of placement rather than out of a constant.

- ``BuddyAllocator``: power-of-two blocks split and coalesced with their buddies (Knuth, TAOCP vol. 1,
  2.5). A pool that is not a power of two is covered by descending power-of-two top blocks, each
  aligned to its own size, so buddies never cross two top blocks.
- ``FirstFitAllocator``: the first free extent large enough, extents merged on free.
"""

from __future__ import annotations

from kvplan.core.sim.model import next_pow2


class BuddyAllocator:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.free_lists: dict[int, set[int]] = {}  # order -> offsets of free blocks
        self.top_order: dict[int, int] = {}  # start of each top block -> its order
        offset = 0
        for order in range(capacity.bit_length() - 1, -1, -1):
            if capacity >> order & 1:
                self.free_lists.setdefault(order, set()).add(offset)
                self.top_order[offset] = order
                offset += 1 << order
        self.used: dict[int, int] = {}  # offset -> order of allocated blocks

    @staticmethod
    def rounded(size: int) -> int:
        return next_pow2(size)

    def _top_of(self, offset: int) -> int:
        start = max(s for s in self.top_order if s <= offset)
        return self.top_order[start]

    def can_allocate(self, size: int) -> bool:
        order = (size - 1).bit_length()
        return any(blocks for o, blocks in self.free_lists.items() if o >= order)

    def allocate(self, size: int) -> int | None:
        order = (size - 1).bit_length()
        candidates = [o for o, blocks in self.free_lists.items() if o >= order and blocks]
        if not candidates:
            return None
        o = min(candidates)
        offset = min(self.free_lists[o])  # lowest address: deterministic placement
        self.free_lists[o].discard(offset)
        while o > order:
            o -= 1
            self.free_lists.setdefault(o, set()).add(offset + (1 << o))
        self.used[offset] = order
        return offset

    def free(self, offset: int) -> None:
        order = self.used.pop(offset)
        top = self._top_of(offset)
        while order < top:
            buddy = offset ^ (1 << order)
            if buddy not in self.free_lists.get(order, ()):
                break
            self.free_lists[order].discard(buddy)
            offset = min(offset, buddy)
            order += 1
        self.free_lists.setdefault(order, set()).add(offset)

    def free_slots(self) -> int:
        return sum(len(blocks) << o for o, blocks in self.free_lists.items())


class FirstFitAllocator:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.extents: list[list[int]] = [[0, capacity]]  # sorted [start, length] of free space
        self.used: dict[int, int] = {}

    @staticmethod
    def rounded(size: int) -> int:
        return size

    def can_allocate(self, size: int) -> bool:
        return any(length >= size for _, length in self.extents)

    def allocate(self, size: int) -> int | None:
        for i, (start, length) in enumerate(self.extents):
            if length >= size:
                if length == size:
                    del self.extents[i]
                else:
                    self.extents[i] = [start + size, length - size]
                self.used[start] = size
                return start
        return None

    def free(self, offset: int) -> None:
        size = self.used.pop(offset)
        ext = self.extents
        lo, hi = 0, len(ext)
        while lo < hi:
            mid = (lo + hi) // 2
            if ext[mid][0] < offset:
                lo = mid + 1
            else:
                hi = mid
        ext.insert(lo, [offset, size])
        if lo + 1 < len(ext) and ext[lo][0] + ext[lo][1] == ext[lo + 1][0]:
            ext[lo][1] += ext[lo + 1][1]
            del ext[lo + 1]
        if lo > 0 and ext[lo - 1][0] + ext[lo - 1][1] == ext[lo][0]:
            ext[lo - 1][1] += ext[lo][1]
            del ext[lo]

    def free_slots(self) -> int:
        return sum(length for _, length in self.extents)


def make_placement(kind: str, capacity: int) -> BuddyAllocator | FirstFitAllocator:
    return BuddyAllocator(capacity) if kind == "buddy" else FirstFitAllocator(capacity)
