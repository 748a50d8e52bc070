"""`kvplan size`, `fit`, `show` and `models` on the attention families (Gemma 4, Gemma 3n, OLMo 3, Seed-OSS,
Hunyuan, MiniMax-M2, GLM-4.x), asserting on JSON."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli import app

runner = CliRunner()
NEW = ["gemma4-31b", "gemma3n-e4b", "olmo3.1-32b", "seed-oss-36b", "hunyuan-a13b", "minimax-m2.7", "minimax-m2.5",
       "glm4.7"]


def run_json(*args: str, code: int = 0) -> dict:
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == code, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("engine", ["ideal", "hf", "vllm", "sglang"])
def test_size_works_on_each_new_model(name, engine):
    out = run_json("size", name, "--engine", engine, "--seq-len", "8192", "--batch", "2")
    for key in ("model", "engine", "bytes_per_token", "total_bytes", "per_gpu_bytes", "layers"):
        assert key in out
    assert out["model"] == name and out["total_bytes"] > 0


@pytest.mark.parametrize("name,tp", [("gemma4-31b", 2), ("gemma3n-e4b", 1), ("olmo3.1-32b", 1), ("seed-oss-36b", 2),
                                     ("hunyuan-a13b", 4), ("minimax-m2.7", 4), ("minimax-m2.5", 4)])
def test_fit_works_on_each_new_model(name, tp):
    out = run_json("fit", name, "--gpu", "h100", "-tp", str(tp), "--max-model-len", "32768", "--engine", "vllm")
    for key in ("fits", "kv_cache_memory_bytes", "num_blocks", "kv_cache_tokens", "max_concurrency", "breakdown"):
        assert key in out
    assert out["fits"] is True and out["breakdown"]["weights"] > 0 and out["kv_cache_tokens"] > 32768


def test_fit_says_glm_4_7_bf16_does_not_fit_eight_h100s():
    """355B bf16 parameters are 710 GB: more than 8 x 80 GB before any KV cache (exit 1)."""
    out = run_json("fit", "glm4.7", "--gpu", "h100", "-tp", "8", "--max-model-len", "32768", code=1)
    assert out["fits"] is False and out["breakdown"]["weights"] * 8 > 700e9


def test_gemma3n_sglang_allocates_the_shared_layers_vllm_does_not():
    """vLLM gives KV-shared layers no cache spec (20 layers hold a cache); SGLang's pools hold a buffer for
    all 35, each shaped as the layer it reads: 7 full layers instead of 4 at 8,192 tokens."""
    vllm = run_json("size", "gemma3n-e4b", "--engine", "vllm", "--seq-len", "8192")
    sglang = run_json("size", "gemma3n-e4b", "--engine", "sglang", "--seq-len", "8192")
    assert sum(g["count"] for g in vllm["layers"] if g["bytes"]) == 20
    assert sum(g["count"] for g in sglang["layers"] if g["bytes"]) == 35
    full_layer = 8192 * 2 * 2 * 256 * 2  # tokens x (K + V) x 2 heads x 256 x bf16
    window_layer = 512 * 2 * 2 * 256 * 2
    assert vllm["total_bytes"] == 4 * full_layer + 16 * window_layer
    assert sglang["total_bytes"] == 7 * full_layer + 28 * window_layer


def test_show_prints_whose_cache_a_shared_layer_reads():
    out = run_json("show", "gemma3n-e4b")
    shared = {g["reads_layer"]: g["layers"] for g in out["groups"] if "reads_layer" in g}
    assert shared == {18: [20, 21, 22, 23, 25, 26, 27, 28, 30, 31, 32, 33], 19: [24, 29, 34]}
    assert all(g["bytes_per_token"] == 0 for g in out["groups"] if "reads_layer" in g)
    r = runner.invoke(app, ["show", "gemma3n-e4b"], env={"COLUMNS": "120"})
    assert r.exit_code == 0, r.output
    assert "shares layer 18's KV cache" in r.stdout and "shares layer 19's KV cache" in r.stdout


def test_show_prints_per_layer_head_shapes():
    out = run_json("show", "gemma4-31b")
    shapes = {(g["kind"], g["num_kv_heads"], g["k_head_dim"]) for g in out["groups"]}
    assert shapes == {("sliding", 16, 256), ("full", 4, 512)}


def test_models_lists_the_new_families_with_hub_aliases():
    rows = {row["name"]: row for row in run_json("models")["models"]}
    for name in NEW:
        assert name in rows
    assert "google/gemma-4-31B-it" in rows["gemma4-31b"]["aliases"]
    assert "google/gemma-3n-E4B-it" in rows["gemma3n-e4b"]["aliases"]
    assert rows["gemma3n-e4b"]["bytes_per_token"] == 20 * 2 * 2 * 256 * 2


@pytest.mark.parametrize("alias,name", [("google/gemma-4-31B-it", "gemma4-31b"), ("allenai/Olmo-3.1-32B-Think", "olmo3.1-32b"),
                                        ("ByteDance-Seed/Seed-OSS-36B-Instruct", "seed-oss-36b"),
                                        ("tencent/Hunyuan-A13B-Instruct", "hunyuan-a13b"),
                                        ("MiniMaxAI/MiniMax-M2.5", "minimax-m2.5"), ("zai-org/GLM-4.6", "glm4.7")])
def test_hub_ids_resolve(alias, name):
    assert run_json("size", alias, "--seq-len", "1")["model"] == name
