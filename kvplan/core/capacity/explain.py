"""Set kvplan's figures beside those a vLLM startup log reports."""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.core.capacity.common import FitResult


@dataclass(frozen=True, kw_only=True)
class ExplainRow:
    figure: str
    unit: str  # "bytes", "blocks", "tokens", "x"
    logged: float | None
    predicted: float | None  # kvplan from the model, GPU and settings alone (estimates included)
    replayed: float | None  # kvplan given the log's own measured budget components

    def error_frac(self, value: float | None) -> float | None:
        if value is None or not self.logged:
            return None
        return (value - self.logged) / self.logged


def explain_rows(logged: dict[str, object], predicted: FitResult | None, replayed: FitResult | None) -> list[ExplainRow]:
    def pick(result: FitResult | None, attr: str) -> float | None:
        if result is None:
            return None
        if attr in ("weights", "activation", "non_torch", "cuda_graph"):
            return float(getattr(result.breakdown, attr))
        return float(getattr(result, attr))

    spec = [
        ("total GPU memory", "bytes", "total_gpu_memory_bytes", None),
        ("weights", "bytes", "weights_bytes", "weights"),
        ("non-torch memory", "bytes", "non_torch_bytes", "non_torch"),
        ("activation peak", "bytes", "activation_bytes", "activation"),
        ("CUDA graphs", "bytes", "cuda_graph_bytes", "cuda_graph"),
        ("KV cache memory", "bytes", "kv_cache_memory_bytes", "kv_cache_memory_bytes"),
        ("KV blocks", "blocks", "num_gpu_blocks", "num_blocks"),
        ("KV cache tokens", "tokens", "kv_cache_tokens", "kv_cache_tokens"),
        ("max concurrency", "x", "max_concurrency", "max_concurrency"),
    ]
    rows = []
    for label, unit, log_key, attr in spec:
        value = logged.get(log_key)
        if label == "total GPU memory":
            rows.append(ExplainRow(figure=label, unit=unit, logged=value,  # type: ignore[arg-type]
                                   predicted=float(predicted.gpu.memory_bytes) if predicted else None, replayed=None))
            continue
        if value is None and attr in ("cuda_graph",):
            continue
        rows.append(ExplainRow(figure=label, unit=unit, logged=value,  # type: ignore[arg-type]
                               predicted=pick(predicted, attr) if attr else None,
                               replayed=pick(replayed, attr) if attr else None))
    return rows
