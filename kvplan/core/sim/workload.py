"""Synthetic requests: arrival processes and length distributions, seeded so runs repeat exactly.

Pure Python ``random.Random``: a workload file with a seed gives the same requests everywhere.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left
from dataclasses import dataclass

from kvplan.core.sim.model import SimRequest
from kvplan.errors import InputError

PS_PER_S = 10**12


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
        d = self.dist
        if d == "constant":
            return lambda: self.value
        if d == "uniform":
            return lambda: rng.randint(self.low, self.high)
        if d == "normal":
            return lambda: round(rng.gauss(self.mean, self.std))
        if d == "lognormal":
            mu = math.log(self.mean) - self.sigma**2 / 2  # so that the mean is `mean`
            return lambda: round(rng.lognormvariate(mu, self.sigma))
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

    def times_s(self, count: int, rng: random.Random) -> list[float]:
        if self.process == "all_at_once":
            return [0.0] * count
        if self.process == "poisson":
            gaps = [rng.expovariate(self.rate) for _ in range(count)]
        elif self.process == "gamma":
            shape = 1 / self.cv**2
            gaps = [rng.gammavariate(shape, 1 / (self.rate * shape)) for _ in range(count)]
        else:
            raise InputError(f"unknown arrival process {self.process!r}")
        out, t = [], 0.0
        for gap in gaps:
            t += gap
            out.append(t)
        return out


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


def synthetic_draws(*, count: int, arrivals: Arrivals, prompt: LengthDist, output: LengthDist,
                    seed: int) -> list[tuple[float, int, int]]:
    """(arrival seconds, prompt tokens, output tokens) as drawn, before clipping."""
    rng = random.Random(seed)
    times = arrivals.times_s(count, rng)
    draw_prompt, draw_output = prompt.sampler(rng), output.sampler(rng)
    return [(times[i], draw_prompt(), draw_output()) for i in range(count)]


def synthetic_requests(*, count: int, arrivals: Arrivals, prompt: LengthDist, output: LengthDist, seed: int,
                       max_model_len: int, shared_prefix: int = 0, n: int = 1) -> list[SimRequest]:
    draws = synthetic_draws(count=count, arrivals=arrivals, prompt=prompt, output=output, seed=seed)
    return [clip_request(i, t, p, o, max_model_len=max_model_len, shared_prefix=shared_prefix, n=n)
            for i, (t, p, o) in enumerate(draws)]
