"""kvplan.validate.cuda: the generate() path that the CUDA measurement reads (run here on CPU, its cache's storages
beside the hf engine), the allocator's rounding, and the rows an estimate or a part not measured gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvplan.core.engines import get_engine
from kvplan.core.sizing import size_kv
from kvplan.io.hf_config import spec_from_hf_config
from kvplan.io.models import load_model
from kvplan.validate.cuda import ALLOCATOR_ROUND, allocator_bytes

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "configs"


@pytest.mark.parametrize("nbytes, held", [(1, 512), (512, 512), (513, 1024), (0, 0), (3 * 512, 3 * 512)])
def test_allocator_blocks_round_up_to_512(nbytes, held):
    assert allocator_bytes(nbytes) == held and held % ALLOCATOR_ROUND == 0 and 0 <= held - nbytes < ALLOCATOR_ROUND


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.mark.parametrize("config, batch, prompt_len, seq_len", [
    ("tiny-gemma2.json", 2, 30, 40),  # interleaved sliding windows: the window layers hold their window
    ("tiny-deepseek-v3.json", 2, 20, 26),  # MLA
    ("qwen3-0.6b.json", 1, 5, 9),  # GQA (two of its layers)
])
def test_generate_leaves_seq_len_tokens_and_the_hf_engine_bytes(config, batch, prompt_len, seq_len):
    """generate() never feeds back its last token: the cache holds seq_len tokens after seq_len - prompt_len + 1 new
    ones, and its storages are what the hf engine predicts."""
    from kvplan.validate.cuda import generate_cache
    from kvplan.validate.hf_cache import build_model, cache_storage_bytes
    from kvplan.validate.run import reduced_config

    spec = load_model(str(CONFIGS / config))
    raw = reduced_config(spec.raw_config, 2 if spec.num_layers > 2 else None)
    model = build_model(raw, dtype="float32")
    done = generate_cache(model, batch=batch, prompt_len=prompt_len, seq_len=seq_len)
    assert done.cached_tokens == seq_len
    assert tuple(done.sequences.shape) == (batch, seq_len + 1)
    sub = spec_from_hf_config(raw, name=spec.name, origin=config)
    predicted = size_kv(sub, get_engine("hf"), batch=batch, seq_len=seq_len, kv_dtype="fp32").total_bytes
    assert cache_storage_bytes(done.cache).total_bytes == predicted


def test_generate_needs_a_decode_step():
    from kvplan.validate.cuda import generate_cache

    with pytest.raises(ValueError, match="seq_len must exceed prompt_len"):
        generate_cache(object(), batch=1, prompt_len=8, seq_len=8)


def _row(**kw):
    from kvplan.validate.run import ComponentResult

    base = dict(model="m", batch=1, seq_len=64, dtype="bf16", component="kv_cache", predicted_bytes=100,
                measured_bytes=100, scaled=False, layers=2, device="cuda")
    return ComponentResult(**{**base, **kw})


@pytest.mark.parametrize("row, passes", [
    (dict(predicted_bytes=104, measured_bytes=100), True),  # 4% under a 5% tolerance
    (dict(predicted_bytes=110, measured_bytes=100), False),
    (dict(component="prefill_peak", predicted_bytes=130, measured_bytes=100, band_bytes=30), True),  # in its band
    (dict(component="prefill_peak", predicted_bytes=131, measured_bytes=100, band_bytes=30), False),
    (dict(component="graph_pool", predicted_bytes=0, measured_bytes=0, missing="not captured"), True),
])
def test_a_claim_is_held_to_the_tolerance_and_an_estimate_to_its_band(row, passes):
    assert _row(**row).passes(0.05) is passes


def test_a_part_not_measured_has_no_figures_in_the_json(tmp_path):
    from kvplan.validate.matrix import result_dict, write_report

    missing = _row(component="graph_pool", measured_bytes=0, missing="the decode step was not captured (X: y)")
    estimate = _row(component="prefill_peak", tokens=2048, predicted_bytes=120, measured_bytes=100, band_bytes=30)
    row = result_dict(missing)
    assert row["measured_bytes"] is None and row["error_frac"] is None and row["predicted_bytes"] is None
    assert row["missing"].startswith("the decode step")
    assert result_dict(estimate)["band_bytes"] == 30 and result_dict(estimate)["tokens"] == 2048
    md = write_report(tmp_path, {"name": "H100", "torch": "2", "transformers": "5"}, [missing, estimate], 0.05)
    text = md.read_text()
    assert "| graph_pool | not measured: the decode step" in text and "| prefill_peak (2048 tokens) | 120 |" in text
    assert json.loads((tmp_path / "validation.json").read_text())["cases"][0]["missing"]


def test_the_matrix_reads_prefill_token_counts(tmp_path):
    from kvplan.errors import ConfigError
    from kvplan.validate.matrix import load_matrix

    good = tmp_path / "m.yaml"
    good.write_text("cases:\n  - {model: gpt2, device: cuda, prefill_tokens: [512, 2k]}\n  - {model: gpt2}\n")
    cases = load_matrix(good)
    assert cases[0].prefill_tokens == (512, 2048) and cases[1].prefill_tokens == (512, 2048)
    bad = tmp_path / "bad.yaml"
    bad.write_text("cases:\n  - {model: gpt2, prefill_tokens: [0]}\n")
    with pytest.raises(ConfigError, match="prefill_tokens"):
        load_matrix(bad)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_cuda
@pytest.mark.parametrize("config", ["tiny-gemma2.json", "tiny-deepseek-v3.json"])
def test_on_cuda_the_allocator_holds_what_the_hf_engine_predicts(config):
    """The cache generate() leaves, read from torch's allocator (not its storages): the hf engine's bytes, as the
    tensors asked for them; the blocks handed out are rounded up to 512 bytes each."""
    from kvplan.validate.cuda import generate_kv
    from kvplan.validate.hf_cache import build_model

    spec = load_model(str(CONFIGS / config))
    model = build_model(spec.raw_config, dtype="bfloat16", device="cuda")
    kv = generate_kv(model, batch=4, prompt_len=56, seq_len=64)
    predicted = size_kv(spec, get_engine("hf"), batch=4, seq_len=64, kv_dtype="bf16").total_bytes
    assert kv.cached_tokens == 64 and kv.storage_bytes == predicted and kv.requested_bytes == predicted
    assert predicted <= kv.allocator_bytes < predicted + (1 << 20)


@needs_cuda
def test_on_cuda_a_captured_decode_step_reserves_a_pool():
    from kvplan.validate.cuda import decode_graph_pool, prefill_peak
    from kvplan.validate.hf_cache import build_model

    spec = load_model(str(CONFIGS / "qwen3-0.6b.json"))
    model = build_model(spec.raw_config, dtype="bfloat16", device="cuda")
    assert decode_graph_pool(model, batch=2, prompt_len=32) > 0
    assert prefill_peak(model, batch=1, tokens=512) > 512 * spec.arch.vocab_size * 2  # the logits alone
