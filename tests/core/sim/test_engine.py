"""The event-driven engine equals the step-by-step reference; allocator laws hold."""

from __future__ import annotations

import dataclasses
import multiprocessing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.core.sim.engine import simulate
from kvplan.core.sim.model import Preemption, SimConfig, SimRequest, StepModel, allocator_spec, rejection
from tests.core.sim.reference import simulate_reference

ALLOCATORS = ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged-1", "paged-4", "paged-5", "paged-16"]


@st.composite
def workloads(draw):
    count = draw(st.integers(1, 40))
    max_len = draw(st.sampled_from([16, 32, 64, 128]))
    shared = draw(st.sampled_from([0, 0, 4, 9]))
    reqs = []
    t = 0
    for i in range(count):
        t += draw(st.integers(0, 3_000))
        prompt = draw(st.integers(max(1, shared), max_len - 1))
        output = draw(st.integers(1, max_len - prompt))
        n = draw(st.sampled_from([1, 1, 1, 2, 3]))
        reqs.append(SimRequest(id=i, arrival_ps=t, prompt=prompt, output=output, n=n))
    cfg = SimConfig(
        pool_slots=draw(st.integers(max_len, 6 * max_len)),
        max_num_seqs=draw(st.integers(1, 12)),
        # below max_model_len too: recomputed prefills then outgrow the budget (once a livelock)
        max_num_batched_tokens=draw(st.integers(max_len // 4, 3 * max_len)),
        max_model_len=max_len,
        step=StepModel(base_ps=draw(st.integers(1, 500)), per_token_ps=draw(st.integers(0, 20)),
                       per_prefill_token_ps=draw(st.integers(0, 20))),
        shared_prefix=shared,
        preemption=draw(st.sampled_from(list(Preemption))),
    )
    return reqs, cfg


def _comparable(result):
    return dataclasses.replace(result, timeline=())


@settings(max_examples=300, deadline=None)
@given(w=workloads(), name=st.sampled_from(ALLOCATORS), placement=st.sampled_from(["buddy", "first-fit"]))
def test_engine_equals_reference(w, name, placement):
    reqs, cfg = w
    alloc = allocator_spec(name, placement=placement)
    fast = simulate(reqs, cfg, alloc, check_invariants=True)
    ref = simulate_reference(reqs, cfg, alloc)
    assert _comparable(fast) == _comparable(ref)
    assert fast.completed + fast.rejected == len(reqs)  # none is lost
    total = (fast.token_states_frac + fast.reserved_frac + fast.internal_frag_frac + fast.external_frag_frac
             + fast.free_frac)
    assert total == pytest.approx(1.0 if fast.makespan_steps else 0.0)  # memory adds up
    for frac in (fast.token_states_frac, fast.reserved_frac, fast.internal_frag_frac, fast.external_frag_frac,
                 fast.free_frac):
        assert frac >= -1e-12


_real_rejection = rejection


def _only_pool_rule(req, cfg, alloc):
    """Only ``larger_than_kv_pool`` (a sequence that outgrows the pool while running alone would be
    preempted and re-admitted forever: that rule, not the guard, stops it)."""
    loose = dataclasses.replace(cfg, max_num_seqs=10**9, max_num_batched_tokens=10**9, max_model_len=10**9,
                                shared_prefix=0)
    return _real_rejection(req, loose, alloc)


@settings(max_examples=100, deadline=None)
@given(w=workloads(), name=st.sampled_from(ALLOCATORS))
def test_progress_guard_without_upfront_rejections(monkeypatch_module, w, name):
    """With the admission rejections switched off, requests that can never run end through the progress
    guard (rule 6) with a reason, in both simulators alike, instead of looping."""
    reqs, cfg = w
    alloc = allocator_spec(name)
    fast = simulate(reqs, cfg, alloc)
    ref = simulate_reference(reqs, cfg, alloc)
    assert _comparable(fast) == _comparable(ref)
    assert fast.completed + fast.rejected == len(reqs)


@pytest.fixture(scope="module")
def monkeypatch_module():
    from kvplan.core.sim import engine
    from tests.core.sim import reference

    mp = pytest.MonkeyPatch()
    mp.setattr(engine, "rejection", _only_pool_rule)
    mp.setattr(reference, "rejection", _only_pool_rule)
    yield mp
    mp.undo()


def test_guard_rejects_what_can_never_be_admitted(monkeypatch_module):
    cfg = SimConfig(pool_slots=256, max_num_seqs=4, max_num_batched_tokens=256, max_model_len=256,
                    step=StepModel(base_ps=10, per_token_ps=1, per_prefill_token_ps=1))
    reqs = [SimRequest(id=0, arrival_ps=0, prompt=10, output=5, n=5), SimRequest(id=1, arrival_ps=5, prompt=10, output=5)]
    for name in ("paged-16", "contiguous-oracle"):
        r = simulate(reqs, cfg, allocator_spec(name))
        assert r.rejected_reasons == {"no_progress_blocked_by_seqs": 1} and r.completed == 1, name
    big = [SimRequest(id=0, arrival_ps=0, prompt=200, output=10)]  # over the budget: admitted alone, as chunked
    assert simulate(big, dataclasses.replace(cfg, pool_slots=4096, max_num_batched_tokens=64),
                    allocator_spec("paged-16")).completed == 1


def _run_regression(queue) -> None:
    # the fuzzed livelock: opt-13b, 1024 slots, 2 requests at once, prompt 200, output 700, budget 256
    cfg = SimConfig(pool_slots=1024, max_num_seqs=256, max_num_batched_tokens=256, max_model_len=2048,
                    step=StepModel(base_ps=10**10, per_token_ps=0, per_prefill_token_ps=0),
                    preemption=Preemption.RECOMPUTE)
    reqs = [SimRequest(id=i, arrival_ps=0, prompt=200, output=700) for i in range(2)]
    r = simulate(reqs, cfg, allocator_spec("paged-16"), check_invariants=True)
    queue.put((r.completed, r.rejected, r.preemptions, _comparable(r) == _comparable(simulate_reference(
        reqs, cfg, allocator_spec("paged-16")))))


def test_recompute_beyond_the_token_budget_finishes():
    """A preempted request that grew past max_num_batched_tokens comes back (as chunked prefill would)."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_run_regression, args=(queue,))
    proc.start()
    proc.join(60)  # a hang guard, not a timing assertion: the run takes milliseconds
    if proc.is_alive():
        proc.kill()
        pytest.fail("the simulation did not finish (livelock)")
    completed, rejected, preemptions, same = queue.get(timeout=5)
    assert (completed, rejected) == (2, 0) and preemptions >= 1 and same


# -- latency, request columns, screening, progress --------------------------------------------------
_ONE_S = 10**12


def test_latency_by_hand():
    """Two requests, one step a second, a pool that holds one of them: B waits for A (numbers by hand).

    A arrives at 0 s: admitted at step 0 (queue 0), its prefill step ends at 1 s (TTFT 1), it holds
    prompt + output after 5 more steps and completes at the end of step 5 (6 s). B arrives at 0.5 s,
    is admitted at step 6 (6 s: queue 5.5), prefilled by 7 s (TTFT 6.5), done at the end of step 11
    (12 s: e2e 11.5). Nearest rank of two values: p50 the smaller, p90 and p99 the larger.
    """
    cfg = SimConfig(pool_slots=20, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=16,
                    step=StepModel(base_ps=_ONE_S, per_token_ps=0, per_prefill_token_ps=0))
    reqs = [SimRequest(id=0, arrival_ps=0, prompt=10, output=5), SimRequest(id=1, arrival_ps=_ONE_S // 2, prompt=10,
                                                                             output=5)]
    for name in ("contiguous-oracle", "paged-1"):
        r = simulate(reqs, cfg, allocator_spec(name))
        assert r.latency is not None and r.completed == 2, name
        assert (r.latency.queue_s.p50, r.latency.queue_s.p90, r.latency.queue_s.p99) == (0.0, 5.5, 5.5), name
        assert (r.latency.ttft_s.p50, r.latency.ttft_s.p90) == (1.0, 6.5), name
        assert (r.latency.e2e_s.p50, r.latency.e2e_s.p99) == (6.0, 11.5), name
    assert simulate([], cfg, allocator_spec("paged-1")).latency is None


@given(st.lists(st.integers(0, 10**15), min_size=1, max_size=300))
def test_percentiles_are_nearest_rank(values):
    from kvplan.core.sim.model import percentiles_s

    p = percentiles_s(values)
    ordered = sorted(values)
    for q, got in ((50, p.p50), (90, p.p90), (99, p.p99)):
        # the smallest value with at least q% of the values at or below it
        want = next(v for v in ordered if sum(x <= v for x in values) * 100 >= q * len(values))
        assert got == want / 1e12


@settings(max_examples=60, deadline=None)
@given(w=workloads(), name=st.sampled_from(ALLOCATORS), data=st.data())
def test_columns_and_any_order_give_the_same_result(w, name, data):
    """A list, its columns (RequestArrays) and a shuffled list give one result: requests run in (arrival, id) order."""
    from kvplan.core.sim.model import RequestArrays

    reqs, cfg = w
    alloc = allocator_spec(name)
    base = simulate(reqs, cfg, alloc)
    assert simulate(RequestArrays.of(reqs), cfg, alloc) == base
    assert simulate(data.draw(st.permutations(reqs)), cfg, alloc) == base
    cols = RequestArrays.of(reqs)
    assert list(cols) == [dataclasses.replace(r, id=i) for i, r in enumerate(sorted(reqs, key=lambda r: (
        r.arrival_ps, r.id)))]


@settings(max_examples=200, deadline=None)
@given(w=workloads(), name=st.sampled_from(ALLOCATORS), placement=st.sampled_from(["buddy", "first-fit"]),
       mml_cut=st.integers(0, 3), pool_cut=st.integers(1, 4))
def test_screening_bounds_agree_with_the_rule(w, name, placement, mml_cut, pool_cut):
    """The column bounds that skip per-request checks never let through a request the rule rejects."""
    from kvplan.core.sim.model import RequestArrays, screen

    reqs, cfg = w
    cfg = dataclasses.replace(cfg, max_model_len=max(2, cfg.max_model_len - mml_cut),
                              pool_slots=max(1, cfg.pool_slots // pool_cut))
    alloc = allocator_spec(name, placement=placement)
    cols = RequestArrays.of(reqs)
    keep, reasons = screen(cols, cfg, alloc)
    slow_keep, slow_reasons = screen(cols, cfg, alloc, rule=lambda r, c, a: rejection(r, c, a))
    assert reasons == slow_reasons
    assert (keep if keep is not None else list(range(len(cols)))) == slow_keep


def test_progress_counts_finished_requests():
    cfg = SimConfig(pool_slots=4096, max_num_seqs=8, max_num_batched_tokens=512, max_model_len=512,
                    step=StepModel(base_ps=10, per_token_ps=1, per_prefill_token_ps=1))
    reqs = [SimRequest(id=i, arrival_ps=i * 50, prompt=20 + i % 30, output=5 + i % 40) for i in range(2000)]
    reqs.append(SimRequest(id=2000, arrival_ps=0, prompt=600, output=1))  # rejected up front
    seen: list[int] = []
    r = simulate(reqs, cfg, allocator_spec("paged-16"), progress=seen.append)
    assert seen == sorted(seen) and seen[0] >= 1 and seen[-1] == len(reqs) == r.completed + r.rejected
    assert len(seen) > 50  # moves with requests, not once at the end


def test_pow2_is_the_papers_rule():
    """Kwon et al. 2023, section 6.1: Orca (Pow2) "over-reserves the space for outputs by at most 2x. For
    example, if the true output length is 25, it reserves 32 positions for outputs" (plus the prompt)."""
    pow2, oracle, mx = (allocator_spec(n) for n in ("contiguous-pow2", "contiguous-oracle", "contiguous-max"))
    assert pow2.reservation_slots(40, 25, 2048) == 40 + 32
    assert pow2.reservation_slots(40, 32, 2048) == 40 + 32
    assert pow2.reservation_slots(1500, 600, 2048) == 2048  # never more than Orca (Max)'s reservation
    assert oracle.reservation_slots(40, 25, 2048) == 65
    assert mx.reservation_slots(40, 25, 2048) == 2048


@given(gap=st.integers(1, 10**18), a1=st.integers(1, 10**13), a2=st.integers(0, 10**9))
def test_first_step_reaching_a_clock_is_the_least(gap, a1, a2):
    from kvplan.core.sim.engine import _first_reaching

    def f(c):
        return a1 * c + a2 * c * (c - 1) // 2

    c = _first_reaching(gap, a1, a2)
    assert c >= 1 and f(c) >= gap and (c == 1 or f(c - 1) < gap)
