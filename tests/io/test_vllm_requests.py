"""Request sets for the vLLM v1 scheduler simulator: the schema (unknown keys rejected) and the pool they plan."""

from __future__ import annotations

import json

import pytest

from kvplan.core.sim.v1 import FULL, MAMBA, SLIDING, simulate_v1
from kvplan.errors import ConfigError, InputError
from kvplan.io.vllm_requests import read_request_set

BASE = {"name": "t", "model": "opt-13b", "num_gpu_blocks": 983,
        "scheduler": {"block_size": 16, "max_num_seqs": 256, "max_num_batched_tokens": 2048, "max_model_len": 8192},
        "requests": [{"id": "0", "arrival_step": 0, "prompt": [[1, 3000]], "output": [2, 10]}]}


def write(tmp_path, data):
    p = tmp_path / "t.requests.json"
    p.write_text(json.dumps(data))
    return p


def test_opt_13b_pool_is_one_full_group_of_16_token_blocks(tmp_path):
    inputs = read_request_set(write(tmp_path, BASE))
    (g,) = inputs.layout.groups
    assert (g.kind, g.block_size, g.num_layers, inputs.layout.num_blocks) == (FULL, 16, 40, 983)
    # OPT-13B (config.json: hidden_size 5120, 40 layers, fp16): K and V of 5120 values a token and layer,
    # 16 tokens a block, 40 layers: 2 * 5120 * 2 B * 16 * 40
    assert inputs.layout.block_bytes == 2 * 5120 * 2 * 16 * 40
    assert simulate_v1(inputs).per_step_scheduled_tokens[:2] == (2048, 952)


def test_sliding_and_hybrid_models_get_vllms_groups(tmp_path):
    gemma = read_request_set(write(tmp_path, {**BASE, "model": "gemma2-9b"}))
    assert sorted(g.kind for g in gemma.layout.groups) == [FULL, SLIDING]
    assert {g.window for g in gemma.layout.groups if g.kind == SLIDING} == {4096}  # config.json sliding_window
    jamba = read_request_set(write(tmp_path, {**BASE, "model": "jamba-mini"}))
    assert MAMBA in {g.kind for g in jamba.layout.groups}


@pytest.mark.parametrize("change, match", [
    ({"surprise": 1}, "surprise"),
    ({"scheduler": {**BASE["scheduler"], "max_num_partial_prefills": 2}}, "max_num_partial_prefills"),
    ({"model_config": {"model_type": "opt"}}, "exactly one of model"),
    ({"requests": [{"id": "0", "prompt": [[1, 0]], "output": [2, 1]}]}, "at least one token"),
    ({"requests": [{"id": "0", "prompt": [[1, 5]], "output": [2, 1]}] * 2}, "unique"),
    ({"num_gpu_blocks": 1}, "num_gpu_blocks"),
])
def test_bad_request_sets_are_refused(tmp_path, change, match):
    with pytest.raises(ConfigError, match=match):
        read_request_set(write(tmp_path, {**BASE, **change}))


def test_prefix_caching_on_a_linear_attention_hybrid_is_refused_with_a_reason(tmp_path):
    data = {**BASE, "model": "jamba-mini", "scheduler": {**BASE["scheduler"], "enable_prefix_caching": True}}
    with pytest.raises(InputError, match="align"):
        simulate_v1(read_request_set(write(tmp_path, data)))
