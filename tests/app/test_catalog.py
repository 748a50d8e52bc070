"""kvplan.app.catalog: the use cases behind `kvplan gpus`, `kvplan examples` and `kvplan engines`."""

from __future__ import annotations

import pytest

from kvplan.app.catalog import engine_profiles, find_examples, gpu_catalog
from kvplan.errors import ConfigError, InputError


def test_the_gpu_catalog():
    names = {g.name for g in gpu_catalog()}
    assert {"H100-80GB", "L4"} <= names


def test_examples_are_listed_or_one_is_given_whole():
    listed = find_examples()
    assert listed.text is None and {e.kind for e in listed.listed} == {"workload", "budgets"}
    first = listed.listed[0]
    one = find_examples(first.name)
    assert one.listed == () and one.text == first.path.read_text(encoding="utf-8")
    with pytest.raises(ConfigError, match="no bundled workload example"):
        find_examples("no-such-example")


def test_engine_profiles_of_one_engine_or_all():
    one = engine_profiles("vllm==0.11.0")
    assert list(one.profiles) == ["vllm"] and one.profiles["vllm"][0].version == "0.6.2"
    assert set(engine_profiles().profiles) == {"vllm", "sglang", "trtllm", "hf"}
    with pytest.raises(InputError, match="unknown engine"):
        engine_profiles("ideal")  # no releases to list
