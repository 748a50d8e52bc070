"""Workload files for ``kvplan simulate``: pydantic models (unknown keys rejected), trace readers
(CSV, JSONL, and the Azure LLM inference trace's ``TIMESTAMP,ContextTokens,GeneratedTokens``), and
the conversion to the simulator's core values."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvplan.core.sim.model import (AllocatorSpec, Preemption, RequestArrays, SimConfig, SimRequest, StepModel,
                                   allocator_spec)
from kvplan.core.sim.workload import Arrivals, LengthDist, clip_columns, synthetic_columns
from kvplan.errors import ConfigError, InputError, KvplanError
from kvplan.io.filekinds import expect_kind
from kvplan.io.paths import probe, shown
from kvplan.io.units import length_before, parse_size
from kvplan.io.yamlio import iter_lines, load_yaml, parse_json, parse_model
from kvplan.core.engines.registry import SERVING

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
    max_num_seqs: int = Field(256, ge=1, le=1 << 20, description="Most sequences running at once. Default 256 "
                                                                 "(vLLM V0's default).")
    max_num_batched_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS, description=(
        "Prompt tokens admitted per step, e.g. 8192 or 8k. Default max(max_model_len, 2048), vLLM's without "
        "chunked prefill."))
    max_model_len: int | None = Field(None, ge=2, le=MAX_MODEL_LEN, description="Longest sequence, prompt plus "
                                      "output, e.g. 2048 or 2k; default: the model's positions.")
    preemption: Literal["recompute", "swap"] = Field("recompute", description="When a paged pool runs out: drop "
                                                     "and prefill again (recompute) or swap to CPU. Default recompute.")
    model: Literal["auto", "event", "vllm-v1"] = Field("auto", description=(
        "Which simulator: event (kvplan's event-driven engine: every allocator, whole prompts in one step, one "
        "shared prefix), vllm-v1 (vLLM v1's scheduler step by step: chunked prefill, per-group pools for "
        "sliding/chunked/linear layers, prefix caching of any shared blocks, CPU offload; paged only). auto "
        "(default): vllm-v1 when the workload needs it (sessions, documents, a conversation or Mooncake trace, "
        "offload, a sliding/chunked/linear model, or a prompt longer than max_num_batched_tokens), else event."))
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
        f"Default {', '.join(DEFAULT_ALLOCATORS)}."))
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


@dataclass(frozen=True, kw_only=True)
class Workload:
    name: str
    requests: RequestArrays | list[SimRequest]  # RequestArrays from files: flat columns, read as SimRequest values
    config: SimConfig
    allocators: list[AllocatorSpec]
    bytes_per_token: int  # KV bytes of one token slot on one GPU (0 when the pool was given in tokens)
    pool_bytes: int
    notes: tuple[str, ...]
    num_blocks: int = 0  # the engine's pool blocks when `kvplan fit` sized the pool (0: given directly)


def workload_schema() -> dict:
    return WorkloadFile.model_json_schema()


# -- traces ---------------------------------------------------------------------------------------
_ARRIVAL_KEYS = ("arrival", "arrival_time", "arrival_s", "timestamp", "time")
_PROMPT_KEYS = ("prompt_tokens", "input_tokens", "contexttokens", "prompt_len", "input_len")
_OUTPUT_KEYS = ("output_tokens", "generated_tokens", "generatedtokens", "output_len")


def _pick(row: dict[str, str], keys: tuple[str, ...]) -> str | None:
    lower = {k.lower().strip(): v for k, v in row.items() if k is not None}
    for key in keys:
        if key in lower:
            return lower[key]
    return None


# Bounds on trace values: arrivals within 10^12 s (unix time is 1.7e9 s), token counts below 2^31
# (the longest contexts served are 10M tokens, Llama 4 Scout, x200), rows as many as requests.count.
_MAX_TRACE_SECONDS = 1e12
_MAX_TRACE_TOKENS = 1 << 31
_MAX_TRACE_ROWS = 10_000_000


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        text = value.strip()
        try:
            if "." in text:  # the Azure trace has 7 fractional digits; datetime takes 6
                head, frac = text.split(".", 1)
                if not (frac.isascii() and frac.isdigit()):
                    raise ValueError(value)
                seconds = datetime.fromisoformat(head).timestamp() + float("0." + frac)
            else:
                seconds = datetime.fromisoformat(text).timestamp()
        except (OverflowError, OSError):
            raise ValueError(value) from None
    if not math.isfinite(seconds) or abs(seconds) > _MAX_TRACE_SECONDS:
        raise ValueError(value)
    return seconds


def _tokens(value: str) -> int:
    text = value.strip()
    if len(text) > 12:  # int() of a 5,000-digit string is slow and then absurd anyway
        raise ValueError(value)
    return int(text)


def _csv_rows(path: Path) -> Iterator[tuple[int, dict[str | None, str]]]:
    """(line number, row) of a CSV with a header, read lazily."""
    current = 0

    def lines() -> Iterator[str]:
        nonlocal current
        for number, line in iter_lines(path):
            current = number
            yield line

    try:
        reader = csv.DictReader(lines())
        if not reader.fieldnames:
            raise ConfigError(f"{path}: empty trace")
        for row in reader:
            yield current, row
    except csv.Error as exc:
        raise ConfigError(f"{path}: line {current}: not valid CSV: {exc}") from None


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict]]:
    for number, line in iter_lines(path):
        if not line.strip():
            continue
        row = parse_json(line, str(path), line=number)
        if not isinstance(row, dict):
            raise ConfigError(f"{path}: line {number}: expected a JSON object per line (got {type(row).__name__})")
        yield number, row


def read_trace(path: Path, limit: int | None = None) -> list[tuple[float, int, int]]:
    """(arrival seconds from the first request, prompt tokens, output tokens), one per row.

    Rows are read lazily: with ``limit`` the rest of the file is never read.
    """
    rows: Iterator[tuple[int, dict]] = (
        _jsonl_rows(path) if path.suffix in (".jsonl", ".ndjson") else _csv_rows(path))  # type: ignore[assignment]
    out: list[tuple[float, int, int]] = []
    t0 = None
    for line, row in rows:
        if limit and len(out) >= limit:
            break
        if len(out) >= _MAX_TRACE_ROWS:
            raise ConfigError(f"{path}: more than {_MAX_TRACE_ROWS:,} rows; set requests.limit to use the first N")
        row = {str(k): "" if v is None else str(v) for k, v in row.items() if k is not None}
        a, p, o = _pick(row, _ARRIVAL_KEYS), _pick(row, _PROMPT_KEYS), _pick(row, _OUTPUT_KEYS)
        if a is None or p is None or o is None:
            raise ConfigError(f"{path}: line {line}: needs an arrival time ({'/'.join(_ARRIVAL_KEYS[:2])}), prompt "
                              f"tokens ({'/'.join(_PROMPT_KEYS[:3])}) and output tokens ({'/'.join(_OUTPUT_KEYS[:2])})")
        try:
            t = _seconds(a)
        except ValueError:
            raise ConfigError(f"{path}: line {line}: cannot read arrival {a[:40]!r}: not a finite time in seconds (within "
                              f"{_MAX_TRACE_SECONDS:.0e}) or an ISO date") from None
        try:
            prompt, output = _tokens(p), _tokens(o)
        except ValueError:
            raise ConfigError(f"{path}: line {line}: cannot read token counts: must be whole numbers "
                              f"(got prompt {p[:40]!r}, output {o[:40]!r})") from None
        if not (0 <= prompt < _MAX_TRACE_TOKENS and 0 <= output < _MAX_TRACE_TOKENS):
            raise ConfigError(f"{path}: line {line}: token counts must be in 0..{_MAX_TRACE_TOKENS - 1} "
                              f"(got {prompt}, {output})")
        t0 = t if t0 is None else t0
        out.append((t - t0, prompt, output))
    if not out:
        raise ConfigError(f"{path}: the trace has no requests")
    return out


def _length(spec: Length, base: Path) -> LengthDist:
    if isinstance(spec, Empirical):
        path = (base / spec.file) if not Path(spec.file).is_absolute() else Path(spec.file)
        values = []
        for i, row in _csv_rows(path):
            if len(values) >= _MAX_TRACE_ROWS:
                raise ConfigError(f"{path}: more than {_MAX_TRACE_ROWS:,} rows; give a sample")
            try:
                value = _tokens(row[spec.column])
            except (KeyError, ValueError, AttributeError):
                raise ConfigError(f"{path}: line {i}: column {spec.column!r} must hold an integer") from None
            if not 0 <= value < _MAX_TRACE_TOKENS:
                raise ConfigError(f"{path}: line {i}: column {spec.column!r} must be in 0..{_MAX_TRACE_TOKENS - 1} "
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


def trace_file(origin: Path, trace: str) -> Path:
    """``requests.trace`` of the workload file ``origin``: absolute, or relative to the file's folder."""
    path = Path(trace) if Path(trace).is_absolute() else origin.parent / trace
    try:
        found = probe(path) is not None
    except ConfigError as exc:  # the OS refused the path: say which file named it
        raise ConfigError(f"{origin}: requests.trace: {exc}") from None
    if not found:
        raise ConfigError(f"{origin}: requests.trace: {shown(path)}: no such file")
    return path


def build_requests(wf: WorkloadFile, origin: Path, *, max_model_len: int,
                   notes: list[str] | None = None) -> RequestArrays:
    """The requests; ``notes`` gets a line when prompts shorter than the shared prefix were raised to it."""
    base = origin.parent
    r, sh = wf.requests, wf.sharing
    if r_v1_only(wf):  # an "auto" trace format is resolved before (workload_v1.resolve_trace_format)
        return []  # sessions, documents and conversation traces: kvplan/io/workload_v1.py builds them
    n = max(sh.parallel_sampling, sh.beam_width)
    prefix = sh.shared_prefix_tokens
    if r.trace:
        path = trace_file(origin, r.trace)
        rows = read_trace(path, r.limit)
        times = [t / r.time_scale for t, _, _ in rows]
        prompts = [p for _, p, _ in rows]
        _note_raised(notes, sum(1 for p in prompts if p < prefix), len(rows), prefix)
        return _requests(origin, times, prompts, [o for _, _, o in rows], max_model_len=max_model_len,
                         shared_prefix=prefix, n=n, clip_prompt=False)
    missing = [k for k in ("count", "arrival", "prompt_tokens", "output_tokens") if getattr(r, k) is None]
    if missing:
        raise ConfigError(f"{origin}: requests: give a trace, or count, arrival, prompt_tokens and output_tokens "
                          f"(missing: {', '.join(missing)})")
    assert r.count and r.arrival and r.prompt_tokens and r.output_tokens
    lengths = []
    for key, spec in (("prompt_tokens", r.prompt_tokens), ("output_tokens", r.output_tokens)):
        try:
            lengths.append(_length(spec, base))
        except ConfigError as exc:
            raise ConfigError(f"{origin}: requests.{key}: {exc}") from None
    times, prompts, outputs = synthetic_columns(
        count=r.count, arrivals=Arrivals(process=r.arrival.process, rate=r.arrival.rate, cv=r.arrival.cv),
        prompt=lengths[0], output=lengths[1], seed=r.seed)
    _note_raised(notes, sum(1 for p in prompts if p < prefix), len(prompts), prefix)
    return _requests(origin, times, prompts, outputs, max_model_len=max_model_len, shared_prefix=prefix, n=n)


def _requests(origin: Path, times: list[float], prompts: list[int], outputs: list[int], **kw) -> RequestArrays:
    try:
        return clip_columns(times, prompts, outputs, **kw)
    except InputError as exc:
        raise ConfigError(f"{origin}: requests: {exc}") from None


def _note_raised(notes: list[str] | None, raised: int, total: int, prefix: int) -> None:
    if notes is not None and raised:
        notes.append(f"{raised:,} of {total:,} prompts were shorter than the {prefix:,}-token shared prefix and were "
                     f"raised to it (the prefix is part of the prompt)")


def preemption(wf: WorkloadFile) -> Preemption:
    return Preemption(wf.scheduler.preemption)


def step_model_constant(seconds: float) -> StepModel:
    return StepModel(base_ps=round(seconds * 10**12), per_token_ps=0, per_prefill_token_ps=0)


def pool_override(wf: WorkloadFile) -> tuple[int | None, int | None]:
    """(pool bytes, pool tokens) when the file gives the KV pool directly."""
    s = wf.serving
    size = parse_size(s.kv_pool_bytes, what="serving.kv_pool_bytes") if s.kv_pool_bytes is not None else None
    return size, s.kv_pool_tokens


def r_v1_only(wf: WorkloadFile) -> bool:
    """Requests only the vllm-v1 simulator builds (sessions, documents, a conversation or Mooncake trace)."""
    r = wf.requests
    return r.sessions is not None or r.documents is not None or r.trace_format in ("conversation", "mooncake")


def resolve_workload(path: Path, *, engine: str | None = None, wf: WorkloadFile | None = None) -> Workload:
    """Read a workload file and turn it into requests, a simulator config and allocators; ``engine``
    (NAME or NAME==VERSION) overrides the file's serving.engine; ``wf``: the file already read."""
    from kvplan.core.capacity.common import FitRequest, model_weights
    from kvplan.core.capacity.fit import fit
    from kvplan.core.sizing import slot_bytes_per_gpu
    from kvplan.io.gpus import get_gpu
    from kvplan.io.models import load_model

    wf = load_workload_file(path) if wf is None else wf
    if engine is not None:
        from kvplan.core.profiles import parse_engine

        parse_engine(engine, allowed=SERVING)  # a clear error before any work
        wf = wf.model_copy(update={"serving": wf.serving.model_copy(update={"engine": engine})})
    s = wf.serving
    notes: list[str] = []
    try:
        spec = load_model(s.model) if s.model else None
        gpu = get_gpu(s.gpu, memory=s.gpu_memory) if (s.gpu or s.gpu_memory) else None
    except KvplanError as exc:
        raise type(exc)(f"{path}: serving: {exc}") from None
    max_len = wf.scheduler.max_model_len or (spec.max_model_len if spec else 0)
    if max_len < 2:
        raise ConfigError(f"{path}: scheduler.max_model_len is required when serving.model gives none")
    if wf.sharing.shared_prefix_tokens >= max_len:
        raise ConfigError(f"{path}: sharing.shared_prefix_tokens ({wf.sharing.shared_prefix_tokens}) must be below "
                          f"max_model_len ({max_len}): every prompt includes the prefix")
    requests = build_requests(wf, path, max_model_len=max_len, notes=notes)
    bpt = 0
    if spec is not None:
        bpt = slot_bytes_per_gpu(spec, kv_dtype=s.kv_cache_dtype, tp=s.tensor_parallel_size,
                                 pp=s.pipeline_parallel_size)
        if any(layer.kind.value in ("sliding", "chunked", "linear", "compressed") for layer in spec.layers):
            notes.append("the simulator holds every token in every attention layer (sliding windows, "
                         "fixed linear-attention states and DeepSeek-V4's compressed entries are not modelled)")
    pool_bytes, pool_tokens = pool_override(wf)
    fit_result = None
    if pool_tokens is None and spec is not None and bpt == 0:
        raise ConfigError(f"{path}: {spec.name} holds no per-token KV cache (no attention layers); "
                          "give serving.kv_pool_tokens")
    if pool_tokens is None:
        if spec is None:
            raise ConfigError(f"{path}: serving needs a model (or kv_pool_tokens) to size the KV pool")
        if pool_bytes is None:
            if gpu is None:
                raise ConfigError(f"{path}: serving needs a gpu (or kv_pool_bytes / kv_pool_tokens)")
            from kvplan.core.profiles import parse_engine

            choice = parse_engine(s.engine)
            fit_result = fit(FitRequest(spec=spec, gpu=gpu, engine=choice.name, profile=choice.profile,
                                        tp=s.tensor_parallel_size,
                                        pp=s.pipeline_parallel_size, kv_dtype=s.kv_cache_dtype,
                                        gpu_memory_utilization=s.gpu_memory_utilization, max_model_len=max_len,
                                        max_num_seqs=wf.scheduler.max_num_seqs,
                                        max_num_batched_tokens=wf.scheduler.max_num_batched_tokens))
            pool_bytes = fit_result.kv_cache_memory_bytes
            # fit's own token count (whole blocks, per the engine's layout), so simulate and fit agree
            pool_tokens = fit_result.kv_cache_tokens
            notes.append(f"KV pool from `kvplan fit` ({choice.name} {choice.version} rules): "
                         f"{pool_bytes / (1 << 30):.2f} GiB per GPU, "
                         f"{pool_tokens:,} KV cache tokens")
            if pool_bytes // bpt != pool_tokens:
                notes.append(f"the pool's bytes over {bpt:,} B per token would give {pool_bytes // bpt:,} token slots; "
                             f"the engine counts {pool_tokens:,} (whole blocks of its layout)")
        else:
            pool_tokens = pool_bytes // bpt
    else:
        pool_bytes = pool_tokens * bpt
    if pool_tokens < 1:
        raise ConfigError(f"{path}: the KV pool holds no token ({pool_bytes:,} B); give more memory or a smaller model")

    mnbt = wf.scheduler.max_num_batched_tokens or max(max_len, VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS)
    if wf.step_time.model == "constant" or spec is None or gpu is None or not gpu.hbm_bandwidth_bytes_per_s:
        seconds = wf.step_time.seconds
        if seconds is None:
            raise ConfigError(f"{path}: step_time.seconds is needed (a roofline needs serving.model and a catalog gpu)")
        step = step_model_constant(seconds)
    else:
        bw = gpu.hbm_bandwidth_bytes_per_s
        weights = fit_result.breakdown.weights if fit_result else None
        params = 0
        if spec.arch is not None:
            wb, _ = model_weights(FitRequest(spec=spec, gpu=gpu, tp=s.tensor_parallel_size, pp=s.pipeline_parallel_size))
            weights = weights if weights is not None else (wb.per_gpu_bytes if wb else 0)
            from kvplan.core.weights import count_params

            params = count_params(spec, spec.arch).active(spec.arch.moe)
        prefill_ps = 0
        if gpu.bf16_dense_tflops:
            flops = gpu.bf16_dense_tflops * 1e12
            prefill_ps = round(2 * params / (s.tensor_parallel_size * s.pipeline_parallel_size) / flops * 1e12)
        else:
            notes.append(f"{gpu.name} has no bf16 TFLOP/s in the catalog: prefill compute is not timed "
                         "(steps take the weight and KV reads only)")
        step = StepModel(
            base_ps=round((weights or 0) / bw * 1e12),
            per_token_ps=round(bpt / bw * 1e12),
            per_prefill_token_ps=prefill_ps,
        )
    n_max = max(wf.sharing.parallel_sampling, wf.sharing.beam_width)
    if wf.sharing.beam_width > 1:
        notes.append("beam search is modelled as beam_width sequences sharing the prompt (beams do not fork)")
    config = SimConfig(pool_slots=pool_tokens, max_num_seqs=wf.scheduler.max_num_seqs, max_num_batched_tokens=mnbt,
                       max_model_len=max_len, step=step, shared_prefix=wf.sharing.shared_prefix_tokens,
                       prefix_caching=wf.sharing.prefix_caching, preemption=preemption(wf))
    if n_max > wf.scheduler.max_num_seqs:
        raise ConfigError(f"{path}: {n_max} sequences per request exceed scheduler.max_num_seqs {wf.scheduler.max_num_seqs}")
    allocators = [allocator_spec(a, placement=wf.placement) for a in wf.allocators]
    return Workload(name=wf.name or path.stem, requests=requests, config=config, allocators=allocators,
                    bytes_per_token=bpt, pool_bytes=pool_bytes or 0, notes=tuple(notes),
                    num_blocks=fit_result.num_blocks if fit_result is not None else 0)
