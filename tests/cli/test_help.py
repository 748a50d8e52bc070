"""Finding out: every option explains itself, `--version` answers, bare `kvplan` shows help and succeeds."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer.main
from typer.testing import CliRunner

from kvplan import __version__
from kvplan.cli import app

runner = CliRunner()
COMMANDS = typer.main.get_command(app).commands


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_and_argument_has_help(name):
    missing = [p.name for p in COMMANDS[name].params if not (getattr(p, "help", None) or "").strip()]
    assert not missing, f"kvplan {name}: no help for {missing}"
    assert (COMMANDS[name].help or "").strip(), f"kvplan {name} has no docstring"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_page_exits_0(name):
    r = runner.invoke(app, [name, "--help"])
    assert r.exit_code == 0, r.output
    assert "Usage:" in r.stdout


def test_version():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.strip() == f"kvplan {__version__}"


def test_bare_kvplan_prints_help_and_exits_0():
    r = subprocess.run([sys.executable, "-m", "kvplan"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Commands:" in r.stdout and "size" in r.stdout and "Exit codes" in r.stdout
