"""Address-space allocators: no region handed out twice, everything coalesces back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.core.sim.placement import BuddyAllocator, FirstFitAllocator


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 5000), ops=st.lists(st.tuples(st.booleans(), st.integers(1, 600)), max_size=80),
       kind=st.sampled_from(["buddy", "first-fit"]))
def test_regions_never_overlap_and_all_frees_coalesce(capacity, ops, kind):
    alloc = BuddyAllocator(capacity) if kind == "buddy" else FirstFitAllocator(capacity)
    held: dict[int, int] = {}
    for do_alloc, size in ops:
        if do_alloc or not held:
            rounded = alloc.rounded(size)
            can = alloc.can_allocate(size)
            off = alloc.allocate(size)
            assert (off is not None) == can
            if off is not None:
                assert 0 <= off and off + rounded <= capacity
                for o, s in held.items():
                    assert off + rounded <= o or o + s <= off, "a region was handed out twice"
                held[off] = rounded
        else:
            off = sorted(held)[size % len(held)]
            alloc.free(off)
            del held[off]
        assert alloc.free_slots() == capacity - sum(held.values())
    for off in list(held):
        alloc.free(off)
    # everything coalesced: the whole pool (buddy: its largest power-of-two part) is allocatable again
    biggest = 1 << (capacity.bit_length() - 1) if kind == "buddy" else capacity
    assert alloc.allocate(biggest) == 0


def test_buddy_rounds_to_powers_of_two_and_splits():
    b = BuddyAllocator(16)
    assert b.allocate(3) == 0 and b.allocate(4) == 4 and b.allocate(8) == 8
    assert not b.can_allocate(1)
    b.free(4)
    assert b.allocate(2) == 4


def test_first_fit_merges_neighbours():
    f = FirstFitAllocator(10)
    a, b, c = f.allocate(3), f.allocate(3), f.allocate(4)
    assert (a, b, c) == (0, 3, 6) and not f.can_allocate(1)
    f.free(a)
    f.free(c)
    assert not f.can_allocate(5)
    f.free(b)
    assert f.allocate(10) == 0
