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
    dp: int = 1  # engines side by side, the batch shared between them (per_gpu_bytes: the busiest engine's)
    dcp: int = 1  # each sequence's KV sharded over dcp of the tp ranks (per rank: cdiv(seq_len, dcp) tokens)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp


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


@dataclass(frozen=True, kw_only=True)
class _GroupBytes:
    """One layer group's bytes for one sequence on each tensor-parallel rank, before batch and stages."""

    layer: Layer
    indices: list[int]
    token_bytes: tuple[int, ...]  # what one more token adds to one layer, each rank (zeros: fixed state only)
    slot_bytes_per_layer: int  # one token slot of one layer, all ranks (0 for fixed state)
    tokens_held_per_layer: int
    sequence_bytes: tuple[int, ...]  # one sequence in one layer, each rank

    @property
    def bytes_per_sequence(self) -> int:
        return sum(self.sequence_bytes) * len(self.indices)


def _check_shape(*, batch: int, seq_len: int, tp: int, pp: int) -> None:
    check_positive("batch", batch, MAX_BATCH)
    check_positive("seq_len", seq_len, MAX_SEQ_LEN)
    check_positive("tensor parallel size", tp, MAX_PARALLEL)
    check_positive("pipeline parallel size", pp, MAX_PARALLEL)


def _group_bytes(layer: Layer, indices: list[int], engine: Engine, *, dtype: KVDtype, model_dtype: str, tp: int,
                 seq_len: int) -> _GroupBytes:
    """What one sequence of ``seq_len`` tokens holds in each layer of a group, under the engine's rules."""
    if isinstance(layer, LinearLayer):
        return _linear_group_bytes(layer, indices, engine, dtype=dtype, model_dtype=model_dtype, tp=tp, seq_len=seq_len)
    slot = engine.slot_bytes(layer, dtype, tp)
    slots = engine.slots_held(layer, seq_len)
    if isinstance(layer, CompressedLayer):  # window + compressed entries + compressor state, per engine
        sequence = (engine.compressed_sequence_bytes(layer, seq_len, dtype, model_dtype),) * tp
    else:
        sequence = tuple(b * slots for b in slot)
    return _GroupBytes(layer=layer, indices=indices, token_bytes=slot, slot_bytes_per_layer=sum(slot),
                       tokens_held_per_layer=slots, sequence_bytes=sequence)


def _linear_group_bytes(layer: LinearLayer, indices: list[int], engine: Engine, *, dtype: KVDtype, model_dtype: str,
                        tp: int, seq_len: int) -> _GroupBytes:
    """A linear-attention / state-space group: its fixed state, plus the tokens of a parallel attention."""
    state = engine.linear_state_bytes(layer, model_dtype, tp)
    if not layer.holds_tokens:
        return _GroupBytes(layer=layer, indices=indices, token_bytes=(0,) * tp, slot_bytes_per_layer=0,
                           tokens_held_per_layer=0, sequence_bytes=state)
    # a parallel attention in the same layer (Falcon-H1) holds tokens too
    tok = engine.slot_bytes(layer, dtype, tp)
    slots = engine.slots_held(layer, seq_len)
    return _GroupBytes(layer=layer, indices=indices, token_bytes=tok, slot_bytes_per_layer=sum(tok),
                       tokens_held_per_layer=slots, sequence_bytes=tuple(s + t * slots for s, t in zip(state, tok)))


@dataclass(frozen=True)
class _GpuGrid:
    """Bytes on each GPU, ``rows[pipeline stage][tensor-parallel rank]``."""

    stage_of: dict[int, int]  # layer index -> its pipeline stage
    rows: list[list[int]]

    @classmethod
    def empty(cls, stage_of: dict[int, int], num_stages: int, tp: int) -> _GpuGrid:
        return cls(stage_of, [[0] * tp for _ in range(num_stages)])

    def add(self, indices: list[int], per_rank: tuple[int, ...], times: int = 1) -> None:
        """Add ``per_rank`` (x ``times``) for each layer in ``indices`` to the GPUs holding that layer."""
        for i in indices:
            row = self.rows[self.stage_of[i]]
            for r in range(len(row)):
                row[r] += per_rank[r] * times

    def most_loaded(self) -> tuple[int, int]:
        """(stage, rank) of the GPU holding the most bytes; the first such GPU on a tie."""
        flat = [(s, r) for s in range(len(self.rows)) for r in range(len(self.rows[s]))]
        return max(flat, key=lambda sr: self.rows[sr[0]][sr[1]])


def size_kv(
    spec: ModelSpec,
    engine: Engine,
    *,
    batch: int,
    seq_len: int,
    kv_dtype: str = "auto",
    tp: int = 1,
    pp: int = 1,
    dp: int = 1,
    dcp: int = 1,
) -> SizeResult:
    """Size the KV cache of ``batch`` sequences of ``seq_len`` tokens each, over ``dp`` engines of tp x pp GPUs (the
    most loaded holds cdiv(batch, dp) of them), each sequence's tokens sharded over ``dcp`` of the tp ranks (token i
    on rank i % dcp: each rank holds cdiv(seq_len, dcp) of them, in its own blocks; whether the engine and model
    take it is the caller's to check: kvplan.core.engines.vllm.dcp)."""
    _check_shape(batch=batch, seq_len=seq_len, tp=tp, pp=pp)
    check_positive("data parallel size", dp, MAX_PARALLEL)
    check_positive("decode context parallel size", dcp, tp)
    if tp % dcp:
        raise InputError(f"decode context parallel size {dcp} must divide the tensor parallel size {tp}")
    per_engine = -(-batch // dp)
    per_rank = -(-seq_len // dcp)
    engine.check_kv_dtype(kv_dtype)
    dtype = get_dtype(spec.dtype if kv_dtype == "auto" else kv_dtype)
    spec = engine.prepare(spec)
    stages = pp_stages(spec.num_layers, pp)
    stage_of = {i: s for s, layers in enumerate(stages) for i in layers}

    # bytes per (stage, rank), and each group's share of it
    held = _GpuGrid.empty(stage_of, len(stages), tp)
    token = _GpuGrid.empty(stage_of, len(stages), tp)
    measured: list[tuple[_GroupBytes, _GpuGrid]] = []
    for layer, indices in spec.layer_groups():
        group = _group_bytes(layer, indices, engine, dtype=dtype, model_dtype=spec.dtype, tp=tp, seq_len=per_rank)
        token.add(indices, group.token_bytes)
        share = _GpuGrid.empty(stage_of, len(stages), tp)
        share.add(indices, group.sequence_bytes, per_engine)
        held.add(indices, group.sequence_bytes, per_engine)
        measured.append((group, share))

    stage, rank = held.most_loaded()
    groups = tuple(_group_size(g, spec, engine, dtype=dtype, tp=tp, batch=batch, per_gpu_bytes=share.rows[stage][rank],
                               dcp=dcp) for g, share in measured)
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
        per_gpu_bytes=held.rows[stage][rank],
        groups=groups,
        bytes_per_token_per_gpu=max(max(row) for row in token.rows),
        dp=dp,
        dcp=dcp,
    )


def _group_size(group: _GroupBytes, spec: ModelSpec, engine: Engine, *, dtype: KVDtype, tp: int, batch: int,
                per_gpu_bytes: int, dcp: int = 1) -> GroupSize:
    layer, count = group.layer, len(group.indices)
    formula = _formula(layer, count, engine, dtype, tp, spec.dtype)
    if dcp > 1:  # a token is held by tp / dcp of the ranks whose slots the formula adds up
        formula = f"({formula}) / {dcp} decode-context ranks"
    return GroupSize(
        layer=layer,
        description=layer.describe(spec.num_attention_heads),
        layer_indices=tuple(group.indices),
        slot_bytes_per_layer=group.slot_bytes_per_layer,
        tokens_held_per_layer=group.tokens_held_per_layer,
        bytes_per_token=group.slot_bytes_per_layer * count // dcp,
        bytes_per_sequence=group.bytes_per_sequence,
        total_bytes=group.bytes_per_sequence * batch,
        per_gpu_bytes=per_gpu_bytes,
        formula=formula,
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
