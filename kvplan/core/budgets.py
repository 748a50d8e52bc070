"""Budget limits: judging measured values against limits, and comparing with a previous run. Pure."""

from __future__ import annotations

from dataclasses import dataclass

# limit name -> (kind, measured quantity's name); "max": value <= limit, "min": value >= limit, "must": true
LIMIT_KINDS = {
    "max_kv_bytes_per_token": "max", "max_kv_bytes": "max", "max_kv_bytes_per_gpu": "max",
    "min_kv_cache_tokens": "min", "min_max_concurrency": "min", "max_model_len_must_fit": "must",
    "min_headroom_frac": "min", "min_token_states_frac": "min", "max_preemptions": "max", "max_rejected": "max",
    "min_completed": "min", "max_gpus": "max", "max_cost_per_hour": "max",
}


@dataclass(frozen=True, kw_only=True)
class LimitResult:
    budget: str
    limit: str
    kind: str
    value: float
    threshold: float
    passed: bool
    reason: str = ""  # why a failing limit fails, with numbers; empty when it passes

    @property
    def margin(self) -> float:
        """How far inside the limit (positive) or past it (negative), in the value's unit."""
        if self.kind == "max":
            return self.threshold - self.value
        if self.kind == "min":
            return self.value - self.threshold
        return 1.0 if self.passed else -1.0

    @property
    def margin_frac(self) -> float | None:
        if self.kind == "must" or not self.threshold:
            return None
        return self.margin / abs(self.threshold)


def judge(budget: str, limit: str, value: float, threshold: float, reason: str = "") -> LimitResult:
    """The verdict on one limit; ``reason`` (what the measurement says about why) is kept only on failure."""
    kind = LIMIT_KINDS[limit]
    if kind == "max":
        passed = value <= threshold
    elif kind == "min":
        passed = value >= threshold
    else:
        passed = bool(value) or not threshold
    return LimitResult(budget=budget, limit=limit, kind=kind, value=value, threshold=threshold, passed=passed,
                       reason="" if passed else reason)


@dataclass(frozen=True, kw_only=True)
class Change:
    budget: str
    limit: str
    before: float
    after: float
    worse: bool


def compare(results: list[LimitResult], baseline: dict[tuple[str, str], float]) -> list[Change]:
    """What moved since the baseline; ``worse`` when it moved towards failing."""
    out = []
    for r in results:
        before = baseline.get((r.budget, r.limit))
        if before is None or before == r.value:
            continue
        worse = (r.value > before) if r.kind == "max" else (r.value < before)
        out.append(Change(budget=r.budget, limit=r.limit, before=before, after=r.value, worse=worse))
    return out
