"""Run the test suite against the newest versions pyproject.toml's ranges allow, and list what differs from
constraints.txt, so that a new release of a dependency is found by us and not by a user. Not part of CI (its
answer changes whenever PyPI does).

    python scripts/drift.py                  # a fresh virtual environment in a temporary folder
    python scripts/drift.py --keep DIR       # ... in DIR, kept afterwards
    python scripts/drift.py -- -x tests/io   # arguments after -- go to pytest

torch stays at the CPU build named by --torch (default torch==2.13.0, installed first, as the README does):
the newest torch on PyPI is a multi-GB CUDA build. Exit status: pytest's (0 when the suite passes).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _name(text: str) -> str:
    """A distribution's normalized name (PEP 503): Jinja2 and jinja2, typing_extensions and typing-extensions."""
    return re.sub(r"[-_.]+", "-", text).lower()


def read_pins(text: str) -> dict[str, str]:
    """name -> version from `name==version` lines (comments, blank lines and local labels like +cpu dropped)."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[_name(name)] = version.split("+", 1)[0].strip()
    return pins


def differences(pinned: dict[str, str], installed: dict[str, str]) -> list[tuple[str, str, str]]:
    """(name, pinned, installed) for every package whose version differs, or that only one side has ('-')."""
    return [(name, pinned.get(name, "-"), installed.get(name, "-"))
            for name in sorted(set(pinned) | set(installed)) if pinned.get(name) != installed.get(name)]


def _run(cmd: list[str]) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main(argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else len(argv)
    own, pytest_args = argv[:split], argv[split + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", metavar="DIR", help="make the virtual environment in DIR and keep it")
    parser.add_argument("--torch", default="torch==2.13.0", help="the torch to install first (a CPU build)")
    args = parser.parse_args(own)
    where = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kvplan-drift-"))
    venv = where / "venv"
    print(f"fresh environment: {venv}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--upgrade"]
    subprocess.run([*pip, "pip"], check=True)
    subprocess.run([*pip, args.torch], check=True)
    # No constraints but torch's (eager upgrades would swap the CPU build for PyPI's CUDA one): the newest each
    # range in pyproject.toml allows.
    keep_torch = where / "torch-only.txt"
    keep_torch.write_text(args.torch + "\n", encoding="utf-8")
    subprocess.run([*pip, "--upgrade-strategy", "eager", "-c", str(keep_torch), "-e", f"{ROOT}[test]"], check=True)
    installed = read_pins(_run([py, "-m", "pip", "freeze", "--exclude-editable"]))
    pinned = read_pins((ROOT / "constraints.txt").read_text(encoding="utf-8"))
    diff = differences(pinned, installed)
    print(f"\n{len(diff)} package(s) differ from constraints.txt" + (":" if diff else ""))
    for name, old, new in diff:
        print(f"  {name:<28} {old:>14} -> {new}")
    print("\nthe suite against them:", flush=True)
    result = subprocess.run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(pytest_args or ["tests"])],
                            cwd=ROOT)
    verdict = "passes" if result.returncode == 0 else f"FAILS (pytest exit {result.returncode})"
    print(f"\ndrift: the suite {verdict} with the newest allowed versions; {len(diff)} differ from constraints.txt")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
