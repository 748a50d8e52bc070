"""kvplan fit beside every vLLM 0.19.0 start in the llm-d-planner logs: KV tokens and each memory figure.

Run: python benchmarks/bench_real_starts.py [--logs DIR]
DIR (default /work/shared/vllm-logs/llm-d-planner-v0.19.0) holds the llm-d-planner project's startup logs
(llm-d-incubation/llm-d-planner, accuracy/results/v0.19.0/logs/, Apache-2.0): 74 starts on H100-80GB, 15 of
them named ``*.FAILED.log``. Each run's model and flags are read from the log's own ``non-default args: {...}``
line (the sweep*.yaml beside the logs say the same), then kvplan's fit use case (kvplan.app.fit.fit_model, what
``kvplan fit`` calls) plans the deployment with the rules of vllm==0.19.0 from the model, GPU and flags alone.

Per started run: the flags that matter, kvplan's "GPU KV cache size" beside the logged one and the error in %,
and each component kvplan's FitResult.breakdown carries beside the figure the log states: ``Model loading
took``; the 0.19 DEBUG profiling line ``Total non KV cache memory: ...; torch peak memory increase: ...;
non-torch forward increase memory: ...; weights memory: ...``; ``Estimated CUDA graph memory`` and ``CUDA graph
pool memory ... (actual)``; the binding rank's KV memory, ``worker requested memory`` less its ``Total non KV
cache memory`` (vLLM prints ``Available KV cache memory`` for rank 0 alone); ``torch.compile took``. A run
kvplan cannot plan is listed with the reason. Per FAILED log: the cause read from its own error lines, and
kvplan's verdict for the same flags.
kvplan.io.vllm_log reads every memory figure (0.19's profiling line and worker snapshot included) and the
args kvplan uses; this file reads only what that parser does not: all the non-default args (a flag kvplan's fit
does not take makes a run unplannable), ``torch.compile took``, the failure lines.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kvplan.core.units import GiB  # noqa: E402
from kvplan.errors import KvplanError  # noqa: E402
from kvplan.io.vllm_log import VLLMLog, non_default_args, parse_vllm_log  # noqa: E402

LOGS = Path("/work/shared/vllm-logs/llm-d-planner-v0.19.0")
GPU = "H100-80GB"  # every run: nvidia.com/gpu.product NVIDIA-H100-80GB-HBM3 (sweep.yaml node_selector)
ENGINE = "vllm==0.19.0"
VLLM_DEFAULT_UTILIZATION = 0.9  # vllm/config/cache.py gpu_memory_utilization default

# The weight format a quantized checkpoint's name states (RedHatAI's llm-compressor naming: w8a8 = int8
# weights per channel, w4a16 = int4 weights in groups of 128, fp8-dynamic = fp8 weights), as kvplan's
# --weight-dtype names it; the name less the suffix is the base model. Only for a checkpoint kvplan does not
# bundle: a bundled one (configs/models/, its quantization_config included) is planned from its own config,
# as `kvplan explain` plans it.
NAME_FORMATS = (("-quantized.w4a16", "int4-g128"), ("-quantized.w8a8", "int8"), ("-fp8-dynamic", "fp8"))
# vLLM's --quantization values that set the weight format whatever the checkpoint says (fp8: quantized on load)
FLAG_FORMATS = {"fp8": "fp8"}
# The flags kvplan's fit states; any other non-default flag that changes memory makes a run unplannable.
IGNORED_ARGS = {"model_tag", "model", "enable_prefix_caching", "trust_remote_code", "api_server_count"}
# Checkpoints in the logs that kvplan does not bundle, and why (what a search of public copies found). The log
# alone does not state a model's dimensions, so sizing one from a look-alike would be a guess.
NOT_SOURCED = {
    "ibm-granite/granite-3.1-2b-instruct": "no copy of its config.json or of its card's architecture table found "
                                           "to cite",
    "ibm-granite/granite-3.1-8b-instruct": "no copy of its config.json or of its card's architecture table found "
                                           "to cite",
    "ibm-granite/granite-vision-3.3-2b": "no copy of its config.json found, and its LLaVA-NeXT tower is not modelled",
    "moonshotai/Kimi-Dev-72B": "no copy of its config.json found (the log resolves Qwen2ForCausalLM; its "
                               "dimensions are not printed)",
    "moonshotai/Kimi-VL-A3B-Instruct": "no copy of its config.json found, and its MoonViT tower is not modelled",
}

_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"
_ARGS = re.compile(r"non-default args: (\{.{0,8000}\})")
_COMPILE = re.compile(rf"torch\.compile took {_NUM} s in total")

# (cause, pattern over the log's lines), most specific first. vLLM 0.19.0's own messages:
# gpu_model_runner.py::_dummy_sampler_run, config/model.py (derived max_model_len), v1/worker/utils.py::
# request_memory, huggingface_hub, transformers' AutoConfig, vocab_parallel_embedding / DP rank checks.
FAILURES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("memory after the pool (sampler warm-up / CUDA graph OOM)", re.compile(
        r"CUDA out of memory occurred when warming up sampler|out of memory.{0,80}captur")),
    ("context longer than the model allows", re.compile(
        r"max_model_len \([0-9]+\) is greater than the derived max_model_len")),
    ("GPU memory already in use by another process", re.compile(
        r"Free memory on device \S+ \([0-9.]+/[0-9.]+ GiB\) on startup is less than desired")),
    ("download failure", re.compile(
        r"couldn't connect to 'https://huggingface\.co'|LocalEntryNotFoundError|[0-9]{3} Client Error")),
    ("unsupported model", re.compile(
        r"Transformers does not recognize this architecture|Model architectures? \[.{0,200}\] (?:is|are) not "
        r"supported")),
    ("parallel layout", re.compile(r"[0-9]+ is not divisible by [0-9]+|DP adjusted local rank [0-9]+ is out of")),
)
OOM = re.compile(r"OutOfMemoryError|CUDA out of memory")


@dataclass(kw_only=True)
class StartLog:
    """One startup log: kvplan.io.vllm_log's figures and what that parser does not read."""

    name: str
    started: bool
    log: VLLMLog
    args: dict[str, object] = field(default_factory=dict)  # all the non-default args vLLM printed
    compile_seconds: float | None = None
    failure: str | None = None  # the cause, for a FAILED log
    failure_line: str | None = None

    # The parser's figures under the names this benchmark prints them by
    @property
    def quantization(self) -> str | None:
        return self.log.quantization

    @property
    def total_memory_bytes(self) -> int | None:  # worker init snapshot / "Free memory on device"
        return self.log.total_gpu_memory_bytes

    @property
    def requested_bytes(self) -> int | None:  # "worker requested memory": utilization x total
        return self.log.requested_memory_bytes

    @property
    def non_kv_bytes(self) -> int | None:  # 0.19 "Total non KV cache memory" on the binding rank (the largest)
        return self.log.non_kv_cache_bytes

    @property
    def activation_bytes(self) -> int | None:  # "torch peak memory increase", binding rank
        return self.log.activation_bytes

    @property
    def non_torch_bytes(self) -> int | None:  # "non-torch forward increase memory", binding rank
        return self.log.non_torch_bytes

    @property
    def profile_weights_bytes(self) -> int | None:  # "weights memory", binding rank
        return self.log.profile_weights_bytes

    @property
    def max_num_seqs(self) -> int | None:  # the flag, or the default vLLM logged
        return self.log.max_num_seqs

    @property
    def binding_kv_bytes(self) -> int | None:
        """KV memory on the rank with the least: requested less that rank's non-KV memory (vLLM prints
        "Available KV cache memory" for rank 0 alone; under pp the last stage holds less)."""
        if self.requested_bytes is not None and self.non_kv_bytes is not None:
            return self.requested_bytes - self.non_kv_bytes
        return self.log.kv_cache_memory_bytes


def read_start_log(path: Path) -> StartLog:
    text = path.read_text(errors="replace")
    lines = text.splitlines()
    s = StartLog(name=path.name.removesuffix(".log"), started=not path.name.endswith(".FAILED.log"),
                 log=parse_vllm_log(text, str(path)))
    for line in lines:
        if (m := _ARGS.search(line)) and not s.args:
            s.args = non_default_args(m.group(1))
        elif m := _COMPILE.search(line):
            s.compile_seconds = float(m.group(1))
    if not s.started:
        s.failure, s.failure_line = classify_failure(lines, pool_made=s.log.kv_cache_tokens is not None)
    return s


def classify_failure(lines: list[str], *, pool_made: bool) -> tuple[str, str | None]:
    """The cause of a failed start, from its own error lines; an OOM with no named stage counts as after the
    pool when the KV cache was sized ("GPU KV cache size" logged), else before it."""
    for cause, pattern in FAILURES:
        for line in lines:
            if pattern.search(line):
                return cause, _message(line)
    for line in lines:
        if OOM.search(line):
            return ("memory after the pool (sampler warm-up / CUDA graph OOM)" if pool_made
                    else "out of memory before the pool (weights / profiling)"), _message(line)
    return "unclassified", None


def _message(line: str) -> str:
    """The line without vLLM's ``(Proc pid=N) LEVEL date [file:line]`` prefix."""
    return re.sub(r"^(?:\([^)]{0,60}\) )?(?:[A-Z]+ [0-9-]+ [0-9:]+ \[[^\]]{0,120}\] )?", "", line).strip()[:200]


@dataclass(frozen=True, kw_only=True)
class Plan:
    """How kvplan is asked about a run: the model reference, the weight format, and fit_model's flags."""

    model: str
    weight_dtype: str
    kwargs: dict[str, object]


def plan_for(s: StartLog) -> Plan | str:
    """The fit question for a run, or why kvplan cannot state it."""
    a = s.args
    model = str(a.get("model") or s.log.model or "")
    unknown = sorted(k for k in a if k not in IGNORED_ARGS and k not in (
        "max_model_len", "tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization", "dtype",
        "kv_cache_dtype", "quantization", "max_num_seqs"))
    if unknown:
        return f"flags kvplan's fit does not take: {', '.join(f'{k}={a[k]!r}' for k in unknown)}"
    ref, weight_dtype = model, "auto"
    quantized = _bundled_quantized(model)
    for suffix, fmt in () if quantized is not None else NAME_FORMATS:
        if ref.lower().endswith(suffix):
            ref, weight_dtype = ref[: -len(suffix)], fmt
    if isinstance(a.get("quantization"), str):
        if a["quantization"] not in FLAG_FORMATS:
            return f"--quantization {a['quantization']}: no kvplan weight format for it"
        weight_dtype = FLAG_FORMATS[str(a["quantization"])]
    # vLLM's --dtype sets the weights' format and, under --kv-cache-dtype auto, the KV cache's; of a quantized
    # checkpoint it sets only what stays unquantized (embeddings, LM head, norms, scales), which fit's
    # --weight-dtype cannot say apart from the quantized layers: the same width as the config's dtype is that
    dtype = {"float16": "fp16", "float32": "fp32", "bfloat16": "bf16"}.get(str(a.get("dtype", "auto")))
    if dtype and quantized:
        if _BITS[dtype] != _BITS.get(quantized, 0):
            return f"--dtype {a['dtype']} on a quantized checkpoint kept in {quantized}: fit states no model dtype"
    else:
        weight_dtype = dtype if dtype and weight_dtype == "auto" else weight_dtype
    kv_dtype = str(a.get("kv_cache_dtype", "auto"))
    kv_dtype = dtype if dtype and kv_dtype == "auto" else kv_dtype
    kwargs: dict[str, object] = dict(
        gpu=GPU, engine=ENGINE, tp=int(a.get("tensor_parallel_size", 1)), pp=int(a.get("pipeline_parallel_size", 1)),
        gpu_memory_utilization=float(a.get("gpu_memory_utilization", VLLM_DEFAULT_UTILIZATION)),
        max_model_len=int(a["max_model_len"]) if "max_model_len" in a else None,
        kv_cache_dtype=kv_dtype, weight_dtype=weight_dtype,
        max_num_seqs=a.get("max_num_seqs"), fetch=False)
    return Plan(model=ref, weight_dtype=weight_dtype, kwargs=kwargs)


_BITS = {"fp16": 16, "bf16": 16, "fp32": 32, "float16": 16, "bfloat16": 16, "float32": 32}


def _bundled_quantized(model: str) -> str | None:
    """For a checkpoint kvplan bundles by this name or alias: its torch_dtype when its config carries a
    quantization_config, "" when it carries none; None when it is not bundled."""
    from kvplan.io.models import bundled_index, load_model

    key = model.strip().lower()
    for entry in bundled_index().values():
        if key == entry.name.lower() or key in (alias.lower() for alias in entry.aliases):
            raw = load_model(entry.name).raw_config
            return str(raw.get("torch_dtype") or "bfloat16") if raw.get("quantization_config") else ""
    return None


def _why(exc: KvplanError) -> str:
    """kvplan's message, its first line, less the spelling suggestions."""
    first = re.sub(r"; did you mean [^?]{0,200}\?", "", str(exc).splitlines()[0])
    return first.split(" and not in the local Hugging Face cache")[0][:160]


def _run_fit(plan: Plan):  # -> FitReport
    from kvplan.app.fit import fit_model

    return fit_model(plan.model, **plan.kwargs)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class Row:
    s: StartLog
    spec: str
    predicted: int
    logged: int
    components: tuple[tuple[str, int | None, int | None], ...]  # (name, kvplan bytes, logged bytes)

    @property
    def error_pct(self) -> float:
        return (self.predicted - self.logged) / self.logged * 100


def predict(s: StartLog) -> Row | str:
    plan = plan_for(s)
    if isinstance(plan, str):
        return plan
    if plan.model in NOT_SOURCED:
        return f"{plan.model} is not bundled: {NOT_SOURCED[plan.model]}"
    if s.log.kv_cache_tokens is None:
        return "the log states no 'GPU KV cache size'"
    try:
        report = _run_fit(plan)
    except KvplanError as exc:
        return f"kvplan: {_why(exc)}"
    r = report.result
    b = r.breakdown
    graphs = s.log.cuda_graph_estimate_bytes  # 0.19 does not take it from the budget; printed as estimated
    return Row(s=s, spec=report.model, predicted=r.logged_kv_cache_tokens or r.kv_cache_tokens,
               logged=s.log.kv_cache_tokens, components=(
                   ("weights", b.weights, s.log.weights_bytes),
                   ("activation", b.activation, s.activation_bytes),
                   ("non_torch", b.non_torch, s.non_torch_bytes),
                   ("cuda_graph", b.cuda_graph, s.log.cuda_graph_bytes if graphs is None else graphs),
                   ("kv_cache", r.kv_cache_memory_bytes, s.binding_kv_bytes)))


def _g(value: int | None) -> str:
    return "-" if value is None else f"{value / GiB:.2f}"


def _flags(s: StartLog) -> str:
    a = s.args
    mns = f"{s.max_num_seqs}{'' if 'max_num_seqs' in a else ' (default)'}" if s.max_num_seqs else "-"
    return (f"tp {a.get('tensor_parallel_size', 1)} pp {a.get('pipeline_parallel_size', 1)} "
            f"gmu {a.get('gpu_memory_utilization', f'{VLLM_DEFAULT_UTILIZATION} (default)')} "
            f"max_model_len {a.get('max_model_len', '-')} dtype {a.get('dtype', 'auto')} "
            f"kv_cache_dtype {a.get('kv_cache_dtype', 'auto')} quantization {s.quantization or '-'} "
            f"max_num_seqs {mns}")


def print_row(row: Row) -> None:
    s = row.s
    print(f"{s.name}\n  {s.args.get('model')} (kvplan: {row.spec}); {_flags(s)}")
    print(f"  KV tokens: kvplan {row.predicted}  logged {row.logged}  error {row.error_pct:+.2f}%"
          + (f"  (torch.compile {s.compile_seconds:.1f} s)" if s.compile_seconds is not None else ""))
    parts = []
    for name, ours, theirs in row.components:
        diff = "" if ours is None or theirs is None else f" ({(ours - theirs) / GiB:+.2f})"
        parts.append(f"{name} {_g(ours)}/{_g(theirs)}{diff}")
    actual = s.log.cuda_graph_bytes
    print("  GiB kvplan/logged (diff): " + "; ".join(parts)
          + (f"; graphs captured {_g(actual)}" if actual is not None else ""))


def summarize(label: str, rows: list[Row]) -> str:
    if not rows:
        return f"{label}: no runs"
    errs = [abs(r.error_pct) for r in rows]
    within = " ".join(f"<={t}%: {sum(e <= t for e in errs)}" for t in (1, 3, 5))
    return (f"{label}: {len(rows)} runs, mean |error| {statistics.mean(errs):.2f}%, median "
            f"{statistics.median(errs):.2f}%, {within}")


def print_failed(failed: list[StartLog]) -> None:
    """Each failed start's cause and kvplan's verdict for the same flags on a free GPU."""
    print(f"\nFailed starts ({len(failed)}):")
    counts: dict[str, int] = {}
    for s in failed:
        cause = s.failure or "unclassified"
        counts[cause] = counts.get(cause, 0) + 1
        plan = plan_for(s)
        if isinstance(plan, str):
            verdict = f"kvplan cannot state it ({plan})"
        else:
            try:
                res = _run_fit(plan).result
                verdict = ("kvplan: fits" if res.fits else "kvplan: does not fit") + (
                    f" ({res.kv_cache_memory_bytes / GiB:.2f} GiB KV, {res.logged_kv_cache_tokens} tokens)"
                    if res.kv_cache_memory_bytes > 0 else "")
            except KvplanError as exc:
                verdict = f"kvplan cannot state it ({_why(exc)})"
        print(f"  {s.name}: {cause}\n    log: {s.failure_line}\n    {verdict}")
    print("  counts: " + "; ".join(f"{k}: {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])))


def _arg(row: Row, key: str) -> int:
    return int(row.s.args.get(key, 1))  # type: ignore[call-overload]


def print_summary(rows: list[Row], *, started: int, left_out: int) -> None:
    plain = [r for r in rows if _arg(r, "tensor_parallel_size") == 1 and _arg(r, "pipeline_parallel_size") == 1
             and r.s.quantization is None]
    print(f"\nSummary: {len(rows)} of {started} started runs reproduced ({left_out} left out)")
    for label, subset in (("all", rows), ("tp 1 plain checkpoints", plain),
                          ("tp >= 2", [r for r in rows if _arg(r, "tensor_parallel_size") >= 2]),
                          ("pp >= 2", [r for r in rows if _arg(r, "pipeline_parallel_size") >= 2]),
                          ("quantized (checkpoint or --quantization)",
                           [r for r in rows if r.s.quantization is not None])):
        print("  " + summarize(label, subset))
    worst = sorted(rows, key=lambda r: -abs(r.error_pct))[:5]
    print("  largest errors: " + "; ".join(f"{r.s.name} {r.error_pct:+.2f}%" for r in worst))
    print("  component diffs, kvplan - logged (GiB): mean / largest |diff| (run)")
    for i, name in enumerate(("weights", "activation", "non_torch", "cuda_graph", "kv_cache")):
        pairs = [((r.components[i][1] - r.components[i][2]) / GiB, r.s.name) for r in rows
                 if r.components[i][1] is not None and r.components[i][2] is not None]
        if pairs:
            far = max(pairs, key=lambda p: abs(p[0]))
            print(f"    {name}: {statistics.mean(p[0] for p in pairs):+.2f} / {far[0]:+.2f} ({far[1]}) "
                  f"over {len(pairs)} runs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=Path, default=LOGS, help=f"the logs' folder (default {LOGS})")
    args = parser.parse_args(argv)
    logs = [read_start_log(p) for p in sorted(args.logs.glob("*.log"))]
    started = [s for s in logs if s.started]
    failed = [s for s in logs if not s.started]
    print(f"{len(logs)} logs in {args.logs}: {len(started)} started, {len(failed)} failed; kvplan fit on {GPU}, "
          f"rules of {ENGINE}\n")
    rows: list[Row] = []
    left_out: list[tuple[str, str]] = []
    for s in started:
        result = predict(s)
        if isinstance(result, str):
            left_out.append((s.name, result))
            continue
        rows.append(result)
        print_row(result)
    print(f"\nLeft out ({len(left_out)} of {len(started)} started runs):")
    for name, why in left_out:
        print(f"  {name}: {why}")

    print_failed(failed)
    print_summary(rows, started=len(started), left_out=len(left_out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
