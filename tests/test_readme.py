"""The README's figures are generated (scripts/readme_figures.py): each deterministic block must equal
what kvplan prints now, so a change in output or numbers shows up here instead of going stale."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "scripts" / "readme_figures.py")
readme_figures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(readme_figures)


def test_readme_opens_with_the_two_setup_commands():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    block = lines[lines.index("```bash") + 1: lines.index("```bash") + 3]
    assert block[0] == "pip install -e . -c constraints.txt && kvplan size llama2-7b --batch 16"
    assert block[1].startswith("pip install torch==2.13.0 && pip install -e '.[test]' -c constraints.txt && "
                               "python -m pytest tests")


def test_ci_runs_the_readmes_commands_with_the_constraints():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install -q -e . -c constraints.txt" in ci
    assert "pip install -q -e '.[test]' -c constraints.txt" in ci
    assert '-c "$root/constraints.txt"' in ci  # the bare install too


@pytest.mark.parametrize("name", sorted(readme_figures.BLOCKS))
def test_generated_block_is_current(name):
    text = readme_figures.README.read_text(encoding="utf-8")
    have = readme_figures.current(text, name)
    assert have is not None, f"README.md lost its {name} block"
    assert have == readme_figures.BLOCKS[name](), f"README block {name} is stale: python scripts/readme_figures.py --write"


@pytest.mark.parametrize("name", sorted(readme_figures.TIMINGS))
def test_timing_blocks_exist(name):
    assert readme_figures.current(readme_figures.README.read_text(encoding="utf-8"), name) is not None


@pytest.mark.parametrize("name", sorted(readme_figures.DOC_BLOCKS))
def test_generated_doc_block_is_current(name):
    path, make = readme_figures.DOC_BLOCKS[name]
    have = readme_figures.current(path.read_text(encoding="utf-8"), name)
    assert have is not None, f"{path.name} lost its {name} block"
    assert have == make(), f"{path.name} block {name} is stale: python scripts/readme_figures.py --write"
