"""vLLM v1's KV planning: layer groups, block pool, fit check, max-model-len search, capacity.

The pure arithmetic of ``vllm/v1/core/kv_cache_utils.py`` (0.33: ``kv_cache_planning.py``) and the page
sizes of ``vllm/v1/kv_cache_interface.py``, under one release's rules (kvplan.core.engines.vllm.profiles):
- layers are bucketed by spec; one spec is one group of all layers; one type with different pages is one
  group whose block costs the sum of the pages (0.11.0+); hybrids get group_size = min layers per type
  (max when max < 1.5 x min), each type cdiv(n, group_size) groups, pages unified by enlarging the
  smaller spec's block size;
- num_blocks = available // (page x group_size), the minimum over workers; --num-gpu-blocks-override
  replaces it (and drives the fit check from 0.20.1); the fit check leaves the null block from 0.29.0;
- per request: full cdiv(L, B) blocks; sliding cdiv(min(W - 1 + in-flight tokens, L), B) + 1; chunked
  cdiv(min(C + in-flight tokens, L), B); Mamba 1 (+ speculative, + 1 with align from 0.16.0);
- the max-model-len estimate and auto-fit (0.14.0+) binary-search the longest request that fits.
vLLM's own unit tests of this, as data, are tests/fixtures/vllm_planning (tests/core/capacity/test_vllm_planning.py).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from kvplan.core.dtypes import KVDtype, get_dtype
from kvplan.core.engines import get_engine
from kvplan.core.engines.base import cdiv
from kvplan.core.profiles import EngineProfile
from kvplan.core.engines.vllm.pages import V4_ENTRY_BLOCK
from kvplan.core.engines.vllm.profiles import CapacityLog, PagePadding, VLLMRules, check_block_size, mla_block
from kvplan.core.spec import AttentionLayer, CompressedLayer, Layer, LayerKind, LinearLayer, MLALayer
from kvplan.errors import ConfigError, InputError

DEFAULT_BLOCK_SIZE = 16  # vllm/config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE, every release read
KERNEL_BLOCK_ALIGN = 16
V4_MAX_BLOCK = 512  # the largest DeepSeek-V4 block size recorded against vLLM's own planning (tests/fixtures)
MLA_HYBRID_BLOCK_ALIGN = 128  # 0.33.0: vllm/platforms/interface.py::_align_hybrid_block_size (MLA + Mamba)

# Kernel block sizes of vLLM's MLA backends (0.20.0: each backend's get_supported_kernel_block_sizes):
# the first is what kvplan plans with unless --block-size picks another allowed one; () takes any
# multiple of 16. FlashMLA's 64 was forced for MLA models from 0.9.0 (vllm/platforms/cuda.py).
MLA_BACKEND_BLOCK_SIZES: dict[str, tuple[int, ...]] = {
    "FLASHMLA": (64,),
    "FLASHMLA_SPARSE": (64,),
    "CUTLASS_MLA": (128,),
    "FLASHINFER_MLA": (64, 32),
    "FLASH_ATTN_MLA": (),
    "TRITON_MLA": (),
}
# Standard-attention backends: the block size stays vLLM's default (any multiple of 16 is accepted).
ATTENTION_BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")
MAMBA_CACHE_MODES = ("none", "align")


def resolve_block_size(rules: VLLMRules, block_size: int | None, attention_backend: str | None, *, has_mla: bool,
                       sparse: bool, v4: bool = False) -> int:
    """The KV block size vLLM runs a model with (``has_mla``: a layer is MLA; ``sparse``: one has an indexer; ``v4``:
    DeepSeek-V4): the one given, else the backend's (MLA), else the release's MLA default or 16. DeepSeek-V4's
    compressed caches take 256 ("Setting kv cache block size to 256 for DEEPSEEK_SPARSE_SWA backend": 0.25.0
    platforms/interface.py::Platform.update_block_size_for_backend, the first layer's backend's preferred size)."""
    if v4:
        if attention_backend is not None:
            raise InputError("DeepSeek-V4 runs its own attention backends in vLLM; leave --attention-backend out")
        return block_size or V4_ENTRY_BLOCK
    if attention_backend is None:
        if has_mla:
            return mla_block(rules, block_size, sparse=sparse)[0]
        return block_size or DEFAULT_BLOCK_SIZE
    name = attention_backend.strip().upper().replace("-", "_")
    if name in ATTENTION_BACKENDS:
        return block_size or DEFAULT_BLOCK_SIZE
    if name not in MLA_BACKEND_BLOCK_SIZES:
        raise InputError(f"unknown vLLM attention backend {attention_backend!r}; use one of: "
                         f"{', '.join((*MLA_BACKEND_BLOCK_SIZES, *ATTENTION_BACKENDS))}")
    if not has_mla:
        raise InputError(f"{name} is an MLA backend and this model has no MLA layers; use one of "
                         f"{', '.join(ATTENTION_BACKENDS)} or leave the backend out")
    allowed = MLA_BACKEND_BLOCK_SIZES[name]
    if block_size is None:
        return allowed[0] if allowed else DEFAULT_BLOCK_SIZE
    if (allowed and block_size not in allowed) or (not allowed and block_size % KERNEL_BLOCK_ALIGN):
        sizes = ", ".join(map(str, allowed)) if allowed else "a multiple of 16"
        raise InputError(f"vLLM's {name} backend takes block size {sizes}, not {block_size}")
    return block_size


def attention_page_bytes(layer: Layer, kv_dtype: KVDtype, block_size: int, *, tp: int = 1,
                         page_size_padded: int | None = None) -> int:
    """One block of one attention/MLA layer on one rank (``AttentionSpec.page_size_bytes``); an explicit
    ``page_size_padded`` replaces it (it may only grow the page, as vLLM asserts)."""
    page = block_size * get_engine("vllm").slot_bytes(layer, kv_dtype, tp)[0]
    if page_size_padded is None:
        return page
    if page_size_padded < page:
        raise ConfigError(f"page_size_padded {page_size_padded} B is smaller than the {page} B page it pads")
    return page_size_padded


@dataclass(frozen=True, kw_only=True)
class Bucket:
    kind: LayerKind
    window: int
    block_size: int
    num_layers: int
    num_groups: int
    # An attention page padded to the layout's page (page_size_padded, PagePadding): its own, smaller page;
    # 0: not padded. The pool counts the padded page: the layer's block holds block_size tokens in more bytes.
    real_page_bytes: int = 0
    state_blocks: int = 1  # LINEAR: blocks one request holds (Mamba state, speculative and align blocks)
    # DeepSeek-V4's packed pool (v4_layout): the group's page, the sum of its layers' pages, which weighs its
    # pages in the logged concurrency of 0.25-0.26 (KVLayout.weighted)
    group_page_bytes: int = 0

    def blocks_needed(self, max_model_len: int, in_flight_tokens: int) -> int:
        """Blocks one request of ``max_model_len`` tokens is admitted with in one group of this kind
        (vllm/v1/kv_cache_interface.py: ``max_memory_usage_bytes`` / ``max_admission_blocks_per_request``)."""
        if self.kind is LayerKind.LINEAR:
            return self.state_blocks
        if self.kind is LayerKind.SLIDING:
            return cdiv(min(self.window - 1 + in_flight_tokens, max_model_len), self.block_size) + 1
        if self.kind is LayerKind.CHUNKED:
            return cdiv(min(self.window + in_flight_tokens, max_model_len), self.block_size)
        return cdiv(max_model_len, self.block_size)


@dataclass(frozen=True, kw_only=True)
class KVLayout:
    page_bytes: int  # one block of one layer (all groups share it after unification)
    group_size: int  # layers per group: tensors the block pool spans
    buckets: tuple[Bucket, ...]
    # Page bytes of each tensor one pool block spans; empty: group_size tensors of page_bytes. Differs for
    # a group of one type with different page sizes (UniformTypeKVCacheSpecs: one tensor per layer).
    tensor_pages: tuple[int, ...] = ()
    # --decode-context-parallel-size (kvplan.core.engines.vllm.dcp): a block of the pool holds block_size tokens on
    # each of dcp ranks, so a request of L tokens needs the blocks of cdiv(L, dcp)
    dcp: int = 1
    # DeepSeek-V4's packed pool (v4_layout): ``packed``: each group's block is one pool block of page_bytes (not
    # page_bytes x group_size spread over the groups); ``check_block_bytes``: what the startup check charges a page
    # (0: a pool block); ``weighted``: the logged concurrency weighs each group's pages by its page bytes over the
    # first group's (0.25-0.26)
    packed: bool = False
    check_block_bytes: int = 0
    weighted: bool = False

    @property
    def num_groups(self) -> int:
        return sum(b.num_groups for b in self.buckets)

    @property
    def min_block_size(self) -> int:
        return min(b.block_size for b in self.buckets)

    def padding(self) -> tuple[tuple[int, int], ...]:
        """(padding layers, layers) of each type whose count the group size does not divide: vLLM fills its last
        group with padding layers and warns of them."""
        return tuple((b.num_groups * self.group_size - b.num_layers, b.num_layers) for b in self.buckets
                     if b.num_groups * self.group_size > b.num_layers)

    @property
    def pool_block_bytes(self) -> int:
        """Bytes one block of the pool takes across every tensor it spans."""
        return self.page_bytes * self.group_size

    @property
    def block_size(self) -> int:
        """The block size vLLM logs and --block-size sets: the smallest group's, or for DeepSeek-V4 the compressed
        caches' (its window and state caches keep blocks of their own)."""
        return self.buckets[0].block_size if self.packed else self.min_block_size

    def tensor_bytes(self, num_blocks: int) -> tuple[int, ...]:
        """The KV tensors vLLM allocates for ``num_blocks`` blocks (one per layer slot of a group)."""
        return tuple(page * num_blocks for page in (self.tensor_pages or (self.page_bytes,) * self.group_size))

    def blocks_admitted(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Pool blocks one request of ``max_model_len`` tokens is admitted with; the second argument is the tokens a
        sliding/chunked layer admits at once (max_in_flight_tokens from 0.26)."""
        per_rank = cdiv(max_model_len, self.dcp)  # (dcp 1: max_model_len)
        return sum(b.num_groups * b.blocks_needed(per_rank, max_num_batched_tokens) for b in self.buckets)

    def blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """What vLLM divides the pool by for its logged concurrency: the blocks a request is admitted with, or for
        DeepSeek-V4 in 0.25-0.26 each group's pages weighed by its page over the first group's, rounded up
        (get_max_concurrency_for_kv_cache_config)."""
        if not self.weighted:
            return self.blocks_admitted(max_model_len, max_num_batched_tokens)
        per_rank = cdiv(max_model_len, self.dcp)
        return cdiv(sum(b.blocks_needed(per_rank, max_num_batched_tokens) * b.group_page_bytes for b in self.buckets),
                    self.buckets[0].group_page_bytes)

    def bytes_needed(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """What the startup check (and the max-model-len estimate) says one request of ``max_model_len`` needs."""
        return ((self.check_block_bytes or self.pool_block_bytes)
                * self.blocks_admitted(max_model_len, max_num_batched_tokens))


def mamba_state_blocks(rules: VLLMRules, mamba_cache_mode: str, num_speculative_tokens: int) -> int:
    """Blocks a Mamba layer holds for one request (``MambaSpec.max_memory_usage_bytes``): one before
    0.16.0; then 1 + speculative blocks, 2 + speculative blocks with --mamba-cache-mode align."""
    if mamba_cache_mode not in MAMBA_CACHE_MODES:
        raise InputError(f"mamba cache mode {mamba_cache_mode!r}: use one of {', '.join(MAMBA_CACHE_MODES)}")
    if num_speculative_tokens < 0:
        raise InputError(f"num_speculative_tokens must be >= 0 (got {num_speculative_tokens})")
    if not rules.mamba_cache_modes:
        if mamba_cache_mode != "none":
            raise ConfigError(f"this vLLM release has no --mamba-cache-mode {mamba_cache_mode} (from 0.16.0); "
                              "pin --engine vllm==0.16.0 or later, or leave the mode out")
        return 1
    return (2 if mamba_cache_mode == "align" else 1) + num_speculative_tokens


@dataclass(frozen=True, kw_only=True)
class _Buckets:
    """A stage's KV layers bucketed by spec: (kind, window, bytes per token or Mamba page) -> the layers."""

    members: dict[tuple, list[Layer]]
    has_mla: bool


def _bucket_layers(layers: list[Layer] | tuple[Layer, ...], *, kv_dtype: KVDtype, model_dtype: str, tp: int,
                   hybrid: bool) -> _Buckets:
    eng = get_engine("vllm")
    buckets: dict[tuple, list[Layer]] = {}
    has_mla = False
    for layer in layers:
        if isinstance(layer, LinearLayer):
            key: tuple = (LayerKind.LINEAR, 0, eng.linear_state_bytes(layer, model_dtype, tp)[0])
            buckets.setdefault(key, []).append(layer)
            if layer.attention is None:
                continue
            # A parallel attention (Falcon-H1) is a layer of its own in vLLM's KV config (falcon_h1.py
            # FalconH1ParallelHybrid holds an Attention and a MambaMixer2): it joins the attention buckets.
            layer = layer.attention
        if isinstance(layer, (AttentionLayer, MLALayer)):
            has_mla = has_mla or isinstance(layer, MLALayer)
            window = layer.window if isinstance(layer, AttentionLayer) and hybrid else 0
            kind = layer.kind if layer.kind is not LayerKind.MLA and hybrid else LayerKind.FULL
            key = (kind, window, eng.slot_bytes(layer, kv_dtype, tp)[0])
        else:
            continue
        buckets.setdefault(key, []).append(layer)
    return _Buckets(members=buckets, has_mla=has_mla)


def _uniform_type_layout(buckets: dict[tuple, list[Layer]], block_size: int, state_blocks: int) -> KVLayout:
    """One type, different pages (head sizes, KV heads): one group whose block costs every layer's page."""
    ((kind, window),) = {(kind, window) for kind, window, _ in buckets}
    pages = [block_size * tok for (_, _, tok), members in buckets.items() for _ in members]
    bucket = Bucket(kind=kind, window=window, block_size=block_size, num_layers=len(pages), num_groups=1,
                    state_blocks=state_blocks)
    return KVLayout(page_bytes=sum(pages), group_size=1, buckets=(bucket,), tensor_pages=tuple(pages))


def _unified_page(buckets: _Buckets, block_size: int, requested_block_size: int | None) -> tuple[int, int]:
    """(attention block size, page bytes) once the Mamba and attention pages are unified."""
    attn_tok = max((k[2] for k in buckets.members if k[0] is not LayerKind.LINEAR), default=0)
    linear_bytes = max((k[2] for k in buckets.members if k[0] is LayerKind.LINEAR), default=0)
    if linear_bytes and attn_tok:
        # Attention block size = 16 x cdiv(mamba page, 16 x attention bytes per token); the mamba page is
        # padded to match (vllm/platforms/interface.py). MLA hybrids (Kimi-Linear) align to 128 tokens
        # (0.33.0: vllm/platforms/interface.py::_align_hybrid_block_size, "if model_config.use_mla").
        align = max(KERNEL_BLOCK_ALIGN, requested_block_size or 0, MLA_HYBRID_BLOCK_ALIGN if buckets.has_mla else 0)
        block_size = align * cdiv(linear_bytes, align * attn_tok)
        return block_size, block_size * attn_tok
    if linear_bytes:
        return block_size, linear_bytes
    return block_size, block_size * attn_tok


def _group_size(counts: list[int]) -> int:
    """Layers per group: all of one type's; for hybrids the fewest of a type, or the most when within 1.5x."""
    if len(counts) == 1:
        return counts[0]
    return max(counts) if max(counts) < 1.5 * min(counts) else min(counts)


_LAYOUTS: dict[tuple, tuple[tuple, object, object, KVLayout | None]] = {}


def build_layout(layers: list[Layer] | tuple[Layer, ...], *, rules: VLLMRules, kv_dtype: KVDtype, model_dtype: str,
                 block_size: int, tp: int = 1, requested_block_size: int | None = None, hybrid: bool = True,
                 mamba_cache_mode: str = "none", num_speculative_tokens: int = 0, name: str = "model") -> KVLayout | None:
    """vLLM's grouping of one pipeline stage's layers into block-table groups (None: no layer holds KV)
    (vllm/v1/core/kv_cache_utils.py::get_kv_cache_groups). Without the hybrid manager every attention
    layer is sized as full attention. Memoized by the (frozen) layer, rules and dtype objects and the settings: a
    plan fits the same stage at many data-parallel sizes."""
    layers = tuple(layers)
    key = (tuple(map(id, layers)), id(rules), id(kv_dtype), model_dtype, block_size, tp, requested_block_size, hybrid,
           mamba_cache_mode, num_speculative_tokens, name)
    hit = _LAYOUTS.get(key)
    if hit is not None and hit[1] is rules and hit[2] is kv_dtype and hit[0] == layers:  # the same objects: C's identity check
        return hit[3]
    layout = _build_layout(layers, rules=rules, kv_dtype=kv_dtype, model_dtype=model_dtype, block_size=block_size,
                           tp=tp, requested_block_size=requested_block_size, hybrid=hybrid,
                           mamba_cache_mode=mamba_cache_mode, num_speculative_tokens=num_speculative_tokens, name=name)
    if len(_LAYOUTS) > 512:
        _LAYOUTS.clear()
    _LAYOUTS[key] = (layers, rules, kv_dtype, layout)
    return layout


def _build_layout(layers: tuple[Layer, ...], *, rules: VLLMRules, kv_dtype: KVDtype, model_dtype: str,
                  block_size: int, tp: int, requested_block_size: int | None, hybrid: bool, mamba_cache_mode: str,
                  num_speculative_tokens: int, name: str) -> KVLayout | None:
    v4 = [layer for layer in layers if isinstance(layer, CompressedLayer)]
    if v4:
        return v4_layout(v4, rules, block_size, name=name, hybrid=hybrid)
    buckets = _bucket_layers(layers, kv_dtype=kv_dtype, model_dtype=model_dtype, tp=tp, hybrid=hybrid)
    if not buckets.members:
        return None
    state_blocks = mamba_state_blocks(rules, mamba_cache_mode, num_speculative_tokens)
    types = {(kind, window) for kind, window, _ in buckets.members}
    if rules.uniform_type_group and len(buckets.members) > 1 and len(types) == 1:
        return _uniform_type_layout(buckets.members, block_size, state_blocks)
    block_size, page = _unified_page(buckets, block_size, requested_block_size)
    group_size = _group_size([len(v) for v in buckets.members.values()])
    out = []
    for (kind, window, tok_bytes), members in buckets.members.items():
        bucket_block, real_page = block_size, 0
        if kind is not LayerKind.LINEAR:
            own_page = block_size * tok_bytes
            # vllm/v1/core/kv_cache_utils.py::unify_kv_cache_spec_page_size: a smaller page that divides the
            # largest grows its block size; one that does not is padded (rules.page_padding) or refused.
            if page % own_page == 0:
                bucket_block = block_size * (page // own_page)
            elif rules.pads_page(members[0]):
                real_page = own_page
            else:
                raise ConfigError(f"{name}: layers with page sizes {own_page} and {page} B cannot share "
                                  "vLLM's block pool (sizes must divide)" + _padding_hint(rules, members[0]))
        out.append(Bucket(kind=kind, window=window, block_size=bucket_block, num_layers=len(members),
                          num_groups=cdiv(len(members), group_size), state_blocks=state_blocks,
                          real_page_bytes=real_page))
    return KVLayout(page_bytes=page, group_size=group_size, buckets=tuple(out))


def _padding_hint(rules: VLLMRules, layer: Layer) -> str:
    """What to pin where a later release pads this page."""
    from kvplan.core.engines.vllm.profiles import VLLM_PROFILES

    since = next((p.version for p in VLLM_PROFILES if p.rules.pads_page(layer)), None)
    if since is None or rules.page_padding is not PagePadding.NONE:
        return ""
    return f"; vLLM pads the smaller page from {since}: pin --engine vllm=={since} or later"


def _approximate_gcd(counts: list[int], lower_bound: int) -> int:
    """The divisor d >= lower_bound (at most the largest count) that pads the counts least to multiples of d, the
    larger on a tie (kv_cache_utils.py::_approximate_gcd, 0.25.0; kv_cache_planning.py 0.33.0)."""
    lo, hi = max(1, lower_bound), max(counts)
    best, least = lo, None
    for d in range(lo, hi + 1):
        pad = sum(-x % d for x in counts)
        if least is None or pad <= least:
            best, least = d, pad
    return best


def _page_counts(specs: list) -> Counter:
    """Specs of each page size in a group."""
    return Counter(x.page for x in specs)


def _most_common(specs: list) -> int:
    """Layers of the group's most common page size (get_num_layer_tuples)."""
    return max(_page_counts(specs).values())


def _split(specs: list, ways: int) -> list[list]:
    """A group of specs dealt into ``ways`` groups by rows (one spec of each page size a row), row k to group
    k mod ways (``layer_tuples[i::n]``); the page sizes must be equally many (vLLM asserts it)."""
    by_page: dict[int, list] = {}
    for x in specs:
        by_page.setdefault(x.page, []).append(x)
    if len({len(v) for v in by_page.values()}) != 1:
        raise ConfigError("DeepSeek-V4: a cache group with unequal counts of its page sizes cannot be split as vLLM "
                          "splits it (not modelled)")
    rows = list(zip(*by_page.values()))
    return [[x for row in rows[k::ways] for x in row] for k in range(ways)]


def v4_layout(layers: list[CompressedLayer], rules: VLLMRules, block_size: int, *, name: str = "model",
              hybrid: bool = True) -> KVLayout:
    """vLLM's block pool for DeepSeek-V4 (kvplan.core.engines.vllm.pages.v4_specs): five groups, one of every layer's
    compressed entries and indexer keys (block_size tokens a block) and one per (block size, window) of the window and
    state caches, the window caches split in two; every group's block is one block of the pool. Rules by release
    (VLLMRules.v4_pool, docs/engines.md "DeepSeek-V4 in vLLM")."""
    from kvplan.core.engines.vllm.pages import V4Spec, v4_specs
    from kvplan.core.engines.vllm.rules import V4Pool

    if rules.v4_pool is V4Pool.NONE:
        raise ConfigError(f"{name}: this vLLM release has no DeepSeek-V4 model; pin --engine vllm==0.20.0 or later")
    if not max(layer.compress_ratio for layer in layers):
        raise ConfigError(f"{name}: a DeepSeek-V4 stage with window-only layers and no compressed cache is not "
                          "modelled (vLLM groups the caches over every stage's layers)")
    check_v4_block(layers, block_size, name)
    if not hybrid:
        return _v4_unified(layers, rules, block_size, name)
    specs = [x for layer in layers for x in v4_specs(layer, block_size)]
    growing = [x for x in specs if x.grows]
    bounded: dict[tuple[int, int], list[V4Spec]] = {}
    for x in specs:
        if not x.grows:
            bounded.setdefault((x.block, x.window), []).append(x)
    growing_pages = sorted({x.page for x in growing})
    groups: list[list[V4Spec]] = [growing]
    summed = rules.v4_pool in (V4Pool.SUMMED, V4Pool.TUPLES)
    if summed:
        # 0.25.0 kv_cache_utils.py::_get_kv_cache_groups_uniform_groups: layer tuples from every group's most common
        # page count; a window or state page padded up to the next compressed page; each (block, window) group dealt
        # into cdiv(its layers of a page size, tuples) groups
        tuples = _approximate_gcd([_most_common(g) for g in (growing, *bounded.values())], _most_common(growing))
        for members in bounded.values():
            if max(x.page for x in members) > growing_pages[-1]:
                raise ConfigError(f"{name}: vLLM's DeepSeek-V4 pool takes --block-size 256 or more in this release "
                                  f"(a window page of {max(x.page for x in members):,} B exceeds every compressed page)")
            padded = [V4Spec(x.grows, x.block, x.window, min(p for p in growing_pages if p >= x.page), x.token_bytes)
                      for x in members]
            groups += _split(padded, cdiv(next(iter(_page_counts(padded).values())), tuples))
    else:
        # 0.33.0 kv_cache_planning.py::_get_packed_kv_cache_groups: a repeat count from the balanced groups (the same
        # count of every page size) only, at least the most layers of a balanced group with several page sizes; each
        # balanced group dealt into cdiv(its most common count, repeat) groups
        def shape(members: list[V4Spec]) -> tuple[bool, int]:
            counts = _page_counts(members)
            return len(set(counts.values())) == 1, len(counts)

        candidates = [growing, *bounded.values()]
        shapes = [shape(m) for m in candidates]
        low = max((_most_common(m) for m, (even, pages) in zip(candidates, shapes) if even and pages > 1), default=0)
        repeat = _approximate_gcd([_most_common(m) for m, (even, _) in zip(candidates, shapes) if even], low) if low else 0
        groups = []
        for members, (even, _) in zip(candidates, shapes):
            ways = cdiv(_most_common(members), repeat) if even and repeat else 1
            groups += _split(members, ways) if ways > 1 else [members]
    buckets = tuple(Bucket(kind=LayerKind.FULL if g[0].grows else LayerKind.SLIDING, window=g[0].window,
                           block_size=g[0].block, num_layers=len(g), num_groups=1,
                           group_page_bytes=sum(x.page for x in g)) for g in groups)
    # _max_memory_usage_bytes_from_groups (0.25.0, DeepSeek-V4): the startup check charges a page the most layer tuples
    # of a group x the compressed group's distinct pages (0.20-0.28; from 0.29 a pool block, VLLMRules.v4_check_widest)
    tuple_check = max(_most_common(g) for g in groups) * sum(growing_pages)
    if summed:
        # _get_kv_cache_config_packed: a block holds, of each page size, the most layers any group has of it
        slots: Counter = Counter()
        for g in groups:
            for page, n in _page_counts(g).items():
                slots[page] = max(slots[page], n)
        tensors = tuple(page for page, n in sorted(slots.items(), reverse=True) for _ in range(n))
        check = tuple_check
        if rules.v4_pool is V4Pool.TUPLES:  # 0.20-0.22: the block is what the check charges a page
            tensors = (check,)
        return KVLayout(page_bytes=sum(tensors), group_size=1, buckets=buckets, tensor_pages=tensors, packed=True,
                        check_block_bytes=check, weighted=True)
    widest = max(b.group_page_bytes for b in buckets)
    if rules.v4_stride_align and V4_ENTRY_BLOCK % block_size:
        # 0.33.0 v1/worker/utils.py::customize_attention_spec: a compressed spec's block stride a multiple of its
        # page at the kernel's 256 tokens, so a block of 512 rounds up to the lcm of those pages
        stride = 1
        for x in (v for layer in layers for v in v4_specs(layer, math.gcd(V4_ENTRY_BLOCK, block_size)) if v.grows):
            stride = math.lcm(stride, x.page)
        widest = cdiv(widest, stride) * stride
    check = 0 if rules.v4_check_widest else tuple_check
    return KVLayout(page_bytes=widest, group_size=1, buckets=buckets, tensor_pages=(widest,), packed=True,
                    check_block_bytes=check)


def _v4_unified(layers: list[CompressedLayer], rules: VLLMRules, block_size: int, name: str) -> KVLayout:
    """DeepSeek-V4 without the hybrid manager (--disable-hybrid-kv-cache-manager, or a KV connector without it):
    every window and state cache becomes a growing cache of block_size tokens a page (0.25.0 kv_cache_utils.py::
    unify_hybrid_kv_cache_specs), one group; 0.31.0 on fails at startup."""
    from kvplan.core.engines.vllm.pages import v4_specs

    if rules.v4_no_hybrid_fails:
        raise ConfigError(f"{name}: this vLLM release fails at startup with DeepSeek-V4 and "
                          "--disable-hybrid-kv-cache-manager (a TypeError building the unified spec); leave it out")
    pages = []
    for layer in layers:
        for x in v4_specs(layer, block_size):
            pages.append(x.page if x.grows else x.page_at(block_size))
    bucket = Bucket(kind=LayerKind.FULL, window=0, block_size=block_size, num_layers=len(pages), num_groups=1,
                    group_page_bytes=sum(pages))
    return KVLayout(page_bytes=sum(pages), group_size=1, buckets=(bucket,), tensor_pages=tuple(pages), packed=True)


def layout_from_groups(groups: list[tuple[Layer, int]], *, kv_dtype: KVDtype, block_size: int,
                       tp: int = 1) -> KVLayout:
    """A layout whose groups are given ((one layer's spec, layers in the group) each), as vLLM's
    ``KVCacheConfig.kv_cache_groups`` lists them; every group's pages must be equal."""
    pages = {attention_page_bytes(layer, kv_dtype, block_size, tp=tp) for layer, _ in groups}
    if len(pages) != 1:
        raise ConfigError(f"groups with page sizes {sorted(pages)} B cannot share one block pool")
    buckets = tuple(Bucket(kind=LayerKind.FULL if layer.kind is LayerKind.MLA else layer.kind,
                           window=getattr(layer, "window", 0), block_size=block_size, num_layers=n, num_groups=1)
                    for layer, n in groups)
    return KVLayout(page_bytes=pages.pop(), group_size=max(n for _, n in groups), buckets=buckets)


def estimate_max_model_len(layout: KVLayout, available_bytes: int, max_model_len: int, in_flight_tokens: int) -> int:
    """Largest max_model_len in [0, max_model_len] whose one request fits ``available_bytes``
    (vllm/v1/core/kv_cache_utils.py::estimate_max_model_len, a binary search; 0: none fits). The bytes a request
    needs grow with its length, so where the longest fits the search would end there: answered at once."""
    if layout.bytes_needed(max_model_len, in_flight_tokens) <= available_bytes:
        return max_model_len
    lo, hi = 0, max_model_len
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if layout.bytes_needed(mid, in_flight_tokens) <= available_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


def max_concurrency(layout: KVLayout, num_blocks: int, max_model_len: int, in_flight_tokens: int) -> float:
    """Requests of ``max_model_len`` tokens the pool holds at once (``get_max_concurrency_for_kv_cache_config``:
    num_blocks, the null block among them, over the blocks one request needs)."""
    per_request = layout.blocks_per_request(max_model_len, in_flight_tokens)
    return num_blocks / per_request if per_request else 0.0


def planning_bytes(rules: VLLMRules, layout: KVLayout, available_bytes: int, num_gpu_blocks_override: int | None) -> int:
    """What the fit check and the max-model-len search compare with: the KV memory, or the override's
    blocks from 0.20.1, less one pool block for the null block from 0.29.0."""
    avail = available_bytes
    if num_gpu_blocks_override and rules.override_in_fit:
        avail = num_gpu_blocks_override * layout.pool_block_bytes
    if rules.null_block_in_fit:
        avail -= layout.pool_block_bytes
    return avail


@dataclass(frozen=True, kw_only=True)
class StagePlan:
    layout: KVLayout | None  # None: the stage holds no KV
    available_bytes: int  # KV memory of the stage's smallest rank
    num_blocks: int  # what the memory holds (before the override and the minimum over stages)
    planning_bytes: int


@dataclass(frozen=True, kw_only=True)
class VLLMPlan:
    """What vLLM's KV planning decides at startup (vllm/v1/core/kv_cache_utils.py, get_kv_cache_configs)."""

    stages: tuple[StagePlan, ...]
    layout: KVLayout | None  # the binding stage's; None: attention-free
    num_blocks: int  # the pool's blocks, the null block among them (1 when attention-free)
    max_model_len: int  # the configured length, or auto-fit's choice
    blocks_per_request: int  # pool blocks one request of max_model_len is admitted with
    max_concurrency: float
    logged_kv_cache_tokens: int
    logged_capacity_rule: str
    estimated_max_model_len: int  # the longest that fits the fit check's memory, up to max_model_len
    fits: bool  # the startup check accepts max_model_len

    @property
    def num_groups(self) -> int:
        return self.layout.num_groups if self.layout else 0

    @property
    def tensor_bytes(self) -> tuple[int, ...]:
        return self.layout.tensor_bytes(self.num_blocks) if self.layout else ()


def plan_stages(stages: list[tuple[KVLayout | None, int]], rules: VLLMRules, max_model_len: int, *,
                in_flight_tokens: int, num_gpu_blocks_override: int | None = None,
                auto_fit: bool = False) -> VLLMPlan:
    """Blocks, fit check and capacity from each pipeline stage's layout and KV memory: num_blocks is the
    minimum over stages (``get_kv_cache_configs``), the override replaces it; auto-fit and the estimate are
    the minimum over stages."""
    if num_gpu_blocks_override is not None and num_gpu_blocks_override < 1:
        raise InputError(f"num_gpu_blocks_override must be >= 1 (got {num_gpu_blocks_override})")
    if auto_fit and not rules.auto_fit:
        raise ConfigError("this vLLM release has no max_model_len auto-fit (from 0.14.0); give a max_model_len "
                          "or pin --engine vllm==0.14.0 or later")
    plans = tuple(StagePlan(layout=lay, available_bytes=kv,
                            num_blocks=max(0, kv) // lay.pool_block_bytes if lay else 1,
                            planning_bytes=planning_bytes(rules, lay, kv, num_gpu_blocks_override) if lay else kv)
                  for lay, kv in stages)
    kv_stages = [p for p in plans if p.layout is not None]
    if not kv_stages:
        # No layer holds KV: vLLM still allocates the null block and checks no memory.
        return VLLMPlan(stages=plans, layout=None, num_blocks=1, max_model_len=max_model_len, blocks_per_request=0,
                        max_concurrency=0.0, logged_kv_cache_tokens=0, logged_capacity_rule="no KV cache",
                        estimated_max_model_len=max_model_len, fits=True)
    binding = min(kv_stages, key=lambda p: (p.num_blocks, p.available_bytes))
    layout = binding.layout
    assert layout is not None
    num_blocks = num_gpu_blocks_override or binding.num_blocks

    def estimate(upper: int) -> int:
        return min(estimate_max_model_len(p.layout, p.planning_bytes, upper, in_flight_tokens)  # type: ignore[arg-type]
                   for p in kv_stages)

    if auto_fit:
        max_model_len = estimate(max_model_len)
    fits = max_model_len > 0 and all(p.layout.bytes_needed(max_model_len, in_flight_tokens) <= p.planning_bytes  # type: ignore[union-attr]
                                     for p in kv_stages)
    per_request = layout.blocks_per_request(max_model_len, in_flight_tokens)
    concurrency = max_concurrency(layout, num_blocks, max_model_len, in_flight_tokens)
    logged, rule = logged_kv_cache_tokens(rules, num_blocks, layout, concurrency, max_model_len)
    return VLLMPlan(stages=plans, layout=layout, num_blocks=num_blocks, max_model_len=max_model_len,
                    blocks_per_request=per_request, max_concurrency=concurrency, logged_kv_cache_tokens=logged,
                    logged_capacity_rule=rule, estimated_max_model_len=estimate(max_model_len), fits=fits)


def plan_vllm(layers: list[Layer] | tuple[Layer, ...], available_bytes: int, max_model_len: int, profile: EngineProfile,
              *, model_dtype: str, in_flight_tokens: int, kv_dtype: str = "auto", tp: int = 1,
              block_size: int | None = None, num_gpu_blocks_override: int | None = None, disable_hybrid: bool = False,
              auto_fit: bool = False, mamba_cache_mode: str = "none", num_speculative_tokens: int = 0,
              attention_backend: str | None = None) -> VLLMPlan:
    """vLLM's KV plan for one worker whose KV memory is ``available_bytes``, under ``profile``'s rules.

    ``in_flight_tokens``: what a sliding/chunked layer admits (max_num_batched_tokens, times the batches in
    flight from 0.26); ``auto_fit``: max_model_len = -1, searched up to ``max_model_len``."""
    rules: VLLMRules = profile.rules
    kv_dtype = v4_kv_dtype(rules, layers, kv_dtype, profile.version)
    dtype = get_dtype(model_dtype if kv_dtype == "auto" else kv_dtype)
    check_layout_dtype(rules, dtype, profile.version)
    if block_size is not None:
        check_block_size(profile, block_size)
    size = resolve_block_size(rules, block_size, attention_backend,
                              has_mla=any(isinstance(x, MLALayer) for x in layers),
                              sparse=any(isinstance(x, MLALayer) and x.indexer_head_dim for x in layers),
                              v4=any(isinstance(x, CompressedLayer) for x in layers))
    layout = build_layout(layers, rules=rules, kv_dtype=dtype, model_dtype=model_dtype, block_size=size, tp=tp,
                          requested_block_size=block_size, hybrid=rules.hybrid_manager and not disable_hybrid,
                          mamba_cache_mode=mamba_cache_mode, num_speculative_tokens=num_speculative_tokens)
    return plan_stages([(layout, available_bytes)], rules, max_model_len, in_flight_tokens=in_flight_tokens,
                       num_gpu_blocks_override=num_gpu_blocks_override, auto_fit=auto_fit)


def check_v4_block(layers: list[Layer] | tuple[Layer, ...], block_size: int, name: str = "model") -> None:
    """Refuse a DeepSeek-V4 block size vLLM does not start with, or that kvplan has not held against its planning."""
    ratio = max((x.compress_ratio for x in layers if isinstance(x, CompressedLayer)), default=0)
    if block_size > V4_MAX_BLOCK:
        raise ConfigError(f"{name}: kvplan has held DeepSeek-V4's pool against vLLM's own planning at block sizes up to "
                          f"{V4_MAX_BLOCK}; --block-size {block_size} is not modelled")
    if ratio and (block_size < ratio or block_size % ratio):
        # 0.33.0: a compressed page of block_size // ratio entries, 0 below the ratio (ZeroDivisionError at startup)
        raise ConfigError(f"{name}: vLLM's DeepSeek-V4 caches need --block-size a multiple of {ratio} (the largest "
                          f"compress ratio); {block_size} does not start")


def v4_size_dtype(profile: EngineProfile, layers: list[Layer] | tuple[Layer, ...], kv_dtype: str,
                  block_size: int, name: str = "model") -> tuple[str, str | None]:
    """For sizing under a vLLM release: the KV dtype to size ``layers`` with and, for DeepSeek-V4, the name of what
    vLLM stores (fp8_ds_mla rows whatever --kv-cache-dtype), refusing what v4_kv_dtype and check_v4_block refuse;
    (``kv_dtype``, None) for any other model."""
    if not any(isinstance(x, CompressedLayer) for x in layers):
        return kv_dtype, None
    planned = v4_kv_dtype(profile.rules, layers, kv_dtype, profile.version)
    check_v4_block(layers, block_size, name)
    return planned, "fp8_ds_mla"


V4_FP8_NAMES = ("fp8", "fp8_e4m3", "fp8_ds_mla")  # what _resolve_dsv4_kv_cache_dtype turns into fp8_ds_mla


def v4_kv_dtype(rules: VLLMRules, layers: list[Layer] | tuple[Layer, ...], kv_dtype: str, version: str) -> str:
    """The KV dtype to plan ``layers`` with: ``kv_dtype``, or for DeepSeek-V4 fp8 (its caches are fp8_ds_mla rows
    whatever the dtype), refusing what vLLM refuses: any but fp8, ``auto`` too before VLLMRules.v4_auto_fp8
    (vllm/models/deepseek_v4/attention.py::_resolve_dsv4_kv_cache_dtype)."""
    if not any(isinstance(x, CompressedLayer) for x in layers):
        return kv_dtype
    from kvplan.core.engines.vllm.rules import V4Pool

    if rules.v4_pool is V4Pool.NONE:
        raise ConfigError(f"vLLM {version} has no DeepSeek-V4 model; pin --engine vllm==0.20.0 or later")
    name = kv_dtype.strip().lower()
    if name in V4_FP8_NAMES or (name == "auto" and rules.v4_auto_fp8):
        return "fp8"
    from kvplan.core.engines.vllm.profiles import VLLM_PROFILES

    since = next((p.version for p in VLLM_PROFILES if p.rules.v4_auto_fp8), None)
    later = f"; from {since}, auto means fp8" if name == "auto" and since else ""
    raise ConfigError(f"vLLM {version} runs DeepSeek-V4 with an fp8 KV cache only (the fp8_ds_mla layout): "
                      f"--kv-cache-dtype {kv_dtype} fails at startup{later}; give --kv-cache-dtype fp8")


def check_layout_dtype(rules: VLLMRules, dtype: KVDtype, version: str) -> None:
    """Refuse a vLLM-only KV layout the release does not have yet."""
    from kvplan.core.engines.vllm.profiles import VLLM_PROFILES

    if dtype.name in VLLM_PROFILES[-1].rules.layout_kv_dtypes and dtype.name not in rules.layout_kv_dtypes:
        since = next(p.version for p in VLLM_PROFILES if dtype.name in p.rules.layout_kv_dtypes)
        raise ConfigError(f"vLLM {version} has no --kv-cache-dtype {dtype.name} (from {since}); pin "
                          f"--engine vllm=={since} or later, or use fp8")


def logged_kv_cache_tokens(rules: VLLMRules, blocks: int, layout: KVLayout, concurrency: float, max_len: int) -> tuple[int, str]:
    """The startup log's "GPU KV cache size" in this release, and how it is computed."""
    if rules.capacity_log is CapacityLog.CONCURRENCY_X_LEN:
        return int(concurrency * max_len), "int(max concurrency x max_model_len)"
    dcp = f" x dcp {layout.dcp}" if layout.dcp > 1 else ""  # 'Multiplying the GPU KV cache size by the dcp_world_size'
    if rules.capacity_log is CapacityLog.BLOCKS_PER_GROUP:
        smallest = f" (the smallest group's, {layout.min_block_size})" if layout.packed else ""
        return (blocks // layout.num_groups * layout.min_block_size * layout.dcp,
                f"num_blocks // layer groups x block_size{smallest}{dcp}")
    if rules.capacity_log is CapacityLog.BLOCKS_X_BLOCK:
        return blocks * layout.min_block_size * layout.dcp, f"num_blocks x block_size{dcp}"
    return blocks * layout.min_block_size, "V0 logs '# GPU blocks' only: num_blocks x block_size"
