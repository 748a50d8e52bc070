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
from kvplan.core.engines import VLLM_MLA_BLOCK_SIZE, get_engine
from kvplan.core.engines.base import cdiv
from kvplan.core.sizing import pp_stages
from kvplan.core.spec import AttentionLayer, Layer, LayerKind, LinearLayer, MLALayer
from kvplan.errors import ConfigError

DEFAULT_UTILIZATION = 0.92
DEFAULT_BLOCK_SIZE = 16
MLA_BLOCK_SIZE = VLLM_MLA_BLOCK_SIZE
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


def kv_layout(layers: list[Layer], req: FitRequest, block_size: int) -> KVLayout:
    """vLLM's grouping of one pipeline stage's layers into block-table groups."""
    eng = get_engine("vllm")
    dtype = resolve_kv_dtype(req.spec, req.kv_dtype)
    buckets: dict[tuple, list[Layer]] = {}
    for layer in layers:
        if isinstance(layer, LinearLayer):
            key: tuple = (LayerKind.LINEAR, 0, eng.linear_state_bytes(layer, req.spec.dtype, req.tp)[0])
        elif isinstance(layer, (AttentionLayer, MLALayer)):
            window = layer.window if isinstance(layer, AttentionLayer) else 0
            key = (layer.kind if layer.kind is not LayerKind.MLA else LayerKind.FULL, window,
                   eng.slot_bytes(layer, dtype, req.tp)[0])
        else:
            continue
        buckets.setdefault(key, []).append(layer)
    if not buckets:
        raise ConfigError(f"{req.spec.name}: no layer on this stage holds KV cache")
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


def fit_vllm(req: FitRequest) -> FitResult:
    spec, gpu = req.spec, req.gpu
    big_gpu = gpu.memory_bytes >= 70 * GiB and not gpu.is_a100_class
    util = req.gpu_memory_utilization or DEFAULT_UTILIZATION
    has_mla = any(isinstance(layer, MLALayer) for layer in spec.layers)
    block_size = req.block_size or (MLA_BLOCK_SIZE if has_mla else DEFAULT_BLOCK_SIZE)
    mnbt = req.max_num_batched_tokens or (8192 if big_gpu else 2048)
    max_num_seqs = req.max_num_seqs or (1024 if big_gpu else 256)
    max_len = req.max_model_len or spec.max_model_len
    if max_len <= 0:
        raise ConfigError(f"{spec.name} gives no maximum context; pass --max-model-len")
    weights, notes = model_weights(req)
    estimated: set[str] = set()
    stages = pp_stages(spec.num_layers, req.pp)
    act_bytes = resolve_kv_dtype(spec, "auto").vector_bytes(1)
    requested = math.ceil(gpu.memory_bytes * util)

    per_stage = []
    for s, layer_range in enumerate(stages):
        last = s == len(stages) - 1
        w = req.weights_memory if req.weights_memory is not None else weights.per_stage_bytes[s]  # type: ignore[union-attr]
        a = given_or_estimate(req.activation_memory, "activation", estimated, lambda: estimates.activation_peak_bytes(
            spec, tokens=mnbt, max_num_seqs=max_num_seqs, tp=req.tp, act_bytes=act_bytes, last_stage=last,
            sampler_run=not req.legacy_v0))
        nt = given_or_estimate(req.non_torch_memory, "non_torch", estimated,
                               lambda: estimates.non_torch_bytes(req.tp, req.pp))
        cg = given_or_estimate(req.cuda_graph_memory, "cuda_graph", estimated, lambda: estimates.cuda_graph_bytes(
            spec, enforce_eager=req.enforce_eager, tp=req.tp, pp=req.pp, v1=not req.legacy_v0))
        if req.kv_cache_memory_bytes is not None:
            kv = req.kv_cache_memory_bytes
        else:
            kv = requested - w - a - nt - (cg if req.cuda_graphs_in_budget else 0)
        layout = kv_layout([spec.layers[i] for i in layer_range], req, block_size)
        blocks = max(0, kv) // layout.page_bytes // layout.group_size
        per_stage.append((blocks, kv, layout, w, a, nt, cg))

    blocks, kv, layout, w, a, nt, cg = min(per_stage, key=lambda t: (t[0], t[1]))
    per_req_blocks = layout.blocks_per_request(max_len, mnbt)
    concurrency = blocks / per_req_blocks if per_req_blocks else 0.0
    max_fit = min(_max_len_fit(stage[2], stage[1], max(spec.max_model_len, max_len), mnbt) for stage in per_stage)
    reasons = []
    if kv <= 0:
        reasons.append(f"no memory left for the KV cache: weights {w / GiB:.2f} GiB + activation {a / GiB:.2f} GiB + "
                       f"non-torch {nt / GiB:.2f} GiB + CUDA graphs {cg / GiB:.2f} GiB exceed "
                       f"{util} x {gpu.memory_bytes / GiB:.2f} GiB = {requested / GiB:.2f} GiB "
                       f"(short by {-kv / GiB:.2f} GiB)")
    else:
        short = [(st[2].bytes_needed(max_len, mnbt), st[1]) for st in per_stage if st[2].bytes_needed(max_len, mnbt) > st[1]]
        if short:
            needed, avail = short[0]
            reasons.append(f"one request of max_model_len {max_len:,} needs {needed / GiB:.2f} GiB of KV cache, "
                           f"{avail / GiB:.2f} GiB available; the longest that fits is {max_fit:,}")
    if req.concurrency and concurrency < req.concurrency and not reasons:
        reasons.append(f"{req.concurrency} concurrent requests of {max_len:,} tokens need "
                       f"{req.concurrency / max(concurrency, 1e-9):.2f}x the KV cache; {concurrency:.2f} fit")
    kv_shown = max(0, kv)
    if req.kv_cache_memory_bytes is None:
        unused = gpu.memory_bytes - requested - (0 if req.cuda_graphs_in_budget else cg)
    else:
        unused = max(0, gpu.memory_bytes - w - a - nt - cg - kv_shown)
    if layout.num_groups > 1:
        notes.append(f"vLLM groups the layers into {layout.num_groups} groups of {layout.group_size}; "
                     f"a block spans one layer of each group")
    return FitResult(
        engine="vllm", gpu=gpu, tp=req.tp, pp=req.pp, kv_dtype=resolve_kv_dtype(spec, req.kv_dtype).name,
        weight_dtype=weights.format if weights else "given", max_model_len=max_len,
        breakdown=Breakdown(weights=w, activation=a, non_torch=nt, cuda_graph=cg, kv_cache=kv_shown, unused=unused),
        kv_cache_memory_bytes=kv_shown, block_size=layout.min_block_size, page_size_bytes=layout.page_bytes * layout.group_size,
        num_blocks=blocks, kv_cache_tokens=blocks // layout.num_groups * layout.min_block_size,
        max_concurrency=concurrency, max_model_len_fit=max_fit, fits=not reasons, reasons=tuple(reasons),
        estimated=tuple(sorted(estimated)),
        settings={"gpu_memory_utilization": util, "block_size": layout.min_block_size, "max_num_batched_tokens": mnbt,
                  "max_num_seqs": max_num_seqs},
        notes=tuple(notes), params=weights.params if weights else 0,
    )
