"""``kvplan validate --matrix``: a set of cases, a Markdown report and its JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvplan.io.filekinds import expect_kind
from kvplan.io.units import length_before
from kvplan.io.yamlio import load_yaml, parse_model
from kvplan.validate.run import Case, ComponentResult


class MatrixCase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    batch: int = Field(1, ge=1, le=4096)
    seq_len: int = Field(64, ge=2)
    prompt_len: int | None = Field(None, ge=1)
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    layers: int | None = Field(None, ge=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"

    @field_validator("seq_len", "prompt_len", mode="before")
    @classmethod
    def _length(cls, value: object, info) -> object:  # type: ignore[no-untyped-def]
        return length_before(value, info.field_name)  # 2k as `--seq-len 2k` reads it


class MatrixFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cases: list[MatrixCase] = Field(min_length=1)


def load_matrix(path: Path) -> list[Case]:
    data = load_yaml(path)
    expect_kind(path, data, "matrix")
    matrix = parse_model(path, MatrixFile, data)
    assert isinstance(matrix, MatrixFile)
    out = []
    for c in matrix.cases:
        ref = c.model
        if ref.startswith((".", "/")) or ref.endswith((".json", ".yaml")):
            ref = str((path.parent / ref) if not Path(ref).is_absolute() else Path(ref))
        out.append(Case(model=ref, batch=c.batch, seq_len=c.seq_len, prompt_len=c.prompt_len, dtype=c.dtype,
                        layers=c.layers, device=c.device))
    return out


def result_dict(r: ComponentResult) -> dict:
    return {"model": r.model, "batch": r.batch, "seq_len": r.seq_len, "dtype": r.dtype, "component": r.component,
            "predicted_bytes": r.predicted_bytes, "measured_bytes": r.measured_bytes, "error_bytes": r.error_bytes,
            "error_frac": r.error_frac, "scaled": r.scaled, "layers": r.layers, "device": r.device, "note": r.note}


def write_report(directory: Path, device: dict, results: list[ComponentResult], tolerance: float) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "validation.json").write_text(json.dumps(
        {"device": device, "tolerance": tolerance, "cases": [result_dict(r) for r in results]}, indent=2) + "\n")
    lines = [
        "# kvplan validation report", "",
        f"Device: {device.get('name')}" + (f", driver {device['driver']}" if device.get("driver") else "")
        + (f", CUDA {device['cuda']}" if device.get("cuda") else "")
        + f"; torch {device.get('torch')}, transformers {device.get('transformers')}.", "",
        "Predicted: kvplan's `hf` engine (KV cache), parameter count x dtype (weights), weights + KV + activation "
        "estimate (peak, CUDA only). Measured: the cache's tensor storages and the parameters' storages; on CUDA "
        "`torch.cuda.max_memory_allocated` for the peak. *scaled*: whole-model figures from a run with fewer layers.",
        "",
        "| model | batch | seq_len | dtype | layers | component | predicted | measured | error | scaled |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r.model} | {r.batch} | {r.seq_len} | {r.dtype} | {r.layers} | {r.component} | "
                     f"{r.predicted_bytes:,} | {r.measured_bytes:,} | {100 * r.error_frac:+.2f}% | "
                     f"{'yes' if r.scaled else ''} |")
    path = directory / "validation.md"
    path.write_text("\n".join(lines) + "\n")
    return path
