"""`kvplan size --engine hf` on an architecture kvplan does not model: transformers' own cache, measured on the meta
device; every other engine refuses it with the reason, in one line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvplan.cli import app  # noqa: E402

runner = CliRunner()

# transformers' MambaConfig values of state-spaces/mamba-130m: hidden 768, 24 layers, d_inner 2 x 768, conv 4, state 16
MAMBA = {"model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 24, "state_size": 16, "expand": 2,
         "conv_kernel": 4, "vocab_size": 50280, "torch_dtype": "float32"}
LLAMA = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 512,
         "torch_dtype": "bfloat16"}


def write(tmp_path, config: dict, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def test_hf_measures_an_architecture_kvplan_does_not_model(tmp_path):
    r = runner.invoke(app, ["size", write(tmp_path, MAMBA), "--engine", "hf", "--batch", "3", "--seq-len", "64",
                            "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["measured"] is True and out["engine"] == "hf" and out["kv_cache_dtype"] == "fp32"
    # Mamba-1's state per sequence and layer: conv d_inner x conv_kernel plus ssm d_inner x state_size, in fp32
    d_inner = 2 * 768
    assert out["total_bytes"] == 3 * 24 * d_inner * (4 + 16) * 4
    assert out["bytes_per_sequence"] == out["total_bytes"] // 3
    assert [(g["count"], g["layer_indices"][0]) for g in out["layers"]] == [(24, 0)]
    assert any("model_type 'mamba'" in n and "measured instead, on the meta device" in n for n in out["notes"])


def test_the_measured_text_output_says_so(tmp_path):
    r = runner.invoke(app, ["size", write(tmp_path, MAMBA), "--engine", "hf", "--seq-len", "16"])
    assert r.exit_code == 0, r.output
    assert "measured, transformers" in r.stdout and "total (1 GPU)" in r.stdout


@pytest.mark.parametrize("engine", ["ideal", "vllm", "sglang", "trtllm"])
def test_other_engines_refuse_it_with_the_reason(tmp_path, engine):
    r = runner.invoke(app, ["size", write(tmp_path, MAMBA), "--engine", engine, "--seq-len", "64"])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "kvplan does not model model_type 'mamba'" in lines[0] and "--engine hf" in lines[0]


def test_fit_refuses_it_too(tmp_path):
    r = runner.invoke(app, ["fit", write(tmp_path, MAMBA), "--gpu", "H100-80GB"])
    assert r.exit_code == 2 and "kvplan does not model" in r.stderr


def test_a_config_transformers_cannot_run_on_meta_is_refused_with_both_reasons(tmp_path):
    bart = {"model_type": "bart", "d_model": 64, "encoder_layers": 1, "decoder_layers": 1,
            "encoder_attention_heads": 2, "decoder_attention_heads": 2, "vocab_size": 100,
            "max_position_embeddings": 64}
    r = runner.invoke(app, ["size", write(tmp_path, bart), "--engine", "hf", "--seq-len", "8"])
    assert r.exit_code == 2, r.output
    line = r.stderr.strip()
    assert "\n" not in line and "cannot run this config on the meta device" in line and "encoder-decoder" in line


@pytest.mark.parametrize("flag", [["-tp", "2"], ["--kv-cache-dtype", "fp8"], ["--block-size", "16"]])
def test_a_measurement_takes_no_parallelism_or_other_format(tmp_path, flag):
    r = runner.invoke(app, ["size", write(tmp_path, MAMBA), "--engine", "hf", "--seq-len", "8", *flag])
    assert r.exit_code == 2 and flag[0] in r.stderr, r.output


def test_no_context_in_the_config_asks_for_seq_len(tmp_path):
    r = runner.invoke(app, ["size", write(tmp_path, MAMBA), "--engine", "hf"])
    assert r.exit_code == 2 and "--seq-len" in r.stderr, r.output


def test_a_forward_past_the_time_limit_is_stopped_and_said(tmp_path, monkeypatch):
    """Mamba's torch scan loops over tokens: 200,000 of them run past a 1-second limit."""
    monkeypatch.setenv("KVPLAN_MEASURE_SECONDS", "1")
    r = runner.invoke(app, ["size", write(tmp_path, MAMBA), "--engine", "hf", "--seq-len", "200000"])
    assert r.exit_code == 2, r.output
    assert "ran past 1 s on the meta device at 200,000 tokens" in r.stderr


def test_an_unchecked_model_type_is_sized_with_a_note(tmp_path):
    """A model type kvplan has not checked, but whose config holds plain decoder attention: sized, and said so."""
    r = runner.invoke(app, ["size", write(tmp_path, dict(LLAMA, model_type="my_llama")), "--seq-len", "10", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["total_bytes"] == 2 * 2 * 2 * 64 * 10 * 2  # 2 layers x K and V x 2 heads x 64 x 10 tokens x bf16
    assert any("'my_llama' is not one kvplan has checked" in n for n in out["notes"])
