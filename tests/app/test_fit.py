"""kvplan.app.fit.fit_model: the use case behind `kvplan fit`, called directly."""

from __future__ import annotations

import pytest

from kvplan.app.fit import FitReport, Memory, fit_model
from kvplan.core.units import GiB
from kvplan.errors import InputError


def test_what_fits_has_no_alternatives():
    report = fit_model("llama3.1-8b", gpu="H100-80GB")
    assert isinstance(report, FitReport) and report.fits
    assert report.model == "llama3.1-8b" and report.alternatives == () and report.fewest is None
    assert report.result.engine == "vllm" and report.result.kv_cache_tokens > 0
    assert "no vllm version given" in report.result.notes[0]  # the engine choice's note comes first


def test_one_change_that_fits_is_offered_and_no_gpu_count():
    report = fit_model("llama3.1-8b", gpu="L4", max_model_len=131072)
    assert not report.fits
    fitting = {w.change for w in report.alternatives if w.result is not None and w.result.fits}
    assert "--tensor-parallel-size 2" in fitting
    assert report.fewest is None  # a single change fits: no need to count GPUs


def test_when_no_single_change_fits_the_fewest_gpus_that_do():
    report = fit_model("llama3.1-70b", gpu="L4")
    assert not report.fits and report.alternatives
    assert not any(w.result is not None and w.result.fits for w in report.alternatives)
    few = report.fewest
    assert few is not None and few.result is not None and few.result.fits
    assert few.tp * few.pp > 1 and few.change == f"-tp {few.tp} -pp {few.pp}"


def test_measured_memory_replaces_the_estimates():
    weights = 15 * GiB
    report = fit_model("llama3.1-8b", gpu="H100-80GB", memory=Memory(weights=weights, activation=2 * GiB))
    assert report.result.breakdown.weights == weights and report.result.breakdown.activation == 2 * GiB
    assert "weights" not in report.result.estimated and "activation" not in report.result.estimated


def test_gpus_of_different_memory_plan_with_the_smallest():
    report = fit_model("llama3.1-8b", gpu_memory="24GiB,23GiB", tp=2)
    assert report.result.gpu.memory_bytes == 23 * GiB


def test_auto_fit_is_vllm_s_only():
    assert fit_model("llama3.1-8b", gpu="H100", max_model_len=-1).result.max_model_len > 0
    with pytest.raises(InputError, match="auto-fit"):
        fit_model("llama3.1-8b", gpu="H100", engine="sglang", max_model_len=-1)
