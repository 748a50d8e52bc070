"""kvplan's v1 scheduler simulator against vLLM's own scheduler: every request set in
tests/fixtures/vllm_scheduler/ with a recorded fixture (<name>.vllm-<version>.json, written by
tools/vllm_reference/run.py driving that vLLM release's Scheduler and KV cache manager on CPU), simulated with
that release's pool plan and scheduler rules (``--engine vllm==<version>``), must hold issue 11's
tolerances: mean and peak running batch within 2%, steps within 1%, preemptions within 5% (at least one
event either way), mean KV usage and prefix hit rate within 1 point; and, stronger, every step and request."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from kvplan.core.engines.vllm.profiles import VLLM_PROFILES
from kvplan.core.profiles import Version, parse_engine
from kvplan.core.sim.v1 import simulate_v1
from kvplan.core.sim.v1.inputs import KIND_NAMES
from kvplan.errors import InputError
from kvplan.io.vllm_requests import load_request_set, request_set_inputs

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_scheduler"


def fixture_files(*, failed: bool = False) -> list[Path]:
    """The fixtures of runs that finished (or, with ``failed``, of runs where vLLM itself raised)."""
    paths = sorted(FIXTURES.glob("*.vllm-*.json")) if FIXTURES.is_dir() else []
    return [p for p in paths if (json.loads(p.read_text())["error"] is not None) == failed]


def inputs_for(fixture: Path, data: dict, version: str | None = None):
    """The fixture's request set under the rules of the release that recorded it (or of ``version``)."""
    path = FIXTURES / f"{data['request_set']}.requests.json"
    rs = load_request_set(path).model_copy(update={"engine": f"vllm=={version or data['vllm_version']}"})
    return request_set_inputs(rs, origin=str(path))


@cache
def run(fixture: Path):
    return simulate_v1(inputs_for(fixture, json.loads(fixture.read_text())))


def within(ours: float, ref: float, rel: float, floor: float = 0.0) -> bool:
    return abs(ours - ref) <= max(rel * abs(ref), floor)


def first_divergence(ours: tuple[int, ...], ref: list[int]) -> str:
    for i, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            return f"first differs at counted step {i}: kvplan {a}, vLLM {b}"
    return "per-step records agree where both have steps" if len(ours) != len(ref) else "per-step records agree"


def decode(series, encoding: str | None) -> list[int]:
    if encoding and ("run-length" in encoding or encoding == "rle"):  # [[value, count], ...]
        return [v for v, n in series for _ in range(n)]
    return list(series)


@pytest.mark.parametrize("fixture", fixture_files(), ids=lambda p: p.name)
def test_kvplan_holds_vllms_scheduler_tolerances(fixture: Path) -> None:
    data = json.loads(fixture.read_text())
    result = run(fixture)
    ref = data["metrics"]
    per_step = data.get("per_step") or {}
    hint = first_divergence(result.per_step_running, decode(per_step.get("running", []), data.get("encoding")))
    ours = result.metrics()
    msg = f"{fixture.name}: kvplan {ours} vs vLLM {ref}; running {hint}"
    assert within(ours["steps"], ref["steps"], 0.01), msg
    assert within(ours["mean_running"], ref["mean_running"], 0.02), msg
    assert within(ours["peak_running"], ref["peak_running"], 0.02, floor=0.0), msg
    assert within(ours["preemptions"], ref["preemptions"], 0.05, floor=1.0), msg
    assert abs(ours["mean_kv_usage"] - ref["mean_kv_usage"]) <= 0.01, msg
    assert abs(ours["prefix_hit_rate"] - ref["prefix_hit_rate"]) <= 0.01, msg
    assert ours["prompt_tokens"] == ref["prompt_tokens"], msg  # the same requests


@pytest.mark.parametrize("fixture", fixture_files(), ids=lambda p: p.name)
def test_the_pool_is_the_one_vllm_built(fixture: Path) -> None:
    """The groups and blocks plan_vllm gives the request set's model are those vLLM's run had."""
    data = json.loads(fixture.read_text())
    inputs = inputs_for(fixture, data)
    kv = data["kv_cache"]
    assert inputs.layout.num_blocks == kv["num_blocks"]
    ours = sorted((KIND_NAMES[g.kind], g.block_size, g.window) for g in inputs.layout.groups if g.kind != 3)
    theirs = sorted(((g["kind"] if g["kind"] != "mla" else "full"), g["block_size"], g.get("sliding_window") or 0)
                    for g in kv["groups"] if g["kind"] != "mamba")
    assert ours == theirs


@pytest.mark.parametrize("fixture", fixture_files(), ids=lambda p: p.name)
def test_kvplan_reproduces_every_step_and_request(fixture: Path) -> None:
    """Stronger than the tolerances: the same running count, KV usage and scheduled tokens at every counted
    step, and the same first-scheduled, first-token and finish steps, preemptions and hits per request."""
    data = json.loads(fixture.read_text())
    result = run(fixture)
    enc = data.get("encoding")
    for key in ("running", "kv_usage_permille", "scheduled_tokens"):
        ours = getattr(result, f"per_step_{key}")
        ref = decode(data["per_step"][key], enc)
        assert list(ours) == ref, f"{key}: {first_divergence(ours, ref)}"
    fields = ("first_scheduled_step", "first_token_step", "finish_step", "num_preemptions", "num_cached_tokens")
    for rec in result.per_request:
        ref = data["per_request"][rec.id]
        assert tuple(getattr(rec, f) for f in fields) == tuple(ref[f] for f in fields), rec.id


@pytest.mark.parametrize("fixture", fixture_files(failed=True), ids=lambda p: p.name)
def test_where_vllm_failed_kvplan_stops_and_the_fix_replays_the_steps_before(fixture: Path) -> None:
    """vLLM 0.20.0-0.20.1 raise in BlockPool.get_new_blocks where the sliding cap in every allocation lets a
    request past a dry pool; kvplan stops there too. Under the next scheduler profile (0.20.2, the fix, which
    preempts instead), kvplan repeats every step vLLM completed before it raised, and goes on."""
    data = json.loads(fixture.read_text())
    with pytest.raises(InputError, match="stops here"):
        simulate_v1(inputs_for(fixture, data))
    release = Version.parse(data["vllm_version"])
    fix = next(p for p in VLLM_PROFILES if p.since > release
               and p.rules.scheduler != parse_engine(f"vllm=={data['vllm_version']}").profile.rules.scheduler)
    result = simulate_v1(inputs_for(fixture, data, fix.version))
    enc = data.get("encoding")
    for key in ("running", "kv_usage_permille", "scheduled_tokens"):
        ref = decode(data["per_step"][key], enc)
        assert list(getattr(result, f"per_step_{key}"))[:len(ref)] == ref, key
    assert result.steps > data["metrics"]["steps"] and result.preemptions > 0 == data["metrics"]["preemptions"]
