"""Request sets for the vLLM v1 scheduler simulator (tests/fixtures/vllm_scheduler/<name>.requests.json):
pydantic models with unknown keys rejected, converted to kvplan.core.sim.v1's inputs.

The pool comes from the model spec and the vLLM release's rules exactly as ``kvplan fit`` plans it
(kvplan.core.engines.vllm.plan.plan_vllm: groups, block sizes, pages), with ``num_gpu_blocks`` as vLLM's
--num-gpu-blocks-override. The format (shared with tools/vllm_reference, which records vLLM's results for
the same files): a JSON object with the model (a kvplan model name, or an inline config.json as
``model_config``), tp, kv_cache_dtype, num_gpu_blocks, the scheduler settings, and requests, each a list of
``[segment id, tokens]`` prompt segments, an ``[segment id, tokens]`` output segment and its arrival step.
Token i of segment s is ``1 + (s * 1_000_003 + i * 7_919 + (s * i) % 104_729) % 30_000``: only equality matters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvplan.core.sim.v1 import OffloadConfig, SchedulerConfig, V1Inputs, V1Request, layout_from_plan
from kvplan.errors import ConfigError, KvplanError
from kvplan.io.yamlio import load_json, parse_model

MAX_TOKENS = 1 << 31
DEFAULT_ENGINE = "vllm==0.33.0"  # the release the reference fixtures were recorded with


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SchedulerSpec(_Strict):
    block_size: int | None = Field(None, ge=1, le=4096, description="KV block size; default: vLLM's for the model.")
    max_num_seqs: int = Field(..., ge=1, le=1 << 20)
    max_num_batched_tokens: int = Field(..., ge=1, le=MAX_TOKENS)
    max_model_len: int = Field(..., ge=2, le=MAX_TOKENS)
    enable_prefix_caching: bool = False
    long_prefill_token_threshold: int = Field(0, ge=0, le=MAX_TOKENS)
    max_num_partial_prefills: int = Field(1, ge=1, le=1, description="vLLM 0.33.0 has no partial-prefill "
                                          "limit any more (1: one long prefill at a time); only 1 is modelled.")
    async_scheduling: bool = Field(False, description="Two batches in flight (vLLM's default since 0.14.0): each "
                                   "batch is scheduled before the previous one's output is processed.")
    watermark: float = Field(0.0, ge=0.0, lt=1.0)
    pipeline_parallel_size: int = Field(1, ge=1, le=64, description="Pipeline stages: batches in flight (pp with "
                                        "the synchronous scheduler, pp + 1 with async on the V2 model runner).")
    v2_model_runner: bool = Field(False, description="vLLM's V2 model runner (async scheduling with pipeline "
                                  "parallelism: a request's decodes pp steps apart).")


class OffloadSpec(_Strict):
    cpu_bytes: int = Field(..., ge=0, le=1 << 60)
    bandwidth_bytes_per_s: float = Field(..., gt=0)
    blocks_per_chunk: int = Field(1, ge=1, le=4096)


class RequestSpec(_Strict):
    id: str = Field(..., min_length=1, max_length=200)
    arrival_step: int = Field(0, ge=0, le=1 << 40)
    prompt: list[tuple[int, int]] = Field(..., min_length=1)
    output: tuple[int, int]

    @model_validator(mode="after")
    def _lengths(self) -> RequestSpec:
        if any(n < 0 or n > MAX_TOKENS for _, n in self.prompt) or sum(n for _, n in self.prompt) < 1:
            raise ValueError("prompt segments need 0 to 2^31 tokens each and at least one token in all")
        if not 1 <= self.output[1] <= MAX_TOKENS:
            raise ValueError("the output segment needs 1 to 2^31 tokens")
        return self


class RequestSet(_Strict):
    name: str = ""
    description: str = ""
    model: str | None = None
    model_config_: dict[str, Any] | None = Field(None, alias="model_config")
    engine: str = Field(DEFAULT_ENGINE, description="vLLM release whose rules plan the pool and schedule.")
    tp: int = Field(1, ge=1, le=64)
    kv_cache_dtype: str = "auto"
    num_gpu_blocks: int = Field(..., ge=2, le=1 << 40, description="The pool, as num_gpu_blocks_override sets it.")
    scheduler: SchedulerSpec
    offload: OffloadSpec | None = None
    requests: list[RequestSpec] = Field(..., min_length=1)

    @model_validator(mode="after")
    def _one_model(self) -> RequestSet:
        if (self.model is None) == (self.model_config_ is None):
            raise ValueError("give exactly one of model (a kvplan model name) and model_config (a config.json)")
        ids = [r.id for r in self.requests]
        if len(set(ids)) != len(ids):
            raise ValueError("request ids must be unique")
        return self


def load_request_set(path: Path) -> RequestSet:
    return parse_model(path, RequestSet, load_json(path))  # type: ignore[return-value]


def request_set_inputs(rs: RequestSet, *, origin: str = "request set") -> V1Inputs:
    """The simulator's inputs: the model's vLLM pool (plan_vllm with the block override), the scheduler, the requests."""
    from kvplan.core.engines.vllm.plan import plan_vllm
    from kvplan.core.profiles import parse_engine
    from kvplan.core.spec import LinearLayer

    try:
        if rs.model is not None:
            from kvplan.io.models import load_model

            spec = load_model(rs.model)
        else:
            from kvplan.io.hf_config import spec_from_hf_config

            spec = spec_from_hf_config(rs.model_config_, name=rs.name or "model_config", origin=f"{origin}: model_config")
        choice = parse_engine(rs.engine, allowed=("vllm",))
        sch = rs.scheduler
        linear = any(isinstance(layer, LinearLayer) for layer in spec.layers)
        plan = plan_vllm(spec.layers, 0, sch.max_model_len, choice.profile, model_dtype=spec.dtype,
                         in_flight_tokens=sch.max_num_batched_tokens * (
                             (sch.pipeline_parallel_size + 1 if sch.v2_model_runner else 2) if sch.async_scheduling
                             else sch.pipeline_parallel_size),
                         kv_dtype=rs.kv_cache_dtype, tp=rs.tp,
                         block_size=sch.block_size, num_gpu_blocks_override=rs.num_gpu_blocks,
                         # vLLM turns Mamba's align mode on with prefix caching (MambaModelConfig)
                         mamba_cache_mode="align" if (linear and sch.enable_prefix_caching) else "none")
        layout = layout_from_plan(plan, sch.max_model_len)
        scheduler = SchedulerConfig(max_num_seqs=sch.max_num_seqs, max_num_batched_tokens=sch.max_num_batched_tokens,
                                    max_model_len=sch.max_model_len, enable_prefix_caching=sch.enable_prefix_caching,
                                    long_prefill_token_threshold=sch.long_prefill_token_threshold,
                                    watermark=sch.watermark, async_scheduling=sch.async_scheduling,
                                    pipeline_parallel_size=sch.pipeline_parallel_size,
                                    v2_model_runner=sch.v2_model_runner,
                                    rules=choice.profile.rules.scheduler)
        offload = (OffloadConfig(cpu_bytes=rs.offload.cpu_bytes, bandwidth_bytes_per_s=rs.offload.bandwidth_bytes_per_s,
                                 blocks_per_chunk=rs.offload.blocks_per_chunk) if rs.offload else None)
    except KvplanError as exc:
        raise ConfigError(f"{origin}: {exc}") from None
    requests = tuple(V1Request(id=r.id, prompt=tuple(r.prompt), output=r.output, arrival_step=r.arrival_step)
                     for r in rs.requests)
    return V1Inputs(requests=requests, scheduler=scheduler, layout=layout, offload=offload,
                    notes=tuple(n for n in (choice.note,) if n))


def read_request_set(path: Path) -> V1Inputs:
    return request_set_inputs(load_request_set(path), origin=str(path))
