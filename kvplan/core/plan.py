"""``kvplan plan``: the deployments that hold a target (requests of a length at once), searched with ``fit``'s own
rules, ranked by cost per hour (with prices) or GPU count, the Pareto front of cost against requests held.

The space, per GPU type, engine release, KV dtype and weight format: a tensor-parallel size the model's heads allow
(kvplan.core.capacity.fit._tp_allowed) within a node, pipeline stages over the layers, and data-parallel replicas
of that engine. A dense model's replicas are independent engines, each the same budget, so one fit gives every dp:
the fewest replicas that hold the target are cdiv(target, whole requests a replica holds) (FitResult.all_concurrency
counts them so). vLLM's data parallelism spreads an MoE model's experts over dp x tp GPUs (with or without expert
parallelism), so there each dp is fitted on its own.

Pure: the GPUs, engines and prices come in as data; every verdict is ``fit``'s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kvplan.core.capacity.common import FitRequest, FitResult, GiB
from kvplan.core.capacity.fit import _tp_allowed, fit
from kvplan.core.gpus import GPUSpec
from kvplan.errors import KvplanError

TP_SIZES = (1, 2, 4, 8, 16)


@dataclass(frozen=True, kw_only=True)
class Target:
    max_model_len: int
    concurrency: int  # requests of max_model_len tokens at once, over every replica


@dataclass(frozen=True, kw_only=True)
class Space:
    gpus: tuple[GPUSpec, ...]
    engines: tuple[tuple[str, Any], ...]  # (engine name, its release's profile)
    kv_dtypes: tuple[str, ...] = ("auto",)
    weight_dtypes: tuple[str, ...] = ("auto",)
    max_gpus: int = 64
    gpus_per_node: int = 8
    max_nodes: int | None = None
    gpu_memory_utilization: float | None = None
    max_pp: int = 8
    replicas: bool = True  # False: one engine (dp 1), as `simulate` runs one

@dataclass(frozen=True, kw_only=True)
class Candidate:
    gpu: GPUSpec
    engine: str
    kv_dtype: str
    weight_dtype: str
    tp: int
    pp: int
    dp: int
    expert_parallel: bool
    result: FitResult  # one replica's fit (the one at this dp where dp changes the budget)
    concurrency: float  # requests of the target length every replica holds at once
    cost_per_hour: float | None  # None: no price for this GPU

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def nodes(self, gpus_per_node: int) -> int:
        return -(-self.num_gpus // gpus_per_node)

    def headroom(self, target: Target) -> float:
        """Requests held beyond the target, as a share of it."""
        return self.concurrency / target.concurrency - 1

    @property
    def flags(self) -> str:
        dp = f" -dp {self.dp}" if self.dp > 1 else ""
        ep = " --enable-expert-parallel" if self.expert_parallel else ""
        return f"-tp {self.tp} -pp {self.pp}{dp}{ep}"


@dataclass(frozen=True, kw_only=True)
class Rejected:
    """A family (GPU, engine, KV dtype, weight format) with no deployment in the limits: its closest one, and why."""

    gpu: GPUSpec
    engine: str
    kv_dtype: str
    weight_dtype: str
    why: str


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    ranked: tuple[Candidate, ...]  # the Pareto front, best first
    rejected: tuple[Rejected, ...]
    fits_evaluated: int  # fit calls made
    candidates: int  # deployments (tp, pp, dp, ...) the fits stood for
    priced: bool


def rank_key(c: Candidate, target: Target, priced: bool) -> tuple[float, float]:
    """Cost per hour with prices (GPU count without), then more headroom first."""
    cost = c.cost_per_hour if priced and c.cost_per_hour is not None else float(c.num_gpus)
    return (cost, -c.headroom(target))


def pareto(candidates: list[Candidate], target: Target, priced: bool) -> list[Candidate]:
    """Those no other beats on both cost (or GPUs) and requests held, best first."""
    front: list[Candidate] = []
    best = -1.0
    for c in sorted(candidates, key=lambda c: rank_key(c, target, priced)):
        if c.concurrency > best:
            front.append(c)
            best = c.concurrency
    return front


def _moe_spread(base: FitRequest) -> bool:
    """Whether dp changes a replica's budget: vLLM spreads routed experts over dp x tp."""
    arch = base.spec.arch
    return base.engine == "vllm" and arch is not None and arch.moe is not None


def _shapes(base: FitRequest, space: Space) -> Iterator[tuple[int, int]]:
    for tp in TP_SIZES:
        if tp > space.gpus_per_node or tp > space.max_gpus or not _tp_allowed(base, tp):
            continue
        for pp in range(1, min(space.max_pp, base.spec.num_layers, space.max_gpus // tp) + 1):
            yield tp, pp


def search(base: FitRequest, space: Space, target: Target, prices: dict[str, float]) -> PlanResult:
    """Every deployment of the space that holds ``target``; ``base`` carries the settings shared by all (the model,
    the drafter and LoRA slots, max_num_seqs, ...)."""
    fitting: list[Candidate] = []
    rejected: list[Rejected] = []
    calls = counted = 0
    for gpu in space.gpus:
        for engine, profile in space.engines:
            for kv in space.kv_dtypes:
                for wd in space.weight_dtypes:
                    family = dataclasses.replace(base, gpu=gpu, engine=engine, profile=profile, kv_dtype=kv,
                                                 weight_dtype=wd, max_model_len=target.max_model_len,
                                                 gpu_memory_utilization=space.gpu_memory_utilization,
                                                 concurrency=None, dp=1, expert_parallel=False)
                    found, closest, n, m = _family(family, space, target, prices.get(gpu.name))
                    calls, counted = calls + n, counted + m
                    if found:
                        fitting += found
                    else:
                        rejected.append(Rejected(gpu=gpu, engine=engine, kv_dtype=kv, weight_dtype=wd, why=closest))
    priced = bool(prices) and all(c.cost_per_hour is not None for c in fitting)
    return PlanResult(ranked=tuple(pareto(fitting, target, priced)), rejected=tuple(rejected), fits_evaluated=calls,
                      candidates=counted, priced=priced)


def _family(family: FitRequest, space: Space, target: Target,
            price: float | None) -> tuple[list[Candidate], str, int, int]:
    """The deployments of one family that hold the target (the fewest replicas for each tp x pp), and, when none
    does, what its closest attempt lacks."""
    found: list[Candidate] = []
    closest: list[tuple[float, str]] = [(-1.0, "no tensor-parallel size divides the model's heads within a node")]
    calls = counted = 0
    spread = _moe_spread(family)

    def attempt(tp: int, pp: int, dp: int, ep: bool) -> FitResult | None:
        nonlocal calls
        calls += 1
        try:
            return fit(dataclasses.replace(family, tp=tp, pp=pp, dp=dp, expert_parallel=ep))
        except KvplanError as exc:
            closest.append((-0.5, f"{family.gpu.name} -tp {tp} -pp {pp}: {exc}"))
            return None

    def add(r: FitResult, tp: int, pp: int, dp: int, ep: bool, held: float) -> None:
        cost = price * tp * pp * dp if price is not None else None
        ep = ep and tp * dp > 1  # experts over one GPU: expert parallelism changes nothing
        found.append(Candidate(gpu=family.gpu, engine=family.engine, kv_dtype=r.kv_dtype, weight_dtype=r.weight_dtype,
                               tp=tp, pp=pp, dp=dp, expert_parallel=ep, result=r, concurrency=held,
                               cost_per_hour=cost))

    for tp, pp in _shapes(family, space):
        max_dp = space.max_gpus // (tp * pp)
        if space.max_nodes is not None:
            max_dp = min(max_dp, space.max_nodes * space.gpus_per_node // (tp * pp))
        if max_dp < 1:
            continue
        max_dp = max_dp if space.replicas else 1
        counted += max_dp * (2 if spread else 1)
        if not spread:  # one fit stands for every dp: replicas are alike
            r = attempt(tp, pp, 1, False)
            if r is None:
                continue
            per = r.max_concurrency if r.fits else 0.0
            whole = math.floor(per)
            need = 1 if per >= target.concurrency else (-(-target.concurrency // whole) if whole else 0)
            if need and need <= max_dp:  # the fewest replicas, and each more (the front may take them)
                for dp in range(need, max_dp + 1):
                    add(r, tp, pp, dp, False, per if dp == 1 else dp * whole)
            else:
                closest.append((max_dp * whole if r.fits else 0.0, _short(r, tp, pp, max_dp, target,
                                                                          max_dp * whole if r.fits else None)))
            continue
        for ep in (False, True):  # vLLM MoE: each dp its own budget; bisect for the fewest, then fit each more
            if ep and max_dp * tp == 1:
                continue

            def held(r: FitResult | None) -> float:
                return r.all_concurrency if r is not None and r.fits else -1.0

            top = attempt(tp, pp, max_dp, ep)
            if held(top) < target.concurrency:
                if top is not None:
                    closest.append((max(held(top), 0.0), _short(top, tp, pp, max_dp, target)))
                continue
            lo, hi, best = 1, max_dp, top
            while lo < hi:
                mid = (lo + hi) // 2
                r = attempt(tp, pp, mid, ep)
                if held(r) >= target.concurrency:
                    hi, best = mid, r
                else:
                    lo = mid + 1
            assert best is not None
            add(best, tp, pp, hi, ep, held(best))
            for dp in range(hi + 1, max_dp + 1):  # each more replica: a budget of its own
                r = attempt(tp, pp, dp, ep)
                if held(r) >= target.concurrency:
                    assert r is not None
                    add(r, tp, pp, dp, ep, held(r))
    return found, max(closest)[1], calls, counted


def _short(r: FitResult, tp: int, pp: int, dp: int, target: Target, held: float | None = None) -> str:
    """Why the closest deployment of a family misses: its fit's reason, or the requests it holds."""
    gpus = tp * pp * dp
    where = f"{r.gpu.name} x {gpus} (-tp {tp} -pp {pp}" + (f" -dp {dp})" if dp > 1 else ")")
    if r.reasons:
        return f"{where}: {r.reasons[0]}"
    b = r.breakdown
    left = r.gpu.memory_bytes - b.weights - b.draft_weights - b.lora
    held = r.all_concurrency if held is None else held
    return (f"{where}: weights {b.weights / GiB:.1f} GiB/GPU leave {left / GiB:.1f} GiB, {held:.0f} of "
            f"{target.concurrency} requests of {target.max_model_len:,} tokens")
