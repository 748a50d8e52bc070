"""Exit codes a CI script can trust: 1 is only ever a verdict; a bug is 3; a closed pipe is 141, quietly."""

from __future__ import annotations

import os
import subprocess
import sys

from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.cli.root import EXIT_BROKEN_PIPE, EXIT_INTERNAL

runner = CliRunner()


def _boom(*args, **kwargs):
    raise RuntimeError("simulated bug")


def test_an_unexpected_exception_exits_3_not_1(monkeypatch):
    monkeypatch.setattr("kvplan.app.size.size_kv", _boom)
    r = runner.invoke(app, ["size", "llama2-7b"])
    assert r.exit_code == EXIT_INTERNAL == 3, r.output
    assert "internal error: RuntimeError: simulated bug" in r.stderr
    assert "Traceback" not in r.output


def test_debug_shows_the_traceback_and_keeps_the_exit_code(monkeypatch):
    monkeypatch.setattr("kvplan.app.size.size_kv", _boom)
    r = runner.invoke(app, ["--debug", "size", "llama2-7b"])
    assert r.exit_code == EXIT_INTERNAL, r.output
    assert "Traceback" in r.stderr and "simulated bug" in r.stderr


def test_debug_keeps_the_exit_code_of_a_user_error():
    r = runner.invoke(app, ["--debug", "size", "no-such-model-xyz"])
    assert r.exit_code == 2, r.output
    assert "unknown model" in r.stderr


def _closed_pipe_run(args: list[str]) -> subprocess.CompletedProcess:
    read, write = os.pipe()
    os.close(read)  # nobody will read: the first write fails with EPIPE
    try:
        return subprocess.run([sys.executable, "-m", "kvplan", *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    finally:
        os.close(write)


def test_a_closed_pipe_exits_141_quietly():
    for args in (["models"], ["size", "llama2-7b", "--json"], ["fit", "llama3.1-70b", "--gpu", "L4"]):
        r = _closed_pipe_run(args)
        assert r.returncode == EXIT_BROKEN_PIPE == 141, (args, r.stderr)
        assert r.stderr == "", (args, r.stderr)
