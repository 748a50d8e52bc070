"""The pool a v1 simulation runs on, from the same model spec and engine profile ``kvplan fit`` uses.

``kvplan fit`` (kvplan.core.engines.vllm.budget) decides num_blocks from the memory budget and plans the groups with
kvplan.core.engines.vllm.plan; ``layout_from_fit`` re-plans the layout with that block count as vLLM's
num_gpu_blocks_override, so the simulated pool is fit's pool block for block.
"""

from __future__ import annotations

from kvplan.core.capacity.common import FitRequest, FitResult
from kvplan.core.engines.vllm.plan import plan_vllm
from kvplan.core.sim.v1.inputs import CacheLayout, layout_from_plan
from kvplan.errors import InputError


def layout_from_fit(req: FitRequest, result: FitResult) -> CacheLayout:
    """The KV cache groups and blocks ``kvplan fit`` planned for ``req`` (vLLM, one pipeline stage)."""
    if req.engine != "vllm":
        raise InputError(f"the v1 scheduler simulator models vLLM, not {req.engine}")
    if req.pp != 1:
        raise InputError("the v1 scheduler simulator models one pipeline stage (pp 1)")
    mnbt = int(result.settings.get("max_num_batched_tokens", 0)) or result.max_model_len
    plan = plan_vllm(req.spec.layers, 0, result.max_model_len, req.engine_profile(), model_dtype=req.spec.dtype,
                     in_flight_tokens=mnbt, kv_dtype=req.kv_dtype, tp=req.tp, block_size=req.block_size,
                     num_gpu_blocks_override=max(2, result.num_blocks), disable_hybrid=req.disable_hybrid_kv_cache_manager,
                     mamba_cache_mode=req.mamba_cache_mode, num_speculative_tokens=req.num_speculative_tokens,
                     attention_backend=req.attention_backend)
    return layout_from_plan(plan, result.max_model_len)
