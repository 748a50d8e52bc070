"""The safe reader: regular files only, size cap, UTF-8, bounded YAML/JSON nesting and alias expansion."""

from __future__ import annotations

import os

import pytest

from kvplan.errors import ConfigError
from kvplan.io import yamlio
from kvplan.io.yamlio import iter_lines, load_json, load_yaml, read_text, yaml_key_lines
from tests.factories import alias_bomb


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe.yaml"
    os.mkfifo(path)
    return path


def test_fifo_is_refused_without_blocking(fifo):
    with pytest.raises(ConfigError, match="named pipe"):
        read_text(fifo)
    with pytest.raises(ConfigError, match="named pipe"):
        list(iter_lines(fifo))


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_device_and_folder_are_refused(tmp_path):
    from pathlib import Path

    with pytest.raises(ConfigError, match="is a device"):
        read_text(Path("/dev/zero"))
    with pytest.raises(ConfigError, match="is a folder"):
        load_yaml(tmp_path)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        read_text(tmp_path / "nope.json")


def test_size_cap_names_the_size(tmp_path):
    path = tmp_path / "big.json"
    path.write_text("x" * 2000)
    with pytest.raises(ConfigError, match=r"2000 bytes, over kvplan's 1000 bytes limit"):
        read_text(path, max_bytes=1000)


@pytest.mark.parametrize("data, where", [
    (b'{"a": 1}\n\xff\xfe', "line 2: not UTF-8 text (byte 0xff at byte offset 9)"),
    (b"a: 1\nb: \x00\n", "line 2: not UTF-8 text (NUL byte, binary data at byte offset 8)"),
])
def test_non_utf8_names_line_and_offset(tmp_path, data, where):
    path = tmp_path / "f.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as exc:
        read_text(path)
    assert where in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        list(iter_lines(path))
    assert where in str(exc.value)


def test_bom_is_skipped(tmp_path):
    path = tmp_path / "f.yaml"
    path.write_bytes(b"\xef\xbb\xbfa: 1\n")
    assert load_yaml(path) == {"a": 1}
    assert list(iter_lines(path)) == [(1, "a: 1")]


def test_iter_lines_is_lazy_and_caps_line_length(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a\n" + "b" * 100 + "\n")
    lines = iter_lines(path, max_line_bytes=50)
    assert next(lines) == (1, "a")  # the long line is not read until asked for
    with pytest.raises(ConfigError, match="line 2 is longer than 50 bytes"):
        next(lines)


DEEP_YAML = ["[" * 50_000 + "]" * 50_000, "- " * 50_000 + "x\n", "{a: " * 50_000 + "1" + "}" * 50_000]


@pytest.mark.parametrize("text", DEEP_YAML)
def test_deep_yaml_is_refused_without_crashing(tmp_path, text):
    """50,000 levels crash libyaml's recursive composer. Whoever refuses it first (kvplan's event scan, or PyYAML's
    own scanner limit since 6.0.4, in its own words), the result is one ConfigError line naming the file."""
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_yaml(path)
    assert str(info.value).startswith(f"{path}:") and "\n" not in str(info.value)


@pytest.mark.parametrize("text", DEEP_YAML)
def test_deep_yaml_is_one_line_and_exit_2_on_the_command_line(tmp_path, text):
    from typer.testing import CliRunner

    from kvplan.cli import app

    path = tmp_path / "deep.yaml"
    path.write_text(text)
    for command in ("simulate", "check"):
        r = CliRunner().invoke(app, [command, str(path)])
        assert r.exit_code == 2, r.output
        assert len(r.stderr.strip().splitlines()) == 1 and "deep.yaml" in r.stderr, r.stderr


@pytest.mark.parametrize("depth", [65, 100, 900])
def test_yaml_nested_past_kvplans_bound_is_refused_by_kvplan(tmp_path, depth):
    """Nesting PyYAML itself reads (it refuses only from about 1,000 flow levels) is refused by kvplan's own bound."""
    path = tmp_path / "deep.yaml"
    path.write_text("[" * depth + "]" * depth)
    with pytest.raises(ConfigError, match="nested deeper than 64 levels"):
        load_yaml(path)
    path.write_text("[" * 64 + "]" * 64)
    assert load_yaml(path) is not None


def test_deep_json_is_refused(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 50_000 + "]" * 50_000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_json(path)
    path.write_text("[" * 100 + "]" * 100)  # within the recursion limit, beyond kvplan's nesting
    with pytest.raises(ConfigError, match="nested deeper than 64"):
        load_json(path)


def test_alias_bomb_is_refused(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    with pytest.raises(ConfigError, match="alias bomb"):
        load_yaml(path)


def test_modest_aliases_load(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("base: &b {x: 1, y: [1, 2]}\nc: *b\nd: *b\n")
    assert load_yaml(path)["d"] == {"x": 1, "y": [1, 2]}


def test_recursive_alias_is_refused(tmp_path):
    path = tmp_path / "rec.yaml"
    path.write_text("a: &a [1, *a]\n")
    with pytest.raises(ConfigError, match="cannot be recursive"):
        load_yaml(path)


def test_key_lines_visit_each_node_once(tmp_path, monkeypatch):
    # Below the load limit an alias-heavy file still has 9^5 paths; the walk lists each node once.
    monkeypatch.setattr(yamlio, "MAX_YAML_NODES", 10**9)
    path = tmp_path / "wide.yaml"
    path.write_text("\n".join(alias_bomb().splitlines()[:5]) + "\n")
    lines = yaml_key_lines(path)
    assert lines[("a",)] == 1 and lines[("e",)] == 5
    assert len(lines) < 100
