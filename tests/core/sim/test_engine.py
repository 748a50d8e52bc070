"""The event-driven engine equals the step-by-step reference; allocator laws hold."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.core.sim.engine import simulate
from kvplan.core.sim.model import Preemption, SimConfig, SimRequest, StepModel, allocator_spec
from tests.core.sim.reference import simulate_reference

ALLOCATORS = ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged-1", "paged-4", "paged-16"]


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
        max_num_batched_tokens=draw(st.integers(max_len, 3 * max_len)),
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
