"""``kvplan validate``: real models run with torch (kvplan.validate), kvplan's predictions beside what they
measure, one case or a matrix of them, and a report written where asked."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvplan.errors import InputError

if TYPE_CHECKING:  # torch and transformers come with these: imported only when validation runs
    from kvplan.io.hub import HubConfig
    from kvplan.validate.run import Case, ComponentResult


@dataclass(frozen=True, kw_only=True)
class ValidateReport:
    device: dict[str, Any]  # what ran the cases: torch, transformers, the device's name and memory
    tolerance: float  # the largest relative error that passes
    results: tuple[ComponentResult, ...]  # every case's parts: predicted beside measured
    report_path: Path | None = None  # validation.md as written (None: no report asked for)
    hubs: tuple[HubConfig, ...] = ()  # what the Hub answered for each case's model, when asked

    @property
    def failed(self) -> tuple[ComponentResult, ...]:
        return tuple(r for r in self.results if not r.passes(self.tolerance))


def validate_models(model: str | None = None, *, batch: int = 1, seq_len: int = 64, prompt_len: int | None = None,
                    dtype: str = "auto", layers: int | None = None, device: str = "auto", tolerance: float = 0.05,
                    matrix: Path | None = None, report: Path | None = None, fetch: bool | None = None,
                    revision: str | None = None) -> ValidateReport:
    """Run ``model`` (or every case of the ``matrix`` file) and measure its KV cache, weights and peak beside
    kvplan's predictions; with ``report``, write validation.md and validation.json into that folder."""
    from kvplan.validate import require_torch

    require_torch()
    from kvplan.io.models import resolve_model
    from kvplan.validate.matrix import write_report
    from kvplan.validate.run import device_description, run_case

    if not 0 <= tolerance < 10:
        raise InputError(f"--tolerance must be between 0 and 10 (got {tolerance})")
    cases = _cases(model, matrix=matrix, revision=revision, batch=batch, seq_len=seq_len, prompt_len=prompt_len,
                   dtype=dtype, layers=layers, device=device)
    results: list[ComponentResult] = []
    hubs = []
    for case in cases:
        resolved = resolve_model(case.model, fetch=fetch, revision=revision)
        if resolved.hub is not None:
            hubs.append(resolved.hub)
        results += run_case(case, resolved.spec)
    info = device_description()
    path = write_report(report, info, results, tolerance) if report is not None else None
    return ValidateReport(device=info, tolerance=tolerance, results=tuple(results), report_path=path,
                          hubs=tuple(hubs))


def _cases(model: str | None, *, matrix: Path | None, revision: str | None, batch: int, seq_len: int,
           prompt_len: int | None, dtype: str, layers: int | None, device: str) -> list[Case]:
    """The matrix file's cases, or the one case the flags describe."""
    from kvplan.validate.matrix import load_matrix
    from kvplan.validate.run import Case

    if matrix is not None:
        if model:
            raise InputError("give a MODEL or --matrix, not both")
        if revision:
            raise InputError("--revision goes with one MODEL, not --matrix")
        return load_matrix(matrix)
    if not model:
        raise InputError("give a MODEL (e.g. llama3-8b) or --matrix FILE")
    if batch < 1 or seq_len < 2:
        raise InputError("--batch must be >= 1 and --seq-len >= 2")
    return [Case(model=model, batch=batch, seq_len=seq_len, prompt_len=prompt_len, dtype=dtype, layers=layers,
                 device=device)]
