"""The GPU catalog (configs/gpus.yaml) and custom GPUs given by memory size."""

from __future__ import annotations

from functools import lru_cache

from kvplan.core.gpus import GPUSpec
from kvplan.errors import InputError
from kvplan.io.models import configs_dir
from kvplan.io.suggest import suggestions
from kvplan.io.units import parse_size
from kvplan.io.yamlio import load_yaml, parse_model


@lru_cache(maxsize=1)
def gpu_catalog() -> tuple[GPUSpec, ...]:
    from kvplan.io.schemas import GPUCatalogFile

    path = configs_dir() / "gpus.yaml"
    catalog = parse_model(path, GPUCatalogFile, load_yaml(path))
    assert isinstance(catalog, GPUCatalogFile)
    return tuple(
        GPUSpec(name=g.name, memory_bytes=g.memory_bytes, hbm_bandwidth_bytes_per_s=g.hbm_bandwidth_bytes_per_s,
                bf16_dense_tflops=g.bf16_dense_tflops, fp8_dense_tflops=g.fp8_dense_tflops, vendor=g.vendor,
                sm_count=g.sm_count, compute_capability=g.compute_capability, source=g.memory_source,
                aliases=tuple(g.aliases))
        for g in catalog.gpus
    )


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(" ", "-")


def get_gpu(name: str | None, *, memory: str | None = None) -> GPUSpec:
    """A catalog GPU by name or alias, or a custom one from ``memory`` (``--gpu-memory 24GiB``)."""
    if memory is not None:
        size = parse_size(memory, what="--gpu-memory")
        if size < (1 << 30):
            raise InputError(f"--gpu-memory {memory} is below 1 GiB; give the card's memory, e.g. 24GiB")
        base = get_gpu(name) if name else None
        if base is None:
            return GPUSpec(name=f"custom-{size / (1 << 30):.1f}GiB", memory_bytes=size, source="--gpu-memory")
        return GPUSpec(**{**base.__dict__, "memory_bytes": size, "source": "--gpu-memory"})
    if not name:
        raise InputError("give --gpu NAME (see `kvplan gpus`) or --gpu-memory SIZE (e.g. 24GiB)")
    key = _norm(name)
    for gpu in gpu_catalog():
        if key == _norm(gpu.name) or key in (_norm(a) for a in gpu.aliases):
            return gpu
    close = suggestions(name, [(n, g.name) for g in gpu_catalog() for n in (g.name, *g.aliases)], cutoff=0.4,
                        norm=_norm)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise InputError(f"unknown GPU {name!r}{hint} (see `kvplan gpus`, or give --gpu-memory 24GiB)")


def closest_gpu_by_memory(memory_bytes: int) -> GPUSpec | None:
    """The catalog GPU whose reported memory is nearest (within 2%), for reading logs."""
    best = min(gpu_catalog(), key=lambda g: abs(g.memory_bytes - memory_bytes))
    return best if abs(best.memory_bytes - memory_bytes) <= 0.02 * memory_bytes else None
