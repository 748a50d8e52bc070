"""`simulate` with pipeline stages (serving.pipeline_parallel_size): the pool per stage, vLLM's batch queue as the
release and model runner keep it, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.app.simulate import plan_simulation
from kvplan.errors import ConfigError

TRAFFIC = """requests:
  count: 50
  seed: 1
  arrival: {process: poisson, rate: 5.0}
  prompt_tokens: {dist: lognormal, mean: 500, sigma: 0.5}
  output_tokens: {dist: lognormal, mean: 100, sigma: 0.5}
scheduler: {max_model_len: 8192%s}
"""


def plan(tmp_path: Path, serving: str, scheduler: str = "", extra: str = ""):
    path = tmp_path / "w.yaml"
    path.write_text(f"name: pp\nserving: {{{serving}}}\n" + TRAFFIC % scheduler + extra)
    return plan_simulation(path)


@pytest.mark.parametrize("pool", ["kv_pool_tokens: 20000", "kv_pool_bytes: 8GiB"])
def test_a_given_pool_is_one_gpus_of_its_stage(tmp_path, pool):
    blocks = [plan(tmp_path, f"model: llama3.1-8b, gpu: H100-80GB, engine: vllm==0.33.0, "
                             f"pipeline_parallel_size: {pp}, {pool}").v1.inputs.layout.num_blocks for pp in (1, 2, 4)]
    if "tokens" in pool:  # token slots: the same blocks on every stage, whatever its layers
        assert blocks == [1250, 1250, 1250]
    else:  # bytes per GPU: a stage's GPU holds its share of the 32 layers, so a block takes 1 / pp of the bytes
        assert blocks[1] == 2 * blocks[0] and blocks[2] == 4 * blocks[0]


def test_the_release_and_the_model_runner_set_the_batches_in_flight(tmp_path):
    # 0.33.0 runs every model on the V2 runner: async, pp + 1 batches, decodes pp steps apart
    p = plan(tmp_path, "model: llama3.1-8b, gpu: H100-80GB, engine: vllm==0.33.0, pipeline_parallel_size: 2")
    cfg = p.v1.inputs.scheduler
    assert (cfg.async_scheduling, cfg.batches_in_flight, cfg.decode_stagger) == (True, 3, 2)
    assert any("3 batches in flight, a request's decodes 2 steps apart" in n for n in p.notes)
    assert p.v1.inputs.step_model.stages == 2
    # 0.27.0 runs an MoE model on the V1 runner: async stays on, pp batches, no stagger
    p = plan(tmp_path, "model: qwen3-30b-a3b, gpu: H100-80GB, engine: vllm==0.27.0, pipeline_parallel_size: 3")
    cfg = p.v1.inputs.scheduler
    assert (cfg.async_scheduling, cfg.v2_model_runner, cfg.batches_in_flight, cfg.decode_stagger) == (True, False, 3, 0)
    assert any("async scheduling on the V1 model runner" in n for n in p.notes)
    # asked for the synchronous scheduler: pp batches
    p = plan(tmp_path, "model: llama3.1-8b, gpu: H100-80GB, engine: vllm==0.33.0, pipeline_parallel_size: 2",
             ", async_scheduling: false")
    assert p.v1.inputs.scheduler.batches_in_flight == 2
    assert any("the synchronous scheduler" in n for n in p.notes)


def test_a_constant_step_is_one_stages_time_and_says_so(tmp_path):
    p = plan(tmp_path, "model: llama3.1-8b, engine: vllm==0.33.0, pipeline_parallel_size: 2, kv_pool_tokens: 20000",
             extra="step_time: {model: constant, seconds: 0.02}\n")
    assert p.v1.inputs.step_model.stages == 2
    assert any("step_time.seconds is one stage's time" in n for n in p.notes)


@pytest.mark.parametrize("serving, match", [
    ("model: gemma3-27b, gpu: H100-80GB, engine: vllm==0.33.0, pipeline_parallel_size: 2", "sliding layers"),
    ("model: deepseek-v4-pro, gpu: B200, engine: vllm==0.33.0, tensor_parallel_size: 8, "
     "pipeline_parallel_size: 2", "DeepSeek-V4 under pipeline parallelism"),
    ("model: llama3.1-8b, gpu: H100-80GB, engine: vllm==0.26.0, pipeline_parallel_size: 2", "0.27.0"),
])
def test_what_pipeline_stages_are_not_simulated_for(tmp_path, serving, match):
    with pytest.raises(ConfigError, match=match):
        plan(tmp_path, serving)
