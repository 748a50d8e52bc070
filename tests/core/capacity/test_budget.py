"""The budget skeleton: every engine's fit takes the same shared steps (kvplan/core/capacity/budget.py)."""

from __future__ import annotations

import dataclasses

import pytest

from kvplan.core.capacity.common import FitRequest
from kvplan.core.capacity.fit import FITTERS, fit
from kvplan.core.gpus import GPUSpec
from kvplan.errors import ConfigError
from kvplan.io.models import load_model

GiB = 1 << 30
MiB = 1 << 20
GPU80 = GPUSpec(name="test-80", memory_bytes=80 * GiB)
ENGINES = sorted(FITTERS)


def measured(engine: str, **kw) -> FitRequest:
    base = {"spec": load_model("llama3-8b"), "gpu": GPU80, "engine": engine, "weights_memory": 15 * GiB,
            "activation_memory": 2 * GiB, "non_torch_memory": 300 * MiB, "cuda_graph_memory": GiB // 2,
            "kv_cache_memory_bytes": 20 * GiB, "max_model_len": 8192}
    base.update(kw)
    return FitRequest(**base)


@pytest.mark.parametrize("engine", ENGINES)
def test_measured_figures_pass_through_every_engine(engine):
    # Every figure given: nothing is estimated, the breakdown shows the measured figures and the given KV
    # memory, and the rest of the GPU is unused.
    r = fit(measured(engine))
    assert r.engine == engine and r.estimated == () and r.fits, r.reasons
    b = r.breakdown
    assert (b.weights, b.activation, b.non_torch, b.cuda_graph, b.kv_cache) == (
        15 * GiB, 2 * GiB, 300 * MiB, GiB // 2, 20 * GiB)
    assert r.kv_cache_memory_bytes == 20 * GiB
    assert sum(b.as_dict().values()) == GPU80.memory_bytes


@pytest.mark.parametrize("engine", ENGINES)
def test_unmeasured_components_are_marked_estimated(engine):
    r = fit(measured(engine, activation_memory=None, non_torch_memory=None))
    assert {"activation", "non_torch"} <= set(r.estimated) and "weights" not in r.estimated
    assert r.breakdown.activation > 0 and r.breakdown.non_torch > 0


@pytest.mark.parametrize("engine", ENGINES)
def test_concurrency_asked_for_is_checked_by_every_engine(engine):
    ok = fit(measured(engine))
    r = fit(measured(engine, concurrency=int(ok.max_concurrency) + 1))
    assert not r.fits and "concurrent requests" in r.reasons[0]
    assert fit(measured(engine, concurrency=max(1, int(ok.max_concurrency)))).fits


@pytest.mark.parametrize("engine", ENGINES)
def test_no_context_is_the_same_error_for_every_engine(engine):
    spec = load_model("llama3-8b")
    with pytest.raises(ConfigError, match="no maximum context"):
        fit(measured(engine, spec=dataclasses.replace(spec, max_model_len=0), max_model_len=None))
