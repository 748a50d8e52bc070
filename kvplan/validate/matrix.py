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
    # CUDA: the prompt lengths whose batch-1 prefill peak is measured (2k as --seq-len reads it)
    prefill_tokens: list[int] = Field(default_factory=lambda: list(Case.prefill_tokens), max_length=8)

    @field_validator("prefill_tokens", mode="before")
    @classmethod
    def _lengths(cls, value: object) -> object:
        if isinstance(value, list):
            return [length_before(v, "prefill_tokens") for v in value]
        return value

    @field_validator("prefill_tokens")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(v < 1 for v in value):
            raise ValueError("prefill_tokens must be positive token counts")
        return value

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
                        layers=c.layers, device=c.device, prefill_tokens=tuple(c.prefill_tokens)))
    return out


def result_dict(r: ComponentResult) -> dict:
    """A part's row: measured, error and prediction null where it could not be measured (``missing`` says why)."""
    measured = not r.missing
    return {"model": r.model, "batch": r.batch, "seq_len": r.seq_len, "dtype": r.dtype, "component": r.component,
            "predicted_bytes": r.predicted_bytes if measured else None,
            "measured_bytes": r.measured_bytes if measured else None,
            "error_bytes": r.error_bytes if measured else None, "error_frac": r.error_frac if measured else None,
            "band_bytes": r.band_bytes, "tokens": r.tokens, "scaled": r.scaled, "layers": r.layers,
            "device": r.device, "note": r.note, "missing": r.missing or None}


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
        "estimate (peak and prefill_peak, CUDA only), vLLM's per-size CUDA-graph estimate (graph_pool, CUDA only). "
        "Measured on CPU: the cache's and the parameters' tensor storages. On CUDA, from torch's caching allocator "
        "around transformers' own calls: what building the model and the cache of a real `generate()` hold "
        "(the bytes their tensors asked for: `requested_bytes` deltas), the peak of a batch-1 prefill (`max_memory_allocated`), the pool a captured "
        "decode step reserves (`memory_reserved`). *band*: an estimate's stated error band (a figure kvplan claims "
        "has none and is held to the tolerance). *scaled*: whole-model figures from a run with fewer layers.",
        "",
        "| model | batch | seq_len | dtype | layers | component | predicted | measured | error | band | scaled |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        part = r.component + (f" ({r.tokens} tokens)" if r.tokens else "")
        head = f"| {r.model} | {r.batch} | {r.seq_len} | {r.dtype} | {r.layers} | {part} | "
        if r.missing:
            lines.append(head + f"not measured: {r.missing} | | | | |")
            continue
        band = f"±{r.band_bytes:,}" if r.band_bytes else ""
        lines.append(head + f"{r.predicted_bytes:,} | {r.measured_bytes:,} | {100 * r.error_frac:+.2f}% | {band} | "
                     f"{'yes' if r.scaled else ''} |")
    path = directory / "validation.md"
    path.write_text("\n".join(lines) + "\n")
    return path
