"""What an engine rule is, and the helpers the rules share.

An engine answers, for one layer on one tensor-parallel rank:
- which vectors it stores per token slot (``token_vectors``): (count, elements) pairs, K and V apart;
- how many token slots one sequence of ``num_tokens`` tokens holds (``slots_held``), which is where
  block rounding and sliding-window freeing live;
- how many bytes a linear-attention layer's fixed state takes (``linear_state_bytes``);
- how many bytes a DSA lightning-indexer key takes per token (``indexer_slot_bytes``, added to the MLA slot);
- how many bytes a DeepSeek-V4 compressed layer holds for one sequence (``compressed_sequence_bytes``).

Everything is integer bytes. Engines are frozen dataclasses, one module each, each rule citing its
source (see docs/engines.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from kvplan.core.dtypes import INDEXER_FP8, KVDtype, get_dtype
from kvplan.core.spec import AttentionLayer, CompressedLayer, Layer, LinearLayer, MLALayer, ModelSpec
from kvplan.errors import InputError


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_heads(num_heads: int, tp: int, *, strict: bool) -> tuple[int, ...]:
    """Heads held by each of ``tp`` ranks.

    Fewer heads than ranks: each head is replicated so that every rank holds one (vLLM
    ``ModelConfig.get_num_kv_heads``: ``max(1, total_num_kv_heads // tp)``). More heads than ranks:
    an even split; ``strict`` engines refuse an uneven one, the others give the extra heads to the
    first ranks.
    """
    if num_heads <= tp:
        if strict and tp % num_heads:
            raise InputError(
                f"tensor parallel size {tp} is not a multiple of the {num_heads} KV heads; "
                f"use a tp that divides or is a multiple of {num_heads}"
            )
        return (1,) * tp
    if num_heads % tp:
        if strict:
            divisors = [d for d in range(1, num_heads + 1) if num_heads % d == 0 and d <= 64]
            raise InputError(
                f"{num_heads} KV heads cannot be split evenly over tensor parallel size {tp}; "
                f"use one of {', '.join(map(str, divisors))}"
            )
        base, extra = divmod(num_heads, tp)
        return tuple(base + (1 if r < extra else 0) for r in range(tp))
    return (num_heads // tp,) * tp


@dataclass(frozen=True, kw_only=True)
class Engine:
    """Base engine: the ``ideal`` semantics. Subclasses override the rules that differ."""

    name: str = "ideal"
    block_size: int = 1  # token slots per allocation unit
    strict_tp: bool = False
    mla_latent: bool = True  # cache MLA as the latent (True) or expanded per-head K/V (False)
    linear_conv_keeps_full_kernel: bool = False  # conv state width: kernel (True) or kernel-1
    # What the engine accepts (empty: anything kvplan can size). kvplan's dtype names, after aliases.
    kv_cache_dtypes: tuple[str, ...] = ()
    # Linear-layer families whose B/C groups are sharded with the heads, so that groups are replicated up
    # to tp when tp does not divide n_groups (vLLM, SGLang: ``extra_groups_for_head_shards``); () for none.
    replicated_group_families: tuple[str, ...] = ()
    paged: ClassVar[bool] = False  # holds tokens in blocks (takes --block-size)

    # -- what a release changes, what a model changes ----------------------------------------------------
    def under(self, rules: Any, *, block_size: int | None) -> Engine:
        """This engine under a release profile's ``rules`` (``block_size``: the one asked, if any). Each engine
        reads the fields of its own rules dataclass; the base has none to read."""
        return self

    def check_block_size(self, block_size: int, profile: Any) -> None:
        """Refuse a block size this engine (under ``profile``, None: the newest) does not start with."""
        if not self.paged:
            raise InputError(f"--block-size applies to paged engines (vllm, sglang, trtllm), not {self.name}")

    def model_block_size(self, spec: ModelSpec, block_size: int | None, profile: Any) -> tuple[int | None, str | None]:
        """The block size this engine uses for ``spec`` when it differs from the one asked (``block_size``, None:
        the default), and a note saying why; (block_size, None) when nothing differs."""
        return block_size, None

    def check_kv_dtype(self, kv_dtype: str) -> None:
        """Refuse a KV dtype this engine has no option for (``auto`` is always the model's own)."""
        if kv_dtype == "auto" or not self.kv_cache_dtypes:
            return
        name = get_dtype(kv_dtype).name
        if name not in self.kv_cache_dtypes:
            raise InputError(f"{self.name} has no {name} KV cache; its KV dtypes are auto, "
                             f"{', '.join(self.kv_cache_dtypes)} (or use --engine ideal to size any format)")

    def prepare(self, spec: ModelSpec) -> ModelSpec:
        """The spec as this engine's implementation caches it (most engines: unchanged)."""
        return spec

    # -- what is stored per token slot -------------------------------------------------------
    def token_vectors(self, layer: Layer, tp: int) -> list[tuple[tuple[int, ...], int]]:
        """Per token slot: [(heads on each rank, elements per vector)], one entry for K, one for V.

        MLA latent is one vector of ``kv_lora_rank + qk_rope_head_dim``, replicated on every rank. A linear
        layer stores nothing per token unless it runs an attention in parallel (Falcon-H1): that one's vectors.
        """
        if isinstance(layer, LinearLayer):
            return self.token_vectors(layer.attention, tp) if layer.attention is not None else []
        if isinstance(layer, AttentionLayer):
            heads = split_heads(layer.num_kv_heads, tp, strict=self.strict_tp)
            return [(heads, layer.k_head_dim), (heads, layer.v_head_dim)]
        if isinstance(layer, MLALayer):
            if self.mla_latent:
                return [((1,) * tp, layer.latent_dim)]
            heads = split_heads(layer.num_heads, tp, strict=self.strict_tp)
            return [(heads, layer.expanded_k_head_dim), (heads, layer.v_head_dim)]
        if isinstance(layer, CompressedLayer):
            return [((1,) * tp, layer.head_dim)]  # the window's shared K=V head, replicated on every rank
        return []

    def slot_bytes(self, layer: Layer, kv_dtype: KVDtype, tp: int) -> tuple[int, ...]:
        """Bytes of one token slot of this layer on each rank (an MLA layer's indexer key included)."""
        per_rank = [0] * tp
        for heads, elems in self.token_vectors(layer, tp):
            vec = kv_dtype.vector_bytes(elems)
            for r in range(tp):
                per_rank[r] += heads[r] * vec
        if isinstance(layer, MLALayer) and layer.indexer_head_dim:
            per_rank = [b + self.indexer_slot_bytes(layer, kv_dtype) for b in per_rank]  # one key, on every rank
        return tuple(per_rank)

    # -- DeepSeek Sparse Attention's lightning indexer -------------------------------------------------
    def indexer_dtype(self, kv_dtype: KVDtype) -> KVDtype:
        """The indexer keys' format: the KV cache's own (a kernel's fixed MLA layout has no indexer form: the
        indexer's fp8 with block scales then)."""
        return INDEXER_FP8 if kv_dtype.fixed_vector_bytes else kv_dtype

    def indexer_slot_bytes(self, layer: MLALayer | CompressedLayer, kv_dtype: KVDtype) -> int:
        """Bytes of one indexer key (one per token for DSA; one per compressed entry for DeepSeek-V4's CSA)."""
        return self.indexer_dtype(kv_dtype).vector_bytes(layer.indexer_head_dim) if layer.indexer_head_dim else 0

    # -- DeepSeek-V4 compressed attention --------------------------------------------------------------
    def compressed_sequence_bytes(self, layer: CompressedLayer, num_tokens: int, kv_dtype: KVDtype,
                                  model_dtype: str) -> int:
        """Bytes one sequence of ``num_tokens`` tokens holds in one DeepSeek-V4 layer, on each rank (the layer is
        replicated under tensor parallelism). ``ideal``: the window's K=V vectors, every compressed entry and
        indexer key (KV dtype), and the compressor's pending inputs in the model dtype: kv and gate of the open
        window's tokens, and with overlap (CSA) the previous window's first half, once a window has closed."""
        model = get_dtype(model_dtype)
        window = min(num_tokens, layer.window) * kv_dtype.vector_bytes(layer.head_dim)
        entries = layer.entries(num_tokens)
        held = window + entries * (kv_dtype.vector_bytes(layer.head_dim) + self.indexer_slot_bytes(layer, kv_dtype))
        if not layer.compress_ratio:
            return held
        open_tokens = num_tokens % layer.compress_ratio
        pending = 2 * open_tokens * model.vector_bytes(layer.compressor_channels)
        if layer.indexer_head_dim:  # the indexer's own compressor, overlapping like CSA's
            pending += 2 * open_tokens * model.vector_bytes(2 * layer.indexer_head_dim)
        if layer.overlap and entries:
            pending += 2 * layer.compress_ratio * model.vector_bytes(layer.head_dim)
            if layer.indexer_head_dim:
                pending += 2 * layer.compress_ratio * model.vector_bytes(layer.indexer_head_dim)
        return held + pending

    # -- how many token slots a sequence holds ---------------------------------------------------
    def tokens_needed(self, layer: Layer, num_tokens: int) -> int:
        """Token states the attention needs for a sequence of ``num_tokens`` tokens (ideal): all but the
        ones the layer's kind skips (kvplan.core.spec: each kind knows its own rule)."""
        return num_tokens - layer.skipped_tokens(num_tokens) if layer.holds_tokens else 0

    def slots_held(self, layer: Layer, num_tokens: int) -> int:
        return self.tokens_needed(layer, num_tokens)

    # -- linear attention state ------------------------------------------------------------------
    def linear_state_elems(self, layer: LinearLayer) -> tuple[int, int]:
        """(conv elements, recurrent elements) one sequence holds in one layer, all ranks."""
        width = layer.conv_kernel if self.linear_conv_keeps_full_kernel else layer.conv_kernel - 1
        return layer.conv_channels * max(0, width), layer.state_elems

    def linear_conv_channels(self, layer: LinearLayer, tp: int) -> int:
        """Conv channels of one layer over all ``tp`` ranks: the layer's own, plus the replicated B/C groups of
        an engine that shards groups with heads when tp does not divide n_groups (each rank then holds its
        own copy of a group: n_groups + tp - n_groups groups in all)."""
        if layer.family not in self.replicated_group_families or not layer.n_groups or layer.n_groups % tp == 0:
            return layer.conv_channels
        return layer.conv_channels + 2 * (tp - layer.n_groups) * layer.group_state

    def linear_state_dtypes(self, layer: LinearLayer, model_dtype: str) -> tuple[KVDtype, KVDtype]:
        """(conv dtype, recurrent dtype): the model's own, KV quantization does not apply."""
        conv = get_dtype(model_dtype)
        return conv, conv

    def linear_state_bytes(self, layer: LinearLayer, model_dtype: str, tp: int) -> tuple[int, ...]:
        conv_elems, state_elems = self.linear_state_elems(layer)
        channels = self.linear_conv_channels(layer, tp)
        if channels != layer.conv_channels:
            conv_elems = conv_elems // layer.conv_channels * channels
        conv_dtype, state_dtype = self.linear_state_dtypes(layer, model_dtype)
        total = conv_dtype.vector_bytes(conv_elems) + state_dtype.vector_bytes(state_elems)
        heads = split_heads(layer.num_heads, tp, strict=self.strict_tp)
        return tuple(total * h // layer.num_heads for h in heads)

    def describe_rules(self) -> str:
        return "exactly the token states attention needs; sliding layers hold min(S, W) tokens"


@dataclass(frozen=True, kw_only=True)
class PagedEngine(Engine):
    """Blocks of ``block_size`` slots; sliding/chunked layers free the blocks they no longer need."""

    paged: ClassVar[bool] = True

    frees_out_of_window: bool = True  # vLLM before 0.9.1 (no hybrid manager) keeps every block

    def blocks_held(self, layer: Layer, num_tokens: int) -> int:
        """Blocks for ``num_tokens`` tokens, less the whole blocks the layer's kind skips (vLLM swaps those for
        the null block: the skipped tokens' full blocks, ``single_type_kv_cache_manager.py``)."""
        if num_tokens == 0 or not layer.holds_tokens:
            return 0
        blocks = cdiv(num_tokens, self.block_size)
        if not self.frees_out_of_window:
            return blocks
        return blocks - layer.skipped_tokens(num_tokens) // self.block_size

    def slots_held(self, layer: Layer, num_tokens: int) -> int:
        return self.blocks_held(layer, num_tokens) * self.block_size
