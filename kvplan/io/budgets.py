"""Budget files for ``kvplan check``: named capacity budgets and the limits they must meet."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvplan.core.sizing import MAX_BATCH, MAX_SEQ_LEN
from kvplan.core.units import GiB
from kvplan.errors import KvplanError
from kvplan.io.filekinds import expect_kind
from kvplan.io.units import length_before
from kvplan.io.yamlio import load_yaml, parse_model
from kvplan.core.engines.registry import SERVING

Size = str | int  # "80GiB", "512KiB", or plain bytes
MAX_COUNT = 1 << 53  # counts are compared as floats; above 2**53 they stop being exact


def _size_bytes(value: str | int, what: str) -> int:
    """A size field as integer bytes; a ValueError (pydantic's one-line message) when it is not one."""
    from kvplan.io.units import parse_size

    try:
        return parse_size(value, what=what)  # the one bound on sizes (kvplan.io.units.MAX_SIZE_BYTES)
    except KvplanError as exc:
        raise ValueError(str(exc)) from None


class Require(BaseModel):
    """The limits a budget must meet; each one named is measured and judged, the rest are skipped."""

    model_config = ConfigDict(extra="forbid")

    max_kv_bytes_per_token: Size | None = Field(None, description=(
        "Most KV bytes one token may add (all layers, all GPUs), e.g. 160KiB; as `kvplan size` counts them."))
    max_kv_bytes: Size | None = Field(None, description=(
        "Most KV bytes of `batch` sequences of `seq_len` tokens, whole deployment, e.g. 4GiB."))
    max_kv_bytes_per_gpu: Size | None = Field(None, description=(
        "Most KV bytes of `batch` sequences of `seq_len` tokens on one GPU (split by tensor/pipeline parallelism)."))
    min_kv_cache_tokens: int | None = Field(None, ge=0, le=MAX_COUNT, description=(
        "Fewest tokens the engine's KV cache must hold (`kvplan fit`: KV cache tokens)."))
    min_max_concurrency: float | None = Field(None, ge=0, allow_inf_nan=False, description=(
        "Fewest requests of max_model_len tokens that must fit at once (`kvplan fit`: max concurrency)."))
    max_model_len_must_fit: bool | None = Field(None, description=(
        "true: the engine must start with max_model_len and one request of that many tokens must fit in the KV "
        "cache (`kvplan fit` says fits)."))
    min_headroom_frac: float | None = Field(None, ge=0, le=1, allow_inf_nan=False, description=(
        "Share of each GPU's memory that stays free with `batch` requests of max_model_len in the KV cache."))
    min_token_states_frac: float | None = Field(None, ge=0, le=1, allow_inf_nan=False, description=(
        "Smallest share of the simulated KV pool that holds token states (`kvplan simulate`), e.g. 0.9."))
    max_preemptions: int | None = Field(None, ge=0, le=MAX_COUNT, description=(
        "Most preemptions the workload's simulation may have."))
    max_rejected: int | None = Field(None, ge=0, le=MAX_COUNT, description=(
        "Most requests the workload's simulation may reject (e.g. longer than the KV pool)."))
    min_completed: int | None = Field(None, ge=0, le=MAX_COUNT, description=(
        "Fewest requests the workload's simulation must complete."))

    @field_validator("max_kv_bytes_per_token", "max_kv_bytes", "max_kv_bytes_per_gpu")
    @classmethod
    def _bytes(cls, value: Size | None, info) -> int | None:  # type: ignore[no-untyped-def]
        return None if value is None else _size_bytes(value, f"require.{info.field_name}")


SIMULATION_LIMITS = ("min_token_states_frac", "max_preemptions", "max_rejected", "min_completed")
FIT_LIMITS = ("min_kv_cache_tokens", "min_max_concurrency", "max_model_len_must_fit", "min_headroom_frac")
SIZE_LIMITS = ("max_kv_bytes_per_token", "max_kv_bytes", "max_kv_bytes_per_gpu")


class Budget(BaseModel):
    """One named deployment (model, GPUs, engine settings) or workload, and the limits it must meet."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="Unique name, shown beside each limit's verdict.")
    model: str | None = Field(None, description=(
        "Bundled model name (`kvplan models`), hub id or config.json path; needed by all but simulation limits."))
    gpu: str | None = Field(None, description="Bundled GPU name (`kvplan gpus`), e.g. H100-80GB; needed by fit limits.")
    gpu_memory: str | None = Field(None, description="Memory per GPU, e.g. 80GiB; overrides the gpu's or stands alone.")
    engine: str = Field("vllm", description=(
        "Serving engine whose allocation rules apply: vllm (default), sglang, trtllm, hf or ideal, optionally "
        "pinned to the release you run, e.g. vllm==0.11.0 (no version: the newest rules; `kvplan engines`); "
        "fit limits need vllm, sglang or trtllm."))
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs one layer is split over (default 1).")
    pipeline_parallel_size: int = Field(1, ge=1, le=64, description="Pipeline stages (default 1).")
    kv_cache_dtype: str = Field("auto", description="KV cache dtype: auto (the model's), fp8, bf16, ... (default auto).")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, allow_inf_nan=False, description=(
        "Share of GPU memory the engine may use (default: the release's own: vLLM 0.9, 0.92 from 0.20)."))
    max_model_len: int | None = Field(None, ge=1, le=MAX_SEQ_LEN, description=(
        "Longest request in tokens, e.g. 32768 or 32k (default: the model's max_position_embeddings)."))
    allow_long_max_model_len: bool = Field(False, description=(
        "The engine's variable for a max_model_len longer than the model's is set where it runs "
        "(VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, "
        "TLLM_ALLOW_LONG_MAX_MODEL_LEN=1); default false: vLLM and SGLang refuse to start, as `kvplan fit` says."))
    batch: int = Field(1, ge=1, le=MAX_BATCH, description="Sequences for max_kv_bytes and min_headroom_frac (default 1).")
    seq_len: int | None = Field(None, ge=1, le=MAX_SEQ_LEN, description=(
        "Tokens per sequence for max_kv_bytes, e.g. 8192 or 8k (default max_model_len)."))
    workload: str | None = Field(None, description=(
        "A workload file (`kvplan simulate`) relative to this file, or a bundled workload's name (`kvplan examples`)."))
    allocator: str = Field("paged-16", description="Allocator whose simulation the limits apply to (default paged-16).")
    require: Require = Field(description="The limits; at least one.")

    @field_validator("max_model_len", "seq_len", mode="before")
    @classmethod
    def _length(cls, value: object, info) -> object:  # type: ignore[no-untyped-def]
        return length_before(value, info.field_name)  # 32k as `--max-model-len 32k` reads it

    @field_validator("gpu_memory")
    @classmethod
    def _memory(cls, value: str | None) -> str | None:
        if value is not None:
            _size_bytes(value, "gpu_memory")
        return value

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, value: str) -> str:
        from kvplan.core.profiles import parse_engine

        try:
            parse_engine(value)
        except KvplanError as exc:
            raise ValueError(str(exc)) from None
        return value

    def engine_choice(self) -> Any:
        from kvplan.core.profiles import parse_engine

        return parse_engine(self.engine)

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
        if asked & set(FIT_LIMITS) and self.engine_choice().name not in SERVING:
            raise ValueError("capacity limits need engine vllm, sglang or trtllm")
        return self


class BudgetsFile(BaseModel):
    """A budgets file for `kvplan check`: exit 0 when every limit passes, 1 when one fails, 2 when invalid."""

    model_config = ConfigDict(extra="forbid")

    budgets: list[Budget] = Field(min_length=1, description="The budgets, each with a unique name.")

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
    data = load_yaml(path)
    expect_kind(path, data, "budgets")  # empty, or a workload file given to `kvplan check`
    model = parse_model(path, BudgetsFile, data)
    assert isinstance(model, BudgetsFile)
    return model


@dataclass(frozen=True, kw_only=True)
class Measured:
    """Each named limit's measured value and threshold (sizes in bytes), and what the measurement
    says about why a value is what it is (shown beside a failing limit)."""

    values: dict[str, float]
    thresholds: dict[str, float]
    reasons: dict[str, str] = field(default_factory=dict)


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def _bytes(n: float | None) -> str:
    """Exact bytes with separators, and GiB from 1 GiB: ``524,288 B``, ``4,294,967,296 B (4.00 GiB)``."""
    n = int(n or 0)
    return f"{n:,} B ({_gib(n)})" if n >= GiB else f"{n:,} B"


def measure(budget: Budget, origin: Path) -> Measured:
    """Measure every limit the budget names with the rules of `kvplan size`, `fit` and `simulate`. A limit's
    reason (shown when it fails) starts with its own measured value and bound: ``474,336 KV cache tokens <
    500,000: ...``."""
    from kvplan.core.capacity.common import FitRequest
    from kvplan.core.capacity.fit import fit
    from kvplan.core.engines import engine_for
    from kvplan.core.sizing import size_kv
    from kvplan.io.gpus import get_gpu
    from kvplan.io.models import load_model

    asked = {k: v for k, v in budget.require.model_dump().items() if v is not None}
    out: dict[str, float] = {}
    why: dict[str, str] = {}
    choice = budget.engine_choice()
    if budget.model and asked.keys() - set(SIMULATION_LIMITS):
        spec = load_model(budget.model)
        max_len = budget.max_model_len or spec.max_model_len
        tp, pp = budget.tensor_parallel_size, budget.pipeline_parallel_size
        if asked.keys() & set(SIZE_LIMITS):
            engine, _ = engine_for(spec, choice.name, profile=choice.profile)
            seq_len = budget.seq_len or max_len
            r = size_kv(spec, engine, batch=budget.batch, seq_len=seq_len, kv_dtype=budget.kv_cache_dtype, tp=tp, pp=pp)
            out.update(max_kv_bytes_per_token=r.bytes_per_token, max_kv_bytes=r.total_bytes,
                       max_kv_bytes_per_gpu=r.per_gpu_bytes)
            halves = "; kv_cache_dtype: fp8 halves it" if r.kv_dtype in ("bf16", "fp16") else ""
            why["max_kv_bytes_per_token"] = (f"{_bytes(r.bytes_per_token)} per token > "
                                             f"{_bytes(asked.get('max_kv_bytes_per_token'))}: {spec.name} stores "
                                             f"{r.kv_dtype} KV{halves}")
            why["max_kv_bytes"] = (f"{_bytes(r.total_bytes)} > {_bytes(asked.get('max_kv_bytes'))}: {budget.batch:,} x "
                                   f"{seq_len:,} tokens at {_bytes(r.bytes_per_token)} per token ({r.kv_dtype}) with "
                                   f"{budget.engine}'s allocation{halves}")
            why["max_kv_bytes_per_gpu"] = (f"{_bytes(r.per_gpu_bytes)} on one GPU > "
                                           f"{_bytes(asked.get('max_kv_bytes_per_gpu'))}: "
                                           f"{budget.batch:,} x {seq_len:,} tokens take {_bytes(r.total_bytes)} over "
                                           f"{r.num_gpus} GPU(s); more tensor_parallel_size lowers it")
        if asked.keys() & set(FIT_LIMITS):
            gpu = get_gpu(budget.gpu, memory=budget.gpu_memory)
            # No concurrency asked of fit: its reasons are then the deployment's own (no KV memory, one request
            # too long), not the min_max_concurrency verdict, which is judged here with the other limits.
            req = FitRequest(spec=spec, gpu=gpu, engine=choice.name, profile=choice.profile, tp=tp, pp=pp,
                             kv_dtype=budget.kv_cache_dtype,
                             gpu_memory_utilization=budget.gpu_memory_utilization, max_model_len=budget.max_model_len,
                             allow_long_max_model_len=budget.allow_long_max_model_len)
            f = fit(req)
            per_request = size_kv(spec, engine_for(spec, choice.name, profile=choice.profile)[0], batch=budget.batch,
                                  seq_len=f.max_model_len,
                                  kv_dtype=budget.kv_cache_dtype, tp=tp, pp=pp).per_gpu_bytes
            b = f.breakdown
            busy = b.weights + b.activation + b.non_torch + b.cuda_graph + per_request
            headroom = 1 - busy / gpu.memory_bytes
            out.update(min_kv_cache_tokens=f.kv_cache_tokens, min_max_concurrency=round(f.max_concurrency, 4),
                       max_model_len_must_fit=float(f.fits),
                       min_headroom_frac=round(headroom, 6))
            fit_says = "; ".join(f.reasons)
            cache = (f"{_gib(f.kv_cache_memory_bytes)} of KV cache per GPU on {gpu.name} x {tp * pp} after weights "
                     f"{_gib(b.weights)}, activation {_gib(b.activation)}, non-torch {_gib(b.non_torch)}, CUDA graphs "
                     f"{_gib(b.cuda_graph)}")
            because = fit_says or cache
            want = asked.get("min_max_concurrency") or 0
            why["min_kv_cache_tokens"] = (f"{f.kv_cache_tokens:,} KV cache tokens < "
                                          f"{asked.get('min_kv_cache_tokens') or 0:,.0f}: {because}")
            need = f" need {want / f.max_concurrency:.2f}x the KV cache" if f.max_concurrency else " do not fit"
            why["min_max_concurrency"] = (f"max concurrency {f.max_concurrency:.2f} < {want:g}: {want:g} requests of "
                                          f"{f.max_model_len:,} tokens{need}; {because}")
            why["max_model_len_must_fit"] = (f"max_model_len {f.max_model_len} does not fit: " + (
                fit_says or f"the longest that fits: max_model_len {f.max_model_len_fit}"))
            why["min_headroom_frac"] = (
                f"headroom {100 * headroom:.1f}% < {100 * (asked.get('min_headroom_frac') or 0):.1f}%: "
                f"weights {_gib(b.weights)} + activation {_gib(b.activation)} + non-torch {_gib(b.non_torch)} + "
                f"CUDA graphs {_gib(b.cuda_graph)} + KV of {budget.batch:,} x {f.max_model_len:,} tokens "
                f"{_gib(per_request)} = {_gib(busy)} of {_gib(gpu.memory_bytes)} per GPU")
    if asked.keys() & set(SIMULATION_LIMITS):
        from kvplan.core.sim.engine import simulate
        from kvplan.core.sim.model import allocator_spec
        from kvplan.errors import ConfigError
        from kvplan.io.examples import resolve_input
        from kvplan.io.paths import probe
        from kvplan.io.workload import resolve_workload

        assert budget.workload is not None
        path = Path(budget.workload)
        path = path if path.is_absolute() else origin.parent / path
        try:
            path = resolve_input(path if probe(path) is not None else budget.workload, "workload")
        except ConfigError as exc:
            raise ConfigError(f"{origin}: budget {budget.name!r}: workload {exc}") from None
        w = resolve_workload(path)
        placement = w.allocators[0].placement if w.allocators else "buddy"
        sim = simulate(w.requests, w.config, allocator_spec(budget.allocator, placement=placement))
        out.update(min_token_states_frac=round(sim.token_states_frac, 6), max_preemptions=sim.preemptions,
                   max_rejected=sim.rejected, min_completed=sim.completed)
        rejected = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in sorted(sim.rejected_reasons.items()))
        outcome = (f"{sim.completed:,} completed, {sim.rejected:,} rejected" + (f" ({rejected})" if rejected else "")
                   + f", {sim.preemptions:,} preemptions")
        why["min_token_states_frac"] = (
            f"token states {100 * sim.token_states_frac:.1f}% < "
            f"{100 * (asked.get('min_token_states_frac') or 0):.1f}%: "
            f"{sim.allocator}: reserved {100 * sim.reserved_frac:.1f}%, "
            f"internal fragmentation {100 * sim.internal_frag_frac:.1f}%, external {100 * sim.external_frag_frac:.1f}%, "
            f"free {100 * sim.free_frac:.1f}% of the KV pool")
        for key, value, op in (("max_preemptions", sim.preemptions, ">"), ("max_rejected", sim.rejected, ">"),
                               ("min_completed", sim.completed, "<")):
            what = key.split("_", 1)[1]
            why[key] = f"{value:,} {what} {op} {asked.get(key) or 0:,.0f}: {sim.allocator}: {outcome}"
    thresholds = {key: float(limit) for key, limit in asked.items()}  # sizes are bytes already (Require._bytes)
    return Measured(values={key: float(out[key]) for key in asked}, thresholds=thresholds,
                    reasons={key: why[key] for key in asked if key in why})
