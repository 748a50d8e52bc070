"""Exact by default: a plain vLLM workload file with no scheduler section (no simulator, no async setting) runs vLLM's
own V1 scheduler as the release does by default (async scheduling from 0.14.0), and reproduces what vLLM 0.33.0's
scheduler recorded on the same requests (tests/fixtures/vllm_scheduler, within issue 11's tolerances); stating
``async_scheduling: false`` reproduces the synchronous recordings.

The workload file carries only what a user would write: the model, the pool (the fixture's blocks, as bytes), the
requests as a trace (arrivals in steps become seconds at one second a step) and a constant step time. Scheduler
limits appear only where the fixture's differ from the defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvplan.app.simulate import plan_simulation, run_simulation
from kvplan.core.engines.vllm.plan import plan_vllm
from kvplan.core.profiles import parse_engine
from kvplan.io.models import load_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_scheduler"
RELEASE = "0.33.0"
# request sets of single-segment prompts without prefix caching: a plain trace says all they hold
SETS = ["sharegpt-opt13b", "long-prompts", "gemma3-sliding", "deepseek-v3-mla", "long-prefill-threshold"]


def workload(tmp_path: Path, name: str, async_scheduling: bool | None) -> Path:
    rs = json.loads((FIXTURES / f"{name}.requests.json").read_text())
    sch, spec = rs["scheduler"], load_model(rs["model"])
    rows = ["arrival,prompt_tokens,output_tokens"]
    for r in rs["requests"]:
        assert len(r["prompt"]) == 1  # one segment: nothing shared that a trace would lose
        rows.append(f"{r.get('arrival_step', 0)},{r['prompt'][0][1]},{r['output'][1]}")
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    profile = parse_engine(f"vllm=={RELEASE}").profile
    layout = plan_vllm(spec.layers, 1 << 50, sch["max_model_len"], profile, model_dtype=spec.dtype,
                       in_flight_tokens=sch["max_num_batched_tokens"]).layout
    pool = rs["num_gpu_blocks"] * layout.pool_block_bytes
    lines = [f"serving: {{model: {rs['model']}, engine: vllm=={RELEASE}, kv_pool_bytes: {pool}}}",
             "requests: {trace: t.csv}", "step_time: {model: constant, seconds: 1.0}",
             f"sharing: {{prefix_caching: {str(sch['enable_prefix_caching']).lower()}}}"]
    limits = {k: sch[k] for k, default in (("max_model_len", spec.max_model_len), ("max_num_batched_tokens", 2048),
                                           ("max_num_seqs", 256), ("long_prefill_token_threshold", 0))
              if sch[k] != default}
    if async_scheduling is not None:
        limits["async_scheduling"] = async_scheduling
    if limits:
        lines.append("scheduler: " + json.dumps(limits))
    path = tmp_path / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def within(ours: float, ref: float, rel: float, floor: float = 0.0) -> bool:
    return abs(ours - ref) <= max(rel * abs(ref), floor)


def _recorded(name: str, async_scheduling: bool | None) -> Path:
    return FIXTURES / f"{name}{'-async' if async_scheduling is None else ''}.vllm-{RELEASE}.json"


# (set, None: no async setting, the default; False: async_scheduling: false) where vLLM recorded that mode
CASES = [(n, a) for n in SETS for a in (None, False) if _recorded(n, a).exists()]


@pytest.mark.parametrize("name, async_scheduling", CASES, ids=[f"{n}-{'default' if a is None else 'sync'}"
                                                              for n, a in CASES])
def test_a_plain_workload_reproduces_vllms_recording(tmp_path, name, async_scheduling):
    recorded = _recorded(name, async_scheduling)
    plan = plan_simulation(workload(tmp_path, name, async_scheduling))
    assert plan.simulator == "vllm-v1" and plan.v1.inputs.scheduler.async_scheduling is (async_scheduling is None)
    ours, ref = run_simulation(plan).v1.metrics(), json.loads(recorded.read_text())["metrics"]
    msg = f"{recorded.name}: kvplan {ours} vs vLLM {ref}"
    assert within(ours["steps"], ref["steps"], 0.01), msg
    assert within(ours["mean_running"], ref["mean_running"], 0.02), msg
    assert within(ours["peak_running"], ref["peak_running"], 0.02), msg
    assert within(ours["preemptions"], ref["preemptions"], 0.05, floor=1.0), msg
    assert abs(ours["mean_kv_usage"] - ref["mean_kv_usage"]) <= 0.01, msg
    assert ours["prompt_tokens"] == ref["prompt_tokens"], msg


def test_the_sets_cover_both_modes():
    """Every set has its synchronous recording, and at least three their async one (the default)."""
    assert all((n, False) in CASES for n in SETS)
    assert sum((n, None) in CASES for n in SETS) >= 3
