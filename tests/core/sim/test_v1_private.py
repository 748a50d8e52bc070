"""Private block keys (kvplan/core/sim/v1/hashing.py::PrivateKeys) and their deferred filing
(KVCacheManager._file_deferred) change nothing: a request whose first segment no other request starts with gets the
same hits, the pool hands out and evicts the same blocks, as when every request's blocks are hashed and filed as
they fill."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.core.engines.vllm.scheduler_rules import V1_BASELINE, newest
from kvplan.core.sim.v1 import CacheGroup, CacheLayout, SchedulerConfig, V1Inputs, V1Request
from kvplan.core.sim.v1.hashing import DEAD, MASK, BlockHasher, PrivateKeys, shared_firsts
from kvplan.core.sim.v1.inputs import CHUNKED
from kvplan.core.sim.v1.scheduler import _Sim
from tests.core.sim.test_v1_quiet import STEP, inputs


def run(inp, private: bool, fast: bool):
    sim = _Sim(inp, check=True)
    sim.private_keys, sim.fast = private, fast
    result = sim.run()
    pool = sim.mgr.pool
    hashed = [k is not None for k in pool.key]  # the keys differ (numbers, DEAD); which blocks are hashed must not
    return result, (list(pool.plain), pool.cached_order(), pool.ref, pool.evicted, hashed), sim


def test_shared_firsts_are_the_ids_more_than_one_request_starts_with():
    assert shared_firsts([1, 2, 5, 9]) == set()
    assert shared_firsts([4, 2, 4, 7, 2, 2]) == {2, 4}
    assert shared_firsts([]) == set()


def test_private_keys_number_blocks_below_every_hashed_key():
    keys = PrivateKeys(0, 16)
    keys.extend(47)
    assert len(keys.keys) == 2 and all(k < 0 and k != DEAD for k in keys.keys)
    other = PrivateKeys(1, 16)
    other.extend(47)
    assert not set(keys.keys) & set(other.keys)
    hashed = BlockHasher([(3, 40), (4, 30)], 16)
    hashed.extend(70)
    assert len(hashed.keys) == 4 and all(0 <= k <= MASK for k in hashed.keys)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_private_requests_run_as_hashed_ones(data):
    # requests of their own (ShareGPT-like) beside some that share a first segment or repeat an earlier request,
    # in pools small enough to preempt: a preempted private request hits its own filed blocks when readmitted
    n = data.draw(st.integers(1, 16))
    spread = data.draw(st.sampled_from([20, 300]))  # bursts leave private heads waiting short of blocks
    reqs = []
    for i in range(n):
        first = data.draw(st.sampled_from([1000 + i] * 3 + [0, 1]))  # mostly its own
        prompt = ((first, data.draw(st.integers(1, 90))), (100 + i, data.draw(st.integers(0, 40))))
        prompt = tuple(p for p in prompt if p[1])
        out = data.draw(st.integers(1, 300))
        if i and data.draw(st.integers(0, 5)) == 0:
            j = data.draw(st.integers(0, i - 1))
            prompt, out = (*reqs[j].prompt, reqs[j].output), data.draw(st.integers(1, 60))
        out = max(1, min(out, 1000 - sum(k for _, k in prompt)))
        reqs.append(V1Request(id=str(i), prompt=prompt, output=(200 + i, out),
                              arrival_step=data.draw(st.integers(0, spread))))
    block = data.draw(st.sampled_from([4, 16]))
    rules = data.draw(st.sampled_from([newest(), V1_BASELINE]))
    inp = inputs(reqs, blocks=1 + data.draw(st.integers(640 // block, 3 * 1024 // block)), block=block, groups=1,
                 caching=True, async_=data.draw(st.booleans()), rules=rules, seqs=data.draw(st.integers(1, 16)),
                 mnbt=data.draw(st.sampled_from([16, 64, 512])), step=data.draw(st.sampled_from([None, STEP])))
    fast = data.draw(st.booleans())
    private, hashed = run(inp, True, fast), run(inp, False, fast)
    assert private[0] == hashed[0]
    assert private[1] == hashed[1]
    firsts = [r.prompt[0][0] for r in reqs]
    assert [private[2]._state(i).private for i in range(n)] == [firsts.count(f) == 1 for f in firsts]


def test_a_preempted_private_request_hits_its_own_blocks():
    # two long private requests in a pool for one: the second preempts the first, which is readmitted with hits
    reqs = [V1Request(id=str(i), prompt=((10 + i, 200),), output=(20 + i, 300), arrival_step=i) for i in range(2)]
    inp = inputs(reqs, blocks=50, block=16, groups=1, caching=True, async_=False, rules=newest(), seqs=4,
                 mnbt=512, step=None)
    private, hashed = run(inp, True, True), run(inp, False, True)
    assert private[0].preemptions > 0 and private[0].tiers.gpu_hit_tokens > 0
    assert private[0] == hashed[0] and private[1] == hashed[1]
    assert private[2].mgr.deferred and not hashed[2].mgr.pool.caches[0].keys() & private[2].mgr.pool.caches[0].keys()


def test_stretches_run_while_a_private_head_waits_short_of_blocks():
    # twelve private requests into a pool for about six: a waiting head whose whole sequence does not fit the free
    # blocks waits, with or without its own cached blocks (each counts against the free ones), so the stretch runs
    # on while it waits; hashed keys cannot know that and leave those steps to the loop
    reqs = [V1Request(id=str(i), prompt=((1000 + i, 100),), output=(200 + i, 300), arrival_step=3 * i)
            for i in range(12)]
    for async_ in (False, True):
        inp = inputs(reqs, blocks=101, block=16, groups=1, caching=True, async_=async_, rules=newest(), seqs=8,
                     mnbt=512, step=None)
        private, hashed = run(inp, True, True), run(inp, False, True)
        assert private[0] == hashed[0] and private[1] == hashed[1]
        assert private[0].preemptions > 0
        assert private[2].quiet_counts[0] > hashed[2].quiet_counts[0] + 200  # steps advanced in stretches


def test_a_chunked_layout_counts_the_nulls_before_the_current_chunk_as_a_hit():
    # (a review's counterexample) vLLM's chunked-local manager finds every block before the current chunk computed
    # with nothing cached: a request's first admission hits them whether its keys are numbered or hashed
    reqs = [V1Request(id=str(i), prompt=((10 + i, 300),), output=(20 + i, 20), arrival_step=i) for i in range(3)]
    inp = V1Inputs(requests=tuple(reqs), scheduler=SchedulerConfig(enable_prefix_caching=True),
                   layout=CacheLayout(num_blocks=400, groups=(CacheGroup(kind=CHUNKED, block_size=16, window=64),)))
    private, hashed = run(inp, True, True), run(inp, False, True)
    assert private[0] == hashed[0] and private[0].cached_tokens == 3 * 256
    assert not private[2].mgr.deferred


def test_stale_copies_of_hit_blocks_stay_fewer_than_the_pool():
    # (a review's counterexample) one long shared prefix hit by request after request while the pool still has
    # unhashed blocks: the hashed queue's stale copies are dropped once they outnumber the pool's blocks
    reqs = [V1Request(id=str(i), prompt=((1, 640), (10 + i, 20)), output=(10**6 + i, 1), arrival_step=3 * i)
            for i in range(300)]
    inp = inputs(reqs, blocks=2001, block=16, groups=1, caching=True, async_=False, rules=newest(), seqs=8,
                 mnbt=2048, step=None)
    sim = _Sim(inp, check=True)
    result = sim.run()
    pool = sim.mgr.pool
    assert result.tiers.gpu_hit_tokens >= 299 * 640 - 640
    assert len(pool.cached_free) <= pool.n_cached + pool.num_blocks
    assert pool.n_stale == sum(pool.stale) and len(pool.cached_order()) == pool.n_cached
