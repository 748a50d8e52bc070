"""constraints.txt pins what the README's commands install; scripts/drift.py compares it with the newest versions.
The pins must satisfy pyproject.toml's ranges (else the README's install fails), and cover every dependency."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")  # Python 3.11+, as constraints.txt is

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("drift", ROOT / "scripts" / "drift.py")
drift = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(drift)

PINS = drift.read_pins((ROOT / "constraints.txt").read_text(encoding="utf-8"))
_PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
REQUIREMENTS = [Requirement(r) for r in (*_PROJECT["dependencies"],
                                         *(r for extra in _PROJECT["optional-dependencies"].values() for r in extra))]


@pytest.mark.parametrize("req", REQUIREMENTS, ids=str)
def test_every_dependency_is_pinned_inside_its_range(req):
    version = PINS.get(drift._name(req.name))
    assert version is not None, f"constraints.txt does not pin {req.name}"
    assert req.specifier.contains(version, prereleases=True), f"{req.name}=={version} is outside {req.specifier}"


def test_every_dependency_range_has_an_upper_bound():
    """A newer major is untested until drift.py has run the suite against it."""
    unbounded = [str(r) for r in REQUIREMENTS if not any(s.operator in ("<", "<=", "==") for s in r.specifier)]
    assert not unbounded, unbounded


def test_pins_are_read_like_pip_writes_them():
    text = "# comment\nJinja2==3.1.6\ntyping_extensions==4.16.0  # why\ntorch==2.13.0+cpu\n\n"
    assert drift.read_pins(text) == {"jinja2": "3.1.6", "typing-extensions": "4.16.0", "torch": "2.13.0"}


def test_differences_name_changed_added_and_removed_packages():
    assert drift.differences({"a": "1", "b": "2", "c": "3"}, {"a": "1", "b": "2.1", "d": "4"}) == [
        ("b", "2", "2.1"), ("c", "3", "-"), ("d", "-", "4")]
