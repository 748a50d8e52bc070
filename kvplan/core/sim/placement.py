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
        orders = max(1, capacity.bit_length())
        self.free_lists: list[set[int]] = [set() for _ in range(orders)]  # order -> offsets of free blocks
        self.nonempty = 0  # bit o set when free_lists[o] is not empty: the smallest fitting order in O(1)
        self.top_order: dict[int, int] = {}  # start of each top block -> its order
        offset = 0
        for order in range(capacity.bit_length() - 1, -1, -1):
            if capacity >> order & 1:
                self._push(order, offset)
                self.top_order[offset] = order
                offset += 1 << order
        self.used: dict[int, int] = {}  # offset -> order of allocated blocks

    @staticmethod
    def rounded(size: int) -> int:
        return next_pow2(size)

    def _push(self, order: int, offset: int) -> None:
        self.free_lists[order].add(offset)
        self.nonempty |= 1 << order

    def can_allocate(self, size: int) -> bool:
        return bool(self.nonempty >> (size - 1).bit_length())

    def allocate(self, size: int) -> int | None:
        order = (size - 1).bit_length()
        nonempty = self.nonempty
        fitting = nonempty >> order
        if not fitting:
            return None
        o = order + (fitting & -fitting).bit_length() - 1  # the smallest free block that fits
        lists = self.free_lists
        blocks = lists[o]
        offset = min(blocks)  # lowest address: deterministic placement
        blocks.discard(offset)
        if not blocks:
            nonempty &= ~(1 << o)
        while o > order:  # split, keeping the lower half
            o -= 1
            lists[o].add(offset + (1 << o))
            nonempty |= 1 << o
        self.nonempty = nonempty
        self.used[offset] = order
        return offset

    def free(self, offset: int) -> None:
        order = self.used.pop(offset)
        lists = self.free_lists
        nonempty = self.nonempty
        # Coalesce with free buddies. No bound is needed at a top block: its buddy (start + size) is where
        # the next, smaller top block starts (or the pool ends), and no block of its size can begin there.
        while True:
            buddy = offset ^ (1 << order)
            blocks = lists[order]
            if buddy not in blocks:
                break
            blocks.discard(buddy)
            if not blocks:
                nonempty &= ~(1 << order)
            if buddy < offset:
                offset = buddy
            order += 1
        lists[order].add(offset)
        self.nonempty = nonempty | 1 << order

    def free_slots(self) -> int:
        return sum(len(blocks) << o for o, blocks in enumerate(self.free_lists))


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
