"""Workload files for ``kvplan simulate`` and ``kvplan check``: pydantic models (unknown keys rejected), read and
validated into a ``WorkloadFile`` (with the engine override applied and an ``auto`` trace format resolved), and the
distributions they name as the core's samplers. Parsing only: kvplan.app.simulate plans the pool and the run."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvplan.core.engines.registry import SERVING
from kvplan.core.sim.model import allocator_spec
from kvplan.core.sim.workload import LengthDist
from kvplan.errors import ConfigError, InputError, KvplanError
from kvplan.io.filekinds import expect_kind
from kvplan.io.traces import MAX_TRACE_ROWS, MAX_TRACE_TOKENS, csv_rows, tokens, trace_file, trace_format
from kvplan.io.units import length_before, parse_size
from kvplan.io.yamlio import load_yaml, parse_model

DEFAULT_ALLOCATORS = ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged-16"]
# Bounds that keep every run finite and every number exact (integer picoseconds, integer slots).
# MAX_COUNT: measured on the 2-core build machine (benchmarks/bench_simulate.py), the vLLM-paper
# workload with 4 allocators and 1,000,000 requests at 2.5 req/s takes about 65 s of CPU in the
# workers plus 5 s to generate (at least 35 s of wall on 2 idle cores) and 0.2 GB (PSS); overloaded at
# 20 req/s about 1.1x the CPU (74 s). That is not far under the 30 s asked of a million (issue 11), so the cap
# stays; 10,000,000 (the former maximum) would take ten times as long.
MAX_COUNT = 1_000_000
MAX_TOKENS = 1 << 31  # any token count in a file (lengths, limits); contexts today reach 10M (Llama 4 Scout)
MAX_MODEL_LEN = 1 << 24
MAX_POOL_TOKENS = 1 << 40
MAX_POOL_BYTES = 1 << 60  # 1 EiB per GPU
MAX_ZIPF_RANGE = 1 << 20  # zipf keeps one weight per value
MAX_STEP_S = 3600.0
# vLLM's default without chunked prefill: max(max_model_len, _DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048)
# (vllm/config.py, SchedulerConfig), so the longest prompt always fits one step.
VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


class _Strict(BaseModel):
    # allow_inf_nan=False: ``gt=0`` alone lets ``.inf`` through, and NaN fails every comparison
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Serving(_Strict):
    model: str | None = Field(None, description="Bundled model name (kvplan models), hub id or config.json path; "
                                                "sizes the KV bytes per token and, with a gpu, the pool.")
    gpu: str | None = Field(None, description="GPU from the catalog (kvplan gpus): memory for the fit, bandwidth "
                                              "and TFLOP/s for the roofline step time.")
    gpu_memory: str | None = Field(None, description="Custom GPU memory, e.g. 24GiB (a GPU not in the catalog).")
    engine: str = Field("vllm", description="Engine whose memory budget sizes the pool (as kvplan fit): vllm "
                                            "(default), sglang or trtllm, optionally pinned to the release you "
                                            "run, e.g. vllm==0.11.0 (no version: the newest rules; see `kvplan "
                                            "engines`).")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs a layer is split over. Default 1.")
    pipeline_parallel_size: int = Field(1, ge=1, le=64, description="Pipeline stages. Default 1.")
    data_parallel_size: int = Field(1, ge=1, le=512, description="vLLM engines (-dp N), each its own scheduler and "
                                    "KV pool on tensor_parallel_size GPUs, behind vLLM's load balancer. Default 1.")
    api_server_count: int | None = Field(None, ge=1, le=512, description="vLLM --api-server-count with "
                                         "data_parallel_size > 1: the API servers, each a load balancer of its own; "
                                         "default: the release's (1; data_parallel_size from 0.15.0).")
    enable_expert_parallel: bool = Field(False, description="vLLM --enable-expert-parallel: an MoE model's experts "
                                         "whole on each of the data_parallel_size x tensor_parallel_size GPUs "
                                         "(sizes each engine's pool). Default false.")
    kv_cache_dtype: str = Field("auto", description="KV dtype (auto: the model's dtype; fp8, fp16, ...).")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="Share of GPU memory the engine "
                                                 "may use; default: the release's own (vLLM: 0.9, 0.92 from 0.20).")
    kv_pool_bytes: str | int | None = Field(None, description="KV pool per GPU, e.g. 12GiB; skips the fit (pool "
                                            "tokens = bytes / KV bytes per token).")
    kv_pool_tokens: int | None = Field(None, gt=0, le=MAX_POOL_TOKENS, description="KV pool in token slots; "
                                       "skips the fit and the bytes.")

    @field_validator("kv_pool_bytes")
    @classmethod
    def _size(cls, value: str | int | None) -> str | int | None:
        if value is None:
            return value
        try:
            size = parse_size(value, what="size")
        except (InputError, OverflowError, ValueError) as exc:
            raise ValueError(str(exc) if isinstance(exc, InputError) else f"size too large (got {str(value)[:20]}...)")
        if size > MAX_POOL_BYTES:
            raise ValueError(f"must be at most {MAX_POOL_BYTES} bytes (1 EiB per GPU; got {str(value)[:20]})")
        if size < 1:
            raise ValueError("must be at least 1 byte")
        return value


    @field_validator("engine")
    @classmethod
    def _known_engine(cls, value: str) -> str:
        from kvplan.core.profiles import parse_engine

        try:
            parse_engine(value, allowed=SERVING)
        except KvplanError as exc:
            raise ValueError(str(exc)) from None
        return value

class Constant(_Strict):
    dist: Literal["constant"] = Field(description="Every request has the same length.")
    value: int = Field(ge=1, le=MAX_TOKENS, description="Tokens.")


class Uniform(_Strict):
    dist: Literal["uniform"] = Field(description="Integers uniform over low..high, both included.")
    low: int = Field(ge=1, le=MAX_TOKENS, description="Smallest length, tokens.")
    high: int = Field(ge=1, le=MAX_TOKENS, description="Largest length, tokens (>= low).")


class Normal(_Strict):
    dist: Literal["normal"] = Field(description="Gaussian, rounded; values below 1 become 1.")
    mean: float = Field(gt=0, le=MAX_TOKENS, description="Mean, tokens.")
    std: float = Field(ge=0, le=MAX_TOKENS, description="Standard deviation, tokens.")


class LogNormal(_Strict):
    dist: Literal["lognormal"] = Field(description="Lognormal, rounded: long-tailed like chat lengths.")
    mean: float = Field(gt=0, le=MAX_TOKENS, description="The distribution's mean (tokens), not mu.")
    sigma: float = Field(1.0, gt=0, le=4, description="Sigma of the underlying normal (spread). Default 1.")


class Zipf(_Strict):
    dist: Literal["zipf"] = Field(description="Zipf over low..high: low is the most common length.")
    a: float = Field(1.2, gt=0, le=20, description="Exponent: larger favours short lengths more. Default 1.2.")
    low: int = Field(1, ge=1, le=MAX_TOKENS, description="Smallest length, tokens. Default 1.")
    high: int = Field(ge=1, le=MAX_TOKENS, description=f"Largest length, tokens; high - low < {MAX_ZIPF_RANGE}.")


class Empirical(_Strict):
    dist: Literal["empirical"] = Field(description="Lengths drawn from a CSV column, uniformly among its rows.")
    file: str = Field(description="CSV file, relative to the workload file.")
    column: str = Field(description="Column holding integer token counts.")


Length = Union[Constant, Uniform, Normal, LogNormal, Zipf, Empirical]


class Arrival(_Strict):
    process: Literal["poisson", "gamma", "all_at_once"] = Field(
        description="poisson (exponential gaps), gamma (gaps with a chosen cv) or all_at_once (every request at 0).")
    rate: float = Field(1.0, gt=0, description="Requests per second (poisson, gamma). Default 1.")
    cv: float = Field(1.0, ge=0.01, le=100, description="Gamma: coefficient of variation of the gaps (1 = Poisson, "
                                                        "above 1 bursty). Default 1.")



# -- sections for the vLLM v1 simulator (kvplan/io/workload_v1.py turns them into requests) --------------
class ConstantS(_Strict):
    dist: Literal["constant"] = Field(description="Always the same number of seconds.")
    value: float = Field(ge=0, le=MAX_STEP_S * 24, description="Seconds.")


class UniformS(_Strict):
    dist: Literal["uniform"] = Field(description="Seconds uniform over low..high.")
    low: float = Field(ge=0, le=MAX_STEP_S * 24, description="Fewest seconds.")
    high: float = Field(ge=0, le=MAX_STEP_S * 24, description="Most seconds (>= low).")


class ExponentialS(_Strict):
    dist: Literal["exponential"] = Field(description="Exponential seconds (memoryless, like Poisson gaps).")
    mean: float = Field(gt=0, le=MAX_STEP_S * 24, description="Mean seconds.")


class LogNormalS(_Strict):
    dist: Literal["lognormal"] = Field(description="Lognormal seconds: mostly short, a long tail.")
    mean: float = Field(gt=0, le=MAX_STEP_S * 24, description="The distribution's mean in seconds, not mu.")
    sigma: float = Field(1.0, gt=0, le=4, description="Sigma of the underlying normal. Default 1.")


Duration = Union[ConstantS, UniformS, ExponentialS, LogNormalS]


class Sessions(_Strict):
    count: int = Field(ge=1, le=MAX_COUNT, description="Conversations; they start at requests.arrival's times.")
    turns: Length = Field(discriminator="dist", description="Turns (requests) per conversation, a distribution.")
    think_time_s: Duration = Field(discriminator="dist", description=(
        "Seconds from one turn's arrival to the next turn's arrival (the user reads the answer and types): "
        "arrivals are fixed before the run, as vLLM's own benchmark harness fixes them; a note counts turns "
        "that arrived before the previous answer was finished."))
    system_prompt_tokens: int = Field(0, ge=0, le=MAX_TOKENS, description="Tokens every conversation starts "
                                      "with (one system prompt shared by all). Default 0.")
    message_tokens: Length = Field(discriminator="dist", description="The user's new message per turn, tokens.")
    output_tokens: Length = Field(discriminator="dist", description="The answer per turn, tokens. Turn k's prompt "
                                  "is turn k-1's prompt + its answer + the new message.")


class Documents(_Strict):
    count: int = Field(ge=1, le=MAX_ZIPF_RANGE, description="Shared documents (RAG passages, code files).")
    tokens: Length = Field(discriminator="dist", description="Tokens per document, a distribution.")
    popularity: float = Field(1.0, ge=0, le=20, description="Zipf exponent of which document a request reads: 0 "
                              "uniform, 1 the classic web popularity, larger concentrates on the first few. Default 1.")
    question_tokens: Length = Field(discriminator="dist", description="Tokens after the document (the request's "
                                    "own question); the prompt is document + question.")


class Offload(_Strict):
    cpu_memory: str | int = Field(description="CPU memory for KV blocks (vLLM's cpu_bytes_to_use), e.g. 64GiB.")
    bandwidth: str | int = Field(description="Host link bandwidth each way per second, e.g. 25GB/s (PCIe 4 x16 "
                                 "measures about 25 GB/s), 50GB/s (PCIe 5), 450GB/s (NVLink-C2C).")
    blocks_per_chunk: int = Field(1, ge=1, le=4096, description="GPU blocks per offloaded chunk (vLLM's "
                                  "blocks_per_chunk). Default 1.")

    @field_validator("cpu_memory", "bandwidth")
    @classmethod
    def _size(cls, value: str | int, info) -> str | int:
        text = value.removesuffix("/s").strip() if isinstance(value, str) else value
        try:
            size = parse_size(text, what=info.field_name)
        except (InputError, OverflowError, ValueError) as exc:
            raise ValueError(str(exc) if isinstance(exc, InputError) else f"too large (got {str(value)[:20]})") from None
        if info.field_name == "bandwidth" and size < 1:
            raise ValueError("must be above 0")
        return value

    def bytes(self) -> tuple[int, int]:
        """(CPU bytes, bandwidth in bytes per second)."""
        bw = self.bandwidth.removesuffix("/s").strip() if isinstance(self.bandwidth, str) else self.bandwidth
        return parse_size(self.cpu_memory, what="offload.cpu_memory"), parse_size(bw, what="offload.bandwidth")


class Requests(_Strict):
    trace: str | None = Field(None, description="CSV or JSONL trace, relative to the workload file: arrival time "
                              "(seconds or ISO time), prompt tokens, output tokens per row (the Azure LLM trace's "
                              "TIMESTAMP,ContextTokens,GeneratedTokens works as is).")
    limit: int | None = Field(None, ge=1, description="Use the first N trace rows (default: all).")
    time_scale: float = Field(1.0, gt=0, description="Divide trace arrival times by this (2 = twice the rate). "
                                                     "Default 1.")
    count: int | None = Field(None, ge=1, description=f"Synthetic: number of requests (at most {MAX_COUNT}).")
    seed: int = Field(0, description="Synthetic: random seed; the same seed gives the same requests. Default 0.")
    arrival: Arrival | None = Field(None, description="Synthetic: the arrival process.")
    prompt_tokens: Length | None = Field(None, discriminator="dist", description="Synthetic: prompt length "
                                         "distribution (tokens, including any shared prefix).")
    output_tokens: Length | None = Field(None, discriminator="dist", description="Synthetic: output length "
                                         "distribution (tokens per sequence; clipped to max_model_len).")
    trace_format: Literal["auto", "requests", "conversation", "mooncake"] = Field("auto", description=(
        "requests (arrival, prompt, output per row), conversation (JSONL: session_id, turn, timestamp in "
        "seconds, input_tokens = the whole prompt, output_tokens) or mooncake (JSONL: timestamp in ms, "
        "input_length, output_length, hash_ids of 512-token blocks); auto: from the first row's keys."))
    sessions: Sessions | None = Field(None, description="Multi-turn conversations (vllm-v1 simulator); the "
                                      "conversations start at requests.arrival's times.")
    documents: Documents | None = Field(None, description="Shared documents: each of requests.count requests "
                                        "reads one (vllm-v1 simulator); needs count, arrival, output_tokens.")

    @field_validator("count")
    @classmethod
    def _count(cls, count: int | None) -> int | None:
        if count is not None and count > MAX_COUNT:
            raise ValueError(f"at most {MAX_COUNT} requests (got {count}; a million take about a minute of CPU and "
                             f"0.2 GB); the memory shares settle long before: pass count: {MAX_COUNT} or fewer")
        return count


class Sharing(_Strict):
    shared_prefix_tokens: int = Field(0, ge=0, le=MAX_TOKENS, description=(
        "Tokens every prompt starts with (a system prompt). Part of the prompt length, not added to it: a prompt "
        "shorter than the prefix is raised to it (counted in a note). Must be below max_model_len. Default 0."))
    prefix_caching: bool = Field(True, description="Paged allocators hold the shared prefix's full blocks once for "
                                                   "all requests. Default true.")
    parallel_sampling: int = Field(1, ge=1, le=64, description="Sequences per request (n) sharing the prompt's "
                                                               "full blocks. Default 1.")
    beam_width: int = Field(1, ge=1, le=64, description="Beams per request, modelled as that many sequences "
                                                        "sharing the prompt. Default 1.")


class Scheduler(_Strict):
    max_num_seqs: int = Field(256, ge=1, le=1 << 20, description="Most sequences running at once. Default: under "
                              "vllm-v1 with a gpu, the OpenAI server's for that GPU and release (256 or 1024); "
                              "otherwise 256 (vLLM V0's default).")
    max_num_batched_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS, description=(
        "Tokens scheduled per step, e.g. 8192 or 8k. Default: under vllm-v1, the OpenAI server's for the GPU and "
        "release (2048 without a gpu); under the event engine max(max_model_len, 2048), vLLM V0's without "
        "chunked prefill."))
    max_model_len: int | None = Field(None, ge=2, le=MAX_MODEL_LEN, description="Longest sequence, prompt plus "
                                      "output, e.g. 2048 or 2k; default: the model's positions.")
    preemption: Literal["recompute", "swap"] = Field("recompute", description="When a paged pool runs out: drop "
                                                     "and prefill again (recompute) or swap to CPU. Default recompute.")
    model: Literal["auto", "event", "vllm-v1"] = Field("auto", description=(
        "Which simulator: event (kvplan's event-driven engine: every allocator, whole prompts in one step, one "
        "shared prefix), vllm-v1 (vLLM v1's scheduler step by step: chunked prefill, per-group pools for "
        "sliding/chunked/linear layers, prefix caching of any shared blocks, CPU offload). auto (default): vllm-v1 "
        "for every vLLM release whose engine is V1 (0.8.0 on), the event engine for V0 releases, SGLang and "
        "TensorRT-LLM unless the workload needs vllm-v1 (sessions, documents, a conversation or Mooncake trace, "
        "offload, a sliding/chunked/linear model, or a prompt longer than max_num_batched_tokens)."))
    long_prefill_token_threshold: int = Field(0, ge=0, le=MAX_TOKENS, description=(
        "vllm-v1: most prompt tokens one request prefills per step when several are waiting or running "
        "(0: no cap, vLLM's default)."))
    async_scheduling: bool | None = Field(None, description=(
        "vllm-v1: two batches in flight, each scheduled before the previous one's output is back (finished "
        "requests free their blocks a step later; sliding windows free on the processed tokens). Default: the "
        "engine release's (on from vLLM 0.14.0)."))

    @field_validator("max_num_batched_tokens", "max_model_len", mode="before")
    @classmethod
    def _length(cls, value: object, info) -> object:  # type: ignore[no-untyped-def]
        return length_before(value, info.field_name)  # 8k as `--max-model-len 8k` reads it


class StepTime(_Strict):
    model: Literal["roofline", "constant"] = Field("roofline", description=(
        "roofline: weights + KV read over the GPU's bandwidth plus prefill compute; constant: seconds per step. "
        "Default roofline (needs serving.model and a catalog gpu)."))
    seconds: float | None = Field(None, gt=0, le=MAX_STEP_S, description="Seconds per step (model: constant, or "
                                                                         "when no roofline is possible).")


class WorkloadFile(_Strict):
    name: str | None = Field(None, description="Shown in the output; default: the file name.")
    description: str | None = Field(None, description="Free text.")
    serving: Serving = Field(description="What serves: the model, the GPU and engine, or the KV pool directly.")
    requests: Requests = Field(description="The traffic: a trace, or count, arrival, prompt_tokens, output_tokens.")
    sharing: Sharing = Field(Sharing(), description="Shared prefix, parallel sampling, beams.")
    scheduler: Scheduler = Field(Scheduler(), description="The engine's scheduler limits.")
    allocators: list[str] = Field(default_factory=lambda: list(DEFAULT_ALLOCATORS), min_length=1, description=(
        "KV allocators compared: contiguous-max, contiguous-pow2, contiguous-oracle, paged-B (B tokens per block). "
        f"Default: under the event engine {', '.join(DEFAULT_ALLOCATORS)}; under vllm-v1 vLLM's paged pool alone."))
    placement: Literal["buddy", "first-fit"] = Field("buddy", description="How contiguous reservations are placed "
                                                                          "in the pool. Default buddy.")
    step_time: StepTime = Field(StepTime(), description="How long one scheduler step takes.")
    offload: Offload | None = Field(None, description="A CPU tier for KV blocks (vLLM's native CPU offloading; "
                                    "vllm-v1 simulator): its size and the host link's bandwidth.")

    @field_validator("allocators")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        for name in names:
            try:
                allocator_spec(name)
            except InputError as exc:
                raise ValueError(str(exc)) from None
        return names


def workload_schema() -> dict:
    return WorkloadFile.model_json_schema()


def length_dist(spec: Length, base: Path) -> LengthDist:
    """A length distribution of the file as the core's value (an empirical one read from its CSV, relative to
    ``base``, the workload file's folder)."""
    if isinstance(spec, Empirical):
        path = (base / spec.file) if not Path(spec.file).is_absolute() else Path(spec.file)
        values = []
        for i, row in csv_rows(path):
            if len(values) >= MAX_TRACE_ROWS:
                raise ConfigError(f"{path}: more than {MAX_TRACE_ROWS:,} rows; give a sample")
            try:
                value = tokens(row[spec.column])
            except (KeyError, ValueError, AttributeError):
                raise ConfigError(f"{path}: line {i}: column {spec.column!r} must hold an integer") from None
            if not 0 <= value < MAX_TRACE_TOKENS:
                raise ConfigError(f"{path}: line {i}: column {spec.column!r} must be in 0..{MAX_TRACE_TOKENS - 1} "
                                  f"(got {value})")
            values.append(value)
        return LengthDist(dist="empirical", values=tuple(values))
    if isinstance(spec, (Uniform, Zipf)) and spec.high < spec.low:
        raise ConfigError(f"{spec.dist}: high ({spec.high}) must be >= low ({spec.low})")
    if isinstance(spec, Zipf) and spec.high - spec.low >= MAX_ZIPF_RANGE:
        raise ConfigError(f"zipf: high - low must be below {MAX_ZIPF_RANGE} (got {spec.high - spec.low}); "
                          f"lengths past max_model_len are clipped anyway")
    return LengthDist(**spec.model_dump())


def load_workload_file(path: Path) -> WorkloadFile:
    data = load_yaml(path)
    expect_kind(path, data, "workload")  # empty, or a budgets file given to `kvplan simulate`
    model = parse_model(path, WorkloadFile, data)
    assert isinstance(model, WorkloadFile)
    return model


def read_workload(path: Path, engine: str | None = None) -> WorkloadFile:
    """The workload file with ``engine`` applied and an ``auto`` trace format resolved."""
    wf = load_workload_file(path)
    if engine is not None:
        from kvplan.core.profiles import parse_engine

        parse_engine(engine, allowed=SERVING)  # a clear error before any work
        wf = wf.model_copy(update={"serving": wf.serving.model_copy(update={"engine": engine})})
    r = wf.requests
    if r.trace and r.trace_format == "auto":
        fmt = trace_format(trace_file(path, r.trace))
        wf = wf.model_copy(update={"requests": r.model_copy(update={"trace_format": fmt})})
    return wf


def duration_sampler(spec: Duration, rng: random.Random) -> Callable[[], float]:
    """Seconds drawn from a duration of the file (think times)."""
    if isinstance(spec, ConstantS):
        return lambda: spec.value
    if isinstance(spec, UniformS):
        if spec.high < spec.low:
            raise ConfigError(f"think_time_s: high ({spec.high}) must be >= low ({spec.low})")
        return lambda: rng.uniform(spec.low, spec.high)
    if isinstance(spec, ExponentialS):
        return lambda: rng.expovariate(1 / spec.mean)
    mu = math.log(spec.mean) - spec.sigma**2 / 2
    return lambda: rng.lognormvariate(mu, spec.sigma)


def is_workload_file(ref: str) -> bool:
    """Whether ``ref`` names a workload file (a YAML file with a workload's keys) rather than a model."""
    from kvplan.io.filekinds import KINDS

    path = Path(ref)
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        return False
    data = load_yaml(path)
    return isinstance(data, dict) and len(KINDS["workload"].marks & data.keys()) >= 2
