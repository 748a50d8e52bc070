"""Data-parallel ranks behind vLLM's load balancer (kvplan/core/sim/v1/dp.py): each rank driven by the router runs
exactly as its own run over the requests it was sent, the balancer's rules pick as vLLM's code does, and the merged
result adds the ranks up."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvplan.core.engines.vllm.scheduler_rules import V1_BASELINE, newest
from kvplan.core.sim.model import StepModel
from kvplan.core.sim.v1 import FULL, CacheGroup, CacheLayout, SchedulerConfig, V1Inputs, V1Request, simulate_v1
from kvplan.core.sim.v1.dp import RouterRules, Score, pick, route, simulate_dp
from kvplan.core.sim.v1.tables import RequestTable
from kvplan.errors import InputError

STEP = StepModel(base_ps=5_000_000_000, per_token_ps=2_000_000, per_prefill_token_ps=9_000_000)
MS = 10**9


def rules_of(score: Score, *, rotate: bool = True, dense_counts: bool = True, servers: bool = False) -> RouterRules:
    return RouterRules(score=score, rotate=rotate, dense_counts=dense_counts, dense_lockstep=False,
                       servers_per_engine=servers)


def make(reqs, *, blocks=400, block=16, caching=False, async_=False, seqs=16, mnbt=512, rules=None,
         step=STEP) -> V1Inputs:
    sched = SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=mnbt, max_model_len=2048,
                            enable_prefix_caching=caching, async_scheduling=async_, rules=rules or newest())
    layout = CacheLayout(num_blocks=blocks, groups=(CacheGroup(kind=FULL, block_size=block),))
    return V1Inputs(requests=tuple(reqs), scheduler=sched, layout=layout, step_model=step)


requests_st = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 400), st.integers(1, 300), st.integers(0, 90)),
                       min_size=1, max_size=40)


def as_requests(drawn) -> list[V1Request]:
    """(shared prefix id, prompt, output, gap in ms) -> requests; a shared prefix of 32 tokens where the id is not 0."""
    reqs, t = [], 0
    for i, (shared, prompt, out, gap) in enumerate(drawn):
        t += gap * MS
        segs = ((1000 + shared, 32), (i, prompt)) if shared else ((i, prompt),)
        reqs.append(V1Request(id=str(i), prompt=segs, output=(5000 + i, out), arrival_ps=t))
    return reqs


@settings(max_examples=80, deadline=None)
@given(requests_st, st.integers(1, 4), st.sampled_from(list(Score)), st.booleans(), st.booleans(),
       st.sampled_from([40, 120, 400]), st.sampled_from([newest(), V1_BASELINE]))
def test_a_rank_driven_by_the_router_runs_as_its_own_run(drawn, size, score, async_, caching, blocks, rules):
    # the router stops each rank at every arrival and publication (quiet stretches broken at its horizon): its
    # closing figures must be those of the same rank run alone over the requests it was sent
    assume(all(32 + prompt + out < (blocks - 1) * 16 for _, prompt, out, _ in drawn))  # each fits the pool alone
    inp = make(as_requests(drawn), blocks=blocks, caching=caching, async_=async_, rules=rules)
    finals: list[tuple[int, ...]] = []
    rows = route(inp, size, rules_of(score), finals=finals)
    assert sorted(i for r in rows for i in r) == list(range(len(drawn)))  # every request sent once
    for sent, final in zip(rows, finals):
        alone = simulate_v1(dataclasses.replace(inp, requests=tuple(inp.requests[i] for i in sent)))
        assert final == (alone.steps, alone.preemptions, alone.completed, alone.generated_tokens,
                         round(alone.seconds * 10**12) if sent else final[4])


@pytest.mark.parametrize("async_, pp", [(False, 1), (True, 1), (False, 2)])
def test_a_rank_gone_idle_past_the_next_arrival_waits_for_the_router(async_, pp):
    # A's long prefill ends after B and C have arrived: the idle rank's clock is past both, and alone it admits
    # them together; driven by the router it must not look past the first before C is sent (a reviewer's case)
    reqs = [V1Request(id="A", prompt=((0, 500),), output=(1, 1), arrival_ps=0),
            V1Request(id="B", prompt=((1, 16),), output=(2, 3), arrival_ps=5 * MS),
            V1Request(id="C", prompt=((2, 16),), output=(3, 3), arrival_ps=8 * MS)]
    sched = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=512, max_model_len=2048, async_scheduling=async_,
                            pipeline_parallel_size=pp)
    inp = dataclasses.replace(make(reqs), scheduler=sched)
    finals: list[tuple[int, ...]] = []
    rows = route(inp, 1, rules_of(Score.QUEUE), finals=finals)
    alone = simulate_v1(inp)
    assert rows == ((0, 1, 2),)
    assert finals[0] == (alone.steps, alone.preemptions, alone.completed, alone.generated_tokens,
                         round(alone.seconds * 10**12))


def test_one_rank_is_the_engine_alone():
    reqs = as_requests([(i % 3, 100 + 37 * i % 300, 20 + 13 * i % 200, 7) for i in range(60)])
    inp = make(reqs, blocks=60, caching=True)
    dp = simulate_dp(inp, 1, rules_of(Score.IN_FLIGHT))
    alone = simulate_v1(inp, per_step=False)
    assert dp.rows == (tuple(range(60)),)
    assert dp.merged.preemptions == alone.preemptions > 0
    for f in ("steps", "completed", "generated_tokens", "mean_kv_usage", "mean_running", "ttft_s", "e2e_s",
              "queue_steps", "prefix_hit_rate", "peak_kv_usage_permille", "free_frac", "throughput_tokens_per_s"):
        assert getattr(dp.merged, f) == getattr(alone, f), f


def test_the_merged_result_adds_up_the_ranks():
    reqs = as_requests([(0, 50 + 29 * i % 400, 10 + 17 * i % 250, 3) for i in range(80)])
    inp = make(reqs, blocks=50)
    dp = simulate_dp(inp, 3, rules_of(Score.IN_FLIGHT))
    m, ranks = dp.merged, dp.ranks
    assert m.completed == 80 == sum(len(r) for r in dp.rows)
    assert m.preemptions == sum(r.preemptions for r in ranks) > 0
    assert m.generated_tokens == sum(r.generated_tokens for r in ranks) == sum(q.output[1] for q in reqs)
    assert m.steps == sum(r.steps for r in ranks)
    assert m.peak_running == max(r.peak_running for r in ranks)
    assert m.mean_kv_usage == pytest.approx(sum(r.mean_kv_usage * r.steps for r in ranks) / m.steps)
    assert m.seconds == max(r.seconds for r in ranks)
    # each request's record is its rank's, at its own row
    for rank, rows in zip(ranks, dp.rows):
        for j, i in enumerate(rows):
            assert m.per_request[i] == dataclasses.replace(rank.per_request[j], id=str(i))


def test_requests_in_a_table_are_sent_as_rows_of_their_own():
    table = RequestTable()
    for i, q in enumerate(as_requests([(0, 80, 40, 5)] * 30)):
        table.append(q.prompt, q.output, q.arrival_ps)
    inp = dataclasses.replace(make([]), requests=table)
    dp = simulate_dp(inp, 2, rules_of(Score.QUEUE))
    assert dp.merged.completed == 30 and len(dp.merged.per_request) == 30


def test_the_balancer_scores_as_each_release_does():
    counts = [[2, 5, 0.9], [1, 9, 0.2], [0, 12, 0.4]]
    # 0.10.1-0.26: waiting x 4 + running: 13, 13, 12
    assert pick(rules_of(Score.QUEUE), counts, [0, 0, 0], 0) == 2
    # 0.27: max(in flight, waiting + running) + waiting x 6 x max(0, usage - 0.5): 7 + 2 x 6 x 0.4 = 11.8, 10, 12
    assert pick(rules_of(Score.IN_FLIGHT), counts, [0, 0, 0], 0) == 1
    # the balancer's own count of requests in flight raises an engine's score above the stale published one:
    # 11.8, max(20, 10) = 20, 12
    assert pick(rules_of(Score.IN_FLIGHT), counts, [0, 20, 0], 0) == 0
    # with N API servers each balancer counts its own requests N times: max(3 x 4, 10) = 12 > 11.8
    assert pick(rules_of(Score.IN_FLIGHT), counts, [0, 4, 0], 0, clients=3) == 0
    # ties go to the first engine scanned from the start
    even = [[0, 0, 0.0]] * 3
    assert [pick(rules_of(Score.QUEUE), even, [0] * 3, s) for s in range(3)] == [0, 1, 2]


def test_a_burst_between_publications_is_spread_round_robin():
    # 8 requests at once: no publication in between, the balancer's own additions spread them over 4 engines
    reqs = [V1Request(id=str(i), prompt=((i, 64),), output=(100 + i, 8), arrival_ps=0) for i in range(8)]
    for score in Score:
        rows = route(make(reqs), 4, rules_of(score))
        assert sorted(len(r) for r in rows) == [2, 2, 2, 2], score


def test_a_loaded_engine_is_avoided_once_its_counts_are_published():
    # a long request on one engine, then after a publication every short one goes elsewhere while it runs
    reqs = [V1Request(id="long", prompt=((0, 1500),), output=(1, 400), arrival_ps=0)]
    reqs += [V1Request(id=str(i), prompt=((i, 16),), output=(100 + i, 2), arrival_ps=(150 + 200 * i) * MS)
             for i in range(1, 6)]
    for score in Score:
        rows = route(make(reqs), 2, rules_of(score))
        assert rows[0] == (0,) and rows[1] == (1, 2, 3, 4, 5), score
    # 0.14.0-0.26.0: a dense model's engines publish nothing, the balancer sees zeros: round-robin regardless
    rows = route(make(reqs), 2, rules_of(Score.QUEUE, dense_counts=False))
    assert rows == ((0, 2, 4), (1, 3, 5))
    # an MoE model's engines publish in every release
    assert route(make(reqs), 2, rules_of(Score.QUEUE, dense_counts=False), moe=True)[0] == (0,)


def test_the_five_second_republication_drops_the_balancers_own_additions():
    # one request every 6 s to two idle engines: each time the counts are republished (zeros, unchanged), so a
    # balancer whose scan always starts at engine 0 (before 0.25.0) sends every one there; from 0.25.0 it alternates
    reqs = [V1Request(id=str(i), prompt=((i, 16),), output=(100 + i, 2), arrival_ps=6000 * MS * i) for i in range(4)]
    assert route(make(reqs), 2, rules_of(Score.QUEUE, rotate=False)) == ((0, 1, 2, 3), ())
    assert route(make(reqs), 2, rules_of(Score.QUEUE, rotate=True)) == ((0, 2), (1, 3))


def test_unchanged_counts_are_republished_every_five_seconds_from_the_last_time():
    # a dense model in 0.14.0-0.24.0 (no counts, the scan always from engine 0): requests at 0, 7.3 and 11 s.
    # The coordinator republishes the zeros at 5 and 10 s (not at 7.3 s, when the second arrives), so the second
    # and the third both see fresh zeros and go to engine 0
    reqs = [V1Request(id=str(i), prompt=((i, 16),), output=(100 + i, 2), arrival_ps=t * 10**9)
            for i, t in enumerate((0, 7300, 11000))]
    assert route(make(reqs), 2, rules_of(Score.QUEUE, rotate=False, dense_counts=False)) == ((0, 1, 2), ())
    # at 0, 4 and 7.3 s: the republication at 5 s drops the addition the request at 4 s made
    reqs = [V1Request(id=str(i), prompt=((i, 16),), output=(100 + i, 2), arrival_ps=t * 10**9)
            for i, t in enumerate((0, 4000, 7300))]
    assert route(make(reqs), 2, rules_of(Score.QUEUE, rotate=False, dense_counts=False)) == ((0, 2), (1,))


def test_an_api_server_per_engine_each_balancing_its_own_requests():
    # 0.15.0 on: `vllm serve -dp 4` has 4 API servers; requests reach them in turn, each scans from its own index
    # and counts its own additions 4 times: a burst still spreads evenly
    reqs = [V1Request(id=str(i), prompt=((i, 64),), output=(100 + i, 8), arrival_ps=0) for i in range(8)]
    for score in Score:
        rows = route(make(reqs), 4, rules_of(score, servers=True))
        assert [len(r) for r in rows] == [2, 2, 2, 2], score
        assert rows[0][0] == 0 and rows[1][0] == 1  # server k's first request goes to engine k
    with pytest.raises(InputError, match="api_server_count"):
        route(make(reqs), 4, rules_of(Score.QUEUE), servers=0)


def test_ranks_need_arrival_times_and_a_paged_pool():
    untimed = make([V1Request(id="0", prompt=((0, 10),), output=(1, 5), arrival_step=0)], step=None)
    with pytest.raises(InputError, match="arrive in time"):
        simulate_dp(untimed, 2, rules_of(Score.QUEUE))
    with pytest.raises(InputError, match="between 1 and"):
        simulate_dp(make(as_requests([(0, 10, 5, 0)])), 0, rules_of(Score.QUEUE))
