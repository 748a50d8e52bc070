"""kvplan.app.validate.validate_models: the use case behind `kvplan validate`, its cases stubbed (real runs:
tests/cli/test_validate_cli.py)."""

from __future__ import annotations

import pytest

from kvplan.errors import InputError

pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvplan.app.validate import validate_models  # noqa: E402
from kvplan.validate import run  # noqa: E402


def _result(case, component: str, predicted: int, measured: int) -> run.ComponentResult:
    return run.ComponentResult(model=case.model, batch=case.batch, seq_len=case.seq_len, dtype="bf16",
                               component=component, predicted_bytes=predicted, measured_bytes=measured, scaled=False,
                               layers=2, device="cpu")


def test_a_part_outside_the_tolerance_fails(monkeypatch):
    monkeypatch.setattr(run, "run_case", lambda case, spec: [_result(case, "kv_cache", 100, 100),
                                                             _result(case, "weights", 100, 120)])
    report = validate_models("llama2-7b", seq_len=128, tolerance=0.1)
    assert [r.component for r in report.results] == ["kv_cache", "weights"]
    assert [r.component for r in report.failed] == ["weights"]
    assert report.device["torch"] and report.report_path is None and report.hubs == ()


def test_a_report_is_written_where_asked(monkeypatch, tmp_path):
    monkeypatch.setattr(run, "run_case", lambda case, spec: [_result(case, "kv_cache", 100, 101)])
    report = validate_models("llama2-7b", report=tmp_path)
    assert report.failed == () and report.report_path is not None and report.report_path.exists()


@pytest.mark.parametrize("args, kwargs, match", [
    ((), {}, "give a MODEL"),
    (("llama2-7b",), {"matrix": "m.yaml"}, "not both"),
    (("llama2-7b",), {"tolerance": 12.0}, "--tolerance"),
    (("llama2-7b",), {"seq_len": 1}, "--seq-len >= 2"),
])
def test_bad_requests_are_refused(args, kwargs, match):
    with pytest.raises(InputError, match=match):
        validate_models(*args, **kwargs)
