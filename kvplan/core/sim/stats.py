"""Percentiles every simulator reports: nearest rank (the smallest value with at least p% of the values at or below
it), no interpolation, so both simulators give the same number from the same per-request times."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

PS_PER_S = 10**12


@dataclass(frozen=True, slots=True, kw_only=True)
class Percentiles:
    p50: float
    p90: float
    p99: float


def percentiles(values: Iterable[float]) -> Percentiles:
    """p50/p90/p99 (nearest rank); zeros when empty."""
    v = sorted(values)
    n = len(v)
    if not n:
        return Percentiles(p50=0.0, p90=0.0, p99=0.0)

    def rank(p: int) -> float:
        return v[max(0, math.ceil(p * n / 100) - 1)]

    return Percentiles(p50=rank(50), p90=rank(90), p99=rank(99))


def percentiles_s(values_ps: Iterable[int]) -> Percentiles:
    """Percentiles of integer picoseconds, in seconds (the rank is taken on the exact integers)."""
    p = percentiles(values_ps)
    return Percentiles(p50=p.p50 / PS_PER_S, p90=p.p90 / PS_PER_S, p99=p.p99 / PS_PER_S)
