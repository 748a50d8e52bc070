"""An unknown or ambiguous --gpu or model name: one line, exit 2, the names it starts first."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from kvplan.cli import app

runner = CliRunner()


def _offered(r) -> list[str]:
    assert r.exit_code == 2, (r.output, r.exception)
    [line] = r.stderr.strip().splitlines()
    m = re.search(r"did you mean (.*?)\?", line)
    assert m, line
    return m.group(1).split(", ")


@pytest.mark.parametrize("typed", ["A100", "a100", "A100-"])
def test_gpu_a100_offers_both_a100s_first(typed):
    offered = _offered(runner.invoke(app, ["fit", "llama3.1-8b", "--gpu", typed]))
    assert offered[:3] == ["A100-40GB", "A100-80GB", "A100-80GB-PCIe"], offered  # A10 only after them


def test_gpu_rtx_offers_every_rtx():
    assert _offered(runner.invoke(app, ["fit", "llama3.1-8b", "--gpu", "RTX"])) == ["RTX-3090", "RTX-4090",
                                                                                    "RTX-5090"]


def test_a_model_prefix_offers_every_size():
    offered = _offered(runner.invoke(app, ["size", "llama3.1"]))
    assert offered[:3] == ["llama3.1-8b", "llama3.1-70b", "llama3.1-405b"], offered
