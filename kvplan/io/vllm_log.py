"""Read a vLLM startup log (V0 and V1 formats) into the figures of its memory budget.

Log formats (vllm/v1/worker/gpu_worker.py, vllm/worker/worker.py, vllm/v1/core/kv_cache_utils.py,
vllm/executor/executor_base.py across versions; see docs/engine-research.md section 1.8 and 1.5):
- ``Initializing a V1 LLM engine (v0.8.5) with config: model='...', ..., dtype=torch.bfloat16, max_seq_len=8192,
  ..., tensor_parallel_size=1, pipeline_parallel_size=1, ..., kv_cache_dtype=auto, ...`` (V0: ``an LLM engine``)
- ``Model loading took 14.9889 GiB and 3.2 seconds`` (newer: ``... GiB memory and ...``; V0 <= 0.6:
  ``Loading model weights took 14.9888 GB``, computed in GiB)
- ``Memory profiling takes 2.1 seconds`` / ``the current vLLM instance can use total_gpu_memory (79.19GiB)
  x gpu_memory_utilization (0.90) = 71.27GiB`` / ``model weights take 14.99GiB; non_torch_memory takes
  0.13GiB; PyTorch activation peak memory takes 4.35GiB; the rest of the memory reserved for KV Cache is
  51.80GiB.``
- ``Memory profiling results: total_gpu_memory=79.15GiB initial_memory_usage=... peak_torch_memory=...
  non_torch_memory=...GiB kv_cache_size=...GiB gpu_memory_utilization=0.90`` (V0 0.6.3-0.6.4)
- ``Available KV cache memory: 51.8 GiB``; ``GPU KV cache size: 424,336 tokens``;
  ``Maximum concurrency for 8,192 tokens per request: 51.80x``; V0 ``# GPU blocks: 27000, # CPU blocks: 2048``
  (``# cuda blocks`` in 0.7/0.8); ``Graph capturing finished in 13 secs, took 0.58 GiB``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from kvplan.errors import ConfigError
from kvplan.io.yamlio import read_text

GiB = 1 << 30
_NUM = r"(-?[0-9][0-9,]*(?:\.[0-9]+)?)"


def _gib(text: str) -> int:
    return int(round(float(text.replace(",", "")) * GiB))


def _int(text: str) -> int:
    return int(float(text.replace(",", "")))


@dataclass(kw_only=True)
class VLLMLog:
    path: str = ""
    version: str | None = None
    generation: str | None = None  # "V0" or "V1"
    model: str | None = None
    dtype: str | None = None
    max_seq_len: int | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    kv_cache_dtype: str | None = None
    max_num_batched_tokens: int | None = None
    enforce_eager: bool | None = None
    block_size: int | None = None
    gpu_memory_utilization: float | None = None
    total_gpu_memory_bytes: int | None = None
    weights_bytes: int | None = None
    non_torch_bytes: int | None = None
    activation_bytes: int | None = None
    kv_cache_memory_bytes: int | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    concurrency_tokens: int | None = None
    num_gpu_blocks: int | None = None
    cuda_graph_bytes: int | None = None
    matched: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("matched", "path")}


def _config_fields(log: VLLMLog, line: str) -> None:
    def grab(key: str) -> str | None:
        m = re.search(rf"\b{key}=('([^']*)'|[^,)\s]+)", line)
        if not m:
            return None
        return m.group(2) if m.group(2) is not None else m.group(1)

    log.model = grab("model") or log.model
    dtype = grab("dtype")
    log.dtype = dtype.removeprefix("torch.") if dtype else log.dtype
    for key, attr in (("max_seq_len", "max_seq_len"), ("tensor_parallel_size", "tensor_parallel_size"),
                      ("pipeline_parallel_size", "pipeline_parallel_size"), ("block_size", "block_size")):
        value = grab(key)
        if value and value.isdigit():
            setattr(log, attr, int(value))
    log.kv_cache_dtype = grab("kv_cache_dtype") or log.kv_cache_dtype
    eager = grab("enforce_eager")
    if eager in ("True", "False"):
        log.enforce_eager = eager == "True"


_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("init", re.compile(r"Initializing an? (V0 |V1 )?LLM engine \(v([^)]+)\) with config: (.*)")),
    ("max_len", re.compile(rf"Using max model len {_NUM}")),
    ("mnbt", re.compile(rf"max_num_batched_tokens(?:=| to ){_NUM}")),
    ("weights", re.compile(rf"(?:Model loading took|Loading model weights took) {_NUM} ?(?:GiB|GB)")),
    ("total", re.compile(rf"total_gpu_memory \({_NUM} ?GiB\) x gpu_memory_utilization \({_NUM}\)")),
    ("breakdown", re.compile(rf"model weights take {_NUM} ?GiB; non_torch_memory takes {_NUM} ?GiB; "
                             rf"PyTorch activation peak memory takes {_NUM} ?GiB; the rest of the memory reserved "
                             rf"for KV Cache is {_NUM} ?GiB")),
    ("v0_results", re.compile(rf"Memory profiling results: total_gpu_memory={_NUM}GiB .*?peak_torch_memory={_NUM}GiB "
                              rf".*?non_torch_memory={_NUM}GiB kv_cache_size={_NUM}GiB gpu_memory_utilization={_NUM}")),
    ("available", re.compile(rf"Available KV cache memory: {_NUM} ?GiB")),
    ("tokens", re.compile(rf"GPU KV cache size: {_NUM} tokens")),
    ("concurrency", re.compile(rf"Maximum concurrency for {_NUM} tokens per request: {_NUM}x")),
    ("blocks", re.compile(rf"(?:# )?(?:GPU|CUDA|cuda|gpu) blocks: {_NUM}")),
    ("graphs", re.compile(rf"Graph capturing finished in {_NUM} secs?, took {_NUM} ?GiB")),
]


def parse_vllm_log(text: str, path: str = "") -> VLLMLog:
    log = VLLMLog(path=path)
    peak_torch = 0
    for line in text.splitlines():
        for name, pattern in _PATTERNS:
            m = pattern.search(line)
            if not m:
                continue
            log.matched.append(name)
            if name == "init":
                log.generation = "V1" if m.group(1) == "V1 " else "V0"
                log.version = m.group(2)
                _config_fields(log, m.group(3))
            elif name == "weights":
                log.weights_bytes = _gib(m.group(1))
            elif name == "total":
                log.total_gpu_memory_bytes, log.gpu_memory_utilization = _gib(m.group(1)), float(m.group(2))
            elif name == "breakdown":
                log.weights_bytes = _gib(m.group(1))
                log.non_torch_bytes, log.activation_bytes = _gib(m.group(2)), _gib(m.group(3))
                log.kv_cache_memory_bytes = _gib(m.group(4))
            elif name == "v0_results":
                # v0.6.3-0.6.4: peak_torch_memory includes the weights; activation = peak - weights below
                log.total_gpu_memory_bytes = _gib(m.group(1))
                peak_torch = _gib(m.group(2))
                log.non_torch_bytes = _gib(m.group(3))
                log.kv_cache_memory_bytes = _gib(m.group(4))
                log.gpu_memory_utilization = float(m.group(5))
            elif name == "max_len":
                log.max_seq_len = _int(m.group(1))
            elif name == "mnbt":
                log.max_num_batched_tokens = _int(m.group(1))
            elif name == "available":
                log.kv_cache_memory_bytes = _gib(m.group(1))
            elif name == "tokens":
                log.kv_cache_tokens = _int(m.group(1))
            elif name == "concurrency":
                log.concurrency_tokens, log.max_concurrency = _int(m.group(1)), float(m.group(2).replace(",", ""))
            elif name == "blocks":
                log.num_gpu_blocks = _int(m.group(1))
            elif name == "graphs":
                log.cuda_graph_bytes = _gib(m.group(2))
    if log.generation is None and {"breakdown", "v0_results", "blocks"} & set(log.matched):
        log.generation = "V0"  # only V0's worker printed these lines
    elif log.generation is None and {"available", "tokens"} & set(log.matched):
        log.generation = "V1"
    if "v0_results" in log.matched and log.weights_bytes is not None and log.activation_bytes is None:
        log.activation_bytes = peak_torch - log.weights_bytes
    return log


def read_vllm_log(path: Path) -> VLLMLog:
    log = parse_vllm_log(read_text(path), str(path))
    if not set(log.matched) - {"init"}:
        raise ConfigError(
            f"{path}: no vLLM memory lines found (looked for 'Model loading took', 'Memory profiling', "
            "'Available KV cache memory', 'GPU KV cache size', '# GPU blocks'); is this a vLLM startup log?"
        )
    return log
