"""`--fetch` / `--revision` on the commands that take a MODEL, against a real local HTTP server standing in
for the Hub (tests/hub_server.py): the `fetched` JSON key, the stderr line, exit 2 with one line for every
failure, offline runs from the cache in a fresh process, and no huggingface_hub at `kvplan size` start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from kvplan.cli import app
from tests.hub_server import TINY_LLAMA, TINY_LLAMA_BYTES_PER_TOKEN, serve_hub


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A running stand-in for the Hub (HF_ENDPOINT) and an empty HF_HOME."""
    yield from serve_hub(tmp_path, monkeypatch)


runner = CliRunner()
LOG = "tests/fixtures/vllm_logs/v1_0_21_qwen3_8b_a5000_cg_subtracted.log"


def _json(args: list[str]) -> dict:
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    assert r.stderr == ""  # with --json the fetch is told in the JSON, not on stderr
    return json.loads(r.stdout)


def _kvplan(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvplan", *args], capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, **env})


def test_size_fetch_json_says_what_was_fetched(hub, tmp_path):
    out = _json(["size", "acme/tiny", "--fetch", "--seq-len", "1"])
    repo = hub.repos["acme/tiny"]
    assert out["bytes_per_token"] == TINY_LLAMA_BYTES_PER_TOKEN
    path = tmp_path / "hf-home" / "hub" / "models--acme--tiny" / "snapshots" / repo.commit / "config.json"
    assert out["fetched"] == {"repo_id": "acme/tiny", "revision": "main", "commit": repo.commit, "path": str(path),
                              "size_bytes": len(repo.files["config.json"]), "downloaded": True,
                              "endpoint": hub.url}
    again = _json(["size", "acme/tiny", "--fetch", "--seq-len", "1"])
    assert again["fetched"]["downloaded"] is False and again["fetched"]["commit"] == repo.commit
    cached = _json(["size", "acme/tiny", "--seq-len", "1"])  # no --fetch: the cache, no request
    assert cached["fetched"] is None and any("local Hugging Face cache" in n for n in cached["notes"])
    assert {q.path for q in hub.log} == {"/acme/tiny/resolve/main/config.json"}


def test_size_fetch_text_prints_one_line_on_stderr(hub):
    r = runner.invoke(app, ["size", "acme/tiny", "--fetch", "--seq-len", "1"])
    assert r.exit_code == 0, r.output
    (line,) = r.stderr.splitlines()
    assert line.startswith("fetched acme/tiny config.json (revision main, commit ") and hub.url in line
    assert "acme/tiny" in r.stdout and "B/token" in r.stdout


def test_a_bundled_model_has_fetched_null():
    assert _json(["size", "llama2-7b", "--seq-len", "1"])["fetched"] is None
    assert _json(["show", "llama2-7b"])["fetched"] is None


def test_show_fit_and_explain_take_fetch(hub):
    show = _json(["show", "acme/tiny", "--fetch"])
    assert show["num_layers"] == TINY_LLAMA["num_hidden_layers"] and show["fetched"]["repo_id"] == "acme/tiny"
    fit = runner.invoke(app, ["fit", "acme/tiny", "--gpu", "H100-80GB", "--revision", "main", "--fetch", "--json"])
    assert fit.exit_code == 0, fit.output
    assert json.loads(fit.stdout)["fetched"]["commit"] == hub.repos["acme/tiny"].commit
    explain = _json(["explain", LOG, "--model", "acme/tiny", "--gpu-memory", "24GiB", "--fetch"])
    assert explain["fetched"]["repo_id"] == "acme/tiny"
    assert any("predicted for acme/tiny" in n for n in explain["notes"])


def test_a_budget_file_names_a_hub_id_and_kvplan_fetch_fetches_it(hub, tmp_path, monkeypatch):
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("budgets:\n  - name: tiny\n    model: acme/tiny\n    engine: ideal\n    seq_len: 1\n"
                       f"    require:\n      max_kv_bytes_per_token: {TINY_LLAMA_BYTES_PER_TOKEN}\n")
    r = runner.invoke(app, ["check", str(budgets)])
    assert r.exit_code == 2 and "--fetch" in r.stderr and hub.log == []
    monkeypatch.setenv("KVPLAN_FETCH", "1")
    r = runner.invoke(app, ["check", str(budgets)])
    assert r.exit_code == 0, r.output
    assert {q.path for q in hub.log} == {"/acme/tiny/resolve/main/config.json"}


@pytest.mark.parametrize("args,match", [
    (["size", "acme/nope", "--fetch"], "error: no model repository acme/nope"),
    (["fit", "acme/gated", "--gpu", "H100-80GB", "--fetch"], "error: acme/gated is gated"),
    (["show", "acme/weights-only", "--fetch"], "error: acme/weights-only has no config.json"),
    (["size", "acme/tiny", "--fetch", "--revision", "nope"], "error: acme/tiny has no revision 'nope'"),
    (["explain", LOG, "--model", "acme/nope", "--gpu-memory", "24GiB", "--fetch"], "error: no model repository acme/nope"),
    (["size", "acme/tiny"], "error: unknown model 'acme/tiny': not bundled"),
])
def test_failures_exit_2_with_one_line(hub, args, match):
    hub.add("acme/gated", TINY_LLAMA, gated=True)
    hub.add("acme/weights-only", None, extra={"model.safetensors": b"\0"})
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(match) and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout == ""


def test_a_fresh_process_fetches_then_runs_offline_from_the_cache(hub, tmp_path):
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "0"}
    first = _kvplan("size", "acme/tiny", "--fetch", "--seq-len", "1", "--json", env=env)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["fetched"]["downloaded"] is True
    # huggingface_hub's own telemetry request (GET /api/agent-harnesses) is not made: config.json only
    assert {(q.method, q.path) for q in hub.log} == {("HEAD", "/acme/tiny/resolve/main/config.json"),
                                                     ("GET", "/acme/tiny/resolve/main/config.json")}
    hub.stop()
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    second = _kvplan("size", "acme/tiny", "--seq-len", "1", "--json", env=offline)
    assert second.returncode == 0, second.stderr
    out = json.loads(second.stdout)
    assert out["bytes_per_token"] == TINY_LLAMA_BYTES_PER_TOKEN and out["fetched"] is None
    missing = _kvplan("size", "acme/other", "--fetch", env=offline)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().splitlines() == [missing.stderr.strip()]
    assert "HF_HUB_OFFLINE is set" in missing.stderr


def test_kvplan_size_of_a_bundled_model_does_not_import_huggingface_hub():
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "kvplan", "size", "llama2-7b"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    imported = [line for line in r.stderr.splitlines() if "huggingface" in line.lower()]
    assert imported == []


@pytest.mark.parametrize("command", ["size", "fit", "show", "explain", "validate"])
def test_every_command_taking_a_model_has_fetch_and_revision(command):
    r = runner.invoke(app, [command, "--help"])
    assert r.exit_code == 0 and "--fetch" in r.stdout and "--revision" in r.stdout
