"""`check`'s simulation limits measure exactly what `simulate` reports: the same plan (simulator, pool, requests)
and the same run, for every bundled workload, whichever simulator it takes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.io.models import configs_dir

runner = CliRunner()
WORKLOADS = sorted(p.stem for p in (configs_dir() / "workloads").glob("*.yaml"))
BIG = 10**12


def _json(*args: str) -> dict:
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


def test_every_bundled_workload_is_here():
    assert len(WORKLOADS) >= 4 and "llama3.1-8b-multiturn-chat" in WORKLOADS


@pytest.mark.parametrize("workload", WORKLOADS)
def test_a_budget_measures_what_simulate_reports(tmp_path, workload):
    simulated = _json("simulate", workload)
    allocator, row = next(iter(simulated["allocators"].items()))
    assert row["completed"] > 0  # the run measured something (a budget of 0 completed was the bug)
    require = {"max_preemptions": BIG, "max_rejected": BIG, "min_completed": 0}
    if row["token_states_frac"] is not None:
        require["min_token_states_frac"] = 0
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(json.dumps({"budgets": [{"name": "b", "workload": workload, "allocator": allocator,
                                                "require": require}]}))
    checked = {r["limit"]: r["value"] for r in _json("check", str(budgets))["results"]}
    assert checked["min_completed"] == row["completed"]
    assert checked["max_preemptions"] == row["preemptions"]
    assert checked["max_rejected"] == row["rejected"]
    if "min_token_states_frac" in require:
        assert checked["min_token_states_frac"] == pytest.approx(row["token_states_frac"], abs=1e-6)
