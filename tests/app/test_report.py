"""The one report (kvplan.app.report): a vllm-v1 run's row carries the simulator's memory shares."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.app.report import allocator_rows, simulation_json
from kvplan.app.simulate import plan_simulation, run_simulation
from kvplan.app.simulation import V1

SHARES = ("token_states_frac", "reserved_frac", "internal_frag_frac", "external_frag_frac", "free_frac")


def test_the_v1_row_reports_the_pools_shares(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("serving: {model: llama3.1-8b, kv_pool_tokens: 50000}\n"
                    "step_time: {model: constant, seconds: 0.01}\n"
                    "scheduler: {model: vllm-v1, max_model_len: 8192, max_num_batched_tokens: 2048}\n"
                    "requests: {count: 40, arrival: {process: all_at_once}, prompt_tokens: {dist: constant, "
                    "value: 300}, output_tokens: {dist: constant, value: 200}}\n")
    run = run_simulation(plan_simulation(path))
    assert run.plan.simulator == V1 and run.v1 is not None
    (row,) = allocator_rows(run)
    assert row.allocator == run.v1.allocator == "paged-16"
    assert tuple(getattr(row, f) for f in SHARES) == tuple(getattr(run.v1, f) for f in SHARES)
    assert sum(getattr(row, f) for f in SHARES) == pytest.approx(1.0, abs=1e-12)
    # 40 requests holding 300 + k tokens at their k-th decode step, about 400 each, in 3,124 usable blocks of 16:
    # about 16,000 / 49,984 (less over the six steps that prefill them in chunks of 2,048)
    assert row.token_states_frac == pytest.approx(16_000 / 49_984, abs=0.02)
    doc = simulation_json(run)["allocators"]["paged-16"]
    assert doc["free_frac"] == pytest.approx(row.free_frac)
