"""Synthetic requests: arrival processes and length distributions, seeded so runs repeat exactly.

Pure Python ``random.Random``: a workload file with a seed gives the same requests everywhere. The
draws come in a fixed order (every arrival gap, then each request's prompt and output in turn), and
requests are built as flat columns (``RequestArrays``): a million take about a second.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate

from kvplan.core.sim.model import RequestArrays, SimRequest
from kvplan.errors import InputError

PS_PER_S = 10**12


_KM = 4 * math.exp(-0.5) / math.sqrt(2.0)


def _lognormal(rng: random.Random, mu: float, sigma: float):
    """``round(rng.lognormvariate(mu, sigma))`` in one call instead of three: the standard library's
    method (exp of a normal drawn by Kinderman and Monahan's ratio of uniforms, ACM TOMS 3, 1977), the
    same arithmetic on the same uniforms, so every seed keeps its values (held to the library's by
    tests/core/sim/test_workload.py). Request generation is dominated by these draws."""
    uniform, log, exp = rng.random, math.log, math.exp

    def draw() -> int:
        while True:
            u1 = uniform()
            u2 = 1.0 - uniform()
            z = _KM * (u1 - 0.5) / u2
            if z * z / 4.0 <= -log(u2):
                return round(exp(mu + z * sigma))

    return draw


@dataclass(frozen=True, kw_only=True)
class LengthDist:
    """``constant`` (value), ``uniform`` (low..high), ``normal`` (mean, std), ``lognormal`` (mean, sigma:
    the distribution's mean, not mu), ``zipf`` (a over low..high), ``empirical`` (values)."""

    dist: str
    value: int = 0
    low: int = 1
    high: int = 0
    mean: float = 0.0
    std: float = 0.0
    sigma: float = 1.0
    a: float = 1.2
    values: tuple[int, ...] = ()

    def sampler(self, rng: random.Random):
        # each sampler binds what it reads (a closure variable is read faster than an attribute);
        # the draws are the same calls in the same order, so every seed gives the same values
        d = self.dist
        if d == "constant":
            value = self.value
            return lambda: value
        if d == "uniform":
            randint, low, high = rng.randint, self.low, self.high
            return lambda: randint(low, high)
        if d == "normal":
            gauss, mean, std = rng.gauss, self.mean, self.std
            return lambda: round(gauss(mean, std))
        if d == "lognormal":
            mu = math.log(self.mean) - self.sigma**2 / 2  # so that the mean is `mean`
            return _lognormal(rng, mu, self.sigma)
        if d == "zipf":
            ranks = range(self.low, self.high + 1)
            weights = [1 / (k**self.a) for k in range(1, len(ranks) + 1)]
            cum, acc = [], 0.0
            for w in weights:
                acc += w
                cum.append(acc)
            return lambda: ranks[min(bisect_left(cum, rng.random() * acc), len(ranks) - 1)]
        if d == "empirical":
            if not self.values:
                raise InputError("empirical distribution needs values")
            return lambda: rng.choice(self.values)
        raise InputError(f"unknown length distribution {d!r}")


@dataclass(frozen=True, kw_only=True)
class Arrivals:
    """``poisson`` (rate per second), ``gamma`` (rate, cv: burstiness, cv 1 is Poisson), ``all_at_once``."""

    process: str
    rate: float = 1.0
    cv: float = 1.0

    def times_s(self, count: int, rng: random.Random) -> array:
        """Arrival times in seconds (``array('d')``): the running sum of the gaps, drawn in order."""
        if self.process == "all_at_once":
            return array("d", [0.0]) * count
        if self.process == "poisson":
            # random.Random.expovariate(rate), written out: the same draws, one call fewer each
            uniform, rate = rng.random, self.rate
            gaps = (-math.log(1.0 - uniform()) / rate for _ in range(count))
        elif self.process == "gamma":
            shape = 1 / self.cv**2
            gammavariate, scale = rng.gammavariate, 1 / (self.rate * shape)
            gaps = (gammavariate(shape, scale) for _ in range(count))
        else:
            raise InputError(f"unknown arrival process {self.process!r}")
        return array("d", accumulate(gaps))


MAX_CLOCK_S = 10**9  # about 31.7 years: arrivals past this are a unit mistake, not a workload


def clip_request(i: int, arrival_s: float, prompt: int, output: int, *, max_model_len: int, shared_prefix: int,
                 n: int, clip_prompt: bool = True) -> SimRequest:
    """A request whose prompt includes the shared prefix (a prompt shorter than the prefix is raised
    to it: every prompt starts with the prefix), its output clipped to max_model_len (as an engine
    stops there). Synthetic prompts are clipped too; a trace's prompt that is too long is kept, and the
    simulator rejects it with its reason."""
    if not 0 <= arrival_s <= MAX_CLOCK_S:  # also catches inf and NaN
        raise InputError(f"request {i} arrives at {arrival_s:g} s, past the simulator's clock ({MAX_CLOCK_S:g} s); "
                         "raise the arrival rate or the trace's time_scale")
    prompt = max(1, prompt, shared_prefix)
    if clip_prompt:
        prompt = min(prompt, max_model_len - 1)
    output = max(1, min(max(1, output), max_model_len - prompt))
    return SimRequest(id=i, arrival_ps=round(arrival_s * PS_PER_S), prompt=prompt, output=output, n=n)


def synthetic_columns(*, count: int, arrivals: Arrivals, prompt: LengthDist, output: LengthDist,
                      seed: int) -> tuple[array, list[int], list[int]]:
    """Arrival seconds, prompt tokens and output tokens as drawn, before clipping."""
    rng = random.Random(seed)
    times = arrivals.times_s(count, rng)
    draw_prompt, draw_output = prompt.sampler(rng), output.sampler(rng)
    prompts: list[int] = []
    outputs: list[int] = []
    add_prompt, add_output = prompts.append, outputs.append
    for _ in range(count):  # one request's prompt, then its output: the order every seed was drawn in
        add_prompt(draw_prompt())
        add_output(draw_output())
    return times, prompts, outputs


def synthetic_draws(*, count: int, arrivals: Arrivals, prompt: LengthDist, output: LengthDist,
                    seed: int) -> list[tuple[float, int, int]]:
    """(arrival seconds, prompt tokens, output tokens) as drawn, before clipping."""
    return list(zip(*synthetic_columns(count=count, arrivals=arrivals, prompt=prompt, output=output, seed=seed)))


def clip_columns(times_s: Sequence[float], prompts: Sequence[int], outputs: Sequence[int], *, max_model_len: int,
                 shared_prefix: int, n: int, clip_prompt: bool = True) -> RequestArrays:
    """``clip_request`` over whole columns (the same values, request i being position i), written
    straight into flat arrays (a million requests: 32 MB, no list of objects on the way)."""
    count = len(times_s)
    if count and not (math.isfinite(sum(times_s)) and min(times_s) >= 0 and max(times_s) <= MAX_CLOCK_S):
        for i, t in enumerate(times_s):  # NaN, inf or out of range somewhere: name the first, as clip_request does
            clip_request(i, t, 1, 1, max_model_len=max_model_len, shared_prefix=shared_prefix, n=n)
    ps = PS_PER_S
    arrival = array("q", (round(t * ps) for t in times_s))
    low, high = max(1, shared_prefix), max_model_len - 1
    if clip_prompt:
        prompt = array("q", (high if x > high else x for x in (y if y > low else low for y in prompts)))
    else:
        prompt = array("q", (x if x > low else low for x in prompts))
    output = array("q", _clip_outputs(outputs, prompt, max_model_len))
    return RequestArrays(arrival, prompt, output, array("q", [n]) * count)


def _clip_outputs(outputs: Iterable[int], prompts: Iterable[int], max_model_len: int) -> Iterator[int]:
    for x, p in zip(outputs, prompts):  # max(1, min(max(1, x), max_model_len - p))
        if x < 1:
            x = 1
        room = max_model_len - p
        if x > room:
            x = room
        yield x if x > 1 else 1


def synthetic_requests(*, count: int, arrivals: Arrivals, prompt: LengthDist, output: LengthDist, seed: int,
                       max_model_len: int, shared_prefix: int = 0, n: int = 1) -> RequestArrays:
    times, prompts, outputs = synthetic_columns(count=count, arrivals=arrivals, prompt=prompt, output=output,
                                                seed=seed)
    return clip_columns(times, prompts, outputs, max_model_len=max_model_len, shared_prefix=shared_prefix, n=n)
