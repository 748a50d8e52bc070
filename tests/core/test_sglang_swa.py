"""SGLang windows sliding layers only for the architectures on its hybrid-SWA list
(configs/model_config.py::is_hybrid_swa_model); other models' sliding layers hold every token."""

from __future__ import annotations

import pytest

from kvplan.core.engines import engine_for, get_engine
from kvplan.core.sizing import size_kv
from kvplan.io.hf_config import spec_from_hf_config

_BASE = dict(hidden_size=64, intermediate_size=128, vocab_size=128, max_position_embeddings=4096,
             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16, torch_dtype="bfloat16")


def _spec(model_type: str, arch: str, **extra):
    return spec_from_hf_config(dict(_BASE, model_type=model_type, architectures=[arch], **extra), name="t", origin="t")


@pytest.mark.parametrize("model_type,arch,windowed", [
    ("gemma2", "Gemma2ForCausalLM", False),  # alternating 8-token window / full: SGLang keeps both full length
    ("mistral", "MistralForCausalLM", False),
    ("gpt_oss", "GptOssForCausalLM", True),  # on the list: the SWA pool holds the window
])
def test_sliding_layers_by_architecture(model_type, arch, windowed):
    extra = dict(sliding_window=8)
    if model_type == "gpt_oss":
        extra.update(num_local_experts=2, num_experts_per_tok=1)
    spec = _spec(model_type, arch, **extra)
    seq = 1000
    sglang = size_kv(spec, get_engine("sglang"), batch=1, seq_len=seq).total_bytes
    sliding = sum(1 for x in spec.layers if x.sliding_window)
    # 4 layers x 2 KV heads x (16 + 16) x 2 B = 128 B/token/layer
    per_layer_token = 2 * (16 + 16) * 2
    expected = per_layer_token * ((4 - sliding) * seq + sliding * (8 if windowed else seq))
    assert sliding > 0
    assert sglang == expected
    _, note = engine_for(spec, "sglang")
    assert (note is None) == windowed


def test_text_config_opt_in():
    spec = _spec("mistral", "SomeNewForCausalLM", sliding_window=8, is_hybrid_swa=True)
    assert size_kv(spec, get_engine("sglang"), batch=1, seq_len=100).total_bytes == 4 * 128 * 8
