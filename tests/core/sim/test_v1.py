"""vLLM v1 scheduler simulator: each rule on a hand-worked case (figures derived from vLLM 0.33.0's rules in
the comments, not from kvplan's output), and the invariants as properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.core.engines.base import cdiv
from kvplan.core.sim.model import StepModel
from kvplan.core.sim.v1 import (
    CHUNKED,
    FULL,
    MAMBA,
    SLIDING,
    CacheGroup,
    CacheLayout,
    OffloadConfig,
    SchedulerConfig,
    V1Inputs,
    V1Request,
    simulate_v1,
)
from kvplan.core.sim.v1.hashing import BlockHasher
from kvplan.core.sim.v1.result import percentiles
from kvplan.errors import InputError

PS = 10**12


def make_inputs(requests, *, num_blocks=1000, groups=None, block_size=16, caching=False, mnbt=2048, seqs=256,
                mml=8192, lpt=0, reserve=True, offload=None, step=None, block_bytes=0, async_=False):
    groups = groups or (CacheGroup(kind=FULL, block_size=block_size),)
    return V1Inputs(requests=tuple(requests),
                    scheduler=SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=mnbt, max_model_len=mml,
                                              enable_prefix_caching=caching, long_prefill_token_threshold=lpt,
                                              reserve_full_isl=reserve, async_scheduling=async_),
                    layout=CacheLayout(num_blocks=num_blocks, groups=groups, block_bytes=block_bytes),
                    offload=offload, step_model=step)


def req(i, prompt, out=1, step=0, out_seg=None):
    prompt = ((1000 + i, prompt),) if isinstance(prompt, int) else tuple(prompt)
    return V1Request(id=str(i), prompt=prompt, output=(out_seg if out_seg is not None else 10**6 + i, out),
                     arrival_step=step)


def by_id(result):
    return {r.id: r for r in result.per_request}


def test_chunked_prefill_splits_a_3000_token_prompt_over_two_steps():
    # budget 2048: step 0 computes 2048 prompt tokens, step 1 the other 952 and samples the first token;
    # then one token a step (vllm/v1/core/sched/scheduler.py::schedule: num_tokens - num_computed, min budget)
    r = simulate_v1(make_inputs([req(0, 3000, out=5)], mml=8192))
    assert r.per_step_scheduled_tokens == (2048, 952, 1, 1, 1, 1)
    rec = by_id(r)["0"]
    assert (rec.first_scheduled_step, rec.first_token_step, rec.finish_step) == (0, 1, 5)
    assert r.steps == 6 and r.completed == 1 and r.generated_tokens == 5


def test_decodes_go_first_and_the_rest_of_the_budget_prefills_a_waiting_request():
    # step 1: request 0's remaining 952 tokens (running first), then request 1's first chunk of 1096;
    # step 2: r0's decode, r1's last 1904; step 3: both decode
    r = simulate_v1(make_inputs([req(0, 3000, out=3), req(1, 3000, out=3)]))
    assert r.per_step_scheduled_tokens == (2048, 952 + 1096, 1 + 1904, 1 + 1, 1)


def test_long_prefill_threshold_caps_chunks_only_with_company():
    # two 1000-token prompts, threshold 300: each gets 300 a step (running then waiting), 100 in the last
    two = simulate_v1(make_inputs([req(0, 1000, out=2), req(1, 1000, out=2)], lpt=300))
    assert two.per_step_scheduled_tokens == (600, 600, 600, 200, 2)
    # alone, nobody is starved: the threshold is off (num_running + num_waiting == 1)
    one = simulate_v1(make_inputs([req(0, 1000, out=2)], lpt=300))
    assert one.per_step_scheduled_tokens == (1000, 1)


def test_sliding_window_layer_frees_blocks_behind_the_window():
    # window 32, blocks of 16, pool of 10 usable blocks. Step 0 holds cdiv(100, 16) = 7 blocks. At a later step
    # with c tokens computed, blocks wholly before token c - 32 + 1 are freed and cdiv(c + 1, 16) are needed:
    # held(c) = cdiv(c + 1, 16) - (c - 31) // 16 (SlidingWindowManager.get_num_skipped_tokens, remove_skipped_blocks)
    g = (CacheGroup(kind=SLIDING, block_size=16, window=32),)
    r = simulate_v1(make_inputs([req(0, 100, out=40)], num_blocks=11, groups=g), check_invariants=True)
    expected = [700] + [round(1000 * (cdiv(c + 1, 16) - (c - 31) // 16) / 10) for c in range(100, 139)]
    assert list(r.per_step_kv_usage_permille) == expected
    assert max(expected[1:]) == 300  # never more than cdiv(31, 16) + 1 blocks once decoding


def test_chunked_local_layer_keeps_only_the_current_chunk():
    # chunk 32: with 100 tokens computed, 96 tokens (6 blocks) lie before the current chunk and are freed
    g = (CacheGroup(kind=CHUNKED, block_size=16, window=32),)
    r = simulate_v1(make_inputs([req(0, 100, out=3)], num_blocks=11, groups=g), check_invariants=True)
    assert r.per_step_kv_usage_permille == (700, 100, 100)


def test_mamba_group_holds_its_state_blocks_beside_full_attention():
    # full attention: cdiv(20, 16) = 2 blocks; Mamba ("none" mode): 1 block a request, whatever its length
    g = (CacheGroup(kind=FULL, block_size=16), CacheGroup(kind=MAMBA, block_size=8192, state_blocks=1))
    r = simulate_v1(make_inputs([req(0, 20, out=20)], num_blocks=11, groups=g), check_invariants=True)
    assert r.per_step_kv_usage_permille[0] == 300
    assert r.per_step_kv_usage_permille[-1] == 400  # 39 tokens: 3 + 1


def test_the_null_block_is_never_handed_out():
    # 3 blocks: block 0 is the null block, so 2 are usable: a 32-token prompt fits, a 33-token one never does
    ok = simulate_v1(make_inputs([req(0, 32, out=1)], num_blocks=3), check_invariants=True)
    assert ok.completed == 1 and ok.per_step_kv_usage_permille == (1000,)
    with pytest.raises(InputError, match="can never be admitted: it needs 3 blocks and the pool has 2"):
        simulate_v1(make_inputs([req(0, 33, out=1)], num_blocks=3))


def test_preemption_takes_the_last_running_request_and_requeues_it_first():
    # 4 usable blocks, two 16-token prompts each growing to 56 tokens. Step 17 needs a third block for r0 with
    # none free: r1 (the last of running) is preempted, its 2 blocks freed. r1 (33 tokens) cannot pass the
    # full-prompt gate (3 blocks, 1 free) until r0 finishes at step 39 (token 40); r1 recomputes its 33 tokens
    # at step 40 and samples its 18th..40th tokens at steps 40..62.
    r = simulate_v1(make_inputs([req(0, 16, out=40), req(1, 16, out=40)], num_blocks=5), check_invariants=True)
    recs = by_id(r)
    assert r.preemptions == 1
    assert (recs["0"].finish_step, recs["0"].num_preemptions) == (39, 0)
    assert (recs["1"].finish_step, recs["1"].num_preemptions, recs["1"].first_token_step) == (62, 1, 0)
    assert r.per_step_scheduled_tokens[17:19] == (1, 1)  # the preempting step admits nothing
    assert r.per_step_scheduled_tokens[40] == 33  # step 40 (no step was empty)


def test_admission_checks_the_whole_prompt_not_only_its_first_chunk():
    # budget 512: r0 (2000 tokens) prefills over steps 0-3. At step 4 r1 (3000 tokens, 188 blocks) finds 74 of
    # 200 blocks free: with scheduler_reserve_full_isl (vLLM's default) it waits for r0 to finish (step 102);
    # without, its first chunk (511 tokens, 32 blocks) is admitted at step 4.
    reqs = [req(0, 2000, out=100), req(1, 3000, out=1, step=4)]
    gated = simulate_v1(make_inputs(reqs, num_blocks=201, mnbt=512))
    assert by_id(gated)["1"].first_scheduled_step == 103
    ungated = simulate_v1(make_inputs(reqs, num_blocks=201, mnbt=512, reserve=False))
    assert by_id(ungated)["1"].first_scheduled_step == 4


def test_max_num_seqs_limits_admission():
    r = simulate_v1(make_inputs([req(i, 10, out=3) for i in range(3)], seqs=2))
    assert [by_id(r)[str(i)].first_scheduled_step for i in range(3)] == [0, 0, 3]


def test_prefix_cache_hit_never_covers_the_last_token():
    # the same 32-token prompt twice: the second finds both blocks cached, but hits stop at num_tokens - 1 = 31,
    # so only the first block (16 tokens) counts (KVCacheManager.get_computed_blocks)
    a = req(0, [(1, 32)], out=1)
    b = req(1, [(1, 32)], out=1, step=1)
    r = simulate_v1(make_inputs([a, b], caching=True), check_invariants=True)
    assert [x.num_cached_tokens for x in r.per_request] == [0, 16]
    assert r.cached_tokens == 16 and r.prefix_hit_rate == pytest.approx(16 / 64)


def test_cached_blocks_are_evicted_least_recently_freed_first_tail_first():
    # 4 usable blocks. A (seg 1, 2 blocks) finishes and frees tail first: LRU queue [a1, a0]. B (seg 2) takes the
    # two never-used blocks, then frees: [a1, a0, b1, b0]. C (48 new tokens) evicts a1, a0, b1
    # (BlockPool.free_blocks appends hashed blocks; get_new_blocks pops the front). Then a seg-2 prefix still
    # finds b0 (16 tokens) and a seg-1 prefix finds nothing.
    reqs = [req(0, [(1, 32)]), req(1, [(2, 32)], step=1), req(2, [(3, 48)], step=2),
            req(3, [(2, 32), (6, 1)], step=3), req(4, [(1, 32), (6, 1)], step=4)]
    r = simulate_v1(make_inputs(reqs, num_blocks=5, caching=True), check_invariants=True)
    assert [x.num_cached_tokens for x in r.per_request] == [0, 0, 0, 16, 0]
    assert r.tiers.gpu_evicted_blocks >= 3


def test_multi_turn_history_is_found_in_the_cache():
    # turn 2's prompt = turn 1's prompt + its output + a new message. Turn 1's last sampled token is never
    # computed (it finished), so its KV covers 40 + 23 = 63 tokens: 3 full blocks cached (prompt blocks at
    # prefill, output blocks as they fill), and turn 2 hits 48 tokens
    t1 = V1Request(id="t1", prompt=((1, 40),), output=(2, 24), arrival_step=0)
    t2 = V1Request(id="t2", prompt=((1, 40), (2, 24), (3, 10)), output=(4, 5), arrival_step=30)
    r = simulate_v1(make_inputs([t1, t2], caching=True), check_invariants=True)
    assert by_id(r)["t2"].num_cached_tokens == 48


def test_cpu_tier_serves_a_prefix_the_gpu_evicted():
    # 4 usable GPU blocks of 4096 B; CPU holds 100 chunks. A's two prompt blocks are written through to CPU at
    # step 0; B (64 tokens) evicts them from the GPU at step 1; C = A's prompt + 16 tokens finds nothing on the GPU
    # and 2 chunks (32 tokens) in CPU, loaded at step 2: 8192 B over 4096 B/s = 2 s added to that step.
    reqs = [req(0, [(1, 32)]), req(1, [(2, 64)], step=1), req(2, [(1, 32), (3, 16)], step=2)]
    step = StepModel(base_ps=PS, per_token_ps=0, per_prefill_token_ps=0)
    off = OffloadConfig(cpu_bytes=100 * 4096, bandwidth_bytes_per_s=4096.0)
    r = simulate_v1(make_inputs(reqs, num_blocks=5, caching=True, offload=off, step=step, block_bytes=4096),
                    check_invariants=True)
    c = by_id(r)["2"]
    assert (c.num_cached_tokens, c.num_cpu_tokens) == (0, 32)
    t = r.tiers
    assert (t.cpu_hit_tokens, t.gpu_hit_tokens, t.recomputed_tokens) == (32, 0, 32 + 64 + 16)
    assert (t.cpu_loaded_chunks, t.bytes_from_cpu, t.cpu_stored_chunks, t.bytes_to_cpu) == (2, 8192, 7, 7 * 4096)
    assert t.load_seconds == pytest.approx(2.0)
    assert r.seconds == pytest.approx(5.0) and c.e2e_s == pytest.approx(3.0)


def test_seconds_follow_the_step_model():
    # 1 s a step plus 1 us per KV token read: step 0 reads 10 tokens, step 1 reads 11
    step = StepModel(base_ps=PS, per_token_ps=10**6, per_prefill_token_ps=0)
    r = simulate_v1(make_inputs([req(0, 10, out=2)], step=step))
    assert r.seconds == pytest.approx(2 + 21e-6)
    rec = r.per_request[0]
    assert (rec.queue_s, rec.ttft_s) == (0.0, pytest.approx(1 + 10e-6))
    assert r.ttft_steps.p50 == 1 and r.e2e_steps.p50 == 2


def test_percentiles_are_nearest_rank():
    p = percentiles([float(x) for x in range(1, 101)])
    assert (p.p50, p.p90, p.p99) == (50.0, 90.0, 99.0)
    assert percentiles([3.0]).p99 == 3.0


def test_arrivals_in_time_need_a_step_model():
    r = V1Request(id="0", prompt=((1, 4),), output=(2, 1), arrival_ps=5)
    with pytest.raises(InputError, match="step-time model"):
        simulate_v1(make_inputs([r]))


def token_id(seg: int, i: int) -> int:
    """The contract's token ids (docs: the vLLM reference request sets)."""
    return 1 + (seg * 1_000_003 + i * 7_919 + (seg * i) % 104_729) % 30_000


segments = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40)), min_size=1, max_size=4)


@given(st.lists(segments, min_size=2, max_size=4), st.sampled_from([4, 16]))
def test_block_keys_match_exactly_when_the_tokens_do(prompts, h):
    toks, keys = [], []
    for segs in prompts:
        toks.append([token_id(s, i) for s, n in segs for i in range(n)])
        hasher = BlockHasher(list(segs), h)
        hasher.extend(len(toks[-1]))
        keys.append(hasher.keys)
    for a in range(len(prompts)):
        for b in range(len(prompts)):
            for j in range(min(len(keys[a]), len(keys[b]))):
                same = toks[a][:(j + 1) * h] == toks[b][:(j + 1) * h]
                assert (keys[a][j] == keys[b][j]) == same


group_sets = st.sampled_from([
    (CacheGroup(kind=FULL, block_size=16),),
    (CacheGroup(kind=SLIDING, block_size=16, window=40),),
    (CacheGroup(kind=FULL, block_size=16), CacheGroup(kind=SLIDING, block_size=16, window=24),
     CacheGroup(kind=SLIDING, block_size=16, window=24)),
    (CacheGroup(kind=FULL, block_size=8), CacheGroup(kind=CHUNKED, block_size=8, window=32)),
    (CacheGroup(kind=FULL, block_size=16), CacheGroup(kind=MAMBA, block_size=4096, state_blocks=2)),
])


@settings(max_examples=80, deadline=None)
@given(st.data(), group_sets, st.booleans(), st.booleans())
def test_invariants_hold_and_every_request_finishes(data, groups, caching, async_):
    caching = caching and not any(g.kind == MAMBA for g in groups)
    mml = 512
    n = data.draw(st.integers(1, 12))
    reqs = []
    for i in range(n):
        segs = data.draw(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 120)), min_size=1, max_size=3))
        prompt = min(sum(k for _, k in segs), mml - 1)
        segs2, left = [], prompt
        for s, k in segs:
            if left:
                segs2.append((s, min(k, left)))
                left -= min(k, left)
        out = data.draw(st.integers(1, 80))
        reqs.append(V1Request(id=str(i), prompt=tuple(segs2), output=(100 + i, out),
                              arrival_step=data.draw(st.integers(0, 30))))
    # the pool holds the longest request alone (else vLLM itself would preempt it forever)
    need = sum(cdiv(mml, g.block_size) if g.kind != MAMBA else g.state_blocks for g in groups)
    num_blocks = need + 1 + data.draw(st.integers(0, 60))
    mnbt = data.draw(st.sampled_from([8, 64, 2048]))
    inp = make_inputs(reqs, num_blocks=num_blocks, groups=groups, caching=caching, mnbt=mnbt,
                      seqs=data.draw(st.integers(1, 8)), mml=mml, lpt=data.draw(st.sampled_from([0, 5])),
                      async_=async_)
    r = simulate_v1(inp, check_invariants=True)
    assert simulate_v1(inp, fast_path=False) == r  # the running requests' fast path changes nothing
    assert r.completed == n
    assert r.generated_tokens == sum(min(q.output[1], mml - q.prompt_len) for q in reqs)
    assert sum(r.per_step_scheduled_tokens) >= r.prompt_tokens - r.cached_tokens
    assert all(t <= mnbt for t in r.per_step_scheduled_tokens)
    assert all(0 <= u <= 1000 for u in r.per_step_kv_usage_permille)
    for rec, q in zip(r.per_request, reqs):
        assert q.arrival_step <= rec.first_scheduled_step <= rec.first_token_step <= rec.finish_step
        assert rec.num_cached_tokens <= q.prompt_len - 1


@pytest.mark.parametrize("model", ["opt-13b", "gemma3-27b", "qwen3-next-80b-a3b"])
def test_the_simulated_pool_is_the_one_fit_plans(model):
    from kvplan.core.capacity.common import FitRequest
    from kvplan.core.capacity.fit import fit
    from kvplan.core.sim.v1.sizing import layout_from_fit
    from kvplan.io.gpus import get_gpu
    from kvplan.io.models import load_model

    req = FitRequest(spec=load_model(model), gpu=get_gpu("H100-80GB"), engine="vllm", max_model_len=8192,
                     tp=4 if model != "opt-13b" else 1)
    result = fit(req)
    layout = layout_from_fit(req, result)
    assert layout.num_blocks == result.num_blocks
    assert layout.block_bytes == result.page_size_bytes
    assert min(g.block_size for g in layout.groups) == result.block_size


def test_arrivals_in_time_join_at_the_first_step_starting_after_them():
    # 1 s a step: A runs steps 0-4; B arrives at 2.5 s and joins at step 3 (starting at 3 s): 0.5 s queued;
    # C arrives at 100 s on an idle engine: the clock jumps to it, no queueing
    step = StepModel(base_ps=PS, per_token_ps=0, per_prefill_token_ps=0)
    reqs = [V1Request(id=n, prompt=((i, 4),), output=(10 + i, o), arrival_ps=t)
            for i, (n, t, o) in enumerate([("A", 0, 5), ("B", 25 * PS // 10, 2), ("C", 100 * PS, 1)])]
    r = by_id(simulate_v1(make_inputs(reqs, step=step)))
    assert (r["B"].arrival_step, r["B"].first_scheduled_step, r["B"].queue_s) == (3, 3, pytest.approx(0.5))
    assert (r["B"].ttft_s, r["B"].e2e_s) == (pytest.approx(1.5), pytest.approx(2.5))
    assert (r["C"].queue_s, r["C"].e2e_s) == (0.0, pytest.approx(1.0))


def test_async_scheduling_schedules_a_batch_ahead():
    # 1 s a batch. Sync: A (5 tokens) runs steps 0-4, B (arrives 2.5 s) is admitted at step 3 (3 s).
    # Async: batch k is scheduled when batch k-1 starts, so batch 3 (scheduled at 2 s) misses B and batch 4
    # (scheduled at 3 s) takes it: queued 4 - 2.5 = 1.5 s, first token at the end of batch 4 (5 s), second
    # at the end of batch 5 (6 s). A's last token comes from batch 4: batch 5 does not schedule it again.
    step = StepModel(base_ps=PS, per_token_ps=0, per_prefill_token_ps=0)
    reqs = [V1Request(id=n, prompt=((i, 4),), output=(10 + i, o), arrival_ps=t)
            for i, (n, t, o) in enumerate([("A", 0, 5), ("B", 25 * PS // 10, 2), ("C", 100 * PS, 1)])]
    sync = by_id(simulate_v1(make_inputs(reqs, step=step)))
    result = simulate_v1(make_inputs(reqs, step=step, async_=True), check_invariants=True)
    r = by_id(result)
    assert sync["B"].first_scheduled_step == 3
    assert (r["A"].first_token_step, r["A"].finish_step) == (0, 4)
    assert (r["B"].first_scheduled_step, r["B"].first_token_step, r["B"].finish_step) == (4, 4, 5)
    assert (r["B"].queue_s, r["B"].ttft_s, r["B"].e2e_s) == (pytest.approx(1.5), pytest.approx(2.5), pytest.approx(3.5))
    assert (r["C"].queue_s, r["C"].e2e_s) == (0.0, pytest.approx(1.0))  # an idle engine schedules at once
    # batch 5 still counts A as running (batch 4 brings its last token, processed after batch 5 is scheduled)
    assert list(result.per_step_running) == [1, 1, 1, 1, 2, 2, 1]


def test_async_scheduling_frees_a_finished_request_a_batch_later():
    # A pool of 2 blocks of 16 (+ the null block): A (32-token prompt, 1 output token) takes both at step 0
    # and B (16 tokens) waits. Sync: A's output at step 0 frees them and B is admitted at step 1. Async:
    # batch 1 is scheduled before batch 0's output is processed (A, its last token in flight, is skipped;
    # B finds no block: an empty batch), so B is admitted in batch 2.
    reqs = [req(0, 32, out=1), req(1, 16, out=1)]
    sync = by_id(simulate_v1(make_inputs(reqs, num_blocks=3)))
    r = by_id(simulate_v1(make_inputs(reqs, num_blocks=3, async_=True), check_invariants=True))
    assert sync["1"].first_scheduled_step == 1
    assert r["1"].first_scheduled_step == 2
