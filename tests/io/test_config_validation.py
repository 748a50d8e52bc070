"""Every config.json field kvplan reads is type-, finiteness- and range-checked with a message naming it."""

from __future__ import annotations

import math

import pytest

from kvplan.errors import ConfigError, InputError
from kvplan.io.hf_config import spec_from_hf_config
from kvplan.io.models import _read_bundled, bundled_index
from kvplan.io.units import parse_size


def bundled(name: str) -> dict:
    import copy

    return copy.deepcopy(_read_bundled(bundled_index()[name].path).config)


def build(cfg: dict):
    return spec_from_hf_config(cfg, name="t", origin="cfg.json")


@pytest.mark.parametrize("model, change, match", [
    ("llama3-8b", {"intermediate_size": "14336"}, r"intermediate_size must be an integer \(got '14336'\)"),
    ("llama3-8b", {"num_hidden_layers": True}, "num_hidden_layers must be an integer"),
    ("llama3-8b", {"num_hidden_layers": 1e9}, "num_hidden_layers must be an integer"),
    ("llama3-8b", {"num_hidden_layers": 10**9}, "num_hidden_layers must be <= 4096"),
    ("llama3-8b", {"num_hidden_layers": 10**6}, "num_hidden_layers must be <= 4096"),
    ("llama3-8b", {"vocab_size": -10**9}, "vocab_size must be >= 1"),
    ("llama3-8b", {"vocab_size": 10**400}, "vocab_size must be <= 16777216"),
    ("llama3-8b", {"hidden_size": math.nan}, "hidden_size must be an integer"),
    ("llama3-8b", {"hidden_size": math.inf}, "hidden_size must be an integer"),
    ("llama3-8b", {"max_position_embeddings": -1}, "max_position_embeddings must be >= 0"),
    ("llama3-8b", {"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
    ("llama3-8b", {"torch_dtype": ["bfloat16"]}, "torch_dtype must be a string"),
    ("llama3-8b", {"model_type": {"a": 1}}, "model_type must be a string"),
    ("llama3-8b", {"text_config": "llama"}, "text_config must be an object"),
    ("llama3-8b", {"text_config": [1, 2]}, "text_config must be an object"),
    ("llama3-8b", {"num_key_value_heads": 5}, r"KV heads \(5\) must divide num_attention_heads \(32\)"),
    ("falcon-7b", {"multi_query": False, "n_head_kv": 5}, r"KV heads \(5\) must divide num_attention_heads \(71\)"),
    ("falcon-40b", {"num_kv_heads": 7}, r"KV heads \(7\) must divide"),
    ("mixtral-8x7b", {"num_experts_per_tok": "8"}, "num_experts_per_tok must be an integer"),
    ("mixtral-8x7b", {"num_experts_per_tok": 9}, r"num_experts_per_tok \(9\) must be <= num_local_experts \(8\)"),
    ("deepseek-v3", {"moe_layer_freq": 0}, "moe_layer_freq must be >= 1"),
    ("qwen3-30b-a3b", {"decoder_sparse_step": 0}, "decoder_sparse_step must be >= 1"),
    ("qwen3-30b-a3b", {"mlp_only_layers": [[1]]}, "mlp_only_layers must be a list of integers"),
    ("llama4-scout", {"interleave_moe_layer_step": 0}, "interleave_moe_layer_step must be >= 1"),
    ("llama4-scout", {"no_rope_layers": [[1]] * 48}, "no_rope_layers must be a list of integers"),
    ("jamba-mini", {"expert_layer_period": 0}, "expert_layer_period must be >= 1"),
    ("jamba-mini", {"attn_layer_period": 0}, "attn_layer_period must be >= 1"),
    ("gemma2-9b", {"layer_types": [["sliding_attention"]] * 42}, r"layer_types\[0\] = \[.*not a layer type"),
    ("gemma3-27b", {"sliding_window_pattern": 0}, "sliding_window_pattern must be >= 1"),
    ("qwen2.5-7b", {"use_sliding_window": "no", "sliding_window": 4096}, "use_sliding_window must be true or false"),
])
def test_bad_field_is_named(model, change, match):
    cfg = bundled(model)
    target = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) and "text_config" not in change else cfg
    target.update(change)
    with pytest.raises(ConfigError, match=match):
        build(cfg)


def test_every_bundled_config_still_loads():
    for name in bundled_index():
        assert build(bundled(name)).num_layers > 0


@pytest.mark.parametrize("text, match", [
    ("9" * 309, "over kvplan's 1 PiB limit"),
    ("999999999999999999999999999999", "over kvplan's 1 PiB limit"),
    ("2000TiB", "over kvplan's 1 PiB limit"),
    (10**30, "over kvplan's 1 PiB limit"),
    ("nan", "expected a size"),
    ("-5GiB", "expected a size"),
])
def test_parse_size_bounds(text, match):
    with pytest.raises(InputError, match=match):
        parse_size(text, what="--gpu-memory")


def test_parse_size_at_the_bound():
    assert parse_size("1024TiB") == 1 << 50
    assert parse_size("80GiB") == 80 << 30
