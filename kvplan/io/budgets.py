"""Budget files for ``kvplan check``: named capacity budgets and the limits they must meet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvplan.core.sizing import MAX_BATCH, MAX_SEQ_LEN
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
    max_gpus: int | None = Field(None, ge=1, le=1024, description=(
        "Most GPUs the cheapest deployment holding `concurrency` requests of max_model_len may take (`kvplan plan`)."))
    max_cost_per_hour: float | None = Field(None, gt=0, allow_inf_nan=False, description=(
        "Highest cost per hour of the cheapest deployment holding the target, at the budget's `prices`."))

    @field_validator("max_kv_bytes_per_token", "max_kv_bytes", "max_kv_bytes_per_gpu")
    @classmethod
    def _bytes(cls, value: Size | None, info) -> int | None:  # type: ignore[no-untyped-def]
        return None if value is None else _size_bytes(value, f"require.{info.field_name}")


SIMULATION_LIMITS = ("min_token_states_frac", "max_preemptions", "max_rejected", "min_completed")
FIT_LIMITS = ("min_kv_cache_tokens", "min_max_concurrency", "max_model_len_must_fit", "min_headroom_frac")
SIZE_LIMITS = ("max_kv_bytes_per_token", "max_kv_bytes", "max_kv_bytes_per_gpu")
PLAN_LIMITS = ("max_gpus", "max_cost_per_hour")


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
    data_parallel_size: int = Field(1, ge=1, le=64, description=(
        "vLLM and SGLang: engines of tp x pp GPUs side by side, each its own KV pool (with enable_dp_attention: "
        "SGLang's attention groups inside the tp GPUs); fit limits count the KV cache tokens and the whole "
        "requests of all of them (default 1)."))
    enable_expert_parallel: bool = Field(False, description=(
        "Whole routed experts on each GPU: over data x tensor parallel GPUs in vLLM, over tp in SGLang "
        "(default false)."))
    enable_dp_attention: bool = Field(False, description=(
        "SGLang: the data_parallel_size ranks are attention groups inside the tensor-parallel GPUs (default false)."))
    decode_context_parallel_size: int = Field(1, ge=1, le=64, description=(
        "vLLM: each sequence's KV over this many of the tensor-parallel ranks, from 0.10.2 (default 1)."))
    speculative_config: dict | None = Field(None, description=(
        "vLLM: speculative decoding as vLLM takes it, e.g. {method: mtp, num_speculative_tokens: 1}: the MTP layers "
        "in the KV cache and the weights (default none)."))
    speculative_algorithm: str | None = Field(None, description=(
        "SGLang: NEXTN (EAGLE from the model's MTP layers), EAGLE or EAGLE3 with speculative_draft_model_path, or "
        "NGRAM: the draft's pool and weights (default none)."))
    speculative_draft_model_path: str | None = Field(None, description=(
        "SGLang: the EAGLE or EAGLE-3 head's checkpoint, a bundled name, hub id or config.json path (default none)."))
    moe_a2a_backend: str = Field("none", description=(
        "SGLang: deepep or mooncake puts whole experts over the tp GPUs and the shared experts whole on each "
        "(default none)."))
    ep_num_redundant_experts: int = Field(0, ge=0, le=4096, description=(
        "SGLang: expert copies loaded beside the routed experts (default 0)."))
    moe_dense_tp_size: int | None = Field(None, ge=1, le=64, description=(
        "SGLang: 1 builds the dense MLP layers whole on every GPU (default: split over tp)."))
    enable_dp_lm_head: bool = Field(False, description=(
        "SGLang with enable_dp_attention: the LM head over the attention group (default false)."))
    max_total_tokens: int | None = Field(None, ge=1, description="SGLang: a cap on the token pool (default none).")
    enable_lora: bool = Field(False, description="vLLM, SGLang: LoRA adapters' slots allocated at start (default false).")
    max_loras: int | None = Field(None, ge=1, le=1024, description=(
        "LoRA slots: vLLM max_loras (default 1), SGLang max_loras_per_batch (default 8)."))
    max_lora_rank: int | None = Field(None, ge=1, le=1024, description="Largest adapter rank (default 16).")
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
    concurrency: int | None = Field(None, ge=1, le=MAX_BATCH, description=(
        "Plan limits: requests of max_model_len tokens the deployment must hold at once (`kvplan plan -c`)."))
    prices: dict[str, float] | None = Field(None, description=(
        "Plan limits: GPU name to a price per GPU-hour; max_cost_per_hour needs them, and only priced GPUs are "
        "searched. Without `gpu`, the plan searches every catalog GPU of 40 GiB or more."))
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
        if (self.max_loras is not None or self.max_lora_rank is not None) and not self.enable_lora:
            raise ValueError("max_loras and max_lora_rank go with enable_lora: true")
        if asked & set(PLAN_LIMITS) and not self.concurrency:
            raise ValueError(f"{', '.join(sorted(asked & set(PLAN_LIMITS)))} need a concurrency (requests at once)")
        if "max_cost_per_hour" in asked and not self.prices:
            raise ValueError("max_cost_per_hour needs prices (GPU name: price per GPU-hour)")
        if asked & set(PLAN_LIMITS) and self.engine_choice().name not in SERVING:
            raise ValueError("plan limits need engine vllm, sglang or trtllm")
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
