"""Set kvplan's figures beside those a vLLM startup log reports.

Three kvplan figures stand beside each logged one:
- *predicted*: from the model, GPU and settings alone, with kvplan's estimates for activation, non-torch
  and CUDA-graph memory (kvplan/core/capacity/estimates.py);
- *replayed*: kvplan's arithmetic fed the log's own measurements. The KV memory is replayed from the logged
  budget components (total x utilization - weights - activation - non-torch [- CUDA-graph estimate]), so it
  checks the release's budget formula; the block and token counts are replayed from the logged KV memory,
  so they check kvplan's block layout and the release's capacity formula.
- *replayed range*: the logs print GiB to two decimals, so the logged KV memory is known only to within
  0.005 GiB; the counts from both ends of that interval bound what an exact replay can give.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.core.capacity.common import FitResult

# vLLM prints memory figures with two decimals ("%.2f GiB"): the true value is within half a unit
LOGGED_GIB_HALF_UNIT = 0.005


@dataclass(frozen=True, kw_only=True)
class Replay:
    """kvplan's fits from the log's own figures (None where the log lacks them)."""

    budget: FitResult | None = None  # from the logged components: KV memory = budget - components
    kv: FitResult | None = None  # from the logged KV memory: blocks and tokens
    kv_low: FitResult | None = None  # from the logged KV memory less half its last printed digit
    kv_high: FitResult | None = None  # ... plus half its last printed digit


@dataclass(frozen=True, kw_only=True)
class ExplainRow:
    figure: str
    unit: str  # "bytes", "blocks", "tokens", "x"
    logged: float | None
    predicted: float | None  # kvplan from the model, GPU and settings alone (estimates included)
    replayed: float | None  # kvplan given the log's own measured figures
    replayed_low: float | None = None  # the replay over the logged figure's rounding interval
    replayed_high: float | None = None

    def error_frac(self, value: float | None) -> float | None:
        if value is None or not self.logged:
            return None
        return (value - self.logged) / self.logged

    def replay_miss(self) -> float | None:
        """How far the logged count lies outside the replayed range (0 inside it); None without a replay."""
        if self.logged is None or self.replayed_low is None or self.replayed_high is None:
            return None
        return max(0.0, self.replayed_low - self.logged, self.logged - self.replayed_high)


_COMPONENTS = {"weights": "weights", "activation": "activation", "non_torch": "non_torch", "cuda_graph": "cuda_graph"}


def _pick(result: FitResult | None, attr: str | None) -> float | None:
    if result is None or attr is None:
        return None
    if attr in _COMPONENTS:
        return float(getattr(result.breakdown, attr))
    if attr == "logged_kv_cache_tokens":  # the figure as this release computes it for its log line
        return float(result.logged_kv_cache_tokens)
    if attr == "cuda_graph_estimate":
        return float(result.breakdown.cuda_graph)
    return float(getattr(result, attr))


def explain_rows(logged: dict[str, object], predicted: FitResult | None, replay: Replay) -> list[ExplainRow]:
    # (label, unit, logged key, kvplan attribute, replayed from): "budget" rows are replayed from the logged
    # components, "kv" rows from the logged KV memory, None rows are inputs the replay takes from the log.
    spec: list[tuple[str, str, str, str | None, str | None]] = [
        ("total GPU memory", "bytes", "total_gpu_memory_bytes", None, None),
        ("weights", "bytes", "weights_bytes", "weights", None),
        ("non-torch memory", "bytes", "non_torch_bytes", "non_torch", None),
        ("activation peak", "bytes", "activation_bytes", "activation", None),
        ("CUDA graphs", "bytes", "cuda_graph_bytes", "cuda_graph", None),
        ("CUDA graph estimate", "bytes", "cuda_graph_estimate_bytes", "cuda_graph_estimate", None),
        ("KV cache memory", "bytes", "kv_cache_memory_bytes", "kv_cache_memory_bytes", "budget"),
        ("KV blocks", "blocks", "num_gpu_blocks", "num_blocks", "kv"),
        ("KV cache tokens", "tokens", "kv_cache_tokens", "logged_kv_cache_tokens", "kv"),
        ("max concurrency", "x", "max_concurrency", "max_concurrency", "kv"),
    ]
    rows = []
    for label, unit, log_key, attr, source in spec:
        value = logged.get(log_key)
        if label == "total GPU memory":
            rows.append(ExplainRow(figure=label, unit=unit, logged=value,  # type: ignore[arg-type]
                                   predicted=float(predicted.gpu.memory_bytes) if predicted else None, replayed=None))
            continue
        if value is None and label.startswith("CUDA graph"):
            continue
        replayed = low = high = None
        if source == "budget":
            replayed = _pick(replay.budget, attr)
        elif source == "kv":
            replayed = _pick(replay.kv, attr)
            low, high = _pick(replay.kv_low, attr), _pick(replay.kv_high, attr)
        rows.append(ExplainRow(figure=label, unit=unit, logged=value,  # type: ignore[arg-type]
                               predicted=_pick(predicted, attr), replayed=replayed,
                               replayed_low=low, replayed_high=high))
    return rows
