"""The model spec: a per-layer description of what each decoder layer caches.

A model is not "an MHA model" or "a GQA model": each layer is one of

- ``AttentionLayer`` of kind FULL, SLIDING (window W) or CHUNKED (chunk C): ``num_kv_heads`` heads of
  ``k_head_dim``/``v_head_dim`` (MHA, GQA and MQA are just values of ``num_kv_heads``);
- ``MLALayer``: DeepSeek-V2/V3 multi-head latent attention, cached either as the compressed latent
  (``kv_lora_rank + qk_rope_head_dim`` per token, no K/V pair) or expanded to per-head K and V;
- ``LinearLayer``: linear attention / state-space (Mamba-1/2, gated delta net, Kimi Delta Attention,
  lightning attention, short convolutions): a fixed state per sequence, plus the KV of a softmax
  attention that runs in parallel in the same layer where there is one (Falcon-H1);
- ``NoCacheLayer``: nothing cached; with ``reads_layer`` set, the layer attends over an earlier layer's
  cache (cross-layer KV sharing: Gemma 3n / Gemma 4 ``num_kv_shared_layers``) and adds no bytes of its own.
- ``CompressedLayer``: DeepSeek-V4's hybrid attention: one shared K=V head over a sliding window plus one
  compressed entry per ``compress_ratio`` tokens (and, for its compressed sparse attention, a lightning-indexer
  key per compressed entry).

An ``MLALayer`` may carry DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2, GLM-5): one extra key of
``indexer_head_dim`` elements per token, cached beside the latent in a format of its own (engines size it).

Pure data: no I/O. Built from configs by ``kvplan.io.hf_config``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from enum import Enum
from typing import Union


class LayerKind(str, Enum):
    FULL = "full"
    SLIDING = "sliding"
    CHUNKED = "chunked"
    MLA = "mla"
    LINEAR = "linear"
    NONE = "none"
    COMPRESSED = "compressed"  # DeepSeek-V4: sliding window + compressed entries (CompressedLayer)


@dataclass(frozen=True, kw_only=True)
class AttentionLayer:
    """Softmax attention over cached K/V heads: full, sliding-window or chunked-local."""

    kind: LayerKind = LayerKind.FULL
    num_kv_heads: int
    k_head_dim: int
    v_head_dim: int
    window: int = 0  # SLIDING: window in tokens; CHUNKED: chunk size in tokens; FULL: 0

    holds_tokens = True  # a KV vector per token (linear attention and no-cache layers hold none)

    def skipped_tokens(self, num_tokens: int) -> int:
        """Leading tokens attention no longer reads once the sequence has ``num_tokens``: the kind's own rule,
        as vLLM's managers answer it (``get_num_skipped_tokens``, single_type_kv_cache_manager.py): none for
        full attention; all but the last W for a sliding window; all before the current chunk for
        chunked-local attention."""
        if self.kind is LayerKind.SLIDING:
            return max(0, num_tokens - self.window)
        if self.kind is LayerKind.CHUNKED:
            return (num_tokens - 1) // self.window * self.window if num_tokens else 0
        return 0

    @property
    def sliding_window(self) -> int:
        """The window of a sliding layer, 0 for any other (engines that keep a cyclic buffer read it)."""
        return self.window if self.kind is LayerKind.SLIDING else 0

    def describe(self, num_attention_heads: int) -> str:
        if self.num_kv_heads == 1:
            family = "MQA"
        elif self.num_kv_heads == num_attention_heads:
            family = "MHA"
        else:
            family = "GQA"
        dims = f"{self.k_head_dim}" if self.k_head_dim == self.v_head_dim else f"(K {self.k_head_dim}, V {self.v_head_dim})"
        what = {LayerKind.FULL: "full", LayerKind.SLIDING: f"sliding {self.window}", LayerKind.CHUNKED: f"chunked {self.window}"}[self.kind]
        return f"{what} {family} {self.num_kv_heads}x{dims}"


@dataclass(frozen=True, kw_only=True)
class MLALayer:
    """Multi-head latent attention (DeepSeek-V2/V3)."""

    kind: LayerKind = LayerKind.MLA
    holds_tokens = True
    window = 0
    sliding_window = 0
    num_heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    # DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): the lightning indexer caches one key of this many
    # elements per token beside the latent (0: no indexer on this layer; GLM's "shared" layers reuse another
    # layer's top-k and cache none). transformers v5.23 cache_utils.py::DynamicIndexedLayer.indexer_keys.
    indexer_head_dim: int = 0
    indexer_heads: int = 0  # the indexer's query heads (its weights; the cache holds one key per token)

    def skipped_tokens(self, num_tokens: int) -> int:
        return 0  # full attention over the latent

    @property
    def latent_dim(self) -> int:
        """Elements cached per token when the latent is stored: c_KV plus the shared RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def expanded_k_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def describe(self, num_attention_heads: int) -> str:
        indexer = f" + indexer {self.indexer_head_dim}" if self.indexer_head_dim else ""
        return f"MLA {self.kv_lora_rank}+{self.qk_rope_head_dim}{indexer}"


@dataclass(frozen=True, kw_only=True)
class LinearLayer:
    """A linear-attention or state-space layer: fixed-size state per sequence.

    ``conv_channels`` x kernel elements of convolution state plus ``state_elems`` of recurrent (SSM)
    state. How much of the kernel window is kept is engine-specific (vLLM keeps kernel-1 columns,
    transformers keeps kernel columns).

    Families (the mixer's state, per sequence and layer; elements, before the engine's dtypes):

    - ``gated_delta_net`` (Qwen3-Next, Qwen3.5): conv over q, k, v (2 x key_dim + value_dim channels),
      a k_head_dim x v_head_dim matrix per value head;
    - ``kda`` (Kimi Delta Attention, Kimi-Linear): conv over q, k, v (3 x heads x head_dim channels),
      a head_dim x head_dim matrix per head;
    - ``mamba`` (Mamba-1, Jamba): conv over d_inner channels, d_inner x d_state;
    - ``mamba2`` (Nemotron-H, Granite 4 hybrids, Falcon-H1, Bamba): conv over d_inner + 2 x n_groups x
      d_state channels (x and the B, C group projections), heads x head_dim x d_state;
    - ``lightning`` (MiniMax-Text-01 / M1 lightning attention): no conv, a head_dim x head_dim K^T V
      matrix per head;
    - ``short_conv`` (LFM2): only a conv state over hidden_size channels, no recurrent state.
    """

    kind: LayerKind = LayerKind.LINEAR
    family: str  # "gated_delta_net", "kda", "mamba", "mamba2", "lightning", "short_conv"
    conv_channels: int
    conv_kernel: int
    state_elems: int
    num_heads: int  # the unit tensor parallelism splits
    state_shape: tuple[int, ...] = ()  # the recurrent state of one sequence (its product is state_elems)
    # Mamba-2 B/C groups: conv_channels include 2 x n_groups x group_state channels. Engines that shard
    # groups with heads (vLLM, SGLang) replicate groups when tp does not divide n_groups.
    n_groups: int = 0
    group_state: int = 0
    # Recurrent-state dtypes a checkpoint's config pins (kvplan dtype names, "" when absent): Qwen3.5's
    # ``mamba_ssm_dtype`` and Nemotron-H's ``mamba_ssm_cache_dtype``; which engine reads which is an
    # engine rule (kvplan.core.engines).
    ssm_dtype: str = ""
    ssm_cache_dtype: str = ""
    # A softmax attention that runs in parallel in the same layer (Falcon-H1): the layer then holds its
    # tokens too, and every engine counts both the state and the attention's KV.
    attention: AttentionLayer | MLALayer | None = None

    @property
    def holds_tokens(self) -> bool:
        """Only a layer with a parallel attention holds tokens; the mixer's state is fixed."""
        return self.attention is not None

    @property
    def window(self) -> int:
        return self.attention.window if self.attention is not None else 0

    @property
    def sliding_window(self) -> int:
        return self.attention.sliding_window if self.attention is not None else 0

    def skipped_tokens(self, num_tokens: int) -> int:
        return self.attention.skipped_tokens(num_tokens) if self.attention is not None else num_tokens

    def describe(self, num_attention_heads: int) -> str:
        mixer = f"{self.family} (fixed state)"
        if self.attention is not None:
            return f"{self.attention.describe(num_attention_heads)} + {mixer}"
        return mixer


@dataclass(frozen=True, kw_only=True)
class NoCacheLayer:
    kind: LayerKind = LayerKind.NONE
    # Cross-layer KV sharing: the index of the earlier layer whose cache this layer's attention reads
    # (-1: the layer has no attention, e.g. a Mamba/MoE-only block). It stores nothing itself.
    reads_layer: int = -1
    holds_tokens = False
    window = 0
    sliding_window = 0

    def skipped_tokens(self, num_tokens: int) -> int:
        return num_tokens

    def describe(self, num_attention_heads: int) -> str:
        if self.reads_layer >= 0:
            return f"shares layer {self.reads_layer}'s KV cache"
        return "no cache"


@dataclass(frozen=True, kw_only=True)
class CompressedLayer:
    """DeepSeek-V4 attention (transformers v5.23 models/deepseek_v4/modeling_deepseek_v4.py, DeepseekV4Attention).

    Every layer keeps one shared K=V head of ``head_dim`` over a sliding window of ``window`` raw tokens. A
    compressed layer also keeps one compressed entry of ``head_dim`` per ``compress_ratio`` tokens for the whole
    sequence: heavily compressed attention (HCA, ratio 128) reads them all, compressed sparse attention (CSA,
    ratio 4) picks the top ``index_topk`` through a lightning indexer that caches its own compressed key of
    ``indexer_head_dim`` per entry. The compressor holds the tokens of the window it has not closed yet; CSA's
    windows overlap (``overlap``): its compressor projects 2 x head_dim and keeps the previous window's half.
    ``compress_ratio`` 0: the sliding window only.
    """

    kind: LayerKind = LayerKind.COMPRESSED
    holds_tokens = True
    head_dim: int
    rope_head_dim: int  # the RoPE part of head_dim (vLLM's fp8 layout keeps it in bf16)
    window: int
    compress_ratio: int
    overlap: bool = False
    indexer_head_dim: int = 0
    indexer_heads: int = 0
    num_heads: int = 0  # query heads

    def skipped_tokens(self, num_tokens: int) -> int:
        """The raw-token window: all but the last ``window`` tokens (the compressed entries are kept apart)."""
        return max(0, num_tokens - self.window)

    @property
    def sliding_window(self) -> int:
        return self.window

    @property
    def compressor_channels(self) -> int:
        """Channels the compressor projects per token (kv and gate each): 2 x head_dim with overlap."""
        return (2 if self.overlap else 1) * self.head_dim

    def entries(self, num_tokens: int) -> int:
        """Compressed entries a sequence of ``num_tokens`` tokens has: one per closed window."""
        return num_tokens // self.compress_ratio if self.compress_ratio else 0

    def describe(self, num_attention_heads: int) -> str:
        what = {0: "sliding", 4: "CSA", 128: "HCA"}.get(self.compress_ratio, f"compressed 1/{self.compress_ratio}")
        base = f"{what} K=V {self.head_dim}, window {self.window}"
        if self.compress_ratio:
            base += f" + 1/{self.compress_ratio} entries"
        if self.indexer_head_dim:
            base += f" + indexer {self.indexer_head_dim}"
        return base


Layer = Union[AttentionLayer, MLALayer, LinearLayer, NoCacheLayer, CompressedLayer]


@dataclass(frozen=True, kw_only=True)
class MoEShape:
    num_experts: int
    experts_per_token: int
    expert_intermediate: int
    shared_intermediate: int = 0  # all shared experts together (0: none)
    shared_gate: bool = False  # Qwen's sigmoid gate on the shared expert (hidden -> 1)
    bias: bool = False  # expert and router biases (gpt-oss)
    gated: bool = True  # experts (and the shared expert) are gate+up+down; False: up+down (Nemotron-H's ReLU^2)


@dataclass(frozen=True, kw_only=True)
class TowerShape:
    """A multimodal model's vision encoder and projector, as the engine builds them beside the language model.

    Counted by kvplan.io.towers from ``vision_config`` and the projector keys, module by module as vLLM builds
    them. ``split_params`` sit in tensor-parallel linears (QKV/Column/RowParallelLinear) that divide their
    weights over the TP ranks; ``whole_params`` (plain nn.Linear, nn.Parameter, norms, a RowParallelLinear's
    bias) are held by every rank. Stored in the model dtype (kvplan.core.weights.weight_bytes says why).
    """

    name: str  # the tower and projector, as vLLM's classes name them
    split_params: int
    whole_params: int
    source: str  # the vLLM files and classes the count follows
    # The profile run's dummy item (vLLM's image "of the maximum feature size"): the prompt tokens it takes (what
    # vLLM divides the encoder budget by), the embeddings the encoder outputs for it, and its pixel values
    # (channels x height x width, every tile); 0: not modelled
    item_tokens: int = 0
    item_embeds: int = 0
    item_pixels: int = 0
    modalities: tuple[str, ...] = ("image",)  # what the tower encodes (vLLM skips it when every limit is 0)

    @property
    def params(self) -> int:
        return self.split_params + self.whole_params


@dataclass(frozen=True, kw_only=True)
class ArchShape:
    """What a parameter count needs beyond the cached layers."""

    vocab_size: int
    hidden_size: int
    tie_word_embeddings: bool
    position_embeddings: int = 0  # learned absolute positions (GPT-2, OPT)
    q_head_dim: int = 0  # per query head; 0: the layer's K head dim
    qkv_bias: bool = False
    o_bias: bool = False
    gated_mlp: bool = True  # SwiGLU-style gate+up+down vs up+down
    intermediate_size: int = 0  # dense MLP
    mlp_bias: bool = False
    moe: MoEShape | None = None
    moe_layers: tuple[bool, ...] = ()  # per layer: routed experts instead of the dense MLP
    norms_per_layer: int = 2
    norm_bias: bool = False
    q_lora_rank: int = 0
    linear_layer_params: int = 0  # one linear-attention / Mamba layer's mixer, all projections included
    extra_params: int = 0  # parameters outside the decoder stack kvplan does not break down (noted)
    # Per-layer differences (empty: every layer alike). Dense MLP width of each layer (Gemma 3n's
    # per-layer intermediate_size list; Gemma 4's double-wide MLP on KV-shared layers):
    layer_intermediate: tuple[int, ...] = ()
    k_eq_v_layers: tuple[bool, ...] = ()  # V is the K projection's output: no v_proj (Gemma 4 global layers)
    # Per layer, held whole by each rank: small modules the generic count does not break down (q/k norms,
    # routing biases, Gemma 3n's AltUp, LAuReL and per-layer-input gate); empty: none.
    layer_whole_params: tuple[int, ...] = ()
    dense_with_moe: bool = False  # MoE layers keep the dense MLP beside the experts (Gemma 4 26B-A4B)
    # More embedding-side tables on the first stage, split over TP as the vocabulary is (Gemma 3n/4's
    # per-layer embeddings and their projection: VocabParallelEmbedding/ColumnParallelLinear in vLLM)
    embedding_extra_params: int = 0
    # Per layer, (split over TP, held whole by every rank) parameters a family reader counts beyond the layer
    # kind's attention formula, the dense MLP and the MoE: LongCat-Flash's second dense MLP and zero-expert
    # router columns, DeepSeek-V4's whole token mixer and hyper-connections (kvplan.io.families.mla).
    layer_extra_params: tuple[tuple[int, int], ...] = ()
    # Per layer, of the whole (replicated) parameters above: those stored in the projections' quantized format
    # (DeepSeek-V4's fused q/kv down-projection and indexer query: FP8 linears every rank holds whole) and those
    # held in float32 whatever the model dtype (DeepSeek-V4's hyper-connection mixers); empty: none
    layer_whole_quantized: tuple[int, ...] = ()
    layer_whole_fp32: tuple[int, ...] = ()
    mlp_layers: tuple[bool, ...] = ()  # per layer: has the dense MLP (when not MoE); empty: every layer has one
    # Not parameters: the RoPE cos/sin caches the engine builds at load, elements in the model dtype on every GPU
    # (kvplan.io.rope)
    rope_cache_elems: int = 0
    # The vision encoder and multimodal projector (None: a text-only model, or a tower kvplan does not model,
    # which the spec's notes name)
    tower: TowerShape | None = None


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    layers: tuple[Layer, ...]
    dtype: str  # the model's dtype name (torch_dtype), the default KV dtype
    max_model_len: int
    num_attention_heads: int
    hidden_size: int
    model_type: str = ""
    source: str = ""
    provenance: str = ""  # how the bundled numbers were checked (bundled files' `notes`)
    notes: tuple[str, ...] = ()  # how traps in the config were resolved, shown to the user
    # Implementation facts an engine may need that are not part of the layer shapes, e.g.
    # "hf_kv_broadcast": transformers' Falcon (new_decoder_architecture) repeats K/V to every query
    # head before caching (models/falcon/modeling_falcon.py, FalconAttention.forward).
    quirks: frozenset[str] = frozenset()
    arch: ArchShape | None = None  # for weight memory; None when the config does not say enough
    raw_config: dict = field(default_factory=dict, compare=False, repr=False)
    # The language model's keys an engine derives its longest context from (max_position_embeddings,
    # seq_length, ..., rope_scaling), as the config gives them, class defaults applied; unvalidated
    # (kvplan.core.capacity.context reads them as each engine does).
    context_config: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @cached_property
    def layer_types(self) -> frozenset[type]:
        """The classes of its layers (computed once: the spec is frozen; a plan asks it thousands of times)."""
        return frozenset(type(layer) for layer in self.layers)

    def has_layer(self, *kinds: type) -> bool:
        """Whether any layer is an instance of one of ``kinds``."""
        return any(issubclass(t, kinds) for t in self.layer_types)

    @cached_property
    def sparse_mla(self) -> bool:
        """Whether an MLA layer carries a sparse-attention indexer (DeepSeek-V3.2)."""
        return any(isinstance(layer, MLALayer) and layer.indexer_head_dim for layer in self.layers)

    def layer_groups(self) -> list[tuple[Layer, list[int]]]:
        """Identical layers grouped, in order of first appearance, with their indices."""
        groups: dict[Layer, list[int]] = {}
        for i, layer in enumerate(self.layers):
            groups.setdefault(layer, []).append(i)
        return list(groups.items())

    def kind_counts(self) -> Counter[LayerKind]:
        return Counter(layer.kind for layer in self.layers)
