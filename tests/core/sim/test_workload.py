"""Synthetic workloads: seeded, clipped, with the means asked for."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.core.sim.workload import Arrivals, LengthDist, synthetic_requests


def make(prompt: LengthDist, output: LengthDist, *, count: int = 4000, seed: int = 0, process: str = "poisson", **kw):
    return synthetic_requests(count=count, arrivals=Arrivals(process=process, rate=2.0, **kw), prompt=prompt,
                              output=output, seed=seed, max_model_len=2048)


def test_lognormal_means_and_clipping():
    reqs = make(LengthDist(dist="lognormal", mean=161, sigma=1.0), LengthDist(dist="lognormal", mean=338, sigma=1.0))
    assert statistics.mean(r.prompt for r in reqs) == pytest.approx(161, rel=0.08)
    assert statistics.mean(r.output for r in reqs) == pytest.approx(338, rel=0.1)
    assert all(1 <= r.prompt < 2048 and r.final_len <= 2048 and r.output >= 1 for r in reqs)


def test_poisson_rate_and_gamma_burstiness():
    poisson = make(LengthDist(dist="constant", value=10), LengthDist(dist="constant", value=10))
    assert poisson[-1].arrival_ps / 1e12 == pytest.approx(len(poisson) / 2.0, rel=0.05)
    gaps = lambda rs: [b.arrival_ps - a.arrival_ps for a, b in zip(rs, rs[1:])]
    bursty = make(LengthDist(dist="constant", value=10), LengthDist(dist="constant", value=10), process="gamma", cv=3.0)
    cv = statistics.pstdev(gaps(bursty)) / statistics.mean(gaps(bursty))
    assert cv == pytest.approx(3.0, rel=0.15)
    assert all(r.arrival_ps == 0 for r in make(LengthDist(dist="constant", value=1), LengthDist(dist="constant", value=1),
                                                  count=10, process="all_at_once"))


def test_zipf_uniform_empirical_bounds_and_seed():
    z = make(LengthDist(dist="zipf", a=1.2, low=5, high=50), LengthDist(dist="uniform", low=3, high=9))
    assert all(5 <= r.prompt <= 50 and 3 <= r.output <= 9 for r in z)
    assert statistics.mode(r.prompt for r in z) == 5  # zipf: the smallest is the most common
    e = make(LengthDist(dist="empirical", values=(7, 11)), LengthDist(dist="normal", mean=40, std=5), seed=3)
    assert {r.prompt for r in e} == {7, 11}
    assert e == make(LengthDist(dist="empirical", values=(7, 11)), LengthDist(dist="normal", mean=40, std=5), seed=3)


def test_shared_prefix_is_part_of_the_prompt_and_the_clock_is_bounded():
    from kvplan.core.sim.workload import MAX_CLOCK_S, clip_request
    from kvplan.errors import InputError

    kw = dict(max_model_len=2048, shared_prefix=256, n=1)
    assert clip_request(0, 0.0, 300, 10, **kw).prompt == 300  # includes the prefix, not 556
    assert clip_request(0, 0.0, 100, 10, **kw).prompt == 256  # raised to the prefix
    assert clip_request(0, 0.0, 5000, 10, **kw).final_len == 2048  # clipped to max_model_len
    assert clip_request(0, MAX_CLOCK_S, 10, 10, **kw).arrival_ps == MAX_CLOCK_S * 10**12
    for bad in (MAX_CLOCK_S * 1.001, float("inf"), float("nan"), -1.0):
        with pytest.raises(InputError, match="past the simulator's clock"):
            clip_request(0, bad, 10, 10, **kw)


@pytest.mark.parametrize("lognormal_output", [False, True])
def test_the_random_stream_order(lognormal_output):
    """Every seed keeps its requests: all arrival gaps are drawn first, then each request's prompt and
    output in turn, straight from ``random.Random(seed)`` (rebuilt here with the standard library's own
    methods, not kvplan's samplers, which write some of them out)."""
    import math
    import random

    count, rate, seed = 2000, 3.0, 11
    output = (LengthDist(dist="lognormal", mean=338, sigma=0.7) if lognormal_output
              else LengthDist(dist="uniform", low=1, high=900))
    reqs = synthetic_requests(count=count, arrivals=Arrivals(process="poisson", rate=rate),
                              prompt=LengthDist(dist="lognormal", mean=161, sigma=1.0),
                              output=output, seed=seed, max_model_len=2048)
    rng = random.Random(seed)
    t, times = 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate)
        times.append(t)
    mu = math.log(161) - 0.5
    for i in range(count):
        p = max(1, min(round(rng.lognormvariate(mu, 1.0)), 2047))
        drawn = round(rng.lognormvariate(math.log(338) - 0.7**2 / 2, 0.7)) if lognormal_output else rng.randint(1, 900)
        o = max(1, min(drawn, 2048 - p))
        assert (reqs[i].arrival_ps, reqs[i].prompt, reqs[i].output, reqs[i].n) == (round(times[i] * 10**12), p, o, 1)


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.floats(0, 1e6), st.integers(-5, 5000), st.integers(-5, 5000)), max_size=40),
       mml=st.integers(2, 4096), prefix=st.integers(0, 5000), n=st.integers(1, 4), clip=st.booleans())
def test_columns_clip_as_clip_request(rows, mml, prefix, n, clip):
    from kvplan.core.sim.workload import clip_columns, clip_request

    cols = clip_columns([t for t, _, _ in rows], [p for _, p, _ in rows], [o for _, _, o in rows],
                        max_model_len=mml, shared_prefix=prefix, n=n, clip_prompt=clip)
    assert list(cols) == [clip_request(i, t, p, o, max_model_len=mml, shared_prefix=prefix, n=n, clip_prompt=clip)
                          for i, (t, p, o) in enumerate(rows)]


def test_columns_name_the_first_request_off_the_clock():
    from kvplan.core.sim.workload import MAX_CLOCK_S, clip_columns
    from kvplan.errors import InputError

    for bad in (float("nan"), float("inf"), -1.0, MAX_CLOCK_S * 2):
        with pytest.raises(InputError, match="request 2 arrives at"):
            clip_columns([0.0, 1.0, bad, 2.0], [1] * 4, [1] * 4, max_model_len=64, shared_prefix=0, n=1)
