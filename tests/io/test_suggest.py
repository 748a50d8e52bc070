"""Suggestions for an unknown name: what starts with the typed text, then what contains it, then close."""

from __future__ import annotations

from kvplan.io.suggest import suggestions

GPUS = [("A10", "A10"), ("A10G", "A10G"), ("A100-40GB", "A100-40GB"), ("A100-80GB", "A100-80GB"),
        ("H100-80GB", "H100-80GB"), ("H100", "H100-80GB"), ("GH200", "GH200"), ("H200", "H200")]


def test_names_starting_with_the_typed_text_come_first():
    assert suggestions("A100", GPUS, cutoff=0.4)[:2] == ["A100-40GB", "A100-80GB"]
    assert "A10" in suggestions("A100", GPUS, cutoff=0.4)  # a close match still comes, after them


def test_an_alias_offers_its_name_once():
    assert suggestions("h10", GPUS, cutoff=0.4)[0] == "H100-80GB"
    assert suggestions("h10", GPUS, cutoff=0.4).count("H100-80GB") == 1


def test_names_containing_the_typed_text_come_before_close_ones():
    assert suggestions("200", GPUS, cutoff=0.4)[:2] == ["H200", "GH200"]


def test_nothing_close_is_nothing():
    assert suggestions("xyz", GPUS, cutoff=0.4) == []
    assert suggestions("", GPUS, cutoff=0.4) == []


def test_at_most_limit():
    assert len(suggestions("a", GPUS, cutoff=0.4, limit=3)) == 3
