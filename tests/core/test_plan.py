"""kvplan.core.plan: the search against a brute force over the same space with `fit` itself, and the hand-worked
cases of issue 24 (fewest GPUs without prices; the cheapest with them, where more GPUs of a cheaper type win)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from kvplan.core.capacity.common import FitRequest
from kvplan.core.capacity.fit import _tp_allowed, fit
from kvplan.core.plan import Space, Target, pareto, search
from kvplan.core.profiles import parse_engine
from kvplan.errors import KvplanError
from kvplan.io.gpus import get_gpu
from kvplan.io.models import load_model

VLLM = parse_engine("vllm==0.20.0")


def _base(model: str) -> FitRequest:
    return FitRequest(spec=load_model(model), gpu=get_gpu("H100-80GB"), engine="vllm", profile=VLLM.profile)


def _brute(base: FitRequest, space: Space, target: Target, prices: dict[str, float]) -> list[tuple[float, float, str]]:
    """Every (cost or GPUs, requests held) of a deployment that holds the target, each fitted at its own dp."""
    moe = base.spec.arch is not None and base.spec.arch.moe is not None
    out = []
    for gpu in space.gpus:
        for tp, pp, dp, ep in itertools.product(range(1, 9), range(1, space.max_pp + 1),
                                                range(1, space.max_gpus + 1), (False, True) if moe else (False,)):
            if tp * pp * dp > space.max_gpus or not _tp_allowed(base, tp):
                continue
            req = dataclasses.replace(base, gpu=gpu, tp=tp, pp=pp, dp=dp, expert_parallel=ep,
                                      max_model_len=target.max_model_len)
            try:
                r = fit(req)
            except KvplanError:
                continue
            if r.fits and r.all_concurrency >= target.concurrency:
                n = tp * pp * dp
                out.append((prices[gpu.name] * n if prices else float(n), r.all_concurrency, f"{gpu.name} {tp}/{pp}/{dp}"))
    return out


@pytest.mark.parametrize("model, gpus, target, prices", [
    ("llama3.1-8b", ("L40S", "H100-80GB"), Target(max_model_len=32_768, concurrency=24), {}),
    ("llama3.1-8b", ("L40S", "H100-80GB"), Target(max_model_len=32_768, concurrency=24),
     {"L40S": 0.9, "H100-80GB": 3.0}),
    ("qwen3-30b-a3b", ("L40S", "H100-80GB"), Target(max_model_len=16_384, concurrency=40),
     {"L40S": 0.9, "H100-80GB": 3.0}),
    ("qwen2.5-7b", ("L40S",), Target(max_model_len=32_768, concurrency=30), {}),  # 28 heads, 4 KV heads: tp 1, 2, 4
])
def test_nothing_cheaper_that_fit_accepts_is_missing(model, gpus, target, prices):
    space = Space(gpus=tuple(get_gpu(g) for g in gpus), engines=(("vllm", VLLM.profile),), max_gpus=8, max_pp=4)
    base = _base(model)
    plan = search(base, space, target, prices)
    brute = _brute(base, space, target, prices)
    assert brute and plan.ranked, "the case must have deployments that hold the target"
    cost = (lambda c: c.cost_per_hour) if prices else (lambda c: float(c.num_gpus))
    assert cost(plan.ranked[0]) == min(b[0] for b in brute)  # the top plan is the cheapest fit accepts
    for b_cost, b_held, what in brute:  # every deployment is matched or beaten by one on the front
        assert any(cost(c) <= b_cost and c.concurrency >= b_held - 1e-9 for c in plan.ranked), what
    for c in plan.ranked:  # and each front member is a deployment fit accepts at that size
        r = fit(dataclasses.replace(base, gpu=c.gpu, tp=c.tp, pp=c.pp, dp=c.dp, expert_parallel=c.expert_parallel,
                                    max_model_len=target.max_model_len))
        assert r.fits and r.all_concurrency >= target.concurrency


def test_more_gpus_of_a_cheaper_type_win_with_prices():
    space = Space(gpus=(get_gpu("L40S"), get_gpu("H100-80GB")), engines=(("vllm", VLLM.profile),), max_gpus=8)
    target = Target(max_model_len=32_768, concurrency=24)
    by_count = search(_base("llama3.1-8b"), space, target, {}).ranked[0]
    by_cost = search(_base("llama3.1-8b"), space, target, {"L40S": 0.9, "H100-80GB": 3.0}).ranked[0]
    assert by_count.gpu.name == "H100-80GB" and by_cost.gpu.name == "L40S"
    assert by_cost.num_gpus > by_count.num_gpus and by_cost.cost_per_hour < 3.0 * by_count.num_gpus


def test_a_family_that_never_holds_the_target_says_why():
    space = Space(gpus=(get_gpu("L40S"),), engines=(("vllm", VLLM.profile),), max_gpus=2, max_pp=2)
    plan = search(_base("llama3-70b"), space, Target(max_model_len=8192, concurrency=64), {})
    assert plan.ranked == () and len(plan.rejected) == 1
    why = plan.rejected[0].why
    assert why.startswith("L40S x 2") and ("of 64 requests" in why or "no memory left" in why)


def test_the_front_drops_what_costs_more_and_holds_less():
    space = Space(gpus=(get_gpu("H100-80GB"),), engines=(("vllm", VLLM.profile),), max_gpus=8)
    target = Target(max_model_len=8192, concurrency=8)
    plan = search(_base("llama3.1-8b"), space, target, {})
    held = [c.concurrency for c in plan.ranked]
    gpus = [c.num_gpus for c in plan.ranked]
    assert held == sorted(held) and len(set(held)) == len(held) and gpus == sorted(gpus)
    assert pareto(list(plan.ranked), target, False) == list(plan.ranked)
