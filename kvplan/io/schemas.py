"""pydantic models of the files users and the project write (unknown keys rejected)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class PublishedFigures(BaseModel):
    """A bundled model's published parameter count and where it was published (the README's
    published-figures table shows it; a test holds kvplan's count to within 1% of it)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    params: int  # what fit counts: the language model as vLLM loads it (say in source what is left out)
    source: str


class BundledModelFile(BaseModel):
    """configs/models/*.yaml: a cited subset of a model's config.json."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    aliases: list[str] = []
    source: str
    notes: str = ""
    config: dict[str, Any]
    published: PublishedFigures | None = None


class GPUEntry(BaseModel):
    """One GPU of configs/gpus.yaml."""

    model_config = ConfigDict(extra="forbid")

    name: str
    aliases: list[str] = []
    vendor: str
    sm_count: int  # streaming multiprocessors (AMD: compute units)
    compute_capability: float | None  # CUDA major.minor; None off CUDA
    memory_bytes: int
    memory_source: str
    hbm_bandwidth_bytes_per_s: int
    bf16_dense_tflops: float | None
    fp8_dense_tflops: float | None
    source: str


class GPUCatalogFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpus: list[GPUEntry]
