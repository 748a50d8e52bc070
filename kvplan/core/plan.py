"""``kvplan plan``: the deployments that hold a target (requests of a length at once), searched with ``fit``'s own
rules, ranked by cost per hour (with prices) or GPU count, the Pareto front of cost against requests held.

The space, per GPU type, engine release, KV dtype and weight format: every tensor-parallel size the model's heads
allow (kvplan.core.capacity.fit._tp_allowed) that fits in a node, pipeline stages over the layers, and
data-parallel replicas of that engine (vLLM and SGLang; TensorRT-LLM's data parallelism is not modelled, so one
engine). A dense model's replicas are independent engines, each the same budget, so one fit gives every dp: the
fewest replicas that hold the target are cdiv(target, whole requests a replica holds) (FitResult.all_concurrency
counts them so). vLLM's data parallelism spreads an MoE model's experts over dp x tp GPUs (with or without expert
parallelism), so there each dp is fitted on its own.

Pure: the GPUs, engines and prices come in as data; every verdict is ``fit``'s.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from kvplan.core.capacity.common import FitRequest, FitResult, GiB
from kvplan.core.capacity.fit import _tp_allowed, fit
from kvplan.core.gpus import GPUSpec
from kvplan.errors import KvplanError

REPLICA_ENGINES = ("vllm", "sglang")  # whose data-parallel replicas `fit` models (-dp N)


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
    replicas: bool = True  # False: one engine of one stage (dp 1, pp 1): `plan WORKLOAD`'s space (each a simulation)


@dataclass(frozen=True, kw_only=True)
class Candidate:
    gpu: GPUSpec
    engine: str
    kv_dtype: str  # as resolved (bf16, fp8_e4m3, ...)
    weight_dtype: str
    asked_kv: str  # as the space asked it (auto: the model's)
    asked_weights: str
    tp: int
    pp: int
    dp: int
    expert_parallel: bool
    result: FitResult  # one replica's fit (at this dp where dp changes the budget, else at dp 1)
    concurrency: float  # requests of the target length every replica holds at once
    cost_per_hour: float | None  # None: no price for this GPU

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def nodes(self, gpus_per_node: int) -> int:
        """Nodes the deployment takes: each tensor-parallel group inside one, as many groups as fit in a node."""
        return -(-(self.pp * self.dp) // (gpus_per_node // self.tp))

    @property
    def all_kv_cache_tokens(self) -> int:
        """The KV cache tokens of every replica."""
        r = self.result
        return r.all_kv_cache_tokens if r.dp == self.dp else self.dp * r.kv_cache_tokens

    def headroom(self, target: Target) -> float:
        """Requests held beyond the target, as a share of it."""
        return self.concurrency / target.concurrency - 1

    @property
    def flags(self) -> str:
        """`kvplan fit`'s flags for this deployment (beside --gpu and --engine)."""
        parts = [f"-tp {self.tp} -pp {self.pp}"]
        if self.dp > 1:
            parts.append(f"-dp {self.dp}")
        if self.expert_parallel:
            parts.append("--enable-expert-parallel")
        if self.asked_kv != "auto":
            parts.append(f"--kv-cache-dtype {self.asked_kv}")
        if self.asked_weights != "auto":
            parts.append(f"--weight-dtype {self.asked_weights}")
        return " ".join(parts)


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
    fitting: tuple[Candidate, ...] = ()  # every deployment that holds the target, best first (the front is in it)


@dataclass(kw_only=True)
class _Family:
    """One family's search: what holds the target, and the closest attempt when nothing does."""

    found: list[Candidate] = field(default_factory=list)
    closest: tuple[float, str] = (-1.0, "no tensor-parallel size divides the model's heads within a node")
    calls: int = 0
    counted: int = 0

    def near(self, held: float, why: str) -> None:
        """Keep the attempt that holds the most (the first of equals)."""
        if held > self.closest[0]:
            self.closest = (held, why)


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
    max_pp = min(space.max_pp, base.spec.num_layers) if space.replicas else 1
    for tp in range(1, min(space.gpus_per_node, space.max_gpus) + 1):
        if not _tp_allowed(base, tp):
            continue
        for pp in range(1, min(max_pp, space.max_gpus // tp) + 1):
            yield tp, pp


def _max_replicas(space: Space, engine: str, tp: int, pp: int) -> int:
    """The most replicas of tp x pp within the GPU and node limits (each tp group inside a node)."""
    if not space.replicas or engine not in REPLICA_ENGINES:
        return 1 if tp * pp <= space.max_gpus and _nodes_ok(space, tp, pp) else 0
    most = space.max_gpus // (tp * pp)
    if space.max_nodes is not None:
        most = min(most, space.max_nodes * (space.gpus_per_node // tp) // pp)
    return most


def _nodes_ok(space: Space, tp: int, pp: int) -> bool:
    return space.max_nodes is None or -(-pp // (space.gpus_per_node // tp)) <= space.max_nodes


def search(base: FitRequest, space: Space, target: Target, prices: dict[str, float]) -> PlanResult:
    """Every deployment of the space that holds ``target``; ``base`` carries the settings shared by all (the model,
    max_num_seqs, ...)."""
    fitting: list[Candidate] = []
    rejected: list[Rejected] = []
    calls = counted = 0
    for gpu in space.gpus:
        for engine, profile in space.engines:
            for kv in space.kv_dtypes:
                for wd in space.weight_dtypes:
                    family = replace(base, gpu=gpu, engine=engine, profile=profile, kv_dtype=kv, weight_dtype=wd,
                                     max_model_len=target.max_model_len,
                                     gpu_memory_utilization=space.gpu_memory_utilization, concurrency=None, dp=1,
                                     expert_parallel=False)
                    f = _family(family, space, target, prices.get(gpu.name))
                    calls, counted = calls + f.calls, counted + f.counted
                    if f.found:
                        fitting += f.found
                    else:
                        rejected.append(Rejected(gpu=gpu, engine=engine, kv_dtype=kv, weight_dtype=wd,
                                                 why=f.closest[1]))
    priced = bool(prices) and all(c.cost_per_hour is not None for c in fitting)
    ordered = sorted(fitting, key=lambda c: rank_key(c, target, priced))
    return PlanResult(ranked=tuple(pareto(ordered, target, priced)), rejected=tuple(rejected), fits_evaluated=calls,
                      candidates=counted, priced=priced, fitting=tuple(ordered))


def _family(family: FitRequest, space: Space, target: Target, price: float | None) -> _Family:
    """The deployments of one family that hold the target (each replica count from the fewest), and, when none
    does, what its closest attempt lacks."""
    out = _Family()
    spread = _moe_spread(family) and space.replicas

    def attempt(tp: int, pp: int, dp: int, ep: bool) -> FitResult | None:
        out.calls += 1
        try:
            return fit(replace(family, tp=tp, pp=pp, dp=dp, expert_parallel=ep))
        except KvplanError as exc:
            out.near(-0.5, f"{family.gpu.name} -tp {tp} -pp {pp}: {exc}")
            return None

    def add(r: FitResult, tp: int, pp: int, dp: int, ep: bool, held: float) -> None:
        cost = round(price * tp * pp * dp, 6) if price is not None else None  # no float noise in a ranking key
        out.found.append(Candidate(gpu=family.gpu, engine=family.engine, kv_dtype=r.kv_dtype,
                                   weight_dtype=r.weight_dtype, asked_kv=family.kv_dtype,
                                   asked_weights=family.weight_dtype, tp=tp, pp=pp, dp=dp,
                                   expert_parallel=ep and tp * dp > 1,  # experts over one GPU: nothing to spread
                                   result=r, concurrency=held, cost_per_hour=cost))

    for tp, pp in _shapes(family, space):
        max_dp = _max_replicas(space, family.engine, tp, pp)
        if max_dp < 1:
            continue
        out.counted += max_dp * (2 if spread else 1)
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
                most = max_dp * whole if r.fits else 0.0
                out.near(most, _short(r, tp, pp, max_dp, target, most if r.fits else None))
            continue
        for ep in (False, True):  # vLLM MoE: each dp its own budget; bisect for the fewest, then fit each more
            if ep and max_dp * tp == 1:
                continue

            def held(r: FitResult | None) -> float:
                return r.all_concurrency if r is not None and r.fits else -1.0

            tried: dict[int, FitResult | None] = {}  # each dp fitted once (the bisection's are reused)

            def at(dp: int) -> FitResult | None:
                if dp not in tried:
                    tried[dp] = attempt(tp, pp, dp, ep)
                return tried[dp]

            top = at(max_dp)
            if held(top) < target.concurrency:
                if top is not None:
                    out.near(max(held(top), 0.0), _short(top, tp, pp, max_dp, target))
                continue
            lo, hi, best = 1, max_dp, top
            while lo < hi:
                mid = (lo + hi) // 2
                r = at(mid)
                if held(r) >= target.concurrency:
                    hi, best = mid, r
                else:
                    lo = mid + 1
            assert best is not None
            add(best, tp, pp, hi, ep, held(best))
            for dp in range(hi + 1, max_dp + 1):  # each more replica: a budget of its own
                r = at(dp)
                if r is not None and held(r) >= target.concurrency:
                    add(r, tp, pp, dp, ep, held(r))
    return out


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
