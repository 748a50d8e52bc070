"""Contiguous allocators under vLLM v1's scheduler (kvplan.core.sim.v1.contiguous): admission, placement, freeing and
the shares on hand-worked request sets (figures derived in the comments), what is refused, and the laws that hold
(and one that does not)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.core.sim.engine import simulate
from kvplan.core.sim.model import SimConfig, SimRequest, StepModel, allocator_spec, next_pow2
from kvplan.core.sim.v1 import FULL, SLIDING, CacheGroup, OffloadConfig, V1Request, simulate_v1
from kvplan.errors import InputError

from .test_v1 import by_id, make_inputs, req

SHARES = ("token_states_frac", "reserved_frac", "internal_frag_frac", "external_frag_frac", "free_frac")


def run(requests, allocator=None, placement="first-fit", **kw):
    inp = make_inputs(requests, **kw)
    if allocator is not None:
        inp = dataclasses.replace(inp, allocator=allocator_spec(allocator, placement=placement))
    return simulate_v1(inp, check_invariants=True)


def slot_steps(result, pool_slots):
    """The shares as slot-steps (share x counted steps x pool slots), rounded to integers."""
    return tuple(round(getattr(result, f) * result.steps * pool_slots) for f in SHARES)


@pytest.mark.parametrize(("allocator", "placement", "placed"), [
    ("contiguous-max", "first-fit", 48), ("contiguous-max", "buddy", 64),  # max_model_len 48; a buddy block of 64
    ("contiguous-pow2", "first-fit", 42), ("contiguous-pow2", "buddy", 64),  # 10 + next_pow2(20) = 42
    ("contiguous-oracle", "first-fit", 30), ("contiguous-oracle", "buddy", 32),  # 10 + 20
])
def test_one_request_alone_splits_its_region(allocator, placement, placed):
    # A 10-token prompt, 20 output tokens: 20 counted steps (the prefill samples the first token), computing
    # c = 10 + k tokens at step k; the last token's KV is never computed, so it fills 29 slots. The pool is
    # 9 blocks of 16 = 144 slots (all of them: the null block is a paged-pool detail).
    # token: sum(10 + k, k < 20) = 390; reserved: sum(29 - c) = 20 x 29 - 390 = 190; internal: 20 x (placed - 29)
    r = run([req(0, 10, out=20)], allocator, placement, num_blocks=9, mml=48)
    assert r.allocator == allocator and r.steps == 20 and r.preemptions == 0
    assert slot_steps(r, 144) == (390, 190, 20 * (placed - 29), 0, 20 * (144 - placed))
    assert r.mean_kv_usage == pytest.approx(placed / 144)  # usage: the share of the slots in regions


def test_the_paged_pool_alone_splits_its_blocks():
    # The same request on vLLM's pool: 8 usable blocks of 16 = 128 slots. Steps 0-5 (c = 10..15) hold one block,
    # reserved 16 - c: 6 + 5 + 4 + 3 + 2 + 1 = 21; step 6 fills it; from step 7 (c = 17) two blocks, whose last
    # reaches past the 29 slots it fills: internal 32 - 29 = 3 for 13 steps = 39, reserved 29 - c: 12 + ... + 0 =
    # 78. Free: 20 x 128 - 390 - 99 - 39 = 2032.
    r = run([req(0, 10, out=20)], num_blocks=9, mml=48)
    assert r.allocator == "paged-16"
    assert slot_steps(r, 128) == (390, 99, 39, 0, 2032)
    assert sum(getattr(r, f) for f in SHARES) == pytest.approx(1.0, abs=1e-12)


def test_contiguous_max_holds_max_model_len_regions_only():
    # 144 slots, max_model_len 48: first fit places three 48-slot regions; a buddy allocator rounds each to 64 and
    # the pool is a 128-slot and a 16-slot block: two. Five short requests wait for them.
    reqs = [req(i, 10, out=20) for i in range(5)]
    ff = run(reqs, "contiguous-max", "first-fit", num_blocks=9, mml=48)
    buddy = run(reqs, "contiguous-max", "buddy", num_blocks=9, mml=48)
    assert (ff.peak_running, buddy.peak_running) == (3, 2)
    assert ff.per_step_running[:21] == (3,) * 20 + (2,)
    assert [by_id(ff)[str(i)].first_scheduled_step for i in range(5)] == [0, 0, 0, 20, 20]
    assert ff.completed == buddy.completed == 5 and ff.preemptions == buddy.preemptions == 0


def test_a_region_that_cannot_be_placed_stops_admission():
    # 100 slots (blocks of 1), oracle regions placed first fit: A (10 + 50 = 60) is placed; B (10 + 40 = 50) finds
    # 40 free and stops admission, so C (10 slots), which would fit, waits behind it (FCFS, as vLLM's admission
    # stops at the first request it cannot allocate). A finishes at step 49; B and C are admitted at step 50.
    reqs = [req(0, 10, out=50), req(1, 10, out=40), req(2, 5, out=5)]
    r = by_id(run(reqs, "contiguous-oracle", block_size=1, num_blocks=100, mml=100))
    assert [r[i].first_scheduled_step for i in "012"] == [0, 50, 50]


def test_first_fit_fragments_and_oracle_can_hold_less_token_state_than_max():
    # 64 slots, max_model_len 32. r0 (21 + 10) arrives at step 1 and finishes at step 10, r2 (18 + 8) arrives at 9
    # and finishes at 16, r1 (31 + 1) arrives at 10. Max: 32-slot regions, two at a time: r1 waits for r0 and runs
    # at step 11 in r0's region; 16 steps. Oracle: r0 [0, 31), r2 [31, 57); when r0 ends, 38 slots are free
    # ([0, 31) and [57, 64)) but no 32 in one piece: external fragmentation 38 for steps 11-16, r1 runs at step 17.
    # Both compute the same tokens (458 slot-steps of token states), oracle over 17 steps instead of 16: a smaller
    # share. So "oracle never holds less token state than max" is no law under FCFS with first fit.
    reqs = [V1Request(id=str(i), prompt=((i, p),), output=(100 + i, o), arrival_step=a)
            for i, (p, o, a) in enumerate([(21, 10, 1), (31, 1, 10), (18, 8, 9)])]
    mx = run(reqs, "contiguous-max", block_size=1, num_blocks=64, mml=32)
    orc = run(reqs, "contiguous-oracle", block_size=1, num_blocks=64, mml=32)
    assert (mx.steps, orc.steps) == (16, 17)
    assert (by_id(mx)["1"].first_scheduled_step, by_id(orc)["1"].first_scheduled_step) == (11, 17)
    assert slot_steps(mx, 64)[0] == slot_steps(orc, 64)[0] == 458
    assert (slot_steps(mx, 64)[3], slot_steps(orc, 64)[3]) == (0, 38 * 6)
    assert orc.token_states_frac < mx.token_states_frac and orc.mean_running < mx.mean_running


@pytest.mark.parametrize("reservation", ["max", "pow2", "oracle"])
@pytest.mark.parametrize("placement", ["buddy", "first-fit"])
@pytest.mark.parametrize(("prompt", "output"), [(10, 25), (161, 338), (3, 1), (40, 24)])
def test_a_region_is_the_one_the_event_engine_places(reservation, placement, prompt, output):
    # One request alone: the event engine holds t = prompt + k tokens at step k <= output (output + 1 steps);
    # the v1 scheduler computes prompt + k for k < output. Each one's internal fragmentation gives its region.
    name, mml = f"contiguous-{reservation}", 512
    cfg = SimConfig(pool_slots=1024, max_num_seqs=4, max_num_batched_tokens=1024, max_model_len=mml,
                    step=StepModel(base_ps=1, per_token_ps=0, per_prefill_token_ps=0))
    event = simulate([SimRequest(id=0, arrival_ps=0, prompt=prompt, output=output)], cfg,
                     allocator_spec(name, placement=placement))
    event_region = round(event.internal_frag_frac * event.makespan_steps * 1024) // (output + 1) + prompt + output
    v1 = run([req(0, prompt, out=output)], name, placement, block_size=1, num_blocks=1024, mml=mml)
    v1_region = round(v1.internal_frag_frac * v1.steps * 1024) // output + prompt + output - 1
    assert v1_region == event_region
    if reservation == "pow2":  # the prompt plus the output rounded up to a power of two, at most max_model_len
        reserved = min(prompt + next_pow2(output), mml)
        assert v1_region == (next_pow2(reserved) if placement == "buddy" else reserved)


def test_what_a_contiguous_allocator_refuses():
    sliding = (CacheGroup(kind=FULL, block_size=16), CacheGroup(kind=SLIDING, block_size=16, window=32))
    with pytest.raises(InputError, match="one full-attention .* this model has 2 .*sliding_window"):
        run([req(0, 10)], "contiguous-max", groups=sliding)
    with pytest.raises(InputError, match="prefix caching"):
        run([req(0, 10)], "contiguous-oracle", caching=True)
    with pytest.raises(InputError, match="no CPU tier"):
        run([req(0, 10)], "contiguous-oracle", offload=OffloadConfig(cpu_bytes=1 << 20, bandwidth_bytes_per_s=1e9))
    # a region past the whole pool would block the queue forever: 8192 slots rounded by the buddy allocator, of 2000
    with pytest.raises(InputError, match="larger than the pool of 2000 slots"):
        run([req(0, 5000, out=3000)], "contiguous-oracle", "buddy", num_blocks=125, mml=8192)
    with pytest.raises(InputError, match="blocks of \\[16\\] tokens"):
        run([req(0, 10)], "paged-32")


@st.composite
def request_sets(draw, mml):
    reqs = []
    for i in range(draw(st.integers(1, 10))):
        p = draw(st.integers(1, mml - 1))
        o = draw(st.integers(1, mml - p))
        reqs.append(V1Request(id=str(i), prompt=((i, p),), output=(100 + i, o), arrival_step=draw(st.integers(0, 20))))
    return reqs


ALLOCATORS = [(f"contiguous-{r}", p) for r in ("max", "pow2", "oracle") for p in ("buddy", "first-fit")]


@settings(max_examples=40, deadline=None)
@given(request_sets(64), st.sampled_from([1, 16]), st.booleans(), st.integers(1, 8))
def test_where_memory_never_binds_every_allocator_schedules_alike(reqs, block, async_, seqs):
    # a pool that holds every request's largest region at once: only the allocator differs, and nothing it decides
    # moves the schedule. Token states are the same slots (pools: num_blocks x B contiguous, one block less paged).
    num_blocks = len(reqs) * 64 // block + 1
    kw = {"block_size": block, "num_blocks": num_blocks, "mml": 64, "seqs": seqs, "async_": async_}
    paged = run(reqs, **kw)
    for name, placement in ALLOCATORS:
        r = run(reqs, name, placement, **kw)
        assert r.per_request == paged.per_request and r.preemptions == paged.preemptions == 0
        assert (r.per_step_running, r.per_step_scheduled_tokens) == (paged.per_step_running,
                                                                    paged.per_step_scheduled_tokens)
        assert slot_steps(r, num_blocks * block)[0] == slot_steps(paged, (num_blocks - 1) * block)[0]


@settings(max_examples=60, deadline=None)
@given(request_sets(64), st.integers(65, 300), st.booleans(), st.integers(2, 8), st.sampled_from([16, 2048]))
def test_contiguous_laws(reqs, slots, async_, seqs, mnbt):
    kw = {"block_size": 1, "num_blocks": slots, "mml": 64, "seqs": seqs, "async_": async_, "mnbt": mnbt}
    results = {(n, p): run(reqs, n, p, **kw) for n, p in ALLOCATORS}
    for r in results.values():  # a region holds every token: nothing is ever preempted, everything completes
        assert r.preemptions == 0 and r.completed == len(reqs)
    # max_model_len a power of two: max's regions are equal aligned blocks under either placement, neither fragments
    assert results["contiguous-max", "buddy"] == results["contiguous-max", "first-fit"]
    # oracle placed first fit reserves prompt + output, and the last sampled token's KV is never written: one
    # slot of internal fragmentation per running request
    oracle = results["contiguous-oracle", "first-fit"]
    assert slot_steps(oracle, slots)[2] == sum(oracle.per_step_running)
    # Synchronous, no prompt chunked: a request holds prompt + k tokens at its k-th step whatever the allocator. (Async
    # scheduling frees a finished request a batch later, and its tokens count at the steps that batch overlaps.)
    if mnbt == 2048 and not async_:
        tokens = sum(o * p + o * (o - 1) // 2 for p, o in ((q.prompt_len, q.output[1]) for q in reqs))
        assert {slot_steps(r, slots)[0] for r in results.values()} == {tokens}
