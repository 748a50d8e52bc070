"""Weight memory from the architecture: parameter counts by component, times the weight format.

Counts follow the module shapes of the reference implementations (transformers' modeling files):
attention projections (MLA's low-rank ones included), dense MLP (gated or plain), MoE routed and
shared experts with their router, linear-attention / Mamba projections, norms, embeddings (tied or
not, learned positions). Pure: no I/O.

Under tensor parallelism every projection, expert and the vocabulary are split over the ranks; norms,
routers and MLA's down-projections (``q_a_proj``, ``kv_a_proj_with_mqa``, replicated linears in vLLM)
are held whole by every rank. Under pipeline parallelism the embedding sits on the first stage and
the LM head on the last (vLLM ``get_pp_indices`` for the layers).

A multimodal model's vision encoder and projector (``ArchShape.tower``, counted by kvplan.io.towers) sit on
every GPU: vLLM 0.19.0 builds them in the ``*ForConditionalGeneration`` constructor with no pipeline-stage
guard (``gemma3_mm.py::Gemma3ForConditionalGeneration``, ``mllama4.py::Llama4ForConditionalGeneration``,
``mistral3.py::Mistral3ForConditionalGeneration``), so each stage holds one copy; their tensor-parallel
linears divide over the TP ranks (``mm_encoder_tp_mode`` "weights", the default; "data" would replicate
them, and kvplan's fit does not take that flag). They are stored in the model dtype even when the decoder is
quantized: Llama 4 builds them with ``quant_config=None`` (``Llama4ForConditionalGeneration.__init__``),
Pixtral's mistral-format encoder is plain ``nn.Linear`` (``pixtral.py::VisionTransformer``), and the
quantized Mistral-Small-3.1 checkpoint in the llm-d-planner logs leaves its tower unquantized (its
"Model loading took" exceeds the int8 decoder by the bf16 tower, as the bf16 checkpoint's does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kvplan.core.spec import ArchShape, AttentionLayer, Layer, LinearLayer, MLALayer, ModelSpec, MoEShape, NoCacheLayer
from kvplan.errors import InputError


@dataclass(frozen=True, kw_only=True)
class WeightFormat:
    """How weights are stored: bits per value plus per-group scale/zero overhead."""

    name: str
    bits: int
    group_elems: int = 0
    group_overhead_bits: int = 0
    description: str = ""

    def bytes_for(self, num_params: int) -> int:
        data_bits = num_params * self.bits
        if self.group_elems:
            data_bits += -(-num_params // self.group_elems) * self.group_overhead_bits
        return -(-data_bits // 8)


# Sources: bf16/fp16/fp32 widths; fp8 block: DeepSeek-V3 config.json quantization_config
# (weight_block_size [128, 128], one fp32 scale per block); int8: per-output-channel fp16 scales,
# counted per 4096 values; int4-g128: AWQ/GPTQ (one fp16 scale and one 4-bit zero per 128 values);
# mxfp4: OCP Microscaling spec (E2M1 values, one 8-bit E8M0 scale per 32), as gpt-oss ships experts.
WEIGHT_FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in (
        WeightFormat(name="fp32", bits=32),
        WeightFormat(name="bf16", bits=16),
        WeightFormat(name="fp16", bits=16),
        WeightFormat(name="fp8", bits=8, group_elems=128 * 128, group_overhead_bits=32, description="FP8, fp32 scale per 128x128 block"),
        WeightFormat(name="int8", bits=8, group_elems=4096, group_overhead_bits=16, description="INT8, fp16 per-channel scales"),
        WeightFormat(name="int4-g128", bits=4, group_elems=128, group_overhead_bits=20, description="INT4 (AWQ/GPTQ), fp16 scale + 4-bit zero per 128"),
        WeightFormat(name="mxfp4", bits=4, group_elems=32, group_overhead_bits=8, description="MXFP4, E8M0 scale per 32"),
    )
}
_FORMAT_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "int4": "int4-g128", "awq": "int4-g128",
                   "gptq": "int4-g128", "fp8_e4m3": "fp8"}


FP32_BYTES = 4  # parameters a model keeps in float32 whatever its dtype (ArchShape.layer_whole_fp32)


def get_weight_format(name: str) -> WeightFormat:
    key = _FORMAT_ALIASES.get(name.lower(), name.lower())
    try:
        return WEIGHT_FORMATS[key]
    except KeyError:
        raise InputError(f"unknown weight dtype {name!r}; use one of: auto, {', '.join(WEIGHT_FORMATS)}") from None


@dataclass(frozen=True, kw_only=True)
class ParamCounts:
    """Parameters by where they live. *_split are divided by TP; *_whole are held by every rank."""

    embedding: int
    lm_head: int  # 0 when tied
    layers_split: tuple[int, ...]  # attention + mixer + MLP weights split over TP
    layers_attn: tuple[int, ...]  # the token mixer's share of layers_split (the rest is the MLP's)
    layers_shared: tuple[int, ...]  # the shared experts' share of layers_split (the rest of the MLP is dense)
    layers_experts: tuple[int, ...]  # routed-expert weights (split over TP or experts)
    layers_whole: tuple[int, ...]  # norms, routers, replicated down-projections
    # of layers_whole: held in the projections' format (replicated quantized linears), and in float32
    layers_whole_fmt: tuple[int, ...] = ()
    layers_whole_fp32: tuple[int, ...] = ()
    final_norm: int
    extra: int
    tower_split: int = 0  # vision encoder and projector: split over TP
    tower_whole: int = 0  # vision encoder and projector: held whole by every rank

    @property
    def total(self) -> int:
        return (self.embedding + self.lm_head + sum(self.layers_split) + sum(self.layers_experts)
                + sum(self.layers_whole) + self.final_norm + self.extra + self.tower_split + self.tower_whole)

    @property
    def language_model(self) -> int:
        """Parameters less the vision tower and projector (what model cards of multimodal models quote)."""
        return self.total - self.tower_split - self.tower_whole

    def active(self, moe: MoEShape | None) -> int:
        """Parameters one token touches (routed experts scaled to experts_per_token)."""
        if moe is None:
            return self.total
        experts = sum(self.layers_experts)
        return self.total - experts + experts * moe.experts_per_token // moe.num_experts


def _attention_params(layer: Layer, arch: ArchShape, num_heads: int) -> tuple[int, int]:
    """(split, whole) parameters of one layer's token mixer."""
    h = arch.hidden_size
    if isinstance(layer, AttentionLayer):
        q_dim = num_heads * (arch.q_head_dim or layer.k_head_dim)
        k_dim = layer.num_kv_heads * layer.k_head_dim
        v_dim = layer.num_kv_heads * layer.v_head_dim
        split = h * (q_dim + k_dim + v_dim) + num_heads * layer.v_head_dim * h
        if arch.qkv_bias:
            split += q_dim + k_dim + v_dim
        if arch.o_bias:
            split += h
        return split, 0
    if isinstance(layer, MLALayer):
        qk_dim = layer.qk_nope_head_dim + layer.qk_rope_head_dim
        whole = h * (layer.kv_lora_rank + layer.qk_rope_head_dim) + layer.kv_lora_rank  # kv_a + kv_a_layernorm
        if arch.q_lora_rank:
            whole += h * arch.q_lora_rank + arch.q_lora_rank  # q_a + q_a_layernorm
            split = arch.q_lora_rank * layer.num_heads * qk_dim
        else:
            split = h * layer.num_heads * qk_dim
        split += layer.kv_lora_rank * layer.num_heads * (layer.qk_nope_head_dim + layer.v_head_dim)  # kv_b
        split += layer.num_heads * layer.v_head_dim * h  # o_proj
        if layer.indexer_head_dim:
            # DSA lightning indexer (transformers deepseek_v32 DeepseekV32Indexer): wq_b from the q latent, wk and
            # its LayerNorm (weight + bias), weights_proj; replicated on every rank (vLLM ReplicatedLinear).
            d, n = layer.indexer_head_dim, layer.indexer_heads
            whole += (arch.q_lora_rank or h) * n * d + h * d + 2 * d + h * n
        return split, whole
    if isinstance(layer, LinearLayer):
        if layer.attention is None:
            return arch.linear_layer_params, 0
        # a parallel attention in the same layer (Falcon-H1): both mixers' weights
        split, whole = _attention_params(layer.attention, arch, num_heads)
        return arch.linear_layer_params + split, whole
    return 0, 0


def _shared_kv_params(target: Layer, arch: ArchShape, num_heads: int) -> int:
    """A layer that reads another layer's KV cache keeps its query and output projections only (Gemma 3n,
    Gemma 4: ``Gemma3nTextAttention`` builds no k_proj/v_proj on KV-shared layers), shaped as its target."""
    if not isinstance(target, AttentionLayer):
        return 0
    q_dim = num_heads * (arch.q_head_dim or target.k_head_dim)
    split = arch.hidden_size * q_dim + num_heads * target.v_head_dim * arch.hidden_size
    return split + (q_dim if arch.qkv_bias else 0) + (arch.hidden_size if arch.o_bias else 0)


def _mlp_params(arch: ArchShape, width: int) -> int:
    h = arch.hidden_size
    mats = 3 if arch.gated_mlp else 2
    bias = (width * (mats - 1) + h) if arch.mlp_bias else 0
    return mats * h * width + bias


_PREFIX: dict[int, tuple[ParamCounts, tuple[list[int], ...]]] = {}


def _prefix_sums(counts: ParamCounts) -> tuple[list[int], ...]:
    """Running sums of each layer's token-mixer, MLP, routed-expert and whole parameters, the whole ones in the model
    dtype, in the projections' format and in float32 apart (memoized by the counts)."""
    hit = _PREFIX.get(id(counts))
    if hit is not None and hit[0] is counts:
        return hit[1]
    sums: tuple[list[int], ...] = ([0], [0], [0], [0], [0], [0], [0])
    n = len(counts.layers_whole)
    q = counts.layers_whole_fmt or (0,) * n
    f = counts.layers_whole_fp32 or (0,) * n
    for a, sp, sh, e, w, wq, w32 in zip(counts.layers_attn, counts.layers_split, counts.layers_shared,
                                        counts.layers_experts, counts.layers_whole, q, f):
        for acc, v in zip(sums, (a, sp - a - sh, e, w - wq - w32, wq, w32, sh)):
            acc.append(acc[-1] + v)
    if len(_PREFIX) > 256:
        _PREFIX.clear()
    _PREFIX[id(counts)] = (counts, sums)
    return sums


_COUNTS: dict[tuple[int, int], tuple[ModelSpec, ArchShape, ParamCounts]] = {}


def count_params(spec: ModelSpec, arch: ArchShape) -> ParamCounts:
    """The model's parameters by where they live (memoized by the spec and arch objects: both are frozen)."""
    hit = _COUNTS.get((id(spec), id(arch)))
    if hit is not None and hit[0] is spec and hit[1] is arch:
        return hit[2]
    counts = _count_params(spec, arch)
    if len(_COUNTS) > 256:
        _COUNTS.clear()
    _COUNTS[(id(spec), id(arch))] = (spec, arch, counts)
    return counts


def _count_params(spec: ModelSpec, arch: ArchShape) -> ParamCounts:
    h = arch.hidden_size
    split, attn, shared, experts, whole = [], [], [], [], []
    whole_fmt: list[int] = []
    whole_fp32: list[int] = []
    for i, layer in enumerate(spec.layers):
        s, w = _attention_params(layer, arch, spec.num_attention_heads)
        if isinstance(layer, NoCacheLayer) and 0 <= layer.reads_layer < len(spec.layers):
            s = _shared_kv_params(spec.layers[layer.reads_layer], arch, spec.num_attention_heads)
        if isinstance(layer, AttentionLayer) and i < len(arch.k_eq_v_layers) and arch.k_eq_v_layers[i]:
            v_dim = layer.num_kv_heads * layer.v_head_dim
            s -= h * v_dim + (v_dim if arch.qkv_bias else 0)  # no v_proj: V is the K projection's output
        attn.append(s)
        width = arch.layer_intermediate[i] if i < len(arch.layer_intermediate) else arch.intermediate_size
        e = sh = 0
        moe_here = arch.moe is not None and i < len(arch.moe_layers) and arch.moe_layers[i]
        if moe_here:
            assert arch.moe is not None
            m = arch.moe
            mats = 3 if m.gated else 2
            per_expert = mats * h * m.expert_intermediate + (2 * m.expert_intermediate + h if m.bias else 0)
            e = m.num_experts * per_expert
            w += h * m.num_experts + (m.num_experts if m.bias else 0)  # router
            if m.shared_intermediate:
                sh = mats * h * m.shared_intermediate
                s += sh
                w += h if m.shared_gate else 0
            if arch.dense_with_moe:
                s += _mlp_params(arch, width)
        elif not arch.mlp_layers or (i < len(arch.mlp_layers) and arch.mlp_layers[i]):
            s += _mlp_params(arch, width)
        w += arch.norms_per_layer * h * (2 if arch.norm_bias else 1)
        w += arch.layer_whole_params[i] if i < len(arch.layer_whole_params) else 0
        if i < len(arch.layer_extra_params):
            s += arch.layer_extra_params[i][0]
            w += arch.layer_extra_params[i][1]
        split.append(s)
        shared.append(sh)
        experts.append(e)
        whole.append(w)
        whole_fmt.append(arch.layer_whole_quantized[i] if i < len(arch.layer_whole_quantized) else 0)
        whole_fp32.append(arch.layer_whole_fp32[i] if i < len(arch.layer_whole_fp32) else 0)
    embedding = arch.vocab_size * h + arch.position_embeddings * h + arch.embedding_extra_params
    return ParamCounts(
        embedding=embedding,
        lm_head=0 if arch.tie_word_embeddings else arch.vocab_size * h,
        layers_split=tuple(split),
        layers_attn=tuple(attn),
        layers_shared=tuple(shared),
        layers_experts=tuple(experts),
        layers_whole=tuple(whole),
        layers_whole_fmt=tuple(whole_fmt) if any(whole_fmt) else (),
        layers_whole_fp32=tuple(whole_fp32) if any(whole_fp32) else (),
        final_norm=h * (2 if arch.norm_bias else 1),
        extra=arch.extra_params,
        tower_split=arch.tower.split_params if arch.tower else 0,
        tower_whole=arch.tower.whole_params if arch.tower else 0,
    )


@dataclass(frozen=True, kw_only=True)
class WeightBytes:
    total_bytes: int  # whole model, one copy
    per_gpu_bytes: int  # the most loaded GPU
    per_stage_bytes: tuple[int, ...]  # one GPU of each pipeline stage
    params: int
    format: str
    # The layers ``repeat`` named, built again (a speculative drafter's MTP layers), on one GPU of the last stage
    repeat_bytes: int = 0


def weight_bytes(
    spec: ModelSpec,
    arch: ArchShape,
    *,
    fmt: WeightFormat,
    expert_fmt: WeightFormat | None = None,
    keep_fmt: WeightFormat,
    tp: int = 1,
    stages: list[range] | None = None,
    part_fmt: Callable[[int, str], WeightFormat | None] | None = None,
    expert_ranks: int | None = None,
    whole_experts: bool = False,
    attn_ranks: int | None = None,
    mlp_ranks: int | None = None,
    shared_ranks: int | None = None,
    head_ranks: int | None = None,
    physical_experts: int | None = None,
    repeat: tuple[int, ...] = (),
) -> WeightBytes:
    """Bytes of the weights in total and on the most loaded GPU.

    ``fmt`` stores the decoder's projections, ``expert_fmt`` the routed experts (default ``fmt``),
    ``keep_fmt`` the embeddings, LM head, norms and routers (quantized checkpoints keep them in the
    model dtype). ``part_fmt(layer, part)``, when given, stores each layer's ``"attn"``, ``"mlp"`` and
    ``"experts"`` weights instead (None: that part is left unquantized, in ``keep_fmt``), for checkpoints
    whose quantization config names the modules it quantizes or leaves out (kvplan.core.quant).
    ``expert_ranks``: the GPUs the routed experts are spread over (default ``tp``; vLLM's data parallelism spreads
    them over dp x tp); ``whole_experts``: each holds whole experts, the most loaded ceil(num_experts / ranks)
    (expert parallelism), rather than a share of every expert; ``attn_ranks``: the GPUs the token mixers and the
    embedding are split over (default ``tp``; SGLang's data-parallel attention: tp // dp, the rest over tp);
    ``mlp_ranks``, ``shared_ranks``, ``head_ranks``: the GPUs the dense MLPs, the shared experts and the LM head are
    split over (default ``tp``; SGLang's --moe-dense-tp-size 1, an all-to-all MoE backend and --enable-dp-lm-head
    change them); ``physical_experts``: with ``whole_experts``, the experts loaded over the ranks, redundant copies
    included (default: the model's).
    ``repeat``: layer indices built once more (an MTP drafter's copies of a decoder layer), in
    ``WeightBytes.repeat_bytes`` and not in the stages' figures.
    """
    counts = count_params(spec, arch)
    expert_fmt = expert_fmt or fmt
    num_experts = arch.moe.num_experts if arch.moe is not None else 1

    def experts_here(n: int, ranks: int) -> int:
        """Expert parameters on the most loaded of ``ranks`` GPUs (``n``: every expert's, of whole layers); on one
        GPU (the model's one copy) the routed experts themselves, redundant copies left out."""
        if whole_experts and ranks > 1:
            return n // num_experts * -(-(physical_experts or num_experts) // ranks)
        return -(-n // ranks)
    stages = stages or [range(spec.num_layers)]

    def layers_bytes(layers: Iterable[int], ranks: int, eranks: int, aranks: int) -> int:
        mranks, sranks = (mlp_ranks or ranks, shared_ranks or ranks) if ranks > 1 else (1, 1)
        if part_fmt is None and isinstance(layers, range) and layers.step == 1:
            # one format a part: the parts' sums over the range (prefix sums), grouped as below, the same bytes
            p = _prefix_sums(counts)
            lo, hi = layers.start, layers.stop
            attn, mlp, experts, whole_n, whole_q, whole_32, shared = (p[k][hi] - p[k][lo] for k in range(7))
            over: dict[int, int] = {}  # parameters by the GPUs they are split over, summed before rounding
            for n, r in ((attn, aranks), (mlp, mranks), (shared, sranks)):
                over[r] = over.get(r, 0) + n
            split = sum(fmt.bytes_for(-(-n // r)) for r, n in over.items())
            return (split + expert_fmt.bytes_for(experts_here(experts, eranks)) + keep_fmt.bytes_for(whole_n)
                    + fmt.bytes_for(whole_q) + FP32_BYTES * whole_32)
        by_fmt: dict[tuple[WeightFormat, int], int] = {}  # rank count 0: the routed experts
        for i in layers:
            mixer, sh = counts.layers_attn[i], counts.layers_shared[i]
            for part, n, default, r in (("attn", mixer, fmt, aranks),
                                        ("mlp", counts.layers_split[i] - mixer - sh, fmt, mranks),
                                        ("shared", sh, fmt, sranks),
                                        ("experts", counts.layers_experts[i], expert_fmt, 0)):
                f = default if part_fmt is None else (part_fmt(i, part) or keep_fmt)
                # summed by format and by the GPUs they are split over before rounding to whole bytes
                by_fmt[(f, r)] = by_fmt.get((f, r), 0) + n
        whole_32 = sum(counts.layers_whole_fp32[i] for i in layers) if counts.layers_whole_fp32 else 0
        whole_q: dict[WeightFormat, int] = {}  # replicated quantized linears, in their layer's attention format
        for i in (layers if counts.layers_whole_fmt else ()):
            f = fmt if part_fmt is None else (part_fmt(i, "attn") or keep_fmt)
            whole_q[f] = whole_q.get(f, 0) + counts.layers_whole_fmt[i]
        whole = sum(counts.layers_whole[i] for i in layers) - sum(whole_q.values()) - whole_32
        replicated = sum(f.bytes_for(n) for f, n in whole_q.items()) + FP32_BYTES * whole_32
        return replicated + sum(f.bytes_for(experts_here(n, eranks) if r == 0 else -(-n // r))
                                for (f, r), n in by_fmt.items()) + keep_fmt.bytes_for(whole)

    def stage_bytes(layers: range, first: bool, last: bool, ranks: int, eranks: int, aranks: int) -> int:
        out = layers_bytes(layers, ranks, eranks, aranks)
        # the vision tower and projector: on every stage, in the model dtype (module docstring); the RoPE caches
        # (ArchShape.rope_cache_elems, not parameters) whole on every GPU of every stage
        out += keep_fmt.bytes_for(-(-counts.tower_split // ranks)) + keep_fmt.bytes_for(counts.tower_whole)
        out += keep_fmt.bytes_for(arch.rope_cache_elems)
        if first:
            out += keep_fmt.bytes_for(-(-counts.embedding // aranks)) + keep_fmt.bytes_for(counts.extra)
        if last:
            hranks = head_ranks or ranks if ranks > 1 else 1
            out += keep_fmt.bytes_for(-(-counts.lm_head // hranks)) + keep_fmt.bytes_for(counts.final_norm)
            if first is False and counts.lm_head == 0:  # tied head on another stage: vLLM keeps a copy
                out += keep_fmt.bytes_for(-(-counts.embedding // ranks))
        return out

    total = stage_bytes(range(spec.num_layers), True, True, 1, 1, 1)
    per_stage = tuple(stage_bytes(layers, s == 0, s == len(stages) - 1, tp, expert_ranks or tp, attn_ranks or tp)
                      for s, layers in enumerate(stages))
    repeated = layers_bytes(repeat, tp, expert_ranks or tp, attn_ranks or tp) if repeat else 0
    return WeightBytes(total_bytes=total, per_gpu_bytes=max(per_stage), per_stage_bytes=per_stage, params=counts.total,
                       format=fmt.name, repeat_bytes=repeated)
