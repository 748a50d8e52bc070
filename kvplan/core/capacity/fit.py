"""``fit``: dispatch to the engine's budget, and what to change when it does not fit."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvplan.core.capacity.common import FitRequest, FitResult, check_request
from kvplan.core.capacity.sglang import fit_sglang
from kvplan.core.capacity.trtllm import fit_trtllm
from kvplan.core.capacity.vllm import fit_vllm
from kvplan.core.engines import get_engine
from kvplan.core.spec import AttentionLayer
from kvplan.errors import InputError, KvplanError

FITTERS = {"vllm": fit_vllm, "sglang": fit_sglang, "trtllm": fit_trtllm}

# what_if proposes tensor parallelism within one node: 8 GPUs on NVLink (HGX/DGX H100, H200, B200 boards);
# beyond that tp crosses nodes, which is a different deployment, not a flag to try.
MAX_TP_IN_NODE = 8
# The utilization what_if proposes: kvplan's choice, not an engine default; above it the engines warn or
# fail on fragmentation and on other processes' memory (vLLM's own docs suggest raising toward 0.95).
HIGH_UTILIZATION = 0.95


def fit(req: FitRequest) -> FitResult:
    if req.engine not in FITTERS:
        raise InputError(f"fit knows the budgets of {', '.join(FITTERS)}; not {req.engine!r}")
    check_request(req)
    get_engine(req.engine).check_kv_dtype(req.kv_dtype)
    result = FITTERS[req.engine](req)
    model_max = req.spec.max_model_len
    if req.max_model_len and 0 < model_max < req.max_model_len:
        # vLLM refuses this unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (vllm/config/model.py, _get_and_verify_max_len)
        result = dataclasses.replace(result, notes=(*result.notes, (
            f"max_model_len {req.max_model_len:,} exceeds the model's {model_max:,} positions: engines refuse it "
            "unless told otherwise (vLLM: VLLM_ALLOW_LONG_MAX_MODEL_LEN=1), and quality past it is not assured")))
    return result


@dataclass(frozen=True, kw_only=True)
class WhatIf:
    change: str
    result: FitResult | None
    error: str = ""


def _tp_allowed(req: FitRequest, tp: int) -> bool:
    spec = req.spec
    if spec.num_attention_heads % tp:
        return False
    for layer in spec.layers:
        if isinstance(layer, AttentionLayer):
            kv = layer.num_kv_heads
            if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
                return False
    return True


def what_if(req: FitRequest, base: FitResult) -> list[WhatIf]:
    """Alternatives a user can try, each fitted with the same rules."""
    options: list[tuple[str, FitRequest]] = []
    if base.kv_dtype not in ("fp8_e4m3", "fp8_e5m2", "int4", "nvfp4"):
        options.append(("--kv-cache-dtype fp8", dataclasses.replace(req, kv_dtype="fp8")))
    for tp in (req.tp * 2, req.tp * 4):
        if tp <= MAX_TP_IN_NODE and _tp_allowed(req, tp):
            options.append((f"--tensor-parallel-size {tp}", dataclasses.replace(req, tp=tp)))
    if 0 < base.max_model_len_fit < base.max_model_len:
        options.append((f"--max-model-len {base.max_model_len_fit}",
                        dataclasses.replace(req, max_model_len=base.max_model_len_fit)))
    util = base.settings.get("gpu_memory_utilization") or base.settings.get("mem_fraction_static") or base.settings.get(
        "free_gpu_memory_fraction") or 0.9
    if float(util) < HIGH_UTILIZATION:
        options.append((f"--gpu-memory-utilization {HIGH_UTILIZATION}",
                        dataclasses.replace(req, gpu_memory_utilization=HIGH_UTILIZATION)))
    if req.weights_memory is None and req.weight_dtype in ("auto", "bf16", "fp16") and base.weight_dtype in ("bf16", "fp16"):
        options.append(("--weight-dtype fp8 (an FP8 checkpoint)", dataclasses.replace(req, weight_dtype="fp8")))
    out = []
    for label, alt in options:
        try:
            out.append(WhatIf(change=label, result=fit(alt)))
        except KvplanError as exc:
            out.append(WhatIf(change=label, result=None, error=str(exc)))
    return out
