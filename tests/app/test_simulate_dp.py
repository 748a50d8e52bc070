"""`simulate` with data-parallel engines (serving.data_parallel_size): each engine's pool as `fit` plans it with
-dp N, the requests sent by the release's load balancer, the report merged and per engine; `check` measures the same
run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.app.report import allocator_rows, simulation_json
from kvplan.app.simulate import plan_simulation, run_simulation
from kvplan.core.capacity.common import FitRequest
from kvplan.core.capacity.fit import fit
from kvplan.core.profiles import parse_engine
from kvplan.cli import app
from kvplan.errors import ConfigError
from kvplan.io.gpus import get_gpu
from kvplan.io.models import load_model

TRAFFIC = """requests:
  count: 600
  seed: 3
  arrival: {process: poisson, rate: 30.0}
  prompt_tokens: {dist: lognormal, mean: 1500, sigma: 0.8}
  output_tokens: {dist: lognormal, mean: 300, sigma: 0.6}
scheduler: {max_model_len: 16384}
"""


def _file(tmp_path: Path, serving: str, extra: str = "") -> Path:
    path = tmp_path / "w.yaml"
    path.write_text(f"name: dp\nserving: {{{serving}}}\n" + TRAFFIC + extra)
    return path


def test_each_engine_gets_the_pool_fit_plans_with_dp(tmp_path):
    path = _file(tmp_path, "model: qwen3-30b-a3b, gpu: H100-80GB, engine: vllm==0.33.0, data_parallel_size: 2, "
                           "enable_expert_parallel: true")
    plan = plan_simulation(path)
    f = fit(FitRequest(spec=load_model("qwen3-30b-a3b"), gpu=get_gpu("H100-80GB"), engine="vllm",
                       profile=parse_engine("vllm==0.33.0").profile, dp=2, expert_parallel=True, max_model_len=16384,
                       async_scheduling=True))
    assert plan.v1.data_parallel_size == 2
    assert plan.pool.pool_slots == f.kv_cache_tokens  # one engine's pool, as fit plans it under -dp 2 with EP
    alone = fit(FitRequest(spec=load_model("qwen3-30b-a3b"), gpu=get_gpu("H100-80GB"), engine="vllm",
                           profile=parse_engine("vllm==0.33.0").profile, max_model_len=16384, async_scheduling=True))
    assert f.kv_cache_tokens > alone.kv_cache_tokens  # the experts spread over both GPUs leave more for KV
    assert any("data parallel: 2 engines" in n for n in plan.notes)
    assert any("lockstep" in n for n in plan.notes)  # an MoE model: the timing caveat is said


def test_the_report_merges_the_engines_and_lists_each(tmp_path):
    run = run_simulation(plan_simulation(_file(tmp_path, "model: llama3.1-8b, gpu: L40S, data_parallel_size: 3")))
    doc = simulation_json(run)
    dp = doc["data_parallel"]
    assert dp["size"] == 3 and [r["rank"] for r in dp["ranks"]] == [0, 1, 2]
    assert sum(r["requests"] for r in dp["ranks"]) == doc["requests"] == 600
    assert sum(r["completed"] for r in dp["ranks"]) == allocator_rows(run)[0].completed == 600
    assert sum(r["preemptions"] for r in dp["ranks"]) == doc["preemptions"]
    assert doc["peak_running"] == max(r["peak_running"] for r in dp["ranks"])
    assert doc["generated_tokens"] == sum(r["generated_tokens"] for r in dp["ranks"])
    assert dp["router"]["interval_s"] == 0.1 and dp["router"]["score"]
    # the balancer spreads the traffic: no engine gets twice another's share
    counts = [r["requests"] for r in dp["ranks"]]
    assert max(counts) < 2 * min(counts)


def test_more_engines_queue_less(tmp_path):
    def p99_queue(dp: int) -> float:
        run = run_simulation(plan_simulation(_file(tmp_path, f"model: llama3.1-8b, gpu: L40S, data_parallel_size: "
                                                             f"{dp}")))
        return simulation_json(run)["latency_s"]["queue"]["p99"]

    assert p99_queue(4) < p99_queue(1)


def test_a_budget_measures_the_data_parallel_run(tmp_path):
    path = _file(tmp_path, "model: llama3.1-8b, gpu: L40S, data_parallel_size: 2")
    doc = simulation_json(run_simulation(plan_simulation(path)))
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(json.dumps({"budgets": [{"name": "dp", "workload": str(path), "require": {
        "max_preemptions": 10**9, "min_completed": 0}}]}))
    r = CliRunner().invoke(app, ["check", str(budgets), "--json"])
    assert r.exit_code == 0, r.output
    checked = {x["limit"]: x["value"] for x in json.loads(r.stdout)["results"]}
    assert checked == {"max_preemptions": doc["preemptions"], "min_completed": 600}


@pytest.mark.parametrize("serving, extra, match", [
    ("model: llama3.1-8b, gpu: L40S, engine: sglang, data_parallel_size: 2", "",
     "only vLLM v1's scheduler simulates data-parallel engines"),
    ("model: llama3.1-8b, gpu: L40S, data_parallel_size: 2", "allocators: [contiguous-max, paged-16]\n",
     "paged pool only"),
])
def test_what_data_parallel_runs_cannot_be(tmp_path, serving, extra, match):
    with pytest.raises(ConfigError, match=match):
        plan_simulation(_file(tmp_path, serving, extra))
