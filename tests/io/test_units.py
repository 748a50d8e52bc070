"""Lengths written by people (kvplan.io.units.parse_length): 8192, 8k, 32K; nothing else."""

from __future__ import annotations

import pytest

from kvplan.errors import InputError
from kvplan.io.units import length_before, parse_length


@pytest.mark.parametrize("text, tokens", [
    ("8192", 8192), ("8k", 8192), ("32K", 32768), ("128k", 131072), (" 16 k ", 16384), ("1", 1), (4096, 4096),
])
def test_a_length_is_digits_and_an_optional_k(text, tokens):
    assert parse_length(text, what="--seq-len") == tokens


@pytest.mark.parametrize("text, why", [
    ("1.5k", "not a fraction"), ("8192.0", "not a fraction"), (".5", "not a fraction"), (1.5, "not a fraction"),
    ("-5", "must be positive"), ("-1k", "must be positive"), ("0", "must be positive"), (0, "must be positive"),
    ("8m", "not a length"), ("8KiB", "not a length"), ("8 kk", "not a length"), ("", "not a length"),
    ("\u00b2", "not a length"), ("1" * 20, "more than 15 digits"), (True, "not a length"),
])
def test_anything_else_is_refused_naming_the_flag(text, why):
    with pytest.raises(InputError, match=why) as exc:
        parse_length(text, what="--seq-len")
    assert str(exc.value).startswith("--seq-len") and "8192 or 8k" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_minus_one_only_where_it_means_the_longest_that_fits():
    assert parse_length("-1", what="--max-model-len", auto=True) == -1
    with pytest.raises(InputError, match="or -1 for the longest that fits"):
        parse_length("-2", what="--max-model-len", auto=True)
    with pytest.raises(InputError, match="must be positive"):
        parse_length("-1", what="--seq-len")


def test_in_a_file_text_is_parsed_and_numbers_are_left_to_the_field():
    assert length_before("32k", "max_model_len") == 32768
    assert length_before(8192.0, "max_model_len") == 8192.0  # pydantic's int field decides
    with pytest.raises(ValueError, match="max_model_len: a length is whole tokens"):
        length_before("1.5k", "max_model_len")
