"""docs/budgets.md's annotated budget file runs as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

from typer.testing import CliRunner

from kvplan.cli import app

DOC = Path(__file__).resolve().parents[2] / "docs" / "budgets.md"


def test_the_annotated_budget_file_runs_as_written(tmp_path):
    block = re.search(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S).group(1)
    path = tmp_path / "budgets.yaml"
    path.write_text(block, encoding="utf-8")
    r = CliRunner().invoke(app, ["check", str(path), "--json"])
    assert r.exit_code in (0, 1), r.output  # a verdict, not an invalid file
    limits = {(x["budget"], x["limit"]) for x in json.loads(r.stdout)["results"]}
    named = set(re.findall(r"^      (\w+):", block, re.M))  # every limit the file names (uncommented)
    assert {limit for _, limit in limits} == named
    assert ("chat-traffic", "min_token_states_frac") in limits
