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
- Lines a served log has before or beside the engine's config line (vllm/entrypoints/openai/api_server.py,
  entrypoints/utils.py): ``vLLM API server version 0.11.0`` (0.6-0.11; ``0.11.0rc3``, ``0.11.0+582e4e37.nv25.11``),
  0.12+'s banner ``... █  version 0.19.0`` / ``█  model   meta-llama/...``, and ``non-default args: {'model': ...,
  'tensor_parallel_size': 2, ...}`` (a Python dict literal; the engine's own config line, read later, wins).
- vLLM 0.19's worker (v1/worker/gpu_worker.py, DEBUG): ``worker init memory snapshot: torch_peak=0.0GiB,
  free_memory=78.68GiB, total_memory=79.19GiB, ...``; ``worker requested memory: 75.23GiB`` (total x utilization);
  ``Memory profiling takes 17.96 seconds. Total non KV cache memory: 17.12GiB; torch peak memory increase:
  1.89GiB; non-torch forward increase memory: 0.25GiB; weights memory: 14.99GiB.`` (one per rank);
  ``Free memory on device (78.68/79.19 GiB) on startup``; ``Defaulting max_num_seqs to 1024``; and the API
  server's ``vllm cache_config_info with initialization after num_gpu_blocks is: 29751`` (v1/metrics/loggers.py).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path

from kvplan.core.units import GiB
from kvplan.errors import ConfigError, KvplanError
from kvplan.io.yamlio import iter_lines

_NUM = r"(-?[0-9][0-9,]*(?:\.[0-9]+)?)"
# Bounds on logged figures: 1 PiB of memory, 2^40 tokens/blocks; a log past these is corrupt, and
# unbounded numbers would overflow float-to-int conversions further on.
_MAX_GIB = 1 << 20
_MAX_COUNT = 1 << 40


def _float(text: str) -> float:
    value = float(text.replace(",", ""))
    if not math.isfinite(value) or abs(value) > _MAX_COUNT:
        raise ValueError(text)
    return value


def _gib(text: str) -> int:
    value = _float(text)
    if abs(value) > _MAX_GIB:
        raise ValueError(text)
    return int(round(value * GiB))


def _fraction(text: str) -> float:
    value = _float(text)
    if not 0 < value <= 1:
        raise ValueError(text)
    return value


def _int(text: str) -> int:
    return int(_float(text))


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
    data_parallel_size: int | None = None
    decode_context_parallel_size: int | None = None
    enable_expert_parallel: bool | None = None
    moe_backend: str | None = None
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
    cuda_graph_bytes: int | None = None  # measured after capture ("Graph capturing finished", "pool memory ... (actual)")
    cuda_graph_estimate_bytes: int | None = None  # 0.18+: "Estimated CUDA graph memory: X GiB total"
    cuda_graph_sizes: int | None = None  # batch sizes captured (PIECEWISE), from the progress bar or the profiling line
    # 0.21+: "--gpu-memory-utilization=U is equivalent to --gpu-memory-utilization=U' without CUDA graph memory
    # profiling": U - U' of the card went to the CUDA-graph estimate
    gpu_memory_utilization_without_graphs: float | None = None
    quantization: str | None = None  # vLLM's --quantization (the engine config's quantization=, or the args)
    max_num_seqs: int | None = None  # the flag, or the default vLLM logged ("Defaulting max_num_seqs to")
    total_gpu_memory_from: str | None = None  # the line that stated total_gpu_memory_bytes
    requested_memory_bytes: int | None = None  # 0.19 "worker requested memory": total x utilization
    non_kv_cache_bytes: int | None = None  # 0.19 "Total non KV cache memory" of the binding rank
    profile_weights_bytes: int | None = None  # 0.19 profiling line's "weights memory", binding rank
    # ranks whose profiling lines differ (pp stages): the binding rank's KV memory, requested - its non-KV memory,
    # where "Available KV cache memory" is rank 0's (vLLM sizes every rank's pool by the least)
    binding_kv_cache_bytes: int | None = None
    least_non_kv_bytes: int | None = None  # the smallest rank's "Total non KV cache memory"
    # --speculative-config as the args give it ({"method": ..., "num_speculative_tokens": ...}), or as the engine's
    # config line names it (SpeculativeConfig(method='mtp', ..., num_spec_tokens=3))
    speculative_config: dict | None = None
    mamba_cache_mode: str | None = None  # the args', or "Mamba cache mode is set to 'align'" (prefix caching)
    enable_prefix_caching: bool | None = None  # the args' (None: the release's default)
    matched: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("matched", "path")}


def _config_fields(log: VLLMLog, line: str) -> None:
    def grab(key: str) -> str | None:
        m = re.search(rf"\b{key}=('([^']{{0,4096}})'|[^,)\s]{{1,4096}})", line)
        if not m:
            return None
        return m.group(2) if m.group(2) is not None else m.group(1)

    log.model = grab("model") or log.model
    dtype = grab("dtype")
    log.dtype = dtype.removeprefix("torch.") if dtype else log.dtype
    for key, attr in (("max_seq_len", "max_seq_len"), ("tensor_parallel_size", "tensor_parallel_size"),
                      ("pipeline_parallel_size", "pipeline_parallel_size"), ("block_size", "block_size"),
                      # (not data_parallel_size: a dense model's DP rank is an engine of its own, whose line says 1;
                      # config/parallel.py::ParallelConfig.reconfigure_for_independent_dp_rank, 0.33.0)
                      ("decode_context_parallel_size", "decode_context_parallel_size")):
        value = grab(key)
        if value and value.isascii() and value.isdigit():
            if len(value) > 12:  # 10^12 tokens / GPUs: beyond any real engine
                raise ValueError(f"{key}={value[:20]}...")
            setattr(log, attr, int(value))
    log.kv_cache_dtype = grab("kv_cache_dtype") or log.kv_cache_dtype
    quantization = grab("quantization")
    if quantization is not None:
        log.quantization = None if quantization == "None" else quantization
    eager = grab("enforce_eager")
    if eager in ("True", "False"):
        log.enforce_eager = eager == "True"
    spec = re.search(r"speculative_config=SpeculativeConfig\(method='([a-z0-9_]{1,40})'[^()]{0,4096}?"
                     r"num_spec_tokens=([0-9]{1,4})", line)
    if spec and log.speculative_config is None:
        log.speculative_config = {"method": spec.group(1), "num_speculative_tokens": int(spec.group(2))}


# The non-default args kvplan reads (vllm/engine/arg_utils.py names) -> VLLMLog field and expected type.
_ARG_FIELDS: dict[str, tuple[str, type]] = {
    "model": ("model", str), "tensor_parallel_size": ("tensor_parallel_size", int),
    "pipeline_parallel_size": ("pipeline_parallel_size", int), "max_model_len": ("max_seq_len", int),
    "gpu_memory_utilization": ("gpu_memory_utilization", float), "dtype": ("dtype", str),
    "kv_cache_dtype": ("kv_cache_dtype", str), "quantization": ("quantization", str),
    "block_size": ("block_size", int), "max_num_batched_tokens": ("max_num_batched_tokens", int),
    "max_num_seqs": ("max_num_seqs", int), "enforce_eager": ("enforce_eager", bool),
    "data_parallel_size": ("data_parallel_size", int), "enable_expert_parallel": ("enable_expert_parallel", bool),
    "decode_context_parallel_size": ("decode_context_parallel_size", int), "moe_backend": ("moe_backend", str),
    "enable_prefix_caching": ("enable_prefix_caching", bool),
}
# One 'key': value pair of a literal kvplan reads, for a dict that literal_eval refuses as a whole (a value
# such as KVTransferConfig(...) is not a literal) or a line cut short
_SPECULATIVE_ARG = re.compile(r"'speculative_config': (\{[^{}]{0,4096}\})")
_ARG_PAIR = re.compile(r"'([a-z_]{1,40})': ('[^'\\]{0,4096}'|-?[0-9][0-9.e+-]{0,30}|True|False|None)")


def non_default_args(text: str) -> dict[str, object]:
    """vLLM's ``non-default args: {...}`` dict, read with ast.literal_eval (literals only: no code runs)."""
    text = text.strip()
    try:
        whole = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        whole = None
    if isinstance(whole, dict):
        return whole
    pairs: dict[str, object] = {}
    spec = _SPECULATIVE_ARG.search(text)  # a dict of literals inside a dict literal_eval refused as a whole
    if spec:
        try:
            pairs["speculative_config"] = ast.literal_eval(spec.group(1))
        except (ValueError, SyntaxError):
            pass
    for m in _ARG_PAIR.finditer(text):
        try:
            pairs.setdefault(m.group(1), ast.literal_eval(m.group(2)))
        except (ValueError, SyntaxError):
            continue
    return pairs


def _apply_args(log: VLLMLog, args: dict[str, object]) -> None:
    """Fill what the log has not stated yet: the engine's own config line, printed later, is what ran."""
    if args.get("model") is None and isinstance(args.get("model_tag"), str):
        args = {**args, "model": args["model_tag"]}
    if isinstance(args.get("speculative_config"), dict) and log.speculative_config is None:
        log.speculative_config = dict(args["speculative_config"])  # type: ignore[arg-type]
    if args.get("mamba_cache_mode") in ("none", "align", "all") and log.mamba_cache_mode is None:
        log.mamba_cache_mode = str(args["mamba_cache_mode"])
    for key, (attr, kind) in _ARG_FIELDS.items():
        value = args.get(key)
        if getattr(log, attr) is not None or value is None:
            continue
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            setattr(log, attr, _fraction(str(value)))
        elif kind is int and isinstance(value, int) and not isinstance(value, bool):
            setattr(log, attr, _int(str(value)))
        elif kind is bool and isinstance(value, bool):
            setattr(log, attr, value)
        elif kind is str and isinstance(value, str) and 0 < len(value) <= 4096:
            if key == "dtype" and value == "auto":
                continue  # the checkpoint's dtype: the config line names it
            setattr(log, attr, value.removeprefix("torch."))


# (name, a literal every matching line contains, the pattern). The literal is a cheap filter, and no
# pattern has an unbounded gap between two literals, so a line costs time linear in its length
# (``.*?`` between literals made one 85 KB line of repeated profiling results take minutes).
_PATTERNS: list[tuple[str, str, re.Pattern[str]]] = [
    ("init", "LLM engine (v", re.compile(r"Initializing an? (V0 |V1 )?LLM engine \(v([^)]{1,64})\) with config: (.*)")),
    ("max_len", "Using max model len", re.compile(rf"Using max model len {_NUM}")),
    ("mnbt", "max_num_batched_tokens", re.compile(rf"max_num_batched_tokens(?:=| to ){_NUM}")),
    ("weights", " took ", re.compile(rf"(?:Model loading took|Loading model weights took) {_NUM} ?(?:GiB|GB)")),
    ("total", "total_gpu_memory (", re.compile(rf"total_gpu_memory \({_NUM} ?GiB\) x gpu_memory_utilization \({_NUM}\)")),
    ("breakdown", "model weights take", re.compile(
        rf"model weights take {_NUM} ?GiB; non_torch_memory takes {_NUM} ?GiB; PyTorch activation peak memory takes "
        rf"{_NUM} ?GiB; the rest of the memory reserved for KV Cache is {_NUM} ?GiB")),
    ("available", "Available KV cache memory", re.compile(rf"Available KV cache memory: {_NUM} ?GiB")),
    ("tokens", "GPU KV cache size", re.compile(rf"GPU KV cache size: {_NUM} tokens")),
    ("concurrency", "Maximum concurrency for", re.compile(rf"Maximum concurrency for {_NUM} tokens per request: {_NUM}x")),
    ("blocks", " blocks: ", re.compile(rf"(?:# )?(?:GPU|CUDA|cuda|gpu) blocks: {_NUM}")),
    ("graphs", "Graph capturing finished", re.compile(rf"Graph capturing finished in {_NUM} secs?, took {_NUM} ?GiB")),
    ("graph_estimate", "Estimated CUDA graph memory", re.compile(rf"Estimated CUDA graph memory: {_NUM} ?GiB total")),
    ("graph_pool", "CUDA graph pool memory", re.compile(
        rf"CUDA graph pool memory: {_NUM} ?GiB \(actual\), {_NUM} ?GiB \(estimated\)")),
    ("graph_profile", "Profiling CUDA graph memory", re.compile(r"Profiling CUDA graph memory: PIECEWISE=([0-9]{1,6})")),
    # V0 "Capturing CUDA graph shapes: 100%|###| 35/35"; V1 0.2x "Capturing CUDA graphs (mixed prefill-decode,
    # PIECEWISE): 100%|###| 19/19" (the FULL decode bar is a second capture of the decode sizes, not counted)
    ("graph_bar", "Capturing CUDA graph", re.compile(
        r"Capturing CUDA graph(?: shapes|s \((?:[a-z -]{0,40}, )?PIECEWISE\)): 100%\|[^|]{0,400}\| ?([0-9]{1,6})/([0-9]{1,6})")),
    # 0.21+: subtracted by default; 0.18-0.19: "increase --gpu-memory-utilization from 0.7000 to 0.7021"
    ("util_equivalent", "is equivalent to --gpu-memory-utilization", re.compile(
        rf"--gpu-memory-utilization={_NUM} is equivalent to --gpu-memory-utilization={_NUM} without")),
    ("util_hint", "increase --gpu-memory-utilization from", re.compile(
        rf"increase --gpu-memory-utilization from {_NUM} to {_NUM}")),
    ("eager", "Cudagraph is disabled under eager mode", re.compile(r"Cudagraph is disabled under eager mode")),
    # the API server's own lines: 0.6-0.11 "vLLM API server version 0.11.0", 0.12+'s banner "█  version 0.19.0"
    ("server_version", " version ", re.compile(
        r"(?:vLLM API server version|█ {1,8}version) ([0-9][0-9A-Za-z.+_-]{0,63})")),
    ("banner_model", "█", re.compile(r"█ {1,8}model {1,8}(\S{1,4096})")),
    ("args", "non-default args: {", re.compile(r"non-default args: (\{.{0,20000})")),
    ("snapshot", "worker init memory snapshot", re.compile(
        rf"worker init memory snapshot: [^\n]{{0,400}}?\btotal_memory={_NUM} ?GiB")),
    # 0.19's closing DEBUG line, and the same words in the error of a start refused for lack of free memory
    ("free_on_startup", "Free memory on device", re.compile(
        rf"Free memory on device(?: [^ (]{{1,32}})? \({_NUM}/{_NUM} ?GiB\) on startup")),
    ("requested", "worker requested memory", re.compile(rf"worker requested memory: {_NUM} ?GiB")),
    ("profile", "Total non KV cache memory", re.compile(
        rf"Total non KV cache memory: {_NUM} ?GiB; torch peak memory increase: {_NUM} ?GiB; "
        rf"non-torch forward increase memory: {_NUM} ?GiB; weights memory: {_NUM} ?GiB")),
    ("engine_blocks", "num_gpu_blocks is:", re.compile(rf"num_gpu_blocks is: {_NUM}")),
    ("default_seqs", "Defaulting max_num_seqs to", re.compile(rf"Defaulting max_num_seqs to {_NUM}")),
    ("mamba_mode", "Mamba cache mode is set to", re.compile(r"Mamba cache mode is set to '([a-z]{1,8})'")),
]
# The figure each line that states the GPU's total memory is read from (said in explain's notes)
_TOTAL_FROM = {
    "total": "total_gpu_memory (X GiB) x gpu_memory_utilization",
    "v0_results": "Memory profiling results: total_gpu_memory=",
    "snapshot": "worker init memory snapshot: total_memory=",
    "free_on_startup": "Free memory on device (free/total GiB) on startup",
}
_V0_RESULTS = "Memory profiling results:"
_V0_KEYS = ("total_gpu_memory", "peak_torch_memory", "non_torch_memory", "kv_cache_size", "gpu_memory_utilization")
_V0_VALUE = re.compile(rf"{_NUM}(GiB)?")


def _v0_results(line: str) -> list[str] | None:
    """v0.6.3-0.6.4's one-line results, read as key=value words (first of each key wins)."""
    found: dict[str, str] = {}
    for word in line[line.index(_V0_RESULTS) + len(_V0_RESULTS):].split():
        key, eq, value = word.partition("=")
        if eq and key in _V0_KEYS and key not in found:
            m = _V0_VALUE.fullmatch(value)
            if m is None or (m.group(2) is None) != (key == "gpu_memory_utilization"):
                return None
            found[key] = m.group(1)
    return [found[k] for k in _V0_KEYS] if len(found) == len(_V0_KEYS) else None


def _apply(log: VLLMLog, name: str, groups: list[str]) -> int | None:
    """Store one matched line's figures; returns v0's peak torch memory when that line is read."""
    g = groups
    if name == "init":
        log.generation = "V1" if g[0] == "V1 " else "V0"
        log.version = g[1]
        _config_fields(log, g[2])
    elif name == "weights":
        log.weights_bytes = _gib(g[0])
    elif name == "total":
        log.total_gpu_memory_bytes, log.gpu_memory_utilization = _gib(g[0]), _float(g[1])
    elif name == "breakdown":
        log.weights_bytes = _gib(g[0])
        log.non_torch_bytes, log.activation_bytes = _gib(g[1]), _gib(g[2])
        log.kv_cache_memory_bytes = _gib(g[3])
    elif name == "v0_results":
        # v0.6.3-0.6.4: peak_torch_memory includes the weights; activation = peak - weights below
        log.total_gpu_memory_bytes = _gib(g[0])
        peak_torch = _gib(g[1])
        log.non_torch_bytes = _gib(g[2])
        log.kv_cache_memory_bytes = _gib(g[3])
        log.gpu_memory_utilization = _float(g[4])
        return peak_torch
    elif name == "max_len":
        log.max_seq_len = _int(g[0])
    elif name == "mnbt":
        log.max_num_batched_tokens = _int(g[0])
    elif name == "available":
        log.kv_cache_memory_bytes = _gib(g[0])
    elif name == "tokens":
        log.kv_cache_tokens = _int(g[0])
    elif name == "concurrency":
        log.concurrency_tokens, log.max_concurrency = _int(g[0]), _float(g[1])
    elif name == "blocks":
        log.num_gpu_blocks = _int(g[0])
    elif name == "graphs":
        log.cuda_graph_bytes = _gib(g[1])
    elif name == "graph_estimate":
        log.cuda_graph_estimate_bytes = _gib(g[0])
    elif name == "graph_pool":
        log.cuda_graph_bytes, log.cuda_graph_estimate_bytes = _gib(g[0]), _gib(g[1])
    elif name in ("graph_profile", "graph_bar"):
        log.cuda_graph_sizes = _int(g[-1])
    elif name == "util_equivalent":
        log.gpu_memory_utilization = _fraction(g[0])
        log.gpu_memory_utilization_without_graphs = _fraction(g[1])
    elif name == "util_hint":
        log.gpu_memory_utilization = _fraction(g[0])
    elif name == "eager":
        log.enforce_eager = True
    elif name == "server_version":
        log.version = log.version or g[0]  # the engine's "LLM engine (vX)" line wins
    elif name == "banner_model":
        log.model = log.model or g[0]
    elif name == "args":
        _apply_args(log, non_default_args(g[0]))
    elif name == "snapshot":
        log.total_gpu_memory_bytes = _gib(g[0])
    elif name == "free_on_startup":
        log.total_gpu_memory_bytes = _gib(g[1])
    elif name == "requested":
        log.requested_memory_bytes = _gib(g[0])
    elif name == "profile":
        # One line per rank. Every rank requests the same memory (total x utilization) and the engine sizes
        # the pool by the worker with the least KV memory left (v1/engine/core.py takes the minimum of the
        # workers' available memory), so the rank with the most non-KV memory binds: under pp, a stage
        # with more layers or the vocabulary; vLLM prints "Available KV cache memory" for rank 0 alone.
        non_kv = _gib(g[0])
        if log.least_non_kv_bytes is None or non_kv < log.least_non_kv_bytes:
            log.least_non_kv_bytes = non_kv
        if log.non_kv_cache_bytes is None or non_kv > log.non_kv_cache_bytes:
            log.non_kv_cache_bytes, log.activation_bytes, log.non_torch_bytes = non_kv, _gib(g[1]), _gib(g[2])
            log.profile_weights_bytes = _gib(g[3])
    elif name == "engine_blocks":
        log.num_gpu_blocks = _int(g[0])
    elif name == "default_seqs":
        log.max_num_seqs = log.max_num_seqs or _int(g[0])
    elif name == "mamba_mode":
        log.mamba_cache_mode = g[0]  # what vLLM set, over the args
    if name in _TOTAL_FROM:
        log.total_gpu_memory_from = _TOTAL_FROM[name]
    return None


def parse_vllm_lines(lines: Iterable[tuple[int, str]], path: str = "") -> VLLMLog:
    """Read (line number, line) pairs; time is linear in the log's size."""
    log = VLLMLog(path=path)
    peak_torch = 0
    matched: set[str] = set()
    for number, line in lines:
        hits: list[tuple[str, list[str]]] = []
        for name, literal, pattern in _PATTERNS:
            if literal in line:
                m = pattern.search(line)
                if m:
                    hits.append((name, list(m.groups())))
        if _V0_RESULTS in line:
            groups = _v0_results(line)
            if groups:
                hits.append(("v0_results", groups))
        for name, groups in hits:
            if name not in matched:
                matched.add(name)
                log.matched.append(name)
            try:
                peak = _apply(log, name, groups)
            except ValueError as exc:
                where = f"{path}: " if path else ""
                raise ConfigError(f"{where}line {number}: {name} figure {str(exc)[:40]!r} is out of range; "
                                  "is this an unedited vLLM log?") from None
            if peak is not None:
                peak_torch = peak
    if log.generation is None and {"breakdown", "v0_results", "blocks"} & matched:
        log.generation = "V0"  # only V0's worker printed these lines
    elif log.generation is None and {"available", "tokens"} & matched:
        log.generation = "V1"
    if log.generation is None and log.version and _at_least_0_11(log.version):
        log.generation = "V1"  # 0.11 removed the V0 engine
    if "v0_results" in matched and log.weights_bytes is not None and log.activation_bytes is None:
        log.activation_bytes = peak_torch - log.weights_bytes
    if log.profile_weights_bytes is not None:
        log.weights_bytes = log.profile_weights_bytes  # the binding rank's, beside its activation and non-torch
    if (log.requested_memory_bytes is not None and log.non_kv_cache_bytes is not None
            and log.least_non_kv_bytes is not None and log.non_kv_cache_bytes > log.least_non_kv_bytes):
        log.binding_kv_cache_bytes = log.requested_memory_bytes - log.non_kv_cache_bytes
    return log


def _at_least_0_11(version: str) -> bool:
    from kvplan.core.profiles import Version

    try:
        return not Version.parse(version) < Version.parse("0.11.0")
    except (ValueError, KvplanError):
        return False


def parse_vllm_log(text: str, path: str = "") -> VLLMLog:
    return parse_vllm_lines(enumerate(text.splitlines(), start=1), path)


def read_vllm_log(path: Path) -> VLLMLog:
    log = parse_vllm_lines(iter_lines(path), str(path))
    if not set(log.matched) - {"init"}:
        raise ConfigError(
            f"{path}: no vLLM memory lines found (looked for 'Model loading took', 'Memory profiling', "
            "'Available KV cache memory', 'GPU KV cache size', '# GPU blocks'); is this a vLLM startup log?"
        )
    return log
