"""The byte-for-byte check every tests/validate/test_hf_cache*.py runs: kvplan's ``hf`` engine against the cache
transformers really holds after a decode, under the installed transformers' own profile (``hf==<installed>``), on a
tiny random model (torch and transformers imported by the caller's
``importorskip`` first)."""

from __future__ import annotations

import pytest

from kvplan.core.sizing import size_kv
from kvplan.io.hf_config import spec_from_hf_config
from kvplan.validate import installed_hf_engine
from kvplan.validate.hf_cache import build_model, measure_decode

DTYPES = ("float32", "bfloat16")


def build_or_skip(name: str, config: dict) -> tuple[str, dict, dict]:
    """(name, config, {dtype: model}); skips when this transformers cannot build the model type."""
    try:
        return name, config, {dt: build_model(config, dtype=dt) for dt in DTYPES}
    except (ValueError, KeyError, ImportError) as exc:  # a model type this transformers lacks
        pytest.skip(f"{name}: transformers cannot build it here ({exc})")


def assert_hf_equals_measured(tiny: tuple[str, dict, dict], dtype: str, batch: int, prompt_len: int,
                              seq_len: int) -> None:
    """Total bytes, and each layer group's bytes against the measured layers it covers."""
    name, config, models = tiny
    measured = measure_decode(models[dtype], batch=batch, prompt_len=prompt_len, seq_len=seq_len)
    spec = spec_from_hf_config(dict(config, torch_dtype=dtype), name=name, origin=name)
    predicted = size_kv(spec, installed_hf_engine(), batch=batch, seq_len=seq_len)
    assert measured.total_bytes > 0
    assert predicted.total_bytes == measured.total_bytes, (name, measured.per_layer_bytes)
    for group in predicted.groups:
        assert group.total_bytes == sum(measured.per_layer_bytes[i] for i in group.layer_indices), group.description
