"""What the operating system refuses is a user error: one line on stderr and exit 2, never exit 3.

Each path kvplan reads (a model argument, a workload or budgets file, a model, workload or trace named
inside one) is given as: a file in a folder kvplan may not enter (EACCES from stat), a file it may not
open (EACCES from open), a name over 255 bytes, a 5,000-character path, and ``~nosuchuser/...``. The
permission errors are injected (os.stat and os.open raise for one folder), so the test runs as root too,
where chmod refuses nothing.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli import app

runner = CliRunner()
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOCKED = "locked-folder"  # os.stat raises EACCES below it: a folder without search permission
UNREADABLE = "unreadable-file"  # os.open raises EACCES below it: a file without read permission
NO_USER = "~kvplan-no-such-user-19"

SERVING = "serving: {model: MODEL, gpu: A100-40GB, kv_pool_tokens: 4096}\nscheduler: {max_model_len: 2048}\n"
SYNTHETIC = ("requests: {count: 4, arrival: {process: all_at_once}, prompt_tokens: {dist: constant, value: 8}, "
             "output_tokens: {dist: constant, value: 8}}\n")
BUDGET = "budgets:\n  - name: b\n    model: MODEL\n    gpu: H100-80GB\n    require: {max_kv_bytes_per_token: 1MiB}\n"
# what a readable file of each kind holds, so only the refusal can fail the command
CONTENT = {
    "model": (FIXTURES / "configs" / "opt-125m.json").read_text(),
    "workload": SERVING.replace("MODEL", "opt-13b") + SYNTHETIC,
    "budgets": BUDGET.replace("MODEL", "opt-13b"),
    "trace": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n",
}
SUFFIX = {"model": ".json", "workload": ".yaml", "budgets": ".yaml", "trace": ".csv"}

# where a path enters: (the command line, the kind of file the path names, a file naming it at PATH, if any)
POSITIONS = {
    "size MODEL": (["size", "PATH"], "model", None),
    "show MODEL": (["show", "PATH"], "model", None),
    "fit MODEL": (["fit", "PATH", "--gpu", "H100-80GB"], "model", None),
    "simulate WORKLOAD": (["simulate", "PATH"], "workload", None),
    "simulate serving.model": (["simulate", "FILE"], "model", SERVING.replace("MODEL", "PATH") + SYNTHETIC),
    "simulate requests.trace": (["simulate", "FILE"], "trace",
                                SERVING.replace("MODEL", "opt-13b") + "requests: {trace: PATH}\n"),
    "check BUDGETS": (["check", "PATH"], "budgets", None),
    "check budget model": (["check", "FILE"], "model", BUDGET.replace("MODEL", "PATH")),
    "check budget workload": (["check", "FILE"], "workload",
                              "budgets:\n  - name: b\n    workload: PATH\n    require: {max_rejected: 0}\n"),
}
CASES = ("folder-without-permission", "file-without-permission", "name-over-255-bytes", "path-of-5000-chars",
         "no-such-user")


@pytest.fixture
def refusing_os(monkeypatch):
    """os.stat refuses paths below LOCKED, os.open those below UNREADABLE, as a real OS would after chmod."""
    real_stat, real_open = os.stat, os.open

    def stat(path, *args, **kwargs):
        if isinstance(path, (str, os.PathLike)) and f"/{LOCKED}/" in os.fspath(path):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_stat(path, *args, **kwargs)

    def open_(path, *args, **kwargs):
        if isinstance(path, (str, os.PathLike)) and f"/{UNREADABLE}/" in os.fspath(path):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "open", open_)


def _path(tmp_path: Path, case: str, kind: str) -> str:
    suffix = SUFFIX[kind]
    if case == "readable":
        (tmp_path / f"x{suffix}").write_text(CONTENT[kind])
        return str(tmp_path / f"x{suffix}")
    if case == "folder-without-permission":
        folder = tmp_path / LOCKED
        folder.mkdir()
        (folder / f"x{suffix}").write_text(CONTENT[kind])  # there, but stat is refused
        return str(folder / f"x{suffix}")
    if case == "file-without-permission":
        folder = tmp_path / UNREADABLE
        folder.mkdir()
        (folder / f"x{suffix}").write_text(CONTENT[kind])  # stat works, open is refused
        return str(folder / f"x{suffix}")
    if case == "name-over-255-bytes":
        return str(tmp_path / ("n" * 300 + suffix))
    if case == "path-of-5000-chars":
        return str(tmp_path / ("d/" * 2500 + f"x{suffix}"))
    assert case == "no-such-user"
    return f"{NO_USER}/x{suffix}"


def _one_line_exit_2(r) -> None:
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.output and "internal error" not in r.stderr


def _run(tmp_path: Path, position: str, case: str):
    argv, kind, holder = POSITIONS[position]
    path = _path(tmp_path, case, kind)
    holder_file = tmp_path / "holder.yaml"
    if holder is not None:
        holder_file.write_text(holder.replace("PATH", json.dumps(path)))  # a JSON string is a YAML string
    return runner.invoke(app, [{"PATH": path, "FILE": str(holder_file)}.get(a, a) for a in argv])


@pytest.mark.parametrize("position", list(POSITIONS))
def test_each_position_reads_a_readable_file(tmp_path, refusing_os, position):
    """The control: with the same files readable, each command succeeds, so only the refusal fails it."""
    r = _run(tmp_path, position, "readable")
    assert r.exit_code == 0, (r.output, r.exception)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("position", list(POSITIONS))
def test_an_os_refusal_is_one_line_and_exit_2(tmp_path, refusing_os, position, case):
    _one_line_exit_2(_run(tmp_path, position, case))


@pytest.mark.parametrize("case, words", [
    ("folder-without-permission", "permission denied"),
    ("file-without-permission", "permission denied"),
    ("name-over-255-bytes", "305 bytes, over the file system's 255-byte limit"),
    ("path-of-5000-chars", "over this system's 4,096-byte limit"),
    ("no-such-user", "no user named 'kvplan-no-such-user-19'"),
])
def test_the_line_says_what_the_os_refused(tmp_path, refusing_os, case, words):
    r = runner.invoke(app, ["size", _path(tmp_path, case, "model")])
    _one_line_exit_2(r)
    assert words in r.stderr, r.stderr
    assert len(r.stderr) < 400, r.stderr  # a 5,000-character path is shown by its ends


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads through chmod 000")
def test_a_real_folder_without_permission(tmp_path):
    folder = tmp_path / "closed"
    folder.mkdir()
    (folder / "config.json").write_text(CONTENT["model"])
    folder.chmod(0)
    try:
        r = runner.invoke(app, ["size", str(folder / "config.json")])
    finally:
        folder.chmod(0o755)
    _one_line_exit_2(r)
    assert "permission denied" in r.stderr


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HF_HOME"])
def test_a_hub_cache_under_no_such_user(monkeypatch, variable):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv(variable, f"{NO_USER}/hf")
    r = runner.invoke(app, ["size", "someorg/some-model"])
    _one_line_exit_2(r)
    assert variable in r.stderr and "no user named" in r.stderr, r.stderr


# "²" passes str.isdigit but not int(): a block size written with it is an unknown allocator, not a crash
SUPERSCRIPT = "paged-\u00b2"


def test_a_superscript_block_size_on_the_command_line():
    r = runner.invoke(app, ["simulate", "vllm-paper-sharegpt", "--allocator", SUPERSCRIPT])
    _one_line_exit_2(r)
    assert "unknown allocator" in r.stderr


@pytest.mark.parametrize("text", [
    "serving: {{model: opt-13b, gpu: A100-40GB, kv_pool_tokens: 4096}}\nallocators: [{a}]\n",
    "budgets:\n  - name: b\n    workload: vllm-paper-sharegpt\n    allocator: {a}\n    require: {{max_rejected: 0}}\n",
], ids=["workload allocators", "budget allocator"])
def test_a_superscript_block_size_in_a_file(tmp_path, text):
    path = tmp_path / "f.yaml"
    path.write_text(text.format(a=SUPERSCRIPT), encoding="utf-8")
    r = runner.invoke(app, ["check" if text.startswith("budgets") else "simulate", str(path)])
    assert r.exit_code == 2, r.output
    assert "unknown allocator" in r.stderr, r.stderr
    assert "internal error" not in r.stderr


def test_a_superscript_layer_index_in_a_config(tmp_path):
    cfg = {"model_type": "gemma4_text", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
           "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32, "global_head_dim": 64,
           "sliding_window": 16, "vocab_size": 1000, "max_position_embeddings": 4096,
           "layer_types": ["sliding_attention", "full_attention"], "per_layer_config": {"\u00b2": {"head_dim": 8}}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = runner.invoke(app, ["size", str(path), "--json"])
    _one_line_exit_2(r)
    assert "per_layer_config keys must be layer indices below 2" in r.stderr


def test_examples_refuses_a_device_rather_than_read_it_forever():
    r = runner.invoke(app, ["examples", "/dev/zero"])
    assert r.exit_code == 2 and "is a device" in r.stderr, r.output
