"""Malformed inputs are one clear line on stderr and exit 2: never a traceback, a crash or a hang.

(a) runs every file-reading command as a subprocess, so a segfault (libyaml on deep nesting) or a
hang (opening a FIFO) is caught by the exit status and the timeout; (b) fuzzes configs and flags
through CliRunner with hypothesis: exit 0, 1 or 2, never 3 (kvplan's "this is a bug").
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.io.models import _read_bundled, bundled_index
from tests.factories import alias_bomb

ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 20


BAD_FILES = {
    "fifo": None,
    "dev-zero": "/dev/zero",
    "alias-bomb.yaml": alias_bomb(),
    "deep.yaml": "[" * 50_000 + "]" * 50_000,
    "deep.json": "[" * 50_000 + "]" * 50_000,
    "non-utf8.yaml": b"name: x\n\xff\xfe\x00\x01 binary\n",
}

COMMANDS = {
    "size": ["size", "{f}"],
    "show": ["show", "{f}"],
    "fit": ["fit", "{f}", "--gpu", "H100"],
    "simulate": ["simulate", "{f}"],
    "check": ["check", "{f}"],
    "explain": ["explain", "{f}"],
    "check --baseline": ["check", "example", "--baseline", "{f}"],
    "validate --matrix": ["validate", "--matrix", "{f}"],
}


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    for name, content in BAD_FILES.items():
        if name == "fifo":
            os.mkfifo(d / name)
        elif isinstance(content, bytes):
            (d / name).write_bytes(content)
        elif content is not None and not content.startswith("/dev/"):
            (d / name).write_text(content)
    return d


def _path(bad_dir: Path, name: str) -> str:
    content = BAD_FILES[name]
    return content if isinstance(content, str) and content.startswith("/dev/") else str(bad_dir / name)


@pytest.mark.parametrize("name", list(BAD_FILES))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_bad_file_is_one_line_exit_2(bad_dir, command, name):
    if name == "dev-zero" and not os.path.exists("/dev/zero"):
        pytest.skip("needs /dev/zero")
    args = [a.format(f=_path(bad_dir, name)) for a in COMMANDS[command]]
    r = subprocess.run([sys.executable, "-m", "kvplan", *args], capture_output=True, text=True,
                       timeout=HANG_GUARD_S, cwd=ROOT)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]


def test_explain_does_not_block_on_a_fifo_named_as_the_model(tmp_path):
    fifo = tmp_path / "model.json"
    os.mkfifo(fifo)
    log = tmp_path / "vllm.log"
    log.write_text(f"Initializing a V1 LLM engine (v0.9.1) with config: model='{fifo}', dtype=torch.bfloat16\n"
                   "Available KV cache memory: 62.5 GiB\n")
    r = subprocess.run([sys.executable, "-m", "kvplan", "explain", str(log), "--gpu", "H100", "--json"],
                       capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=ROOT)
    assert r.returncode in (0, 1), r.stderr
    assert "named pipe" in r.stdout  # the prediction is skipped with the reason


# -- (b) property-based fuzz ----------------------------------------------------------------------
runner = CliRunner()
BUNDLED = sorted(bundled_index())

bad_values = st.one_of(
    st.text(max_size=8), st.sampled_from(["14336", "1e9", "", "nan"]),
    st.just(math.nan), st.just(math.inf), st.just(-math.inf),
    st.integers(min_value=-(10**12), max_value=0), st.sampled_from([10**6, 10**9, 10**30, 2**63, 10**400]),
    st.integers(min_value=1, max_value=10**5),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.lists(st.integers(min_value=-3, max_value=3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.none(), st.booleans(),
)


def _config(name: str) -> dict:
    return copy.deepcopy(_read_bundled(bundled_index()[name].path).config)


def _keys(cfg: dict) -> list[tuple[str, ...]]:
    out = [(k,) for k in cfg]
    if isinstance(cfg.get("text_config"), dict):
        out += [("text_config", k) for k in cfg["text_config"]]
    return sorted(out)


def _assert_no_bug(r, args) -> None:
    assert r.exit_code in (0, 1, 2), (args, r.exit_code, r.output[-2000:], r.exception)
    assert "Traceback" not in r.output


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_configs_never_crash(tmp_path, data):
    name = data.draw(st.sampled_from(BUNDLED), label="model")
    cfg = _config(name)
    for _ in range(data.draw(st.integers(1, 2), label="mutations")):
        path = data.draw(st.sampled_from(_keys(cfg)), label="key")
        target = cfg if len(path) == 1 else cfg[path[0]]
        if not isinstance(target, dict):
            continue
        target[path[-1]] = data.draw(bad_values, label="value")
    file = tmp_path / "config.json"
    try:
        file.write_text(json.dumps(cfg))  # NaN/Infinity written as JSON's extension, which json.loads reads
    except (ValueError, OverflowError):
        return
    for args in (["size", str(file), "--json"], ["show", str(file), "--json"], ["fit", str(file), "--gpu", "H100", "--json"]):
        _assert_no_bug(runner.invoke(app, args), args)


small_ints = st.one_of(st.integers(-5, 5), st.sampled_from([0, 1, 3, 7, 16, 4096, 10**6, 10**9, 2**63, 10**30]))
size_text = st.one_of(st.sampled_from(["24GiB", "0", "1", "-1GiB", "1e9", "nan", "inf", "9" * 309, "999TiB",
                                       "0.5GiB", "80 GB", "GiB", ""]), st.text(max_size=6))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(["llama3-8b", "deepseek-v3", "gemma3-27b", "qwen3-next-80b-a3b", "jamba-mini"]),
       tp=small_ints, pp=small_ints, block=small_ints, seq=small_ints, batch=small_ints,
       gpu_memory=size_text, util=st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                                            st.sampled_from([0.0, 0.9, 1.0, 1.5, -0.1])))
def test_fuzzed_flags_never_crash(model, tp, pp, block, seq, batch, gpu_memory, util):
    runs = [
        ["size", model, "-tp", str(tp), "-pp", str(pp), "--block-size", str(block), "--seq-len", str(seq),
         "--batch", str(batch), "--json"],
        ["fit", model, "--gpu-memory", gpu_memory, "-tp", str(tp), "--json"],
        ["fit", model, "--gpu", "H100", "--gpu-memory-utilization", str(util), "-pp", str(pp),
         "--max-model-len", str(seq), "--block-size", str(block), "--json"],
    ]
    for args in runs:
        _assert_no_bug(runner.invoke(app, args), args)
