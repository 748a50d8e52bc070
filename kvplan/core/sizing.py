"""KV-cache sizing: bytes per token, per sequence, per GPU, per layer group, under an engine's rules.

Pure functions over ``ModelSpec`` and ``Engine``; integer bytes throughout.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.core.dtypes import KVDtype, get_dtype
from kvplan.core.engines.base import Engine
from kvplan.core.spec import AttentionLayer, CompressedLayer, Layer, LinearLayer, MLALayer, ModelSpec
from kvplan.errors import InputError

# Sanity bounds for user numbers: large enough for any real deployment, small enough to catch typos.
MAX_BATCH = 1 << 24
MAX_SEQ_LEN = 1 << 30
MAX_PARALLEL = 4096


def pp_stages(num_layers: int, pp: int) -> list[range]:
    """Layers of each pipeline stage, split as vLLM does.

    vLLM ``vllm/distributed/utils.py:get_pp_indices``: ``num_layers // pp`` each, and the remainder
    given one by one to the stages before the last (the last also holds the LM head).
    """
    if pp > num_layers:
        raise InputError(f"pipeline parallel size {pp} exceeds the model's {num_layers} layers; use at most {num_layers}")
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    stages, start = [], 0
    for size in sizes:
        stages.append(range(start, start + size))
        start += size
    return stages


@dataclass(frozen=True, kw_only=True)
class GroupSize:
    """Identical layers, sized together. Bytes are whole-deployment unless named per_gpu."""

    layer: Layer
    description: str
    layer_indices: tuple[int, ...]
    slot_bytes_per_layer: int  # one token slot of one layer, all ranks
    tokens_held_per_layer: int  # token slots one sequence holds in one layer (0 for fixed state)
    bytes_per_token: int  # what one more token adds across the group, one sequence (before a window fills)
    bytes_per_sequence: int
    total_bytes: int
    per_gpu_bytes: int  # this group's bytes on the most loaded GPU
    formula: str

    @property
    def count(self) -> int:
        return len(self.layer_indices)


@dataclass(frozen=True, kw_only=True)
class SizeResult:
    model: str
    engine: str
    kv_dtype: str
    batch: int
    seq_len: int
    tp: int
    pp: int
    bytes_per_token: int  # the whole deployment: every GPU's slot bytes added (MLA latent: once per rank)
    bytes_per_sequence: int
    total_bytes: int
    per_gpu_bytes: int
    groups: tuple[GroupSize, ...]
    bytes_per_token_per_gpu: int = 0  # what one more token adds on the GPU it adds most to

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp


def check_positive(name: str, value: int, upper: int) -> None:
    if value < 1 or value > upper:
        raise InputError(f"{name} must be between 1 and {upper:,} (got {value:,})")


def _formula(layer: Layer, count: int, engine: Engine, kv_dtype: KVDtype, tp: int, model_dtype: str) -> str:
    if isinstance(layer, LinearLayer):
        conv, state = engine.linear_state_elems(layer)
        conv_dt, state_dt = engine.linear_state_dtypes(layer, model_dtype)
        fixed = (
            f"{count} layers x ({conv:,} conv elems x {conv_dt.name} + {state:,} state elems x {state_dt.name}) per sequence"
        )
        if layer.attention is None:
            return fixed
        return f"{_formula(layer.attention, count, engine, kv_dtype, tp, model_dtype)} per token; {fixed}"

    if isinstance(layer, CompressedLayer):
        per_token = engine.slot_bytes(layer, kv_dtype, 1)[0]
        text = f"{count} layers x {per_token} B (one {layer.head_dim}-elem K=V vector) over the last {layer.window} tokens"
        if layer.compress_ratio:
            text += f", + 1 entry per {layer.compress_ratio} tokens"
            if layer.indexer_head_dim:
                text += f" (+ a {layer.indexer_head_dim}-elem indexer key)"
            text += " + the compressor's open window"
        return text
    vectors = engine.token_vectors(layer, tp)
    if not vectors:
        return "0"
    width = f"{kv_dtype.bits // 8} B" if kv_dtype.bits % 8 == 0 else f"{kv_dtype.bits}/8 B"
    scale = kv_dtype.scale_bytes_for(vectors[0][1])
    scale_txt = f" + {scale} B scales per vector" if scale else ""
    heads = sum(vectors[0][0])
    if isinstance(layer, MLALayer) and engine.mla_latent:
        ranks = f" x {tp} ranks (replicated)" if tp > 1 else ""
        indexer = ""
        if layer.indexer_head_dim:
            indexer = (f" + {layer.indexer_head_dim} indexer key = {engine.indexer_slot_bytes(layer, kv_dtype)} B "
                       f"({engine.indexer_dtype(kv_dtype).name})")
        return (f"{count} layers x ({layer.kv_lora_rank} kv_lora_rank + {layer.qk_rope_head_dim} rope) x {width}{scale_txt}"
                f"{indexer}{ranks}")
    if len(vectors) == 2 and vectors[0][1] == vectors[1][1]:
        return f"2 x {count} layers x {heads} kv_heads x {vectors[0][1]} head_dim x {width}{scale_txt}"
    return f"{count} layers x {heads} kv_heads x ({vectors[0][1]} K + {vectors[1][1]} V) x {width}{scale_txt}"


def size_kv(
    spec: ModelSpec,
    engine: Engine,
    *,
    batch: int,
    seq_len: int,
    kv_dtype: str = "auto",
    tp: int = 1,
    pp: int = 1,
) -> SizeResult:
    """Size the KV cache of ``batch`` sequences of ``seq_len`` tokens each."""
    check_positive("batch", batch, MAX_BATCH)
    check_positive("seq_len", seq_len, MAX_SEQ_LEN)
    check_positive("tensor parallel size", tp, MAX_PARALLEL)
    check_positive("pipeline parallel size", pp, MAX_PARALLEL)
    engine.check_kv_dtype(kv_dtype)
    dtype = get_dtype(spec.dtype if kv_dtype == "auto" else kv_dtype)
    spec = engine.prepare(spec)
    stages = pp_stages(spec.num_layers, pp)
    stage_of = {i: s for s, layers in enumerate(stages) for i in layers}

    # bytes per (stage, rank), and each group's share of it
    gpu_bytes = [[0] * tp for _ in stages]
    gpu_token_bytes = [[0] * tp for _ in stages]
    group_gpu: list[list[list[int]]] = []
    groups_out: list[tuple[Layer, list[int], int, int, int, int]] = []
    for layer, indices in spec.layer_groups():
        share = [[0] * tp for _ in stages]
        if isinstance(layer, LinearLayer):
            per_rank = engine.linear_state_bytes(layer, spec.dtype, tp)
            slots = 0
            slot_total = 0
            if layer.holds_tokens:  # a parallel attention in the same layer (Falcon-H1) holds tokens too
                tok = engine.slot_bytes(layer, dtype, tp)
                for i in indices:
                    for r in range(tp):
                        gpu_token_bytes[stage_of[i]][r] += tok[r]
                slots = engine.slots_held(layer, seq_len)
                slot_total = sum(tok)
                per_rank = tuple(state + t * slots for state, t in zip(per_rank, tok))
        else:
            per_rank = engine.slot_bytes(layer, dtype, tp)
            for i in indices:
                for r in range(tp):
                    gpu_token_bytes[stage_of[i]][r] += per_rank[r]
            slots = engine.slots_held(layer, seq_len)
            slot_total = sum(per_rank)
            if isinstance(layer, CompressedLayer):  # window + compressed entries + compressor state, per engine
                per_rank = (engine.compressed_sequence_bytes(layer, seq_len, dtype, spec.dtype),) * tp
            else:
                per_rank = tuple(b * slots for b in per_rank)
        for i in indices:
            for r in range(tp):
                share[stage_of[i]][r] += per_rank[r] * batch
                gpu_bytes[stage_of[i]][r] += per_rank[r] * batch
        group_gpu.append(share)
        per_seq = sum(per_rank) * len(indices)
        groups_out.append((layer, indices, slot_total, slots, per_seq, per_seq * batch))

    flat = [(s, r) for s in range(len(stages)) for r in range(tp)]
    worst = max(flat, key=lambda sr: gpu_bytes[sr[0]][sr[1]])
    groups = tuple(
        GroupSize(
            layer=layer,
            description=layer.describe(spec.num_attention_heads),
            layer_indices=tuple(indices),
            slot_bytes_per_layer=slot_total,
            tokens_held_per_layer=slots,
            bytes_per_token=slot_total * len(indices),
            bytes_per_sequence=per_seq,
            total_bytes=total,
            per_gpu_bytes=share[worst[0]][worst[1]],
            formula=_formula(layer, len(indices), engine, dtype, tp, spec.dtype),
        )
        for (layer, indices, slot_total, slots, per_seq, total), share in zip(groups_out, group_gpu)
    )
    return SizeResult(
        model=spec.name,
        engine=engine.name,
        kv_dtype=dtype.name,
        batch=batch,
        seq_len=seq_len,
        tp=tp,
        pp=pp,
        bytes_per_token=sum(g.bytes_per_token for g in groups),
        bytes_per_sequence=sum(g.bytes_per_sequence for g in groups),
        total_bytes=sum(g.total_bytes for g in groups),
        per_gpu_bytes=gpu_bytes[worst[0]][worst[1]],
        groups=groups,
        bytes_per_token_per_gpu=max(max(row) for row in gpu_token_bytes),
    )


def slot_bytes_per_gpu(spec: ModelSpec, *, kv_dtype: str = "auto", tp: int = 1, pp: int = 1) -> int:
    """Bytes one token slot takes on the most loaded GPU, over the layers whose cache grows with tokens."""
    from kvplan.core.engines import get_engine

    one = size_kv(spec, get_engine("ideal"), batch=1, seq_len=1, kv_dtype=kv_dtype, tp=tp, pp=pp)
    return sum(g.per_gpu_bytes for g in one.groups if g.tokens_held_per_layer)


def uneven_tp_note(spec: ModelSpec, tp: int) -> str | None:
    """For engines that size any tp (ideal, hf): say when no serving engine would accept this one."""
    heads = sorted({layer.num_kv_heads for layer in spec.layers if isinstance(layer, AttentionLayer)})
    uneven = [h for h in heads if (h >= tp and h % tp) or (h < tp and tp % h)]
    if not uneven:
        return None
    return (f"tp {tp} does not split {uneven[0]} KV heads evenly: vLLM, SGLang and TensorRT-LLM refuse it; "
            "this figure gives the extra heads to the first ranks")


def layer_token_bytes(layer: Layer, engine: Engine, kv_dtype: KVDtype, tp: int = 1) -> int:
    """Bytes of one token slot of one layer summed over ranks (0 for fixed-state layers)."""
    if isinstance(layer, (AttentionLayer, MLALayer, CompressedLayer)) or (isinstance(layer, LinearLayer) and layer.holds_tokens):
        return sum(engine.slot_bytes(layer, kv_dtype, tp))
    return 0
