"""Pipeline parallelism in the v1 simulator (SchedulerConfig.pipeline_parallel_size, StepModel.stages): the batches
in flight and the stages' timing. vLLM's own scheduler with 2 to 4 stages, sync and async, is matched step for step
by tests/core/sim/test_vllm_reference.py (the *-pp* fixtures); these are the laws around it."""

from __future__ import annotations

import pytest

from kvplan.core.engines.vllm.scheduler_rules import newest
from kvplan.core.sim.model import StepModel
from kvplan.core.sim.v1 import FULL, CacheGroup, CacheLayout, SchedulerConfig, V1Inputs, V1Request, simulate_v1
from kvplan.core.engines.vllm.profiles import VLLM_PROFILES
from kvplan.errors import InputError

D = 10**10  # a stage's time: 10 ms


def run(reqs, *, pp: int, stages: int | None = None, async_: bool = False, v2: bool = False, rules=None):
    sched = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=512, max_model_len=4096, async_scheduling=async_,
                            pipeline_parallel_size=pp, v2_model_runner=v2, rules=rules or newest())
    layout = CacheLayout(num_blocks=400, groups=(CacheGroup(kind=FULL, block_size=16),))
    step = StepModel(base_ps=D, per_token_ps=0, per_prefill_token_ps=0, stages=stages or pp)
    return simulate_v1(V1Inputs(requests=tuple(reqs), scheduler=sched, layout=layout, step_model=step))


def req(i: int, *, out: int = 3, at: int = 0) -> V1Request:
    return V1Request(id=str(i), prompt=((i, 10),), output=(100 + i, out), arrival_ps=at)


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_a_request_alone_waits_for_each_token_to_cross_every_stage(pp):
    # the prefill and each decode take pp stages; the next token is scheduled only once the last is back
    r = run([req(0, out=3)], pp=pp).per_request[0]
    assert r.ttft_s == pytest.approx(pp * D / 1e12)
    assert r.e2e_s == pytest.approx(3 * pp * D / 1e12)


def test_requests_arriving_together_share_their_batches():
    # four requests at once fit one batch: they cross the stages together, as fast as one alone
    for pp in (2, 4):
        many = run([req(i, out=5) for i in range(4)], pp=pp)
        alone = run([req(0, out=5)], pp=pp)
        assert many.seconds == alone.seconds and many.steps == alone.steps
        assert many.per_step_scheduled_tokens == tuple(4 * t for t in alone.per_step_scheduled_tokens)


def test_a_request_arriving_while_the_engine_waits_is_scheduled_when_the_oldest_batch_is_back():
    # pp 2, sync: at 0 the first request's prefill is scheduled, then (queue not full) an empty batch, which takes
    # the second place; the engine then waits for the prefill (2 stages, 20 ms). The second request, arriving at
    # 5 ms, is scheduled at 20 ms beside the first one's decode, and they decode together from there
    both = run([req(0, out=4), req(1, out=4, at=D // 2)], pp=2)
    first, second = both.per_request
    assert first.ttft_s == pytest.approx(2 * D / 1e12) and first.e2e_s == pytest.approx(8 * D / 1e12)
    assert second.queue_s == pytest.approx(1.5 * D / 1e12)
    assert both.per_step_scheduled_tokens == (10, 1 + 10, 2, 2, 1)
    assert both.schedule_calls > both.steps  # the empty batches


def test_sync_stages_schedule_no_request_twice_while_its_token_is_in_flight():
    r = run([req(0, out=4)], pp=3)
    # one request: each counted step schedules it once; empty schedule() calls fill the queue between
    assert r.per_step_scheduled_tokens == (10, 1, 1, 1)
    assert r.schedule_calls > r.steps


def test_async_on_the_v2_runner_staggers_a_requests_decodes():
    # pp 2, async on the V2 model runner: 3 batches in flight, a request decodes at most every 2 schedule() calls
    sync = run([req(0, out=6)], pp=2)
    v2 = run([req(0, out=6)], pp=2, async_=True, v2=True)
    assert v2.per_request[0].finish_step >= 2 * 5  # six tokens, each decode 2 calls after the last
    assert v2.seconds <= sync.seconds  # it does not wait for each token to come back


def test_async_on_the_v1_runner_keeps_pp_batches_and_no_stagger():
    # vLLM before 0.33.0 keeps async scheduling on the V1 model runner with pipeline stages: max_concurrent_batches
    # is pp (2 at least), and nothing staggers a request's decodes (a reviewer matched recorded runs with it)
    cfg = SchedulerConfig(async_scheduling=True, pipeline_parallel_size=3, v2_model_runner=False)
    assert cfg.batches_in_flight == 3 and cfg.decode_stagger == 0
    assert SchedulerConfig(async_scheduling=True, pipeline_parallel_size=3, v2_model_runner=True).batches_in_flight == 4
    assert SchedulerConfig(async_scheduling=True).batches_in_flight == 2
    r = run([req(0, out=6)], pp=3, async_=True, v2=False)
    assert r.completed == 1


def test_what_kvplan_did_not_compare():
    older = next(p for p in VLLM_PROFILES if p.version == "0.26.0").rules.scheduler
    with pytest.raises(InputError, match="0.27.0"):
        run([req(0)], pp=2, rules=older)
