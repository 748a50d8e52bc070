"""vLLM v1's memory budget and KV block layout.

Sources (vllm-project/vllm; details and commits in docs/engine-research.md):
- ``vllm/v1/worker/gpu_worker.py:Worker.determine_available_memory``: KV memory =
  ceil(total x gpu_memory_utilization) - (weights + torch activation peak of ``profile_run`` over
  max_num_batched_tokens + non-torch increase) - CUDA graph estimate (subtracted by default since
  v0.21); ``kv_cache_memory_bytes`` replaces all of it.
- The block layout, fit check and capacity: kvplan.core.capacity.vllm_plan.
- Defaults (``vllm/engine/arg_utils.py``, ``vllm/config/cache.py``): gpu_memory_utilization 0.92 (0.9
  before late 2025), block size 16 (64 for MLA with FlashMLA, ``vllm/platforms/cuda.py``);
  max_num_batched_tokens 8192 and max_num_seqs 1024 for the OpenAI server on GPUs with >= 70 GiB
  other than A100, else 2048 and 256.
"""

from __future__ import annotations

import math

from kvplan.core.capacity import estimates
from kvplan.core.capacity.common import (
    Breakdown,
    FitRequest,
    FitResult,
    GiB,
    given_or_estimate,
    model_weights,
    resolve_kv_dtype,
)
from kvplan.core.capacity.vllm_plan import (  # noqa: F401  (the planning API, importable from here too)
    DEFAULT_BLOCK_SIZE,
    Bucket,
    KVLayout,
    VLLMPlan,
    attention_page_bytes,
    build_layout,
    check_layout_dtype,
    estimate_max_model_len,
    layout_from_groups,
    logged_kv_cache_tokens,
    max_concurrency,
    plan_stages,
    plan_vllm,
    resolve_block_size,
)
from kvplan.core.profiles.vllm import VLLMRules, batch_defaults, capture_sizes
from kvplan.core.sizing import pp_stages
from kvplan.core.spec import AttentionLayer, Layer, LayerKind
from kvplan.errors import ConfigError, InputError

def kv_layout(layers: list[Layer], req: FitRequest, block_size: int, *, hybrid: bool = True) -> KVLayout | None:
    """``build_layout`` with a fit request's model, dtype, tp and the rules of its release."""
    return build_layout(layers, rules=req.engine_profile().rules, kv_dtype=resolve_kv_dtype(req.spec, req.kv_dtype),
                        model_dtype=req.spec.dtype, block_size=block_size, tp=req.tp,
                        requested_block_size=req.block_size, hybrid=hybrid, mamba_cache_mode=req.mamba_cache_mode,
                        num_speculative_tokens=req.num_speculative_tokens, name=req.spec.name)


_max_len_fit = estimate_max_model_len  # the name earlier code used


def _in_flight_tokens(rules: VLLMRules, mnbt: int, pp: int) -> int:
    """Tokens a sliding/chunked layer must admit: max_num_batched_tokens until 0.26; then
    max_concurrent_batches x max_num_batched_tokens, two batches with async scheduling at pp 1, else pp
    (0.26.0: vllm/config/vllm.py)."""
    if not rules.in_flight_admission:
        return mnbt
    return mnbt * (2 if rules.async_default and pp == 1 else pp)


def _rank_memory(req: FitRequest) -> list[int]:
    """Each pipeline stage's smallest GPU: vLLM sizes every rank of a stage alike, and the smallest rank's
    blocks become every rank's (docs/engine-versions-research.md section 1j)."""
    if req.gpu_memory_per_rank is None:
        return [req.gpu.memory_bytes] * req.pp
    ranks = req.gpu_memory_per_rank
    if len(ranks) != req.tp * req.pp:
        raise InputError(f"--gpu-memory lists {len(ranks)} GPUs; tp {req.tp} x pp {req.pp} needs "
                         f"{req.tp * req.pp} (one size per GPU, or one size for all)")
    if min(ranks) <= 0:
        raise InputError(f"--gpu-memory: every GPU needs memory > 0 (got {min(ranks)})")
    return [min(ranks[s * req.tp:(s + 1) * req.tp]) for s in range(req.pp)]


def fit_vllm(req: FitRequest) -> FitResult:
    profile = req.engine_profile()
    rules: VLLMRules = profile.rules
    spec, gpu = req.spec, req.gpu
    util = req.gpu_memory_utilization or rules.default_utilization
    block_size = resolve_block_size(rules, spec.layers, req.block_size, req.attention_backend)
    max_len = req.max_model_len or spec.max_model_len
    if max_len <= 0:
        raise ConfigError(f"{spec.name} gives no maximum context; pass --max-model-len")
    kv_dtype = resolve_kv_dtype(spec, req.kv_dtype)
    check_layout_dtype(rules, kv_dtype, profile.version)
    default_mnbt, default_seqs = batch_defaults(rules, gpu, max_len)
    mnbt = req.max_num_batched_tokens or default_mnbt
    max_num_seqs = req.max_num_seqs or default_seqs
    in_flight = _in_flight_tokens(rules, mnbt, req.pp)
    hybrid = rules.hybrid_manager and not req.disable_hybrid_kv_cache_manager
    weights, notes = model_weights(req)
    estimated: set[str] = set()
    stages = pp_stages(spec.num_layers, req.pp)
    stage_memory = _rank_memory(req)
    act_bytes = resolve_kv_dtype(spec, "auto").vector_bytes(1)
    graphs = [] if req.enforce_eager else capture_sizes(rules, max_num_seqs=max_num_seqs, max_num_batched_tokens=mnbt)
    subtract_graphs = rules.cuda_graphs == "subtracted"
    if req.kv_cache_memory_bytes is not None and not rules.kv_cache_memory_bytes:
        notes.append(f"vLLM {profile.version} has no --kv-cache-memory-bytes (from 0.10.2): the figure is used as "
                     "the KV memory to plan with")
    if req.gpu_memory_per_rank is not None and len(set(req.gpu_memory_per_rank)) > 1:
        notes.append(f"the GPUs differ in memory: vLLM plans with the smallest, {min(req.gpu_memory_per_rank) / GiB:.2f} "
                     "GiB, and gives every rank the smallest rank's block count")

    per_stage = []
    for s, layer_range in enumerate(stages):
        last = s == len(stages) - 1
        requested = math.ceil(stage_memory[s] * util)
        w = req.weights_memory if req.weights_memory is not None else weights.per_stage_bytes[s]  # type: ignore[union-attr]
        a = given_or_estimate(req.activation_memory, "activation", estimated, lambda: estimates.activation_peak_bytes(
            spec, tokens=mnbt, max_num_seqs=max_num_seqs, tp=req.tp, act_bytes=act_bytes, last_stage=last,
            sampler_run=rules.v1))
        nt = given_or_estimate(req.non_torch_memory, "non_torch", estimated,
                               lambda: estimates.non_torch_bytes(req.tp, req.pp))
        cg = given_or_estimate(req.cuda_graph_memory, "cuda_graph", estimated, lambda: estimates.cuda_graph_bytes(
            spec, num_graphs=len(graphs), tp=req.tp, pp=req.pp, era=estimates.cuda_graph_era(rules)))
        if req.kv_cache_memory_bytes is not None:
            kv = req.kv_cache_memory_bytes
        else:
            kv = requested - w - a - nt - (cg if subtract_graphs else 0)
        layout = build_layout([spec.layers[i] for i in layer_range], rules=rules, kv_dtype=kv_dtype,
                              model_dtype=spec.dtype, block_size=block_size, tp=req.tp,
                              requested_block_size=req.block_size, hybrid=hybrid,
                              mamba_cache_mode=req.mamba_cache_mode, num_speculative_tokens=req.num_speculative_tokens,
                              name=spec.name)
        blocks = max(0, kv) // layout.pool_block_bytes if layout else 1
        per_stage.append((blocks, kv, layout, w, a, nt, cg, stage_memory[s], requested))

    blocks, kv, layout, w, a, nt, cg, memory, requested = min(per_stage, key=lambda t: (t[0], t[1]))
    if all(stage[2] is None for stage in per_stage):
        return _attention_free(req, profile, util, max_len, max_num_seqs, w, a, nt, cg, requested, estimated, notes,
                               weights)
    plan = plan_stages([(st[2], st[1]) for st in per_stage], rules, max_len, in_flight_tokens=in_flight,
                       num_gpu_blocks_override=req.num_gpu_blocks_override, auto_fit=req.auto_fit_max_model_len)
    layout = plan.layout
    assert layout is not None
    blocks = plan.num_blocks
    if req.auto_fit_max_model_len:
        notes.append(f"max_model_len -1: vLLM fits the longest context the KV memory holds, {plan.max_model_len:,} "
                     f"(searched up to {max_len:,})")
        max_len = plan.max_model_len
    usable = max(0, blocks - 1) if rules.v1 else blocks  # V1's block pool keeps block 0 as the null block
    reasons = []
    if kv <= 0:
        graphs_txt = f" + CUDA graphs {cg / GiB:.2f} GiB" if subtract_graphs else ""
        reasons.append(f"no memory left for the KV cache: weights {w / GiB:.2f} GiB + activation {a / GiB:.2f} GiB + "
                       f"non-torch {nt / GiB:.2f} GiB{graphs_txt} exceed "
                       f"{util} x {memory / GiB:.2f} GiB = {requested / GiB:.2f} GiB "
                       f"(short by {-kv / GiB:.2f} GiB)")
    elif not plan.fits:
        short = [(st.layout.bytes_needed(max_len, in_flight), st.planning_bytes) for st in plan.stages
                 if st.layout is not None and st.layout.bytes_needed(max_len, in_flight) > st.planning_bytes]
        needed, avail = short[0] if short else (0, 0)
        if max_len <= 0:
            reasons.append(f"no context fits: one block per layer group needs {layout.pool_block_bytes / GiB:.2f} GiB "
                           f"of KV cache, {max(0, avail) / GiB:.2f} GiB available")
        else:
            reasons.append(f"one request of max_model_len {max_len:,} needs {needed / GiB:.2f} GiB of KV cache, "
                           f"{max(0, avail) / GiB:.2f} GiB available; the longest that fits is "
                           f"{plan.estimated_max_model_len:,}")
    concurrency = plan.max_concurrency
    if req.concurrency and concurrency < req.concurrency and not reasons:
        reasons.append(f"{req.concurrency} concurrent requests of {max_len:,} tokens need "
                       f"{req.concurrency / max(concurrency, 1e-9):.2f}x the KV cache; {concurrency:.2f} fit")
    kv_shown = max(0, kv)
    if req.kv_cache_memory_bytes is None:
        unused = memory - requested - (0 if subtract_graphs else cg)
    else:
        unused = max(0, memory - w - a - nt - cg - kv_shown)
    if layout.num_groups > 1:
        notes.append(f"vLLM groups the layers into {layout.num_groups} groups of {layout.group_size}; "
                     f"a block spans one layer of each group")
    if layout.tensor_pages:
        notes.append(f"layers of one attention type with different page sizes share one group: a block costs "
                     f"{layout.pool_block_bytes:,} B, the sum of their pages")
    if not hybrid and any(isinstance(x, AttentionLayer) and x.kind is not LayerKind.FULL for x in spec.layers):
        notes.append("sliding-window layers are sized as full attention: " + (
            "--disable-hybrid-kv-cache-manager" if rules.hybrid_manager else
            f"vLLM {profile.version} has no hybrid KV cache manager (from 0.9.1)"))
    if req.num_gpu_blocks_override:
        notes.append(f"--num-gpu-blocks-override {req.num_gpu_blocks_override} replaces the {_memory_blocks(per_stage)} "
                     "blocks the memory holds" + (" and is what the fit check plans with" if rules.override_in_fit
                                                  else " (the fit check still plans with the memory before 0.20.1)"))
    if graphs and rules.cuda_graphs != "subtracted":
        notes.append(f"CUDA graphs ({len(graphs)} batch sizes, {cg / GiB:.2f} GiB) are captured after the KV cache "
                     + ("is allocated, from the 1 - utilization slack" if rules.cuda_graphs == "after_kv" else
                        "is sized: estimated and logged, not subtracted unless VLLM_MEMORY_PROFILER_ESTIMATE_"
                        "CUDAGRAPHS=1"))
    return FitResult(
        engine="vllm", gpu=gpu, tp=req.tp, pp=req.pp, kv_dtype=kv_dtype.name,
        weight_dtype=weights.format if weights else "given", max_model_len=max_len,
        breakdown=Breakdown(weights=w, activation=a, non_torch=nt, cuda_graph=cg, kv_cache=kv_shown, unused=unused),
        kv_cache_memory_bytes=kv_shown, block_size=layout.min_block_size, page_size_bytes=layout.pool_block_bytes,
        num_blocks=blocks, kv_cache_tokens=blocks // layout.num_groups * layout.min_block_size,
        max_concurrency=concurrency, max_model_len_fit=plan.estimated_max_model_len, fits=not reasons,
        reasons=tuple(reasons), estimated=tuple(sorted(estimated)),
        settings={"gpu_memory_utilization": util, "block_size": layout.min_block_size, "max_num_batched_tokens": mnbt,
                  "max_num_seqs": max_num_seqs, "cuda_graph_sizes": len(graphs)},
        notes=tuple(notes), params=weights.params if weights else 0, engine_version=profile.version,
        usable_blocks=usable, logged_kv_cache_tokens=plan.logged_kv_cache_tokens,
        logged_capacity_rule=plan.logged_capacity_rule,
    )


def _memory_blocks(per_stage: list[tuple]) -> int:
    """Blocks the KV memory holds: the minimum over pipeline stages."""
    return min(st[0] for st in per_stage if st[2] is not None)


def _attention_free(req: FitRequest, profile, util: float, max_len: int, max_num_seqs: int, w: int, a: int, nt: int,
                    cg: int, requested: int, estimated: set[str], notes: list[str], weights) -> FitResult:
    """A model with no KV layers: vLLM allocates one (null) block and checks no KV memory."""
    notes.append("no layer holds a KV cache: vLLM allocates one null block and requests are bounded by "
                 "max_num_seqs")
    return FitResult(
        engine="vllm", gpu=req.gpu, tp=req.tp, pp=req.pp, kv_dtype=resolve_kv_dtype(req.spec, req.kv_dtype).name,
        weight_dtype=weights.format if weights else "given", max_model_len=max_len,
        breakdown=Breakdown(weights=w, activation=a, non_torch=nt, cuda_graph=cg, kv_cache=0,
                            unused=min(_rank_memory(req)) - requested),
        kv_cache_memory_bytes=0, block_size=req.block_size or DEFAULT_BLOCK_SIZE, page_size_bytes=0, num_blocks=1,
        kv_cache_tokens=0, max_concurrency=float(max_num_seqs), max_model_len_fit=max_len, fits=True, reasons=(),
        estimated=tuple(sorted(estimated)), settings={"gpu_memory_utilization": util, "max_num_seqs": max_num_seqs},
        notes=tuple(notes), params=weights.params if weights else 0, engine_version=profile.version,
        usable_blocks=0, logged_kv_cache_tokens=0, logged_capacity_rule="no KV cache",
    )
