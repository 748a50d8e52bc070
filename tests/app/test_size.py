"""kvplan.app.size.size_model: the use case behind `kvplan size`, called directly."""

from __future__ import annotations

import json

import pytest

from kvplan.app.size import MeasuredSizeReport, SizeReport, size_model
from kvplan.errors import InputError, UnmodeledError

# transformers' MambaConfig values of state-spaces/mamba-130m (as tests/cli/test_size_measured_cli.py)
MAMBA = {"model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 24, "state_size": 16, "expand": 2,
         "conv_kernel": 4, "vocab_size": 50280, "torch_dtype": "float32"}


def test_a_bundled_model_at_its_max_context():
    report = size_model("llama2-7b", batch=16)
    assert isinstance(report, SizeReport)
    r = report.result
    # 2 (K and V) x 32 layers x 32 KV heads x 128 head_dim x 2 B (fp16)
    assert r.bytes_per_token == 2 * 32 * 32 * 128 * 2 == 524_288
    assert r.seq_len == 4096 and report.seq_len_is_model_max
    assert r.total_bytes == 16 * 4096 * 524_288 == report.ideal.total_bytes
    assert report.engine_version is None and report.engine_notes == () and report.hub is None


def test_a_paged_engine_reports_its_release_block_size_and_the_token_states_beside_it():
    report = size_model("gemma3-27b", batch=8, seq_len=30_001, engine="vllm==0.11.0")
    assert isinstance(report, SizeReport)
    assert report.engine_version == "0.11.0" and report.block_size == 16 and not report.seq_len_is_model_max
    assert "vLLM 0.11.0 rules" in report.rules
    # whole blocks and a window freed in whole blocks only: never less than the token states
    assert report.result.total_bytes > report.ideal.total_bytes
    assert report.notes == (*report.model_notes, *report.engine_notes)


def test_a_length_past_the_model_is_a_note_and_no_version_says_which_rules():
    report = size_model("llama2-7b", seq_len=8192, engine="vllm")
    assert isinstance(report, SizeReport)
    assert any("exceeds the model's max context 4,096" in n for n in report.model_notes)
    assert any("no vllm version given" in n for n in report.engine_notes)


def test_a_bad_engine_is_refused_before_the_model_is_read():
    with pytest.raises(InputError, match="unknown engine 'foo'"):
        size_model("no-such-model", engine="foo")


def test_an_unmodeled_config_is_refused_by_kvplan_s_own_engines(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MAMBA))
    with pytest.raises(UnmodeledError, match="--engine hf"):
        size_model(str(path), engine="vllm", seq_len=64)


def test_hf_measures_an_unmodeled_config_on_the_meta_device(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MAMBA))
    report = size_model(str(path), engine="hf", batch=3, seq_len=64)
    assert isinstance(report, MeasuredSizeReport)
    m = report.measured
    # Mamba-1's state per sequence and layer: conv d_inner x conv_kernel plus ssm d_inner x state_size, in fp32
    assert m.total_bytes == 3 * 24 * (2 * 768) * (4 + 16) * 4
    assert (m.batch, m.seq_len, m.dtype) == (3, 64, "fp32") and not report.seq_len_is_model_max
    assert "measured instead, on the meta device" in report.notes[0]


@pytest.mark.parametrize("flags, named", [({"tp": 2}, "-tp"), ({"kv_cache_dtype": "fp8"}, "--kv-cache-dtype"),
                                          ({"block_size": 16}, "--block-size")])
def test_a_measurement_refuses_what_it_cannot_honour(tmp_path, flags, named):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MAMBA))
    with pytest.raises(InputError, match=named):
        size_model(str(path), engine="hf", seq_len=8, **flags)
