"""A max_model_len longer than the model's: each engine's own limit and what it does past it
(kvplan.core.capacity.context; the rules' sources are in the engines' modules and docs/engines.md)."""

from __future__ import annotations

import pytest

from kvplan.core.capacity.context import ContextLimit, decide
from kvplan.core.engines.sglang.budget import sglang_context_limit
from kvplan.core.engines.trtllm.budget import trtllm_context_limit
from kvplan.core.engines.vllm.budget import vllm_context_limit

LLAMA31 = {"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
YARN_SCALED = {"max_position_embeddings": 163840,  # DeepSeek-V3: positions already scaled
               "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096}}
YARN_ADDED = {"max_position_embeddings": 32768,  # Qwen2.5's model card: YaRN added over the native 32,768
              "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
LINEAR = {"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}}


@pytest.mark.parametrize(("context", "tokens", "source"), [
    ({"max_position_embeddings": 131072}, 131072, "max_position_embeddings"),
    (LLAMA31, 131072, "max_position_embeddings"),
    ({"max_position_embeddings": 32768, "seq_length": 8192}, 8192, "seq_length"),  # the smallest key
    ({"max_position_embeddings": 4096, "model_max_length": 8192}, 8192, "model_max_length"),  # Command-R
    (YARN_SCALED, 163840, "max_position_embeddings"),  # 0.6.2's 4,096 x 40 and 0.33's unscaled agree
    (YARN_ADDED, 0, "RoPE yarn factor 4: releases differ in applying it"),  # 0.6.2 131,072, 0.33 32,768
    (LINEAR, 0, "RoPE linear factor 4: releases differ in applying it"),  # 0.33 skips Gemma 3's only
    ({"max_position_embeddings": 8192, "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0},
                                                           "sliding_attention": {"rope_type": "default"}}},
     0, "per-layer RoPE factors"),
])
def test_vllm_derives_the_smallest_length_key(context, tokens, source):
    limit = vllm_context_limit(context)
    assert limit is not None and (limit.max_model_len, limit.source) == (tokens, source)
    assert limit.override == "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" and not limit.clamps


@pytest.mark.parametrize(("context", "tokens"), [
    ({"max_position_embeddings": 32768, "seq_length": 8192}, 8192),  # the first key in SGLang's order
    (LLAMA31, 131072),
    ({**LLAMA31, "rope_scaling": {"type": "llama3", "factor": 8.0}}, 131072),  # transformers adds rope_type
    (YARN_SCALED, 163840),  # original_max_position_embeddings named: no factor
    (LINEAR, 16384),
    ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}, 1048576),  # Gemma 3
])
def test_sglang_multiplies_the_first_key_by_the_rope_factor(context, tokens):
    limit = sglang_context_limit(context)
    assert limit is not None and limit.max_model_len == tokens
    assert limit.override == "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" and not limit.clamps


def test_sglang_cannot_tell_a_factor_only_in_rope_parameters():
    limit = sglang_context_limit({"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "linear",
                                                                                      "factor": 2.0}})
    assert limit is not None and limit.max_model_len == 0


@pytest.mark.parametrize(("context", "raw", "tokens"), [
    (LLAMA31, {}, 131072),
    (YARN_ADDED, {}, 32768),  # yarn: not scaled
    ({"max_position_embeddings": 4097, "rope_scaling": {"type": "dynamic", "factor": 1.5}}, {}, 6146),  # ceil
    ({"max_position_embeddings": 131072}, {"text_config": {}}, 0),  # a multimodal model class decides
])
def test_trtllm_lowers_to_max_position_embeddings_times_the_factor(context, raw, tokens):
    limit = trtllm_context_limit(context, raw)
    assert limit is not None and limit.max_model_len == tokens and limit.clamps
    assert limit.override == "TLLM_ALLOW_LONG_MAX_MODEL_LEN=1"


def test_no_length_key_no_limit():
    assert vllm_context_limit({}) is None and sglang_context_limit({"n_positions": 0}) is None
    assert trtllm_context_limit({"seq_length": 2048}, {}) is None


REFUSES = ContextLimit(engine="vLLM", max_model_len=131072, source="max_position_embeddings",
                       override="VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
CLAMPS = ContextLimit(engine="TensorRT-LLM", max_model_len=131072, source="max_position_embeddings",
                      override="TLLM_ALLOW_LONG_MAX_MODEL_LEN=1", clamps=True)


def test_a_longer_length_is_refused_with_the_variable_and_the_limit():
    d = decide(REFUSES, asked=200000, default=131072, allow=False, model_positions=131072)
    assert d.exceeded and d.max_model_len == 200000 and not d.note
    assert "does not start" in d.reason and "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in d.reason
    assert "131,072" in d.reason and "--max-model-len 131072" in d.reason


def test_the_override_flag_starts_it():
    d = decide(REFUSES, asked=200000, default=131072, allow=True, model_positions=131072)
    assert d.exceeded and d.max_model_len == 200000 and not d.reason and "is set where it runs" in d.note


def test_trtllm_starts_with_its_own_limit():
    d = decide(CLAMPS, asked=200000, default=131072, allow=False, model_positions=131072)
    assert d.max_model_len == 131072 and not d.reason and "not 200000" in d.note
    d = decide(CLAMPS, asked=200000, default=131072, allow=True, model_positions=131072)
    assert d.max_model_len == 200000 and not d.reason


@pytest.mark.parametrize("asked", [None, 4096, 131072])
def test_within_the_limit_nothing_is_said(asked):
    d = decide(REFUSES, asked=asked, default=131072, allow=False, model_positions=131072)
    assert d == type(d)(max_model_len=asked or 131072)


def test_the_default_is_the_engines_when_it_is_shorter():
    limit = vllm_context_limit({"max_position_embeddings": 32768, "seq_length": 8192})
    d = decide(limit, asked=None, default=32768, allow=False, model_positions=32768)
    assert d.max_model_len == 8192 and "seq_length" in d.note and not d.reason


def test_an_underivable_limit_keeps_a_note():
    limit = vllm_context_limit(LINEAR)
    d = decide(limit, asked=20000, default=4096, allow=False, model_positions=4096)
    assert not d.reason and d.max_model_len == 20000 and "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in d.note
