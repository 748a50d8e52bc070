"""Budget files for ``kvplan check``: named capacity budgets and the limits they must meet."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvplan.io.yamlio import load_yaml, parse_model

Size = str | int  # "80GiB", "512KiB", or plain bytes


class Require(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_kv_bytes_per_token: Size | None = Field(None, description="KV bytes one token adds (all layers, all GPUs).")
    max_kv_bytes: Size | None = Field(None, description="KV bytes of `batch` sequences of `seq_len` tokens, whole deployment.")
    max_kv_bytes_per_gpu: Size | None = None
    min_kv_cache_tokens: int | None = Field(None, ge=0)
    min_max_concurrency: float | None = Field(None, ge=0, description="Requests of max_model_len tokens at once.")
    max_model_len_must_fit: bool | None = Field(None, description="One request of max_model_len must fit.")
    min_headroom_frac: float | None = Field(None, ge=0, le=1, description=(
        "Share of each GPU's memory that stays free with `batch` requests of max_model_len in the KV cache."))
    min_token_states_frac: float | None = Field(None, ge=0, le=1)
    max_preemptions: int | None = Field(None, ge=0)
    max_rejected: int | None = Field(None, ge=0)
    min_completed: int | None = Field(None, ge=0)


SIMULATION_LIMITS = ("min_token_states_frac", "max_preemptions", "max_rejected", "min_completed")
FIT_LIMITS = ("min_kv_cache_tokens", "min_max_concurrency", "max_model_len_must_fit", "min_headroom_frac")
SIZE_LIMITS = ("max_kv_bytes_per_token", "max_kv_bytes", "max_kv_bytes_per_gpu")


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    model: str | None = None
    gpu: str | None = None
    gpu_memory: str | None = None
    engine: Literal["vllm", "sglang", "trtllm", "hf", "ideal"] = "vllm"
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    pipeline_parallel_size: int = Field(1, ge=1, le=64)
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    max_model_len: int | None = Field(None, ge=1)
    batch: int = Field(1, ge=1, description="Sequences for max_kv_bytes and min_headroom_frac.")
    seq_len: int | None = Field(None, ge=1, description="Tokens per sequence for max_kv_bytes (default max_model_len).")
    workload: str | None = Field(None, description="A workload file (kvplan simulate), relative to this file.")
    allocator: str = Field("paged-16", description="Allocator whose simulation the limits apply to.")
    require: Require

    @model_validator(mode="after")
    def _what_it_plans_for(self) -> "Budget":
        r = self.require
        asked = {k for k, v in r.model_dump().items() if v is not None}
        if not asked:
            raise ValueError("require names no limit")
        if asked & set(SIMULATION_LIMITS) and not self.workload:
            raise ValueError(f"{', '.join(sorted(asked & set(SIMULATION_LIMITS)))} need a workload file")
        if asked - set(SIMULATION_LIMITS) and not self.model:
            raise ValueError(f"{', '.join(sorted(asked - set(SIMULATION_LIMITS)))} need a model")
        if asked & set(FIT_LIMITS) and not (self.gpu or self.gpu_memory):
            raise ValueError(f"{', '.join(sorted(asked & set(FIT_LIMITS)))} need a gpu (or gpu_memory)")
        if asked & set(FIT_LIMITS) and self.engine not in ("vllm", "sglang", "trtllm"):
            raise ValueError("capacity limits need engine vllm, sglang or trtllm")
        return self


class BudgetsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    budgets: list[Budget] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> "BudgetsFile":
        names = [b.name for b in self.budgets]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"budget names must be unique: {', '.join(dupes)}")
        return self


def budgets_schema() -> dict:
    return BudgetsFile.model_json_schema()


def load_budgets(path: Path) -> BudgetsFile:
    model = parse_model(path, BudgetsFile, load_yaml(path))
    assert isinstance(model, BudgetsFile)
    return model


def measure(budget: Budget, origin: Path) -> tuple[dict[str, float], dict[str, float]]:
    """(measured value, limit) of each limit the budget names; sizes in bytes."""
    from kvplan.core.capacity.common import FitRequest
    from kvplan.core.capacity.fit import fit
    from kvplan.core.engines import engine_for
    from kvplan.core.sizing import size_kv
    from kvplan.io.gpus import get_gpu
    from kvplan.io.models import load_model
    from kvplan.io.units import parse_size

    asked = {k: v for k, v in budget.require.model_dump().items() if v is not None}
    out: dict[str, float] = {}
    if budget.model and asked.keys() - set(SIMULATION_LIMITS):
        spec = load_model(budget.model)
        max_len = budget.max_model_len or spec.max_model_len
        if asked.keys() & set(SIZE_LIMITS):
            engine, _ = engine_for(spec, budget.engine)
            r = size_kv(spec, engine, batch=budget.batch, seq_len=budget.seq_len or max_len,
                        kv_dtype=budget.kv_cache_dtype, tp=budget.tensor_parallel_size, pp=budget.pipeline_parallel_size)
            out.update(max_kv_bytes_per_token=r.bytes_per_token, max_kv_bytes=r.total_bytes,
                       max_kv_bytes_per_gpu=r.per_gpu_bytes)
        if asked.keys() & set(FIT_LIMITS):
            gpu = get_gpu(budget.gpu, memory=budget.gpu_memory)
            req = FitRequest(spec=spec, gpu=gpu, engine=budget.engine, tp=budget.tensor_parallel_size,
                             pp=budget.pipeline_parallel_size, kv_dtype=budget.kv_cache_dtype,
                             gpu_memory_utilization=budget.gpu_memory_utilization, max_model_len=max_len)
            f = fit(req)
            per_request = size_kv(spec, engine_for(spec, budget.engine)[0], batch=budget.batch, seq_len=f.max_model_len,
                                  kv_dtype=budget.kv_cache_dtype, tp=budget.tensor_parallel_size,
                                  pp=budget.pipeline_parallel_size).per_gpu_bytes
            b = f.breakdown
            busy = b.weights + b.activation + b.non_torch + b.cuda_graph + per_request
            out.update(min_kv_cache_tokens=f.kv_cache_tokens, min_max_concurrency=round(f.max_concurrency, 4),
                       max_model_len_must_fit=float(f.max_model_len_fit >= f.max_model_len and f.kv_cache_memory_bytes > 0),
                       min_headroom_frac=round(1 - busy / gpu.memory_bytes, 6))
    if asked.keys() & set(SIMULATION_LIMITS):
        from kvplan.core.sim.engine import simulate
        from kvplan.core.sim.model import allocator_spec
        from kvplan.errors import ConfigError
        from kvplan.io.workload import resolve_workload

        assert budget.workload is not None
        from kvplan.io.examples import resolve_input

        path = Path(budget.workload)
        path = path if path.is_absolute() else origin.parent / path
        try:
            path = resolve_input(path if path.exists() else budget.workload, "workload")
        except ConfigError as exc:
            raise ConfigError(f"{origin}: budget {budget.name!r}: workload {exc}") from None
        w = resolve_workload(path)
        placement = w.allocators[0].placement if w.allocators else "buddy"
        sim = simulate(w.requests, w.config, allocator_spec(budget.allocator, placement=placement))
        out.update(min_token_states_frac=round(sim.token_states_frac, 6), max_preemptions=sim.preemptions,
                   max_rejected=sim.rejected, min_completed=sim.completed)
    thresholds = {}
    for key, limit in asked.items():
        thresholds[key] = float(parse_size(limit, what=f"{budget.name}: require.{key}")) if key in SIZE_LIMITS else float(limit)
    return {key: float(out[key]) for key in asked}, thresholds
