"""vLLM's scheduler rules by release (kvplan.core.engines.vllm.scheduler_rules): each rule on a small request set
where it changes the outcome. Each case runs the newest rules with that one rule set back to its older value
(dataclasses.replace), so the test fails if the simulator stops honouring the rule; the figures are derived in
the comments from vLLM's code, not read from kvplan's output."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from kvplan.core.engines.vllm.profiles import VLLM_PROFILES
from kvplan.core.engines.vllm.scheduler_rules import FreeOrder, SchedulerRules, WindowCap, newest, scheduler_notes
from kvplan.core.profiles import parse_engine
from kvplan.core.sim.v1 import (
    FULL,
    MAMBA,
    SLIDING,
    CacheGroup,
    CacheLayout,
    SchedulerConfig,
    V1Inputs,
    V1Request,
    simulate_v1,
)
from kvplan.errors import InputError

NEWEST = newest()


def rules_of(version: str) -> SchedulerRules:
    return parse_engine(f"vllm=={version}").profile.rules.scheduler


def older(**changed) -> SchedulerRules:
    """The newest rules with one rule set back to an older release's value."""
    return dataclasses.replace(NEWEST, **changed)


def run(requests, rules, *, groups=None, num_blocks=1000, caching=False, mnbt=2048, seqs=8, lpt=0, async_=False):
    sched = SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=mnbt, max_model_len=8192,
                            enable_prefix_caching=caching, long_prefill_token_threshold=lpt,
                            async_scheduling=async_, rules=rules)
    layout = CacheLayout(num_blocks=num_blocks, groups=groups or (CacheGroup(kind=FULL, block_size=16),))
    return simulate_v1(V1Inputs(requests=tuple(requests), scheduler=sched, layout=layout), check_invariants=True)


def req(i, prompt, out=1, step=0):
    prompt = ((1000 + i, prompt),) if isinstance(prompt, int) else tuple(prompt)
    return V1Request(id=str(i), prompt=prompt, output=(10**6 + i, out), arrival_step=step)


def first_scheduled(result, rid: str) -> int:
    return next(r.first_scheduled_step for r in result.per_request if r.id == rid)


def test_the_profiles_carry_each_rule_from_the_release_that_changed_it():
    assert rules_of("0.11.0") == rules_of("0.8.0")  # no older v1 scheduler was diffed: 0.11.0's rules
    assert (rules_of("0.11.0").async_skip_last_in_flight, rules_of("0.11.1").async_skip_last_in_flight) == (False, True)
    assert (rules_of("0.13.0").async_default, rules_of("0.14.0").async_default) == (False, True)
    assert (rules_of("0.18.1").full_sequence_gate, rules_of("0.19.0").full_sequence_gate) == (False, True)
    assert [rules_of(v).window_cap for v in ("0.19.1", "0.20.0", "0.20.1", "0.20.2")] == [
        WindowCap.NONE, WindowCap.EVERY_ALLOCATION, WindowCap.EVERY_ALLOCATION, WindowCap.ADMISSION]
    assert [rules_of(v).free_order for v in ("0.22.1", "0.23.0", "0.24.0")] == [
        FreeOrder.APPEND, FreeOrder.WINDOW_UNHASHED_FIRST, FreeOrder.UNHASHED_FIRST]
    assert (rules_of("0.23.0").watermark, rules_of("0.24.0").watermark) == (False, True)
    assert not rules_of("0.25.1").window_cap_in_flight and rules_of("0.26.0").window_cap_in_flight
    assert not rules_of("0.25.1").window_frees_processed and rules_of("0.26.0").window_frees_processed
    assert (rules_of("0.27.1").hybrid_prefix_caching_default, rules_of("0.28.0").hybrid_prefix_caching_default) == (
        False, True)
    assert (rules_of("0.28.0").window_checkpoint_caching, rules_of("0.29.0").window_checkpoint_caching) == (False, True)
    assert (rules_of("0.30.0").threshold_needs_company, rules_of("0.31.0").threshold_needs_company) == (False, True)
    assert rules_of("0.33.0") == NEWEST
    # the memory plan reads the same 0.26.0 change (sliding layers sized for max_in_flight_tokens)
    assert parse_engine("vllm==0.26.0").profile.rules.in_flight_admission


def test_every_rule_changes_somewhere_and_each_change_is_cited():
    fields = [f.name for f in dataclasses.fields(SchedulerRules) if f.name != "release"]
    chain = [p.rules.scheduler for p in VLLM_PROFILES]
    for name in fields:
        assert len({getattr(r, name) for r in chain}) > 1, f"{name} never changes: a rule nothing can test"
    for before, after in itertools.pairwise(VLLM_PROFILES):
        if after.rules.scheduler != before.rules.scheduler:
            assert after.rules.scheduler.release == after.version
            cited = [c for c in after.changes if c.startswith("scheduler") and "::" in c and after.version in c]
            assert cited, (after.version, after.changes)


def test_async_0_11_0_schedules_one_more_decode_for_a_request_whose_last_token_is_in_flight():
    # 10-token prompt, 3 output tokens, async: step 0 prefills (token 1 in flight), steps 1 and 2 decode the
    # in-flight positions (tokens 2 and 3). At step 3 token 3 is still in flight: 0.11.1+ skips the request
    # (sched::schedule), 0.11.0 schedules a 4th decode whose output is dropped (the request finished at step 2).
    reqs = [req(0, 10, out=3)]
    new = run(reqs, NEWEST, async_=True)
    old = run(reqs, older(async_skip_last_in_flight=False), async_=True)
    assert new.per_step_scheduled_tokens == (10, 1, 1)
    assert old.per_step_scheduled_tokens == (10, 1, 1, 1)
    assert new.per_request[0].finish_step == old.per_request[0].finish_step == 2


def test_without_the_whole_sequence_gate_the_first_chunk_is_enough():
    # budget 512: r0 (2000 tokens) prefills over steps 0-3 (4 steps) and decodes 100 tokens (finishes at step 102).
    # At step 4 r1 (3000 tokens, 188 blocks) finds 74 of 200 blocks free: 0.19.0+ waits until r0 finishes;
    # before 0.19.0 only its first chunk (511 tokens, 32 blocks) had to fit.
    reqs = [req(0, 2000, out=100), req(1, 3000, out=1, step=4)]
    assert first_scheduled(run(reqs, NEWEST, num_blocks=201, mnbt=512), "1") == 103
    assert first_scheduled(run(reqs, older(full_sequence_gate=False), num_blocks=201, mnbt=512), "1") == 4


# Gemma-like: one full-attention and one sliding-window (32) group, blocks of 16, budget 64.
HYBRID = (CacheGroup(kind=FULL, block_size=16), CacheGroup(kind=SLIDING, block_size=16, window=32))


def test_the_0_19_gate_counts_a_sliding_group_at_full_length():
    # r0: 200-token prompt in chunks of 64 (steps 0-3), 50 tokens out (finishes at step 52). At step 10 it holds
    # 13 full blocks + 3 sliding ones (207 tokens; blocks before (206 - 31) // 16 = 10 freed): 44 of 60 free.
    # r1 (400 tokens) arrives: full cdiv(400, 16) = 25 blocks; the sliding group counts 25 uncapped (0.19.x) or
    # max_admission_blocks_per_request = cdiv(31 + 64, 16) + 1 = 7 (0.20.0+): 50 > 44 waits, 32 <= 44 is admitted.
    reqs = [req(0, 200, out=50), req(1, 400, out=1, step=10)]
    capped = run(reqs, NEWEST, groups=HYBRID, num_blocks=61, mnbt=64)
    uncapped = run(reqs, older(window_cap=WindowCap.NONE), groups=HYBRID, num_blocks=61, mnbt=64)
    assert first_scheduled(capped, "1") == 10
    assert first_scheduled(uncapped, "1") == 53


def test_the_0_20_0_cap_in_every_allocation_runs_the_pool_dry_where_0_20_2_preempts():
    # Sliding window 32 only, blocks of 16, budget 16 (cap cdiv(31 + 16, 16) + 1 = 4 blocks), 5 usable blocks.
    # A request holds 3 real blocks but for one step in 16 (a new block at every 16th token, the oldest freed
    # 15 tokens later), so two running requests fill the pool. r0 (80 tokens, chunks of 16 over steps 0-4, then
    # one token a step: 75 + s tokens before step s) needs its 8th table entry at step 37 (112 tokens) with no
    # block free: 0.20.2+ preempts r1 (2 tokens, joined at step 5); 0.20.0-0.20.1 count r0's table of 7 entries
    # (null ones included) against the cap of 4 as needing nothing, and BlockPool.get_new_blocks raises.
    g = (CacheGroup(kind=SLIDING, block_size=16, window=32),)
    reqs = [req(0, 80, out=60), req(1, 2, out=60, step=5)]
    fixed = run(reqs, NEWEST, groups=g, num_blocks=6, mnbt=16, seqs=2)
    assert fixed.per_step_running[36:38] == (2, 1) and fixed.preemptions == 2
    with pytest.raises(InputError, match="0.20.0-0.20.1 stops here"):
        run(reqs, older(window_cap=WindowCap.EVERY_ALLOCATION), groups=g, num_blocks=6, mnbt=16, seqs=2)


def test_from_0_26_0_the_sliding_cap_counts_two_batches_with_async_scheduling():
    # As above with async scheduling and a 160-token r1 (full 10 blocks; sliding 10 uncapped). The cap is
    # cdiv(31 + 64, 16) + 1 = 7 on one batch's tokens (0.20.0-0.25.1) or cdiv(31 + 128, 16) + 1 = 11 on
    # max_in_flight_tokens = 2 x 64 (0.26.0+, so min(10, 11) = 10). At step 10 r0 holds 13 + 3 blocks: 18 of 34
    # free. 10 + 7 = 17 fits; 10 + 10 = 20 waits for r0 (finished at step 53 with a batch in flight).
    reqs = [req(0, 200, out=50), req(1, 160, out=1, step=10)]
    one_batch = run(reqs, older(window_cap_in_flight=False), groups=HYBRID, num_blocks=35, mnbt=64, async_=True)
    two = run(reqs, NEWEST, groups=HYBRID, num_blocks=35, mnbt=64, async_=True)
    assert first_scheduled(one_batch, "1") == 10
    assert first_scheduled(two, "1") > 50


def test_from_0_26_0_window_blocks_are_freed_on_the_processed_tokens():
    # Sliding window 32, 10 usable blocks, async: step 0 prefills 100 tokens (7 blocks). At step 1 the prefill is
    # still in flight: 0.26.0+ frees behind the window on num_computed - num_in_flight = 0 tokens (nothing: 7
    # blocks); before, on the 100 computed tokens: (100 - 31) // 16 = 4 blocks freed, 3 held.
    g = (CacheGroup(kind=SLIDING, block_size=16, window=32),)
    processed = run([req(0, 100, out=5)], NEWEST, groups=g, num_blocks=11, async_=True)
    computed = run([req(0, 100, out=5)], older(window_frees_processed=False), groups=g, num_blocks=11, async_=True)
    assert processed.per_step_kv_usage_permille[:3] == (700, 700, 300)
    assert computed.per_step_kv_usage_permille[:3] == (700, 300, 300)


# Free-queue order with prefix caching, 3 usable blocks. r0 (32 tokens, 2 hashed blocks) finishes at step 0: its
# blocks go to the back of the queue, tail first: [3, 2, 1]. r1 (8 tokens) takes block 3 and frees it unhashed at
# step 1. r2 (8 new tokens) takes the front block at step 2. r3 = r0's prompt + 1 token hits r0's blocks at step 3.
# Unhashed freed to the front (0.24.0+): [3, 2, 1], r2 takes 3, r3 hits 2 blocks (32 tokens). Appended (up to
# 0.22.1): [2, 1, 3], r2 evicts block 2 (r0's second), r3 hits 1 block (16 tokens).
FREE_ORDER_REQS = [req(0, [(1, 32)]), req(1, [(2, 8)], step=1), req(2, [(3, 8)], step=2),
                   req(3, [(1, 32), (4, 1)], step=3)]


@pytest.mark.parametrize("order,hit", [(FreeOrder.UNHASHED_FIRST, 32), (FreeOrder.APPEND, 16)])
def test_unhashed_blocks_reused_first_from_0_24_0(order, hit):
    r = run(FREE_ORDER_REQS, older(free_order=order), num_blocks=4, caching=True)
    assert [x.num_cached_tokens for x in r.per_request] == [0, 0, 0, hit]


@pytest.mark.parametrize("kind,hit", [(FULL, 16), (SLIDING, 32)])
def test_0_23_0_reuses_unhashed_blocks_first_in_sliding_window_groups_only(kind, hit):
    # 0.23.0: SlidingWindowManager.free prepends a finished request's unhashed blocks; a full attention group's go
    # to the back as before. A window of 64 covers these prompts, so the sliding group hits like a full one.
    g = (CacheGroup(kind=kind, block_size=16, window=64 if kind == SLIDING else 0),)
    r = run(FREE_ORDER_REQS, older(free_order=FreeOrder.WINDOW_UNHASHED_FIRST), groups=g, num_blocks=4, caching=True)
    assert r.per_request[3].num_cached_tokens == hit


@pytest.mark.parametrize("alone_capped,steps", [(False, (1000, 1)), (True, (300, 300, 300, 100, 1))])
def test_before_0_31_0_the_threshold_caps_a_request_alone_too(alone_capped, steps):
    # one 1000-token prompt, threshold 300: 0.31.0+ applies it only with len(running) + len(waiting) > 1
    r = run([req(0, 1000, out=2)], older(threshold_needs_company=not alone_capped), lpt=300)
    assert r.per_step_scheduled_tokens == steps


def test_a_watermark_needs_a_release_that_has_it():
    SchedulerConfig(watermark=0.1, rules=rules_of("0.24.0"))
    with pytest.raises(InputError, match="no watermark option"):
        SchedulerConfig(watermark=0.1, rules=rules_of("0.23.0"))


@pytest.mark.parametrize("asked,says", [
    ("0.19.1", "scheduler: vLLM 0.19.0's rules (0.19.0 to before 0.20.0"),
    ("0.20.1", "scheduler: vLLM 0.20.0's rules (0.20.0 to before 0.20.2"),
    ("0.27.1", "scheduler: vLLM 0.27.0's rules (0.27.0 to before 0.28.0"),  # 0.27.0: the data-parallel balancer
    ("0.33.0", "scheduler: vLLM 0.31.0's rules (0.31.0 and later"),
])
def test_the_note_names_the_scheduler_release_followed(asked, says):
    notes = scheduler_notes(parse_engine(f"vllm=={asked}").profile, DENSE, caching=True)
    assert notes[0].startswith(says) and len(notes) == 1


DENSE = CacheLayout(num_blocks=10, groups=(CacheGroup(kind=FULL, block_size=16),))
SWA = CacheLayout(num_blocks=10, groups=HYBRID)
LINEAR = CacheLayout(num_blocks=10, groups=(CacheGroup(kind=FULL, block_size=16),
                                            CacheGroup(kind=MAMBA, block_size=8192, state_blocks=1)))


def test_the_notes_say_what_is_not_modelled():
    assert "0.8.0's v1 scheduler was not compared" in scheduler_notes(
        parse_engine("vllm==0.8.0").profile, DENSE, caching=False)[0]
    swa, before = parse_engine("vllm==0.29.0").profile, parse_engine("vllm==0.28.0").profile
    assert any("checkpoint blocks" in n for n in scheduler_notes(swa, SWA, caching=True))
    assert not any("checkpoint" in n for n in scheduler_notes(before, SWA, caching=True))
    assert not any("checkpoint" in n for n in scheduler_notes(swa, SWA, caching=False))
    assert any("prefix caching on by default" in n for n in scheduler_notes(before, LINEAR, caching=False))
    assert len(scheduler_notes(parse_engine("vllm==0.27.0").profile, LINEAR, caching=False)) == 1


def test_without_the_gate_a_request_outgrowing_the_pool_alone_is_stopped_not_looped():
    # 4 usable blocks (64 tokens); a 40-token prompt growing to 90 tokens. Its first chunk fits, so before 0.19.0
    # vLLM admits it, preempts it at 64 tokens (it is alone), re-admits it and preempts it again, forever.
    with pytest.raises(InputError, match="outgrows the whole pool"):
        run([req(0, 40, out=50)], older(full_sequence_gate=False), num_blocks=5)
    # with the gate, it is preempted once and then never admitted again: the same dead end, said so
    with pytest.raises(InputError, match="can never be admitted"):
        run([req(0, 40, out=50)], NEWEST, num_blocks=5)
