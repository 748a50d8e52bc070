"""vLLM v1's memory budget and KV block layout.

Sources (vllm-project/vllm; details and commits in docs/engine-research.md):
- ``vllm/v1/worker/gpu_worker.py:Worker.determine_available_memory``: KV memory =
  ceil(total x gpu_memory_utilization) - (weights + torch activation peak of ``profile_run`` over
  max_num_batched_tokens + non-torch increase) - CUDA graph estimate (subtracted by default since
  v0.21); ``kv_cache_memory_bytes`` replaces all of it.
- ``vllm/v1/core/kv_cache_utils.py``: layers bucketed by spec; one bucket is one group of all layers;
  hybrids get group_size = min layers per type (max when max < 1.5 x min), each type cdiv(n, group_size)
  groups; page sizes unified by enlarging the smaller spec's block size; num_blocks =
  available // page // group_size, the minimum over pipeline stages; the per-request need and the
  max-model-len estimate (binary search) use group_size x page x sum over groups of blocks needed.
- ``vllm/v1/kv_cache_interface.py:max_memory_usage_bytes``: full cdiv(L, B) blocks; sliding
  cdiv(min(W - 1 + max_num_batched_tokens, L), B) + 1; chunked cdiv(min(C + max_num_batched_tokens, L), B);
  mamba one block.
- Hybrid attention + mamba (``vllm/platforms/interface.py``): attention block size =
  16 x cdiv(mamba page, 16 x attention bytes per token); the mamba page is padded to match.
- Defaults (``vllm/engine/arg_utils.py``, ``vllm/config/cache.py``): gpu_memory_utilization 0.92 (0.9
  before late 2025), block size 16 (64 for MLA with FlashMLA, ``vllm/platforms/cuda.py``);
  max_num_batched_tokens 8192 and max_num_seqs 1024 for the OpenAI server on GPUs with >= 70 GiB
  other than A100, else 2048 and 256.
- "GPU KV cache size: N tokens" = num_blocks // num_groups x block size; "Maximum concurrency" =
  num_blocks / blocks one request of max_model_len needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
from kvplan.core.engines import get_engine
from kvplan.core.engines.base import cdiv
from kvplan.core.profiles.vllm import VLLMRules, batch_defaults, capture_sizes
from kvplan.core.sizing import pp_stages
from kvplan.core.spec import AttentionLayer, Layer, LayerKind, LinearLayer, MLALayer
from kvplan.errors import ConfigError

DEFAULT_BLOCK_SIZE = 16  # vllm/config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE, every release read
KERNEL_BLOCK_ALIGN = 16


@dataclass(frozen=True, kw_only=True)
class Bucket:
    kind: LayerKind
    window: int
    block_size: int
    num_layers: int
    num_groups: int


@dataclass(frozen=True, kw_only=True)
class KVLayout:
    page_bytes: int  # one block of one layer (all groups share it after unification)
    group_size: int  # layers per group: tensors the block pool spans
    buckets: tuple[Bucket, ...]

    @property
    def num_groups(self) -> int:
        return sum(b.num_groups for b in self.buckets)

    @property
    def min_block_size(self) -> int:
        return min(b.block_size for b in self.buckets)

    def blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        total = 0
        for b in self.buckets:
            if b.kind is LayerKind.LINEAR:
                need = 1
            elif b.kind is LayerKind.SLIDING:
                need = cdiv(min(b.window - 1 + max_num_batched_tokens, max_model_len), b.block_size) + 1
            elif b.kind is LayerKind.CHUNKED:
                need = cdiv(min(b.window + max_num_batched_tokens, max_model_len), b.block_size)
            else:
                need = cdiv(max_model_len, b.block_size)
            total += b.num_groups * need
        return total

    def bytes_needed(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        return self.group_size * self.page_bytes * self.blocks_per_request(max_model_len, max_num_batched_tokens)


def kv_layout(layers: list[Layer], req: FitRequest, block_size: int, *, hybrid: bool = True) -> KVLayout | None:
    """vLLM's grouping of one pipeline stage's layers into block-table groups (None: no layer holds KV).
    Without the hybrid manager every attention layer is sized as full attention."""
    eng = get_engine("vllm")
    dtype = resolve_kv_dtype(req.spec, req.kv_dtype)
    buckets: dict[tuple, list[Layer]] = {}
    for layer in layers:
        if isinstance(layer, LinearLayer):
            key: tuple = (LayerKind.LINEAR, 0, eng.linear_state_bytes(layer, req.spec.dtype, req.tp)[0])
        elif isinstance(layer, (AttentionLayer, MLALayer)):
            window = layer.window if isinstance(layer, AttentionLayer) and hybrid else 0
            kind = layer.kind if layer.kind is not LayerKind.MLA and hybrid else LayerKind.FULL
            key = (kind, window, eng.slot_bytes(layer, dtype, req.tp)[0])
        else:
            continue
        buckets.setdefault(key, []).append(layer)
    if not buckets:
        return None
    attn_tok = max((k[2] for k in buckets if k[0] is not LayerKind.LINEAR), default=0)
    linear_bytes = max((k[2] for k in buckets if k[0] is LayerKind.LINEAR), default=0)
    if linear_bytes and attn_tok:
        align = max(KERNEL_BLOCK_ALIGN, req.block_size or 0)
        block_size = align * cdiv(linear_bytes, align * attn_tok)
        page = block_size * attn_tok
    elif linear_bytes:
        page = linear_bytes
    else:
        page = block_size * attn_tok
    counts = [len(v) for v in buckets.values()]
    if len(counts) == 1:
        group_size = counts[0]
    else:
        group_size = max(counts) if max(counts) < 1.5 * min(counts) else min(counts)
    out = []
    for (kind, window, tok_bytes), members in buckets.items():
        if kind is LayerKind.LINEAR:
            bucket_block = block_size
        else:
            own_page = block_size * tok_bytes
            if page % own_page:
                raise ConfigError(f"{req.spec.name}: layers with page sizes {own_page} and {page} B cannot share "
                                  "vLLM's block pool (sizes must divide)")
            bucket_block = block_size * (page // own_page)
        out.append(Bucket(kind=kind, window=window, block_size=bucket_block, num_layers=len(members),
                          num_groups=cdiv(len(members), group_size)))
    return KVLayout(page_bytes=page, group_size=group_size, buckets=tuple(out))


def _max_len_fit(layout: KVLayout, kv_bytes: int, upper: int, mnbt: int) -> int:
    """Largest max_model_len whose one request fits (vLLM ``_estimate_max_model_len``: binary search)."""
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if layout.bytes_needed(mid, mnbt) <= kv_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _in_flight_tokens(rules: VLLMRules, mnbt: int, pp: int) -> int:
    """Tokens a sliding/chunked layer must admit: max_num_batched_tokens until 0.26; then
    max_concurrent_batches x max_num_batched_tokens, two batches with async scheduling at pp 1, else pp
    (0.26.0: vllm/config/vllm.py)."""
    if not rules.in_flight_admission:
        return mnbt
    return mnbt * (2 if rules.async_default and pp == 1 else pp)


def _logged_tokens(rules: VLLMRules, blocks: int, layout: KVLayout, concurrency: float, max_len: int) -> tuple[int, str]:
    """The startup log's "GPU KV cache size" in this release, and how it is computed."""
    if rules.capacity_log == "concurrency_x_len":
        return int(concurrency * max_len), "int(max concurrency x max_model_len)"
    if rules.capacity_log == "blocks_per_group":
        return blocks // layout.num_groups * layout.min_block_size, "num_blocks // layer groups x block_size"
    if rules.capacity_log == "blocks_x_block":
        return blocks * layout.min_block_size, "num_blocks x block_size"
    return blocks * layout.min_block_size, "V0 logs '# GPU blocks' only: num_blocks x block_size"


def fit_vllm(req: FitRequest) -> FitResult:
    profile = req.engine_profile()
    rules: VLLMRules = profile.rules
    spec, gpu = req.spec, req.gpu
    util = req.gpu_memory_utilization or rules.default_utilization
    has_mla = any(isinstance(layer, MLALayer) for layer in spec.layers)
    block_size = req.block_size or (rules.mla_block_size if has_mla else DEFAULT_BLOCK_SIZE)
    max_len = req.max_model_len or spec.max_model_len
    if max_len <= 0:
        raise ConfigError(f"{spec.name} gives no maximum context; pass --max-model-len")
    default_mnbt, default_seqs = batch_defaults(rules, gpu, max_len)
    mnbt = req.max_num_batched_tokens or default_mnbt
    max_num_seqs = req.max_num_seqs or default_seqs
    in_flight = _in_flight_tokens(rules, mnbt, req.pp)
    hybrid = rules.hybrid_manager and not req.disable_hybrid_kv_cache_manager
    weights, notes = model_weights(req)
    estimated: set[str] = set()
    stages = pp_stages(spec.num_layers, req.pp)
    act_bytes = resolve_kv_dtype(spec, "auto").vector_bytes(1)
    requested = math.ceil(gpu.memory_bytes * util)
    graphs = [] if req.enforce_eager else capture_sizes(rules, max_num_seqs=max_num_seqs, max_num_batched_tokens=mnbt)
    subtract_graphs = rules.cuda_graphs == "subtracted"
    if req.kv_cache_memory_bytes is not None and not rules.kv_cache_memory_bytes:
        notes.append(f"vLLM {profile.version} has no --kv-cache-memory-bytes (from 0.10.2): the figure is used as "
                     "the KV memory to plan with")

    per_stage = []
    for s, layer_range in enumerate(stages):
        last = s == len(stages) - 1
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
        layout = kv_layout([spec.layers[i] for i in layer_range], req, block_size, hybrid=hybrid)
        if layout is None:
            per_stage.append((1, kv, None, w, a, nt, cg))
            continue
        blocks = max(0, kv) // layout.page_bytes // layout.group_size
        per_stage.append((blocks, kv, layout, w, a, nt, cg))

    blocks, kv, layout, w, a, nt, cg = min(per_stage, key=lambda t: (t[0], t[1]))
    if all(stage[2] is None for stage in per_stage):
        return _attention_free(req, profile, util, max_len, max_num_seqs, w, a, nt, cg, requested, estimated, notes,
                               weights)
    layout = layout or next(stage[2] for stage in per_stage if stage[2] is not None)
    if req.num_gpu_blocks_override:
        blocks = req.num_gpu_blocks_override
    usable = max(0, blocks - 1) if rules.v1 else blocks  # V1's block pool keeps block 0 as the null block

    def planning_bytes(stage: tuple) -> int:
        """What the fit check and the max-model-len search compare with: the KV memory (or the override's
        blocks from 0.20.1), less one block for the null block from 0.29."""
        lay = stage[2]
        if lay is None:
            return stage[1]
        avail = stage[1]
        if req.num_gpu_blocks_override and rules.override_in_fit:
            avail = req.num_gpu_blocks_override * lay.page_bytes * lay.group_size
        if rules.null_block_in_fit:
            avail -= lay.page_bytes * lay.group_size
        return avail

    per_req_blocks = layout.blocks_per_request(max_len, in_flight)
    concurrency = blocks / per_req_blocks if per_req_blocks else 0.0
    max_fit = min(_max_len_fit(st[2], planning_bytes(st), max_len, in_flight) for st in per_stage if st[2] is not None)
    reasons = []
    if kv <= 0:
        graphs_txt = f" + CUDA graphs {cg / GiB:.2f} GiB" if subtract_graphs else ""
        reasons.append(f"no memory left for the KV cache: weights {w / GiB:.2f} GiB + activation {a / GiB:.2f} GiB + "
                       f"non-torch {nt / GiB:.2f} GiB{graphs_txt} exceed "
                       f"{util} x {gpu.memory_bytes / GiB:.2f} GiB = {requested / GiB:.2f} GiB "
                       f"(short by {-kv / GiB:.2f} GiB)")
    else:
        short = [(st[2].bytes_needed(max_len, in_flight), planning_bytes(st)) for st in per_stage
                 if st[2] is not None and st[2].bytes_needed(max_len, in_flight) > planning_bytes(st)]
        if short:
            needed, avail = short[0]
            reasons.append(f"one request of max_model_len {max_len:,} needs {needed / GiB:.2f} GiB of KV cache, "
                           f"{avail / GiB:.2f} GiB available; the longest that fits is {max_fit:,}")
    if req.concurrency and concurrency < req.concurrency and not reasons:
        reasons.append(f"{req.concurrency} concurrent requests of {max_len:,} tokens need "
                       f"{req.concurrency / max(concurrency, 1e-9):.2f}x the KV cache; {concurrency:.2f} fit")
    kv_shown = max(0, kv)
    if req.kv_cache_memory_bytes is None:
        unused = gpu.memory_bytes - requested - (0 if subtract_graphs else cg)
    else:
        unused = max(0, gpu.memory_bytes - w - a - nt - cg - kv_shown)
    if layout.num_groups > 1:
        notes.append(f"vLLM groups the layers into {layout.num_groups} groups of {layout.group_size}; "
                     f"a block spans one layer of each group")
    if not hybrid and any(isinstance(x, AttentionLayer) and x.kind is not LayerKind.FULL for x in spec.layers):
        notes.append("sliding-window layers are sized as full attention: " + (
            "--disable-hybrid-kv-cache-manager" if rules.hybrid_manager else
            f"vLLM {profile.version} has no hybrid KV cache manager (from 0.9.1)"))
    if graphs and rules.cuda_graphs != "subtracted":
        notes.append(f"CUDA graphs ({len(graphs)} batch sizes, {cg / GiB:.2f} GiB) are captured after the KV cache "
                     + ("is allocated, from the 1 - utilization slack" if rules.cuda_graphs == "after_kv" else
                        "is sized: estimated and logged, not subtracted unless VLLM_MEMORY_PROFILER_ESTIMATE_"
                        "CUDAGRAPHS=1"))
    logged, rule = _logged_tokens(rules, blocks, layout, concurrency, max_len)
    return FitResult(
        engine="vllm", gpu=gpu, tp=req.tp, pp=req.pp, kv_dtype=resolve_kv_dtype(spec, req.kv_dtype).name,
        weight_dtype=weights.format if weights else "given", max_model_len=max_len,
        breakdown=Breakdown(weights=w, activation=a, non_torch=nt, cuda_graph=cg, kv_cache=kv_shown, unused=unused),
        kv_cache_memory_bytes=kv_shown, block_size=layout.min_block_size, page_size_bytes=layout.page_bytes * layout.group_size,
        num_blocks=blocks, kv_cache_tokens=blocks // layout.num_groups * layout.min_block_size,
        max_concurrency=concurrency, max_model_len_fit=max_fit, fits=not reasons, reasons=tuple(reasons),
        estimated=tuple(sorted(estimated)),
        settings={"gpu_memory_utilization": util, "block_size": layout.min_block_size, "max_num_batched_tokens": mnbt,
                  "max_num_seqs": max_num_seqs, "cuda_graph_sizes": len(graphs)},
        notes=tuple(notes), params=weights.params if weights else 0, engine_version=profile.version,
        usable_blocks=usable, logged_kv_cache_tokens=logged, logged_capacity_rule=rule,
    )


def _attention_free(req: FitRequest, profile, util: float, max_len: int, max_num_seqs: int, w: int, a: int, nt: int,
                    cg: int, requested: int, estimated: set[str], notes: list[str], weights) -> FitResult:
    """A model with no KV layers: vLLM allocates one (null) block and checks no KV memory."""
    notes.append("no layer holds a KV cache: vLLM allocates one null block and requests are bounded by "
                 "max_num_seqs")
    return FitResult(
        engine="vllm", gpu=req.gpu, tp=req.tp, pp=req.pp, kv_dtype=resolve_kv_dtype(req.spec, req.kv_dtype).name,
        weight_dtype=weights.format if weights else "given", max_model_len=max_len,
        breakdown=Breakdown(weights=w, activation=a, non_torch=nt, cuda_graph=cg, kv_cache=0,
                            unused=req.gpu.memory_bytes - requested),
        kv_cache_memory_bytes=0, block_size=req.block_size or DEFAULT_BLOCK_SIZE, page_size_bytes=0, num_blocks=1,
        kv_cache_tokens=0, max_concurrency=float(max_num_seqs), max_model_len_fit=max_len, fits=True, reasons=(),
        estimated=tuple(sorted(estimated)), settings={"gpu_memory_utilization": util, "max_num_seqs": max_num_seqs},
        notes=tuple(notes), params=weights.params if weights else 0, engine_version=profile.version,
        usable_blocks=0, logged_kv_cache_tokens=0, logged_capacity_rule="no KV cache",
    )
