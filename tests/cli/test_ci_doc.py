"""docs/ci.md's workflow: what main uploads is what a pull request downloads and passes to --baseline.

The steps' shell scripts are run as the runner runs them (``bash -e -o pipefail``) with stand-ins for
``gh`` and ``kvplan`` on PATH, for the first run (no artifact yet) and a later one.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

DOC = Path(__file__).resolve().parents[2] / "docs" / "ci.md"


def workflow() -> dict:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    (block,) = [b for b in blocks if "jobs:" in b]
    data = yaml.safe_load(block)
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    data["_file"] = re.search(r"#\s*\.github/workflows/(\S+)", block).group(1)
    return data


WF = workflow()
STEPS = WF["jobs"]["kvplan"]["steps"]


def step(predicate) -> dict:
    (found,) = [s for s in STEPS if predicate(s)]
    return found


INSTALL = step(lambda s: "pip install" in s.get("run", ""))
UPLOAD = step(lambda s: str(s.get("uses", "")).startswith("actions/upload-artifact@"))
FETCH = step(lambda s: "gh run download" in s.get("run", ""))
CHECK = step(lambda s: "kvplan check" in s.get("run", ""))


def flag(script: str, name: str) -> str:
    lexer = shlex.shlex(script.replace("\\\n", " "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = list(lexer)
    return words[words.index(name) + 1]


def test_runs_on_main_and_pull_requests_with_read_access_to_actions():
    assert WF["on"]["push"]["branches"] == ["main"] and "pull_request" in WF["on"]
    assert WF["permissions"]["actions"] == "read"
    assert FETCH["env"]["GH_TOKEN"] == "${{ github.token }}"
    assert "pull_request" in FETCH["if"] and "push" in UPLOAD["if"] and "always()" in UPLOAD["if"]


def test_the_artifact_written_on_main_is_the_one_read_in_pull_requests():
    script = FETCH["run"]
    assert flag(script, "--name") == UPLOAD["with"]["name"]
    assert flag(script, "--workflow") == WF["_file"]
    assert flag(script, "--branch") == "main" and flag(script, "--event") == "push"
    downloaded = f"{flag(script, '--dir')}/{Path(UPLOAD['with']['path']).name}"
    assert f"--baseline {downloaded}" in CHECK["run"] and f"[ -f {downloaded} ]" in CHECK["run"]


def test_json_output_is_the_uploaded_file():
    line = next(x for x in CHECK["run"].splitlines() if "kvplan check" in x)
    assert "--json" in line
    assert line.rstrip().endswith(f"> {UPLOAD['with']['path']}")


def run_step(script: str, tmp_path: Path, gh: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in (("gh", gh), ("kvplan", 'echo "$@" > kvplan-args; echo "{}"'),
                       ("pip", 'for a in "$@"; do echo "$a"; done > pip-args')):
        path = bin_dir / name
        path.write_text(f"#!/bin/bash\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, **WF.get("env", {}), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "GITHUB_REPOSITORY": "o/r"}
    return subprocess.run(["bash", "--noprofile", "--norc", "-e", "-o", "pipefail", "-c", script], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)


NO_RUNS = 'case "$1 $2" in "run list") echo "";; *) exit 1;; esac'
LIST_FAILS = 'echo "HTTP 403" >&2; exit 1'
EXPIRED = 'case "$1 $2" in "run list") echo 42;; *) echo "no artifact" >&2; exit 1;; esac'


@pytest.mark.parametrize("gh", [NO_RUNS, LIST_FAILS, EXPIRED])
def test_first_run_without_a_baseline_goes_on(tmp_path, gh):
    r = run_step(FETCH["run"], tmp_path, gh)
    assert r.returncode == 0, r.stderr
    assert "::notice::" in r.stdout and not (tmp_path / "baseline").exists()
    r = run_step(CHECK["run"], tmp_path, gh)
    assert r.returncode == 0, r.stderr
    assert "--baseline" not in (tmp_path / "kvplan-args").read_text()
    assert (tmp_path / UPLOAD["with"]["path"]).read_text() == "{}\n"


def test_a_later_run_passes_the_downloaded_file(tmp_path):
    # `gh run download RUN --name N --dir D` extracts the artifact's files into D.
    gh = ('case "$1 $2" in "run list") echo 42;; "run download") [ "$3" = 42 ] || exit 1; '
          'while [ $# -gt 0 ]; do [ "$1" = --dir ] && d=$2; shift; done; mkdir -p "$d"; '
          'echo "{}" > "$d/capacity.json";; esac')
    r = run_step(FETCH["run"], tmp_path, gh)
    assert r.returncode == 0 and "run 42" in r.stdout, r.stderr
    r = run_step(CHECK["run"], tmp_path, gh)
    assert r.returncode == 0, r.stderr
    args = (tmp_path / "kvplan-args").read_text().split()
    assert args[args.index("--baseline") + 1] == "baseline/capacity.json"
    assert (tmp_path / args[args.index("--baseline") + 1]).exists()


def test_kvplan_is_installed_from_its_repository_at_the_pinned_revision(tmp_path):
    """No package index serves kvplan: the step must hand pip a direct reference to a git URL at a revision,
    the one the workflow pins, as a single argument (quoted, so the shell does not split `kvplan @ ...`)."""
    from packaging.requirements import Requirement

    r = run_step(INSTALL["run"], tmp_path, gh="exit 1")
    assert r.returncode == 0, r.stderr
    args = (tmp_path / "pip-args").read_text().splitlines()
    assert args[0] == "install" and len(args) == 2, args
    req = Requirement(args[1])
    assert req.name == "kvplan" and req.url, args
    url, _, rev = req.url.removeprefix("git+").rpartition("@")
    assert req.url.startswith("git+https://") and url == WF["env"]["KVPLAN_REPO"]
    assert rev == WF["env"]["KVPLAN_REV"] and re.fullmatch(r"[0-9a-f]{40}|v?[0-9][\w.]*", rev), rev


def test_no_step_installs_kvplan_by_name_from_an_index():
    from packaging.requirements import InvalidRequirement, Requirement

    installs = [shlex.split(line.split("pip install", 1)[1]) for s in STEPS for line in s.get("run", "").splitlines()
                if "pip install" in line]
    assert installs
    for words in installs:
        for word in (w for w in words if not w.startswith("-")):
            try:
                req = Requirement(word)
            except InvalidRequirement:
                continue  # a path or a wheel file
            assert req.name != "kvplan" or req.url, f"pip install {word}: no package index serves kvplan"
