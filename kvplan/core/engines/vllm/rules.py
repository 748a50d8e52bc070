"""The types of vLLM's rules: what a release does, as typed fields (kvplan.core.engines.vllm.profiles holds
the values, release by release, and is where they are imported from).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kvplan.core.engines.vllm.activation import Sampler
from kvplan.core.engines.vllm.scheduler_rules import V1_BASELINE, SchedulerRules
from kvplan.core.spec import Layer, MLALayer


@dataclass(frozen=True, kw_only=True)
class BlockSizeRule:
    """The ``--block-size`` values a release starts with on CUDA: those its argument parser takes, less those its
    CUDA attention kernels refuse at startup (docs/engine-versions-research.md, section 7, "Block sizes")."""

    choices: tuple[int, ...]  # what --block-size parses to; (): any positive integer
    choices_source: str  # "release: file::function" of the parser's rule
    # The CUDA attention backends take a multiple of cuda_multiple_of, or one of cuda_also (V0: XFormers'
    # paged-attention kernel), up to cuda_max (0: no cap).
    cuda_multiple_of: int = 1
    cuda_also: tuple[int, ...] = ()
    cuda_max: int = 0
    cuda_source: str = ""  # "release: file::function" of the CUDA rule

    def on_cuda(self, block_size: int) -> bool:
        return ((block_size % self.cuda_multiple_of == 0 or block_size in self.cuda_also)
                and not (self.cuda_max and block_size > self.cuda_max))

    def allows(self, block_size: int) -> bool:
        parsed = block_size in self.choices if self.choices else block_size >= 1
        return parsed and self.on_cuda(block_size)

    def valid(self) -> tuple[int, ...]:
        """The sizes that start on CUDA, or the first few when any multiple does."""
        if self.choices:
            return tuple(b for b in self.choices if self.on_cuda(b))
        step = self.cuda_multiple_of
        return tuple(sorted({*self.cuda_also, *(step * i for i in range(1, 5))}))

    def describe(self) -> str:
        """One line: the sizes that start on CUDA, then the parser's and CUDA's rules with their sources."""
        sizes = ", ".join(map(str, self.valid())) if self.choices else f"any multiple of {self.cuda_multiple_of}"
        parsed = ", ".join(map(str, self.choices)) if self.choices else "any positive integer"
        cuda = f"a multiple of {self.cuda_multiple_of}" + "".join(f" or {b}" for b in self.cuda_also)
        if self.cuda_max:
            cuda += f", at most {self.cuda_max}"
        return f"{sizes} (--block-size takes {parsed}, {self.choices_source}; CUDA needs {cuda}, {self.cuda_source})"

    def suggestion(self) -> str:
        sizes = ", ".join(map(str, self.valid()))
        return f"use one of {sizes}" if self.choices else f"use {sizes} or another multiple of {self.cuda_multiple_of}"


class Budget(str, Enum):
    """What the KV budget charges (docs/engine-versions-research.md section 1)."""

    FREE_DELTA = "free_delta"  # total x util - (free at start - free after the profile run)        (<= 0.6.3)
    DEVICE_USED = "device_used"  # total x util - (torch peak + device used - torch allocated)     (0.6.4; V1 0.8-0.9.0)
    COMPONENTS = "components"  # total x util - (weights + activation peak + non-torch increase) (0.6.5 V0; V1 0.9.1-0.26)
    CONSUMED = "consumed"  # total x util - (free at start - free after + torch peak - allocated) (0.27+)


class CudaGraphs(str, Enum):
    AFTER_KV = "after_kv"  # captured after the KV cache is allocated, out of the 1 - utilization slack
    ESTIMATED = "estimated_not_subtracted"  # estimated and logged, subtracted only with VLLM_MEMORY_PROFILER_..._CUDAGRAPHS=1
    SUBTRACTED = "subtracted"  # estimated and subtracted from the KV budget by default

    @property
    def subtracted(self) -> bool:
        return self is CudaGraphs.SUBTRACTED


class CapacityLog(str, Enum):
    """What "GPU KV cache size: N tokens" means."""

    NUM_BLOCKS = "num_blocks"  # V0 logs '# GPU blocks' only
    BLOCKS_X_BLOCK = "blocks_x_block"  # num_blocks x block_size
    BLOCKS_PER_GROUP = "blocks_per_group"  # num_blocks // groups x block_size
    CONCURRENCY_X_LEN = "concurrency_x_len"  # int(max concurrency x max_model_len)


class Capture(str, Enum):
    """Which CUDA-graph batch sizes are captured (capture_sizes below)."""

    V0 = "v0"
    V1_512 = "v1_512"
    V1_2X_SEQS = "v1_2x_seqs"
    V1_2X_SEQS_STEP16 = "v1_2x_seqs_step16"


class BatchDefaults(str, Enum):
    """The default max_num_batched_tokens / max_num_seqs table (batch_defaults below)."""

    V0 = "v0"
    V1_0_8_0 = "v1_0.8.0"
    V1_0_8_4 = "v1_0.8.4"
    V1_0_8_5 = "v1_0.8.5"
    V1_0_9 = "v1_0.9"
    V1_0_28 = "v1_0.28"


class MlaGivenBlock(str, Enum):
    """What an MLA model's --block-size becomes on Hopper, where FlashMLA is the default."""

    KEPT = "kept"
    REPLACED = "replaced"  # by mla_block_size, whatever it is
    UNLESS_MULTIPLE = "unless_multiple"  # unless a multiple of it (sparse MLA: unless equal)


class DecodeContextParallel(str, Enum):
    """Which attention layers --decode-context-parallel-size shards (token i of a sequence on rank i % dcp)."""

    NONE = "none"  # no such flag
    MLA = "mla"  # 0.10.2: MLA only, on backends that return the softmax LSE (v1/worker/gpu_model_runner.py)
    ATTENTION = "attention"  # 0.11.1: GQA/MQA too, on FlashAttention and FlashInfer (config/model.py)


class Bitsandbytes(str, Enum):
    """How a release loads a pre-quantized bitsandbytes checkpoint."""

    NESTED_KEPT = "nested kept"  # double-quantized absmax kept as loaded (uint8 per 64, fp32 per 256 of those)
    ABSMAX_FP32 = "absmax fp32"  # dequantized to fp32 at load (0.10.0: bitsandbytes_loader.py::_dequantize_dq)
    REMOVED = "removed"  # 0.28.0: bitsandbytes quantization and its loader are gone


class ModelRunner(str, Enum):
    """Which GPU model runner a release picks on CUDA when VLLM_USE_V2_MODEL_RUNNER is not set
    (vllm/config/vllm.py::VllmConfig.use_v2_model_runner). It moves the batches in flight: with async scheduling
    the V2 runner keeps pp + 1, the V1 runner 2 at pp 1, else pp (VllmConfig.max_concurrent_batches, from 0.23.0;
    up to 0.22 the executors' max_concurrent_batches: 2 at pp 1 with async, else pp)."""

    V1 = "v1"  # V2 only with VLLM_USE_V2_MODEL_RUNNER=1
    # V2 for the architectures in VLLMRules.v2_architectures and every other generate model that is neither MoE
    # nor hybrid (Mamba / linear attention) (0.25.0: _is_default_v2_model_runner_model; a listed hybrid from 0.27.0,
    # and none of 0.26.0's listed architectures is hybrid)
    V2_UNLESS_MOE = "v2 unless moe or hybrid"
    V2 = "v2"  # every model (0.29.0: no architecture test left)


class PagePadding(str, Enum):
    """Which smaller KV page vLLM pads to the largest when it does not divide it: the layer keeps its block
    size and its page takes the largest page's bytes in the pool (``page_size_padded``). A page no rule pads
    is refused, NotImplementedError (vllm/v1/core/kv_cache_utils.py::unify_kv_cache_spec_page_size; 0.33.0:
    v1/core/kv_cache_planning.py)."""

    NONE = "none"  # (<= 0.23.x) "Cannot unify by adjusting block_size"
    # An attention layer whose backend sets indexes_kv_by_block_stride (0.24.0-0.28.x): the block dimension
    # outermost in the layered stride order (vllm/v1/attention/backend.py::AttentionBackend.
    # indexes_kv_by_block_stride). Every CUDA backend kvplan names has it, FlashAttention (the default) in both
    # NHD and HND, FlashInfer, Triton, FlexAttention and the dense MLA backends; sparse FlashMLA defines no
    # layered stride order and is not padded.
    BLOCK_STRIDE = "block_stride"
    NON_MLA = "non_mla"  # any attention layer but MLA (0.29.0 on): sparse MLA indexes whole token rows


class V4Pool(str, Enum):
    """How vLLM packs DeepSeek-V4's five cache groups into one block pool and what it logs (kvplan.core.engines.vllm.
    plan.v4_layout; each group's page is the sum of its layers' pages, each spec's page padded to 576 B)."""

    NONE = "none"  # the release has no DeepSeek-V4 model
    # 0.20.0-0.22.x: as SUMMED, but a block is the most layer tuples of a group x the compressed group's distinct
    # page sizes (what SUMMED's startup check charges a page)
    TUPLES = "tuples"
    # 0.23.0-0.26.x (vllm/v1/core/kv_cache_utils.py::_get_kv_cache_groups_uniform_groups, _get_kv_cache_config_packed,
    # get_max_concurrency_for_kv_cache_config): a window/state page is padded up to the next compressed-entry page;
    # a block holds the most layers of each page size any group has; the logged concurrency weighs each group's
    # pages by its page bytes over the compressed group's; the startup check counts layer tuples x the distinct
    # compressed pages
    SUMMED = "summed"
    # 0.27.0 on (0.33.0: v1/core/kv_cache_planning.py::_get_packed_kv_cache_groups, _get_kv_cache_bytes_per_block):
    # no state padding; a block is the widest group's page; a request's pages are summed unweighted
    WIDEST = "widest"


# Typed fields read from the table below as their names (each value checked when the rules are built).
_ENUMS = {"budget": Budget, "cuda_graphs": CudaGraphs, "capacity_log": CapacityLog, "capture": Capture,
          "batch_defaults": BatchDefaults, "sampler": Sampler, "bitsandbytes": Bitsandbytes, "mla_given_block": MlaGivenBlock,
          "model_runner": ModelRunner, "page_padding": PagePadding, "dcp": DecodeContextParallel, "v4_pool": V4Pool}


@dataclass(frozen=True, kw_only=True)
class VLLMRules:
    v1: bool  # the release's default engine is V1
    # From model, GPU and settings alone the budgets come to the same sum; they differ in what else they charge
    # (other processes' memory: device_used) and in what the startup log prints.
    budget: Budget
    default_utilization: float
    cuda_graphs: CudaGraphs
    kv_cache_memory_bytes: bool  # --kv-cache-memory-bytes exists
    null_block_in_fit: bool  # the fit check and max-model-len search leave one block for the null block
    capacity_log: CapacityLog
    capture: Capture
    batch_defaults: BatchDefaults
    mla_block_size: int  # the KV block size forced for MLA models
    mla_given_block: MlaGivenBlock = MlaGivenBlock.KEPT
    block_sizes: BlockSizeRule  # the --block-size values that start on CUDA
    override_in_fit: bool  # --num-gpu-blocks-override also drives the fit check and the estimate
    hybrid_manager: bool  # sliding-window layers free out-of-window blocks (else sized as full attention)
    # Layers of one attention type whose pages differ (other head sizes or KV heads) form one group
    # whose block costs the sum of their pages (UniformTypeKVCacheSpecs); before, pages were unified.
    uniform_type_group: bool = False
    # A smaller attention page that does not divide the largest is padded to it (PagePadding); else refused.
    page_padding: PagePadding = PagePadding.NONE
    auto_fit: bool = False  # max_model_len = -1 picks the longest that fits
    # a default max_num_seqs is cut to max_num_batched_tokens (0.11.0: vllm/engine/arg_utils.py::
    # EngineArgs._set_default_args, min(default_max_num_seqs, max_num_batched_tokens)); before, a budget below the
    # default made vLLM refuse to start (SchedulerConfig: max_num_batched_tokens must be >= max_num_seqs)
    seqs_cut_to_batched_tokens: bool = False
    # --mamba-cache-mode: a Mamba layer holds 1 + speculative blocks a request (none) or 2 + speculative
    # (align, with prefix caching); before, one block.
    mamba_cache_modes: bool = False
    layout_kv_dtypes: tuple[str, ...] = ()  # vLLM-only KV layouts this release has (kvplan.core.dtypes names)
    # The model runner by default (ModelRunner) and the architectures it names for V2 (DEFAULT_V2_MODEL_RUNNER_
    # ARCHITECTURES in vllm/config/vllm.py); read where the plan counts batches in flight (0.26.0 on).
    model_runner: ModelRunner = ModelRunner.V1
    v2_architectures: tuple[str, ...] = ()
    scheduler: SchedulerRules = V1_BASELINE  # the v1 scheduler and KV cache manager (scheduler_rules.py)
    # The profile run's sampler and whether the fused-MoE workspace stays allocated (activation.py)
    sampler: Sampler = Sampler.NONE
    moe_workspace: bool = False
    bitsandbytes: Bitsandbytes = Bitsandbytes.NESTED_KEPT
    skips_unused_tower: bool = False  # a vision tower whose every modality is limited to 0 is not built (0.16.0)
    # an MTP drafter takes the target's LM head (0.16.0); before, DeepSeek's MTP layer loaded its own shared_head.head
    mtp_shares_head: bool = False
    # LoRA's embedding and LM head carry 256 extra vocabulary rows a slot and grow the base ones (gone in 0.12.0)
    lora_extra_vocab: bool = True
    dcp: DecodeContextParallel = DecodeContextParallel.NONE  # --decode-context-parallel-size (0.10.2)
    # DCP with an fp8 MLA cache and with sparse MLA: refused ('DCP not support fp8 kvcache now', read in 0.10.2 to
    # 0.20.0; FlashMLA-sparse without decode LSE), both run in 0.33.0 (layers/attention/mla_attention.py::
    # MLADCPManager, v1/attention/backends/mla/flashmla_sparse.py); releases between were not read
    dcp_fp8_and_sparse_mla: bool = False
    v4_pool: V4Pool = V4Pool.NONE  # DeepSeek-V4's cache groups in the block pool (V4Pool)
    # DeepSeek-V4 with --kv-cache-dtype auto: fp8_ds_mla; before, the attention asserts an fp8 dtype and the start
    # fails (vllm/models/deepseek_v4/attention.py::_resolve_dsv4_kv_cache_dtype)
    v4_auto_fp8: bool = False
    # 0.32.0 on: at a block size that does not divide 256 a block's bytes round up to the lcm of the compressed pages at
    # 256 tokens (v1/worker/utils.py::customize_attention_spec, block_stride_alignment)
    v4_stride_align: bool = False
    # 0.29.0 on: the startup check charges a pool block a page of DeepSeek-V4 (kv_cache_planning.py::
    # _max_memory_usage_bytes_from_groups); before, the most layer tuples x the compressed group's distinct pages
    v4_check_widest: bool = False
    # 0.31.0 on: --disable-hybrid-kv-cache-manager fails at startup for DeepSeek-V4 (a TypeError building the
    # unified spec); before, every cache is sized as growing at block_size tokens a block
    v4_no_hybrid_fails: bool = False

    def pads_page(self, layer: Layer) -> bool:
        """vLLM pads this attention/MLA layer's page to the largest page when it does not divide it
        (unify_kv_cache_spec_page_size)."""
        if self.page_padding is PagePadding.NON_MLA:
            return not isinstance(layer, MLALayer)
        if self.page_padding is PagePadding.BLOCK_STRIDE:
            return not (isinstance(layer, MLALayer) and layer.indexer_head_dim)
        return False

    def __post_init__(self) -> None:
        for name, kind in _ENUMS.items():  # the table names them; a misspelt one fails here, at import
            object.__setattr__(self, name, kind(getattr(self, name)))

    @property
    def bnb_absmax_fp32(self) -> bool:
        """Double-quantized bitsandbytes scales are dequantized to fp32 at load (kvplan.core.quant)."""
        return self.bitsandbytes is Bitsandbytes.ABSMAX_FP32

    @property
    def async_default(self) -> bool:
        """Async scheduling on by default (2 batches in flight)."""
        return self.scheduler.async_default

    def runs_v2(self, *, architectures: tuple[str, ...], moe: bool, hybrid: bool) -> bool:
        """The V2 model runner runs this model by default (vllm/config/vllm.py::VllmConfig.use_v2_model_runner;
        the features it lacks, such as ngram speculative decoding, are not modelled)."""
        if self.model_runner is ModelRunner.V2:
            return True
        if self.model_runner is ModelRunner.V2_UNLESS_MOE:
            return any(a in self.v2_architectures for a in architectures) or not (moe or hybrid)
        return False

    def max_concurrent_batches(self, *, pp: int, async_scheduling: bool, v2_runner: bool) -> int:
        """Batches in flight (vllm/config/vllm.py::VllmConfig.max_concurrent_batches, 0.23.0 to 0.33.0): with
        async scheduling pp + 1 on the V2 model runner, 2 at pp 1 on the V1 runner; else pp."""
        if async_scheduling:
            if v2_runner:
                return pp + 1
            if pp <= 1:
                return 2
        return pp

    @property
    def in_flight_admission(self) -> bool:
        """Sliding/chunked layers admit max_in_flight_tokens, not one batch (the scheduler's admission cap)."""
        return self.scheduler.window_cap_in_flight
