"""`kvplan plan` through the CLI: the JSON contract, the exit codes, the prices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.app.plan import plan_model, simulate_candidates
from kvplan.cli import app

runner = CliRunner()
EXAMPLE_PRICES = Path(__file__).resolve().parents[2] / "configs" / "prices" / "example-2026-05.yaml"


def _plan(*args: str) -> tuple[int, dict]:
    r = runner.invoke(app, ["plan", *args, "--json"])
    assert r.exit_code in (0, 1), r.output
    return r.exit_code, json.loads(r.stdout)


def test_the_json_contract_and_the_top_plan_is_what_fit_says():
    code, out = _plan("llama3.1-8b", "--max-model-len", "32k", "--concurrency", "24", "--gpus", "L40S,H100-80GB",
                      "--engine", "vllm==0.20.0")
    assert code == 0 and out["ranked_by"] == "num_gpus" and out["plans"]
    top = out["plans"][0]
    for key in ("gpu", "num_gpus", "nodes", "engine", "engine_version", "tensor_parallel_size",
                "pipeline_parallel_size", "data_parallel_size", "enable_expert_parallel", "flags", "cost_per_hour",
                "concurrency", "headroom_frac", "kv_cache_tokens", "borderline"):
        assert key in top
    r = runner.invoke(app, ["fit", "llama3.1-8b", "--gpu", top["gpu"], "--engine", "vllm==0.20.0",
                            *top["flags"].split(), "--max-model-len", "32k", "--concurrency", "24", "--json"])
    fitted = json.loads(r.stdout)
    assert r.exit_code == 0 and fitted["all_ranks"]["max_concurrency"] == pytest.approx(top["concurrency"], abs=1e-4)


def test_prices_rank_by_cost_and_leave_unpriced_gpus_out():
    code, out = _plan("llama3.1-8b", "--max-model-len", "32k", "--concurrency", "24", "--gpus", "L40S,H100-80GB",
                      "--price", "L40S=0.9")
    assert code == 0 and out["ranked_by"] == "cost_per_hour"
    assert {p["gpu"] for p in out["plans"]} == {"L40S"} and any("no price for H100-80GB" in n for n in out["notes"])
    costs = [p["cost_per_hour"] for p in out["plans"]]
    assert costs == sorted(costs) and costs[0] == pytest.approx(0.9 * out["plans"][0]["num_gpus"])


def test_the_example_prices_file():
    code, out = _plan("llama3.1-8b", "--max-model-len", "32k", "--concurrency", "24", "--prices", str(EXAMPLE_PRICES))
    assert code == 0 and out["currency"] == "USD"
    assert {p["gpu"] for p in out["plans"]} <= {"A100-80GB", "H100-80GB", "H200"}


def test_nothing_holds_the_target_is_exit_1_with_each_familys_reason():
    code, out = _plan("llama3-70b", "--max-model-len", "8k", "--concurrency", "64", "--gpus", "L40S", "--max-gpus", "2")
    assert code == 1 and out["plans"] == [] and out["rejected"][0]["gpu"] == "L40S" and out["rejected"][0]["why"]


@pytest.mark.parametrize("args, match", [
    (["--price", "H100-80GB"], "GPU=PRICE pairs"),
    (["--price", "H100-80GB=-1"], "must be a positive number"),
    (["--price", "NOPE=1"], "NOPE"),
    (["--concurrency", "0"], "at least 1"),
    (["--gpus", "A10"], None),  # a small GPU asked for is searched (and may hold nothing)
])
def test_bad_input_is_exit_2(args, match):
    r = runner.invoke(app, ["plan", "llama3.1-8b", "--max-model-len", "8k", "--concurrency", "4", *args])  # last wins
    if match is None:
        assert r.exit_code in (0, 1), r.output
        return
    assert r.exit_code == 2 and match in r.output and "Traceback" not in r.output


def test_the_text_report_fits_80_columns():
    r = runner.invoke(app, ["plan", "deepseek-v3", "--max-model-len", "32k", "--concurrency", "64", "--prices",
                            str(EXAMPLE_PRICES), "--top", "5"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert all(len(line) <= 80 for line in r.output.splitlines())
    assert "ranked by cost per hour" in r.output


WORKLOAD = Path(__file__).resolve().parents[2] / "configs" / "workloads" / "llama3.1-8b-multiturn-chat.yaml"
PRICED = ["--gpus", "L40S,A100-80GB,H100-80GB", "--price", "L40S=0.9,A100-80GB=1.3,H100-80GB=3"]


def test_a_workload_plan_is_the_cheapest_that_keeps_the_bound():
    """Every deployment that holds one request is simulated in cost order, not only the memory front: latency does
    not follow KV capacity (1 x H100 at 3.00 keeps the bound where 2 x L40S at 1.80 does not, and the front has
    4 x L40S at 3.60 before it)."""
    code, out = _plan(str(WORKLOAD), "--max-ttft", "0.05", *PRICED, "--top", "2")
    assert code == 0 and out["chosen"] is not None
    assert out["bounds"] == [{"latency": "ttft", "percentile": "p99", "seconds": 0.05}]
    sims = out["simulated"]
    chosen = sims[out["chosen"]]
    assert chosen["latency_s"]["ttft"]["p99"] <= 0.05 and chosen["rejected"] == 0
    costs = [s["cost_per_hour"] for s in sims]
    assert costs == sorted(costs)  # simulated cheapest first
    for s in sims[:out["chosen"]]:  # every cheaper one missed the bound
        assert s["latency_s"]["ttft"]["p99"] > 0.05 or s["rejected"]
    assert all(s["data_parallel_size"] == 1 and s["pipeline_parallel_size"] == 1 for s in sims)


def test_the_top_rows_run_with_a_workloads_traffic_replicas_and_stages_included():
    # on L40S a 70B model needs several GPUs: the front has pipelined and data-parallel rows, each simulated
    # (vLLM's batch queue over the stages, its load balancer over the engines)
    code, out = _plan("llama3.1-70b", "-s", "8k", "-c", "16", "--gpus", "L40S", "--engine", "vllm==0.33.0",
                      "--workload", WORKLOAD.stem, "--top", "4")  # a bundled example by name, as simulate takes it
    assert code == 0 and [s["flags"] for s in out["simulated"]] == [p["flags"] for p in out["plans"][:4]]
    assert any(s["pipeline_parallel_size"] > 1 for s in out["simulated"])
    for s in out["simulated"]:
        assert s["skipped"] is None and s["completed"] > 0 and s["latency_s"]["e2e"]["p99"] > 0, s
    # a data-parallel deployment (off this front: -tp 2 holds more on the same GPUs) runs behind the load balancer
    report = plan_model("llama3.1-8b", max_model_len=8192, concurrency=64, gpus="L40S")
    replicas = next(c for c in report.result.fitting if c.dp == 3 and c.pp == 1 and c.tp == 1)
    (sim,) = simulate_candidates(report, WORKLOAD, [replicas], workers=1)
    assert not sim.skipped and sim.completed > 0 and sim.latency_s["e2e"]["p99"] > 0


@pytest.mark.parametrize("args, match", [
    ([str(WORKLOAD)], "needs a bound"),
    (["llama3.1-8b", "-s", "8k", "-c", "4", "--max-ttft", "1"], "give --workload"),
    ([str(WORKLOAD), "--max-ttft", "1", "-c", "4"], "no --concurrency"),
    ([str(WORKLOAD), "--max-ttft", "1", "--percentile", "p95"], "p50, p90 or p99"),
    (["llama3.1-8b", "-s", "8k"], "give --max-model-len and --concurrency"),
])
def test_a_workload_plan_refuses_what_it_cannot_judge(args, match):
    r = runner.invoke(app, ["plan", *args])
    assert r.exit_code == 2 and match in r.output


def test_the_flags_name_the_dtypes_and_a_row_is_what_fit_says():
    code, out = _plan("llama3.1-70b", "-s", "8k", "-c", "16", "--gpus", "H100-80GB", "--kv-cache-dtype", "auto,fp8",
                      "--engine", "vllm==0.20.0")
    fp8 = next(p for p in out["plans"] if "--kv-cache-dtype fp8" in p["flags"])
    r = runner.invoke(app, ["fit", "llama3.1-70b", "--gpu", "H100-80GB", "--engine", "vllm==0.20.0",
                            *fp8["flags"].split(), "--max-model-len", "8k", "--json"])
    fitted = json.loads(r.stdout)
    assert fitted["kv_cache_dtype"] == fp8["kv_cache_dtype"]
    assert fitted["all_ranks"]["kv_cache_tokens"] == fp8["kv_cache_tokens"]


@pytest.mark.parametrize("args, match", [
    (["--kv-cache-dtype", "nope"], "nope"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
    (["--top", "0"], "--top must be at least 1"),
])
def test_settings_every_fit_would_refuse_are_exit_2(args, match):
    r = runner.invoke(app, ["plan", "llama3.1-8b", "-s", "8k", "-c", "4", *args])
    assert r.exit_code == 2 and match in r.output


def test_tensor_parallel_groups_stay_in_a_node():
    """3 GPUs a node hold one tp 2 group each: -tp 2 -pp 3 takes 3 nodes."""
    code, out = _plan("llama3.1-8b", "-s", "32k", "-c", "10", "--gpus", "L40S", "--gpus-per-node", "3",
                      "--max-nodes", "2")
    for p in out["plans"]:
        assert p["nodes"] <= 2
        groups = p["pipeline_parallel_size"] * p["data_parallel_size"]
        assert p["nodes"] == -(-groups // (3 // p["tensor_parallel_size"]))


def test_tensorrt_llm_plans_one_engine():
    code, out = _plan("llama3.1-8b", "-s", "32k", "-c", "24", "--gpus", "L40S", "--engine", "trtllm")
    assert out["plans"] and all(p["data_parallel_size"] == 1 for p in out["plans"])
