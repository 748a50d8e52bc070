"""`check` budgets with a speculative drafter or LoRA slots measure what `fit` and `size` say for the same flags."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli import app

runner = CliRunner()
BIG = 10**12


def _json(*args: str) -> dict:
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


def _check(tmp_path, budget: dict) -> dict:
    path = tmp_path / "budgets.yaml"
    path.write_text(json.dumps({"budgets": [{"name": "b", **budget}]}))
    return {r["limit"]: r["value"] for r in _json("check", str(path))["results"]}


@pytest.mark.parametrize("extra, flags", [
    ({"speculative_config": {"method": "mtp", "num_speculative_tokens": 1}},
     ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}']),
    ({"engine": "sglang", "speculative_algorithm": "NEXTN"}, ["--engine", "sglang", "--speculative-algorithm", "NEXTN"]),
])
def test_a_drafters_budget_is_fits(tmp_path, extra, flags):
    budget = {"model": "deepseek-v3", "gpu": "H200", "tensor_parallel_size": 8, "max_model_len": 32768, **extra,
              "require": {"min_kv_cache_tokens": 1, "max_kv_bytes_per_token": BIG}}
    checked = _check(tmp_path, budget)
    fitted = _json("fit", "deepseek-v3", "--gpu", "H200", "-tp", "8", "--max-model-len", "32768", *flags)
    assert checked["min_kv_cache_tokens"] == fitted["kv_cache_tokens"]
    # the MTP layer's KV a token beside the 61 layers': 62 MLA latents of (512 + 64) x 2 B, on each of the 8 GPUs
    assert checked["max_kv_bytes_per_token"] == 8 * 62 * 1152


def test_a_lora_budget_is_fits(tmp_path):
    budget = {"model": "llama3.1-8b", "gpu": "H100-80GB", "enable_lora": True, "max_loras": 4,
              "require": {"min_kv_cache_tokens": 1}}
    fitted = _json("fit", "llama3.1-8b", "--gpu", "H100-80GB", "--enable-lora", "--max-loras", "4")
    assert _check(tmp_path, budget)["min_kv_cache_tokens"] == fitted["kv_cache_tokens"]
    plain = _json("fit", "llama3.1-8b", "--gpu", "H100-80GB")
    assert fitted["kv_cache_tokens"] < plain["kv_cache_tokens"]


def test_a_budget_kvplan_cannot_plan_says_which(tmp_path):
    path = tmp_path / "budgets.yaml"
    path.write_text(json.dumps({"budgets": [{"name": "moe", "model": "qwen3-30b-a3b", "gpu": "H100-80GB",
                                             "enable_lora": True, "require": {"min_kv_cache_tokens": 1}}]}))
    r = runner.invoke(app, ["check", str(path)])
    assert r.exit_code == 2 and "budget 'moe': qwen3-30b-a3b: LoRA on routed experts" in r.output


def test_plan_limits_measure_what_plan_finds(tmp_path):
    budget = {"model": "llama3.1-8b", "engine": "vllm==0.20.0", "max_model_len": 32768, "concurrency": 24,
              "prices": {"L40S": 0.9, "H100-80GB": 3.0}, "require": {"max_gpus": 64, "max_cost_per_hour": 1000}}
    checked = _check(tmp_path, budget)
    args = ("plan", "llama3.1-8b", "--engine", "vllm==0.20.0", "--max-model-len", "32768", "--concurrency", "24")
    cheapest = _json(*args, "--price", "L40S=0.9,H100-80GB=3.0")["plans"][0]
    fewest = _json(*args)["plans"][0]  # max_gpus: the fewest GPUs of any type, whatever the prices
    assert checked == {"max_gpus": fewest["num_gpus"], "max_cost_per_hour": pytest.approx(cheapest["cost_per_hour"])}
    assert fewest["num_gpus"] < cheapest["num_gpus"]  # 1 x H100 holds it; the cheapest is 3 x L40S


def test_plan_limits_need_a_target_and_prices(tmp_path):
    path = tmp_path / "budgets.yaml"
    path.write_text(json.dumps({"budgets": [{"name": "b", "model": "llama3.1-8b", "require": {"max_gpus": 4}}]}))
    r = runner.invoke(app, ["check", str(path)])
    assert r.exit_code == 2 and "need a concurrency" in r.output
    path.write_text(json.dumps({"budgets": [{"name": "b", "model": "llama3.1-8b", "concurrency": 4,
                                             "require": {"max_cost_per_hour": 4}}]}))
    r = runner.invoke(app, ["check", str(path)])
    assert r.exit_code == 2 and "needs prices" in r.output


@pytest.mark.parametrize("budget, match", [
    ({"max_loras": 4}, "go with enable_lora"),
    ({"engine": "trtllm", "speculative_config": {"method": "mtp", "num_speculative_tokens": 1}},
     "speculative_config is vLLM's"),
])
def test_a_budgets_keys_are_named_as_a_budget_spells_them(tmp_path, budget, match):
    path = tmp_path / "budgets.yaml"
    path.write_text(json.dumps({"budgets": [{"name": "b", "model": "deepseek-v3", "gpu": "H200",
                                             "tensor_parallel_size": 8, **budget,
                                             "require": {"min_kv_cache_tokens": 1}}]}))
    r = runner.invoke(app, ["check", str(path)])
    assert r.exit_code == 2 and match in r.output and "--speculative" not in r.output


def test_sglang_placements_and_draft_head_in_a_budget_are_fits(tmp_path):
    budget = {"model": "deepseek-v3", "gpu": "H200", "engine": "sglang==0.5.5", "tensor_parallel_size": 8,
              "data_parallel_size": 8, "enable_dp_attention": True, "enable_dp_lm_head": True,
              "moe_a2a_backend": "deepep", "ep_num_redundant_experts": 8, "moe_dense_tp_size": 1,
              "max_total_tokens": 100000, "max_model_len": 32768, "require": {"min_kv_cache_tokens": 1}}
    fitted = _json("fit", "deepseek-v3", "--gpu", "H200", "--engine", "sglang==0.5.5", "-tp", "8", "-dp", "8",
                   "--enable-dp-attention", "--enable-dp-lm-head", "--moe-a2a-backend", "deepep",
                   "--ep-num-redundant-experts", "8", "--moe-dense-tp-size", "1", "--max-total-tokens", "100000",
                   "--max-model-len", "32768")
    assert _check(tmp_path, budget)["min_kv_cache_tokens"] == 8 * fitted["kv_cache_tokens"] == 8 * 100_000  # the cap
    eagle = {"model": "llama2-7b", "gpu": "H100-80GB", "engine": "sglang==0.4.3", "speculative_algorithm": "EAGLE",
             "speculative_draft_model_path": "lmzheng/sglang-EAGLE-llama2-chat-7B", "gpu_memory_utilization": 0.7,
             "require": {"min_kv_cache_tokens": 1}}
    fitted = _json("fit", "llama2-7b", "--gpu", "H100-80GB", "--engine", "sglang==0.4.3", "--speculative-algorithm",
                   "EAGLE", "--speculative-draft-model-path", "lmzheng/sglang-EAGLE-llama2-chat-7B",
                   "--gpu-memory-utilization", "0.7")
    assert _check(tmp_path, eagle)["min_kv_cache_tokens"] == fitted["kv_cache_tokens"]
