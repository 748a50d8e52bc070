"""The v1 simulator's memory shares (kvplan.core.sim.v1.shares) against a slot-by-slot recount at every counted step,
over prefix caching, sliding windows, chunked local attention, groups of two block sizes, async scheduling,
preemption and the contiguous allocators; and what the shares add up to."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from math import lcm
from unittest import mock

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kvplan.core.engines.base import cdiv
from kvplan.core.engines.vllm.scheduler_rules import newest
from kvplan.core.profiles import parse_engine
from kvplan.core.sim.model import StepModel, allocator_spec, next_pow2
from kvplan.core.sim.v1 import CHUNKED, FULL, MAMBA, SLIDING, CacheGroup, V1Request, simulate_v1
from kvplan.core.sim.v1 import scheduler as v1_scheduler
from kvplan.core.sim.v1.contiguous import ContiguousManager

from .test_v1 import make_inputs, req

SHARES = ("token_states_frac", "reserved_frac", "internal_frag_frac", "external_frag_frac", "free_frac")


def final_tokens(r, mml: int) -> int:
    """The tokens whose KV a request computes: its last sampled token's never is."""
    return min(r.prompt_len + r.max_tokens, mml) - 1


def classify(start: int, size: int, computed: int, final: int) -> list[str]:
    """Slots [start, start + size) of a request that has computed ``computed`` tokens and will compute ``final``."""
    fill = max(final, computed)
    return ["token" if x < computed else "reserved" if x < fill else "internal" for x in range(start, start + size)]


def recount_paged(sim, running) -> tuple[int, int, int, int, int]:
    mgr, mml = sim.mgr, sim.cfg.max_model_len
    sizes = [g.block_size for g in sim.inputs.layout.groups if g.kind != MAMBA]
    unit = lcm(*sizes)
    seen: dict[int, tuple[list[str], int]] = {}
    for r in running:
        for gi, table in enumerate(r.blocks):
            g = sim.inputs.layout.groups[gi]
            if g.kind == MAMBA:
                continue
            assert len(table) == cdiv(r.num_computed, g.block_size)  # what the books rest on
            for j, b in enumerate(table):
                if b == 0:
                    continue
                slots = classify(j * g.block_size, g.block_size, r.num_computed, final_tokens(r, mml))
                if b in seen:  # shared through the prefix cache: full for every holder, counted once
                    assert seen[b][0] == slots == ["token"] * g.block_size
                seen[b] = (slots, unit // g.block_size)
    pool = mgr.pool
    assert set(seen) == {b for b in range(1, pool.num_blocks) if pool.ref[b] > 0}
    count = {k: sum(u * slots.count(k) for slots, u in seen.values()) for k in ("token", "reserved", "internal")}
    return count["token"], count["reserved"], count["internal"], 0, unit * pool.num_free


def recount_contiguous(sim, running, waiting, budget: int) -> tuple[int, int, int, int, int]:
    mgr, mml = sim.mgr, sim.cfg.max_model_len
    spec = mgr.spec
    slots = {"token": 0, "reserved": 0, "internal": 0}
    placed_total = 0
    for r in running:
        out = min(r.max_tokens, mml - r.prompt_len)
        reserved = {"max": mml, "pow2": min(r.prompt_len + next_pow2(out), mml),
                    "oracle": r.prompt_len + out}[spec.reservation]
        placed = next_pow2(reserved) if spec.placement == "buddy" else reserved
        assert mgr.regions[r.index][1] == placed
        placed_total += placed
        for k in slots:
            slots[k] += classify(0, placed, r.num_computed, final_tokens(r, mml)).count(k)
    free = mgr.pool.slots - placed_total
    external = 0
    # admission went on while budget and max_num_seqs allowed: it stopped at the head, whose region found no place;
    # external fragmentation when the free slots would have held it
    if waiting and budget > 0 and len(running) < sim.cfg.max_num_seqs:
        _, head = mgr.region(waiting[0])
        assert not mgr.place.can_allocate(head)
        external = free if free >= head else 0
    return slots["token"], slots["reserved"], slots["internal"], external, free - external


@contextmanager
def recounting():
    """Recount the split at every counted step of every simulation run inside; yields the largest computed count
    each request reached, by (run, request index)."""
    original = v1_scheduler._Sim._check
    reached: dict[tuple[int, int], int] = {}

    def check(self, running, waiting, computed, budget, books):
        original(self, running, waiting, computed, budget, books)
        if books is None or not self.mgr.books.measured:
            return
        if isinstance(self.mgr, ContiguousManager):
            assert books == recount_contiguous(self, running, waiting, budget)
        else:
            assert books == recount_paged(self, running)
        assert sum(books) == self.mgr.books.pool_units
        for r in running:
            key = (id(self), r.index)
            reached[key] = max(reached.get(key, 0), r.num_computed)

    with mock.patch.object(v1_scheduler._Sim, "_check", check):
        yield reached


GROUPS = [
    (CacheGroup(kind=FULL, block_size=16),),
    (CacheGroup(kind=SLIDING, block_size=16, window=40),),
    (CacheGroup(kind=FULL, block_size=16), CacheGroup(kind=SLIDING, block_size=16, window=24),
     CacheGroup(kind=SLIDING, block_size=16, window=24)),
    (CacheGroup(kind=FULL, block_size=8), CacheGroup(kind=CHUNKED, block_size=8, window=32)),
    (CacheGroup(kind=FULL, block_size=16), CacheGroup(kind=SLIDING, block_size=32, window=40)),  # two block sizes
]
CONTIGUOUS = [None, ("contiguous-max", "buddy"), ("contiguous-pow2", "buddy"), ("contiguous-oracle", "first-fit"),
              ("contiguous-pow2", "first-fit")]


# the newest rules, and 0.11.0's, whose async scheduler computes one token more (the last one's, in flight)
RULES = [newest(), parse_engine("vllm==0.11.0").profile.rules.scheduler]


@settings(max_examples=150, deadline=None)
@given(st.data(), st.sampled_from(GROUPS), st.sampled_from(CONTIGUOUS), st.booleans(), st.booleans(),
       st.sampled_from(RULES))
def test_the_books_are_a_slot_by_slot_recount_at_every_step(data, groups, contiguous, caching, async_, rules):
    if contiguous is not None:
        groups, caching = (CacheGroup(kind=FULL, block_size=data.draw(st.sampled_from([1, 4, 16]))),), False
    caching = caching and len({g.block_size for g in groups}) == 1
    mml = 128
    n = data.draw(st.integers(2, 10))
    shared = data.draw(st.sampled_from([0, 20, 40]))  # a shared prefix: prefix-cache hits
    reqs = []
    for i in range(n):
        own = data.draw(st.integers(1, 60))
        prompt = ((0, shared), (1000 + i, own)) if shared else ((1000 + i, own),)
        out = data.draw(st.integers(1, mml - shared - own))
        reqs.append(V1Request(id=str(i), prompt=prompt, output=(10**6 + i, out), arrival_step=data.draw(st.integers(0, 4))))
    # a pool that holds the longest request alone, often not two: preemptions (paged), queueing (contiguous)
    need = sum(cdiv(mml, g.block_size) for g in groups)
    num_blocks = need + 1 + data.draw(st.integers(0, 12))
    mnbt = data.draw(st.sampled_from([16, 64, 2048]))  # chunked prefill from 16
    inp = make_inputs(reqs, num_blocks=num_blocks, groups=groups, caching=caching, mnbt=mnbt,
                      seqs=data.draw(st.integers(2, 8)), mml=mml, async_=async_)
    inp = dataclasses.replace(inp, scheduler=dataclasses.replace(inp.scheduler, rules=rules))
    if contiguous is not None:
        inp = dataclasses.replace(inp, allocator=allocator_spec(contiguous[0], placement=contiguous[1]))
    with recounting() as reached:
        r = simulate_v1(inp, check_invariants=True)
    assert r.completed == n
    event(f"preempted: {r.preemptions > 0}, prefix hits: {r.cached_tokens > 0}, external: {bool(r.external_frag_frac)}")
    # every reserved slot is filled in the end: each request computes the tokens the books expected (0.11.0's
    # async scheduler may compute one more, its last token's, which the books count as used once it is)
    extra = 1 if async_ and not rules.async_skip_last_in_flight else 0
    for q, i in zip(reqs, range(n)):
        final = min(q.prompt_len + q.output[1], mml) - 1
        got = [c for (_, j), c in reached.items() if j == i]
        if not got:  # admitted, prefilled in one step and done with its one output token: never running at a check
            assert q.output[1] == 1 and q.prompt_len <= mnbt, q
            continue
        assert len(got) == 1 and final <= got[0] <= final + extra, (q, got)
    assert sum(getattr(r, f) for f in SHARES) == pytest.approx(1.0, abs=1e-12)


def test_the_paged_shares_add_up_to_one_and_free_is_vllms_unused_share():
    # a shared 64-token system prompt (prefix-cache hits), a sliding-window group beside full attention, a pool
    # small enough to preempt
    groups = (CacheGroup(kind=FULL, block_size=16), CacheGroup(kind=SLIDING, block_size=16, window=32))
    reqs = [V1Request(id=str(i), prompt=((0, 64), (1000 + i, 20 + 7 * i)), output=(10**6 + i, 40 + 9 * i),
                      arrival_step=3 * i) for i in range(12)]
    r = simulate_v1(make_inputs(reqs, groups=groups, num_blocks=40, caching=True, mml=512), check_invariants=True)
    assert r.cached_tokens > 0 and r.preemptions > 0
    shares = [getattr(r, f) for f in SHARES]
    assert all(0 <= s <= 1 for s in shares) and sum(shares) == pytest.approx(1.0, abs=1e-12)
    assert r.external_frag_frac == 0
    # evictable cached blocks are free, as vLLM's usage counts them: free = 1 - usage at every step
    assert r.free_frac == pytest.approx(1 - r.mean_kv_usage, abs=1e-12)


def test_a_pool_with_a_mamba_group_is_not_measured():
    groups = (CacheGroup(kind=FULL, block_size=16), CacheGroup(kind=MAMBA, block_size=4096, state_blocks=2))
    r = simulate_v1(make_inputs([req(0, 100, out=5)], groups=groups, mml=4096))
    assert all(getattr(r, f) is None for f in SHARES)
    assert any("not measured" in note for note in r.notes)


def test_the_timeline_samples_the_split_over_the_run():
    step = StepModel(base_ps=10**9, per_token_ps=0, per_prefill_token_ps=0)
    reqs = [V1Request(id=str(i), prompt=((i, 30),), output=(100 + i, 50), arrival_ps=i * 10**10) for i in range(20)]
    inp = make_inputs(reqs, num_blocks=30, step=step)
    r = simulate_v1(inp, timeline_points=40)
    assert simulate_v1(inp).timeline == ()
    assert 20 <= len(r.timeline) <= 80
    steps, clocks = [p[0] for p in r.timeline], [p[1] for p in r.timeline]
    assert steps == sorted(set(steps)) and clocks == sorted(clocks) and clocks[-1] > 0
    assert {sum(p[2:]) for p in r.timeline} == {29 * 16}  # every point splits the whole pool
