"""Quiet stretches (kvplan/core/sim/v1/quiet.py) change nothing: the same results and the same pool, block by
block, as the loop that walks every request at every step (``fast_path=False``)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.core.engines.vllm.scheduler_rules import V1_BASELINE, newest
from kvplan.core.sim.model import StepModel
from kvplan.core.sim.v1 import FULL, CacheGroup, CacheLayout, SchedulerConfig, V1Inputs, V1Request
from kvplan.core.sim.model import allocator_spec
from kvplan.core.sim.v1.contiguous import ContiguousManager
from kvplan.core.sim.v1.scheduler import _Sim

quiet_counts: list[tuple[int, int, int]] = []  # each run's steps advanced in stretches, admitted and stopped in them
STEP = StepModel(base_ps=5_000_000, per_token_ps=20_000, per_prefill_token_ps=90_000)
TICK = StepModel(base_ps=7_000_000, per_token_ps=0, per_prefill_token_ps=0)  # arrivals land on step ends


def run(inputs: V1Inputs, fast: bool):
    """The result, the pool's state at the end, and how many quiet stretches ran."""
    sim = _Sim(inputs, check=True)
    sim.fast = fast
    sim.timeline_points = 40
    result = sim.run()
    pool = sim.mgr.pool
    if isinstance(sim.mgr, ContiguousManager):
        state = (pool.num_free, sim.mgr.regions, sim.mgr.entries, sim.mgr.internal)
    else:
        state = (list(pool.plain), pool.cached_order(), pool.caches, pool.key, pool.ref, pool.evicted)
    quiet_counts.append(sim.quiet_counts)
    return result, state, sim.quiet_stretches


SERIES = ("per_step_running", "per_step_kv_usage_permille", "per_step_scheduled_tokens", "per_step_waiting",
          "per_step_start_ps")


def lean_run_agrees(inputs: V1Inputs, full) -> None:
    """Without the per-step figures (simulate_v1(per_step=False), the default path's) every other figure is the
    same, and the peaks are those of the figures not kept."""
    sim = _Sim(inputs, check=False)
    sim.per_step, sim.timeline_points = False, 40
    lean = sim.run()
    assert all(getattr(lean, f) == () for f in SERIES)
    assert lean.peak_kv_usage_permille == max(full.per_step_kv_usage_permille, default=0)
    assert lean.peak_waiting == max(full.per_step_waiting, default=0)
    assert lean == dataclasses.replace(full, **{f: () for f in SERIES})


def inputs(reqs, *, blocks: int, block: int, groups: int, caching: bool, async_: bool, rules, seqs: int,
           mnbt: int, step: StepModel | None, lpt: int = 0, mml: int = 1024, watermark: float = 0.0,
           reserve: bool = True, allocator: str | None = None) -> V1Inputs:
    layout = CacheLayout(num_blocks=blocks, groups=tuple(CacheGroup(kind=FULL, block_size=block)
                                                         for _ in range(groups)))
    sched = SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=mnbt, max_model_len=mml,
                            enable_prefix_caching=caching, async_scheduling=async_, rules=rules,
                            long_prefill_token_threshold=lpt, watermark=watermark, reserve_full_isl=reserve)
    return V1Inputs(requests=tuple(reqs), scheduler=sched, layout=layout, step_model=step,
                    allocator=allocator_spec(allocator) if allocator else None)


def test_a_plain_decode_run_takes_quiet_stretches_and_changes_nothing():
    # 12 requests a few steps apart, long outputs: most steps are decode-only, with blocks crossed and filled
    reqs = [V1Request(id=str(i), prompt=((i % 3, 40), (100 + i, 30 + i)), output=(200 + i, 150 + 7 * i),
                      arrival_step=9 * i) for i in range(12)]
    for async_ in (False, True):
        inp = inputs(reqs, blocks=70, block=16, groups=1, caching=True, async_=async_, rules=newest(), seqs=8,
                     mnbt=256, step=None)
        fast, slow = run(inp, True), run(inp, False)
        assert fast[2] > 3 and slow[2] == 0
        assert fast[0] == slow[0] and fast[1] == slow[1]
        assert fast[0].preemptions > 0  # the pool ran short: stretches ended at it
        steps, admitted, stopped = quiet_counts[-2]  # the fast run's
        assert steps > fast[0].steps // 2 and admitted > 0 and stopped > 0  # they went on through arrivals and stops


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_quiet_stretches_give_the_step_by_step_results_and_pool(data):
    n = data.draw(st.integers(1, 14))
    timed = data.draw(st.booleans())
    reqs = []
    for i in range(n):
        shared = data.draw(st.integers(0, 2))
        prompt = ((shared, data.draw(st.integers(1, 60))), (100 + i, data.draw(st.integers(0, 40))))
        prompt = tuple(p for p in prompt if p[1])
        out = data.draw(st.integers(1, 260))
        # a later turn may repeat an earlier request's whole sequence: the same hashes filed twice
        if i and data.draw(st.booleans()):
            j = data.draw(st.integers(0, i - 1))
            prompt, out = (*reqs[j].prompt, reqs[j].output), data.draw(st.integers(1, 60))
        if sum(k for _, k in prompt) + out > 1000:
            out = max(1, 1000 - sum(k for _, k in prompt))
        at = data.draw(st.integers(0, 400))
        reqs.append(V1Request(id=str(i), prompt=prompt, output=(200 + i, out),
                              **({"arrival_ps": at * 7_000_000} if timed else {"arrival_step": at})))
    block = data.draw(st.sampled_from([4, 16]))
    groups = data.draw(st.integers(1, 2))
    blocks = 1 + groups * data.draw(st.integers(1024 // block, 3 * 1024 // block))
    rules = data.draw(st.sampled_from([newest(), V1_BASELINE, dataclasses.replace(V1_BASELINE, release="0.11.1",
                                                                                   async_skip_last_in_flight=True)]))
    inp = inputs(reqs, blocks=blocks, block=block, groups=groups, caching=data.draw(st.booleans()),
                 async_=data.draw(st.booleans()), rules=rules, seqs=data.draw(st.integers(1, 10)),
                 mnbt=data.draw(st.sampled_from([16, 64, 512])), step=data.draw(st.sampled_from([STEP, TICK]))
                 if timed or data.draw(st.booleans()) else None, lpt=data.draw(st.sampled_from([0, 0, 8, 40])))
    fast, slow = run(inp, True), run(inp, False)
    assert fast[0] == slow[0]
    assert fast[1] == slow[1]
    lean_run_agrees(inp, fast[0])


def test_a_long_prompt_admitted_chunk_by_chunk_before_the_whole_sequence_gate():
    # vLLM 0.11.0 (no whole-sequence gate) with long_prefill_token_threshold 8: the 500-token prompt's first chunk
    # fits the free blocks though the whole prompt does not, so it is admitted while the others decode
    reqs = [V1Request(id=str(i), prompt=((10 + i, 96),), output=(20 + i, 200), arrival_step=0) for i in range(2)]
    reqs.append(V1Request(id="long", prompt=((30, 500),), output=(31, 5), arrival_step=5))
    for async_ in (False, True):
        inp = inputs(reqs, blocks=40, block=16, groups=1, caching=False, async_=async_, rules=V1_BASELINE, seqs=4,
                     mnbt=64, step=None, lpt=8)
        fast, slow = run(inp, True), run(inp, False)
        assert fast[2] > 0
        assert fast[0] == slow[0] and fast[1] == slow[1]


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_quiet_stretches_hold_under_every_admission_rule_and_allocator(data):
    # contiguous allocators (a region per request, no prefix caching), a watermark, no whole-sequence gate, and
    # requests stopped by max_model_len rather than their output length
    mml = data.draw(st.sampled_from([256, 1024]))
    reqs = []
    for i in range(data.draw(st.integers(1, 12))):
        prompt = data.draw(st.integers(1, min(200, mml - 1)))
        out = data.draw(st.integers(1, 400))  # past max_model_len at 256: stopped there
        reqs.append(V1Request(id=str(i), prompt=((100 + i, prompt),), output=(200 + i, out),
                              arrival_step=data.draw(st.integers(0, 300))))
    allocator = data.draw(st.sampled_from([None, "contiguous-max", "contiguous-pow2", "contiguous-oracle"]))
    watermark = 0.0 if allocator else data.draw(st.sampled_from([0.0, 0.05]))
    rules = dataclasses.replace(newest(), watermark=True) if watermark else newest()
    blocks = 1 + data.draw(st.integers(mml // 16 + 2, 4 * mml // 16))
    inp = inputs(reqs, blocks=blocks, block=16, groups=1, caching=False, async_=data.draw(st.booleans()),
                 rules=rules, seqs=data.draw(st.integers(1, 10)), mnbt=data.draw(st.sampled_from([16, 64, 512])),
                 step=None, mml=mml, watermark=watermark, reserve=data.draw(st.booleans()), allocator=allocator)
    fast, slow = run(inp, True), run(inp, False)
    assert fast[0] == slow[0]
    assert fast[1] == slow[1]
    lean_run_agrees(inp, fast[0])
