"""vLLM's memory rules, and its v1 scheduler's (VLLMRules.scheduler, scheduler_rules.py), release by release.

Every change point was found by reading the released sdists from PyPI (0.6.2 to 0.33.0, every release;
0.15.x has none); docs/engine-versions-research.md has each rule with its file, function and line.
Each profile below is the previous one with what changed replaced. The rules' types (VLLMRules, its enums,
BlockSizeRule) are defined in rules.py and imported from here.
"""

from __future__ import annotations

import dataclasses

from kvplan.core.engines.vllm.rules import (  # noqa: F401  (imported from here: the rules' types and their values)
    BatchDefaults,
    Bitsandbytes,
    BlockSizeRule,
    Budget,
    CapacityLog,
    Capture,
    CudaGraphs,
    MlaGivenBlock,
    ModelRunner,
    PagePadding,
    VLLMRules,
)
from kvplan.core.engines.vllm.scheduler_rules import (  # noqa: F401
    V1_BASELINE, FreeOrder, RouterRules, SchedulerRules, Score, WindowCap)
from kvplan.core.gpus import GPUSpec
from kvplan.core.profiles import EngineProfile, chain
from kvplan.core.units import GiB
from kvplan.errors import InputError


_OLDEST = VLLMRules(
    v1=False, budget="free_delta", default_utilization=0.9, cuda_graphs="after_kv", kv_cache_memory_bytes=False,
    null_block_in_fit=False, capacity_log="num_blocks",
    capture="v0", batch_defaults="v0", mla_block_size=16, override_in_fit=False,
    hybrid_manager=False,
    # V0 runs FlashAttention when the block is a multiple of 16, else XFormers, whose paged-attention kernel
    # takes 8, 16 and 32 (csrc/attention/paged_attention_v1.cu).
    block_sizes=BlockSizeRule(
        choices=(8, 16, 32), choices_source="0.6.2: vllm/engine/arg_utils.py::EngineArgs.add_cli_args",
        cuda_multiple_of=16, cuda_also=(8,), cuda_source="0.6.2: vllm/attention/selector.py::which_attn_to_use"),
)


_V0_BLOCKS = (8, 16, 32, 64, 128)
_ARGS = "{}: vllm/engine/arg_utils.py::EngineArgs.add_cli_args"
_V1_FLASH_ATTN = "0.8.0: vllm/v1/attention/backends/flash_attn.py::FlashAttentionBackend.get_kv_cache_shape"


class _ReleaseTable:
    """The table below as it reads: each ``at`` is the previous release's rules with what changed replaced."""

    def __init__(self, oldest: VLLMRules) -> None:
        self.rules = oldest
        self.entries: list[tuple[str, VLLMRules, tuple[str, ...]]] = []

    def at(self, version: str, changes: tuple[str, ...], **changed: object) -> None:
        self.rules = dataclasses.replace(self.rules, **changed)
        self.entries.append((version, self.rules, changes))

    def blocks(self, **changed: object) -> BlockSizeRule:
        """The previous release's --block-size rule with ``changed`` replaced."""
        return dataclasses.replace(self.rules.block_sizes, **changed)

    def sched(self, version: str, **changed: object) -> SchedulerRules:
        """The previous release's scheduler rules with ``changed`` replaced, as ``version``'s."""
        return dataclasses.replace(self.rules.scheduler, release=version, **changed)


# The MoE architectures vLLM 0.26.0 runs on the V2 model runner by default (vllm/config/vllm.py
# DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES); every other model that is neither MoE nor hybrid runs on it too.
_V2_ARCHITECTURES_0_26 = ("DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "InklingForCausalLM",
                          "InklingForConditionalGeneration", "LongcatFlashNgramForCausalLM", "Qwen2MoeForCausalLM")

_table = _ReleaseTable(_OLDEST)


def _router(**changed: object) -> RouterRules:
    """The previous release's data-parallel load balancer with ``changed`` replaced."""
    return dataclasses.replace(_table.rules.scheduler.router, **changed)


_table.at("0.6.2", (
    "the V0 engine; KV = total x util - (free at start - free after the profile run) "
    "(0.6.3: vllm/worker/worker.py::Worker.determine_num_available_blocks)",
    "CUDA graphs are captured after the KV cache is allocated, out of the 1 - utilization slack",
    "logs '# GPU blocks: N' only; max_num_seqs 256, max_num_batched_tokens max(max_model_len, 2048)",
    "--block-size takes 8, 16 or 32 (0.6.2: vllm/engine/arg_utils.py::EngineArgs.add_cli_args, choices); "
    "FlashAttention runs multiples of 16, XFormers 8 (vllm/attention/selector.py::which_attn_to_use)",
))
_table.at("0.6.4", ("the peak counts device-wide used memory, so other processes' memory is charged "
                    "(0.6.4: vllm/worker/worker.py::Worker.determine_num_available_blocks)",
                    "logs one 'Memory profiling results: ...' line",
                    "--block-size also takes 64 and 128 (0.6.4: vllm/engine/arg_utils.py::EngineArgs.add_cli_args)"),
          budget="device_used", block_sizes=_table.blocks(choices=_V0_BLOCKS, choices_source=_ARGS.format("0.6.4")))
_table.at("0.6.5", ("KV = total x util - (weights + activation peak increase + non-torch increase) "
                    "(0.6.5: vllm/worker/worker.py with vllm/utils.py::memory_profiling)",
                    "logs 'model weights take ...; non_torch_memory takes ...; PyTorch activation peak memory takes "
                    "...'",
                    "--block-size takes 8, 16 or 32 again (0.6.5: vllm/engine/arg_utils.py::EngineArgs.add_cli_args)"),
          budget="components", block_sizes=_table.blocks(choices=(8, 16, 32), choices_source=_ARGS.format("0.6.5")))
_table.at("0.6.6", ("--block-size takes 8 to 128, but CUDA refuses more than 32: 'CUDA Paged Attention kernel only "
                    "supports block sizes up to 32' (0.6.6: vllm/config.py::CacheConfig._verify_args)",),
          block_sizes=_table.blocks(choices=_V0_BLOCKS, choices_source=_ARGS.format("0.6.6"), cuda_max=32,
                                    cuda_source="0.6.6: vllm/config.py::CacheConfig._verify_args"))
_table.at("0.7.0", ("the 32-token cap is gone: 64 and 128 run on FlashAttention "
                    "(0.7.0: vllm/config.py::CacheConfig._verify_args; vllm/platforms/cuda.py::"
                    "CudaPlatformBase.get_attn_backend_cls)",),
          block_sizes=_table.blocks(cuda_max=0,
                                    cuda_source="0.7.0: vllm/platforms/cuda.py::CudaPlatformBase.get_attn_backend_cls"))
_table.at("0.8.0", ("the V1 engine is the default (vllm/envs.py VLLM_USE_V1 '1'); its budget charges device-wide "
                    "used memory again (0.8.0: vllm/v1/worker/gpu_worker.py::Worker.determine_available_memory)",
                    "logs 'GPU KV cache size: num_blocks x block_size tokens' and 'Maximum concurrency'",
                    "captures batch sizes 1, 2, 4, 8..512 step 8 up to max_num_batched_tokens (vllm/config.py)",
                    "max_num_seqs 1024 on every GPU; max_num_batched_tokens 8192 on H100/H200, else 2048 "
                    "(0.8.0: vllm/engine/arg_utils.py)",
                    "block sizes must be multiples of 16 on CUDA: 8 is refused at startup, 'Block size must be a "
                    "multiple of 16.' (0.8.0: vllm/v1/attention/backends/flash_attn.py::"
                    "FlashAttentionBackend.get_kv_cache_shape)",
                    "the profile run samples max_num_seqs dummy requests with top-k and top-p, sorting the vocabulary "
                    "in PyTorch (0.8.0: vllm/v1/worker/gpu_model_runner.py::GPUModelRunner._dummy_sampler_run, "
                    "vllm/v1/sample/ops/topk_topp_sampler.py::apply_top_k_top_p)"),
          v1=True, sampler="sort", budget="device_used", capacity_log="blocks_x_block", capture="v1_512",
          batch_defaults="v1_0.8.0",
          block_sizes=_table.blocks(cuda_also=(), cuda_source=_V1_FLASH_ATTN))
_table.at("0.8.4", ("max_num_seqs 1024 on H100/H200 only, else 256 (0.8.4: vllm/engine/arg_utils.py)",),
          batch_defaults="v1_0.8.4")
_table.at("0.8.5", ("the large batch defaults go by device memory (>= 70 GiB), not the GPU's name "
                    "(0.8.5: vllm/engine/arg_utils.py)",
                    "--block-size takes BlockSize = Literal[1, 8, 16, 32, 64, 128] "
                    "(0.8.5: vllm/config.py::CacheConfig.block_size; arg_utils.py::get_kwargs makes it the choices); "
                    "CUDA still needs a multiple of 16"),
          batch_defaults="v1_0.8.5",
          block_sizes=_table.blocks(choices=(1, *_V0_BLOCKS),
                                    choices_source="0.8.5: vllm/config.py::CacheConfig.block_size"))
_table.at("0.9.0", ("MLA models use 64-token blocks (FlashMLA; 0.9.0: vllm/platforms/cuda.py)",
                    "an MLA model's --block-size is replaced by 64: 'Forcing kv cache block size to 64 for FlashMLA "
                    "backend' (0.9.0: vllm/platforms/cuda.py::CudaPlatformBase.check_and_update_config)",
                    "the max-model-len estimate (binary search) appears, capped at the configured max_model_len "
                    "(0.9.0: vllm/v1/core/kv_cache_utils.py::estimate_max_model_len)",
                    "A100s no longer get the large batch defaults"),
          mla_block_size=64, mla_given_block="replaced", batch_defaults="v1_0.9")
_table.at("0.9.1", ("the budget is total x util, refused at startup when free memory is below it; KV = budget - "
                    "(weights + activation peak + non-torch) (0.9.1: vllm/v1/worker/gpu_worker.py)",
                    "the hybrid KV cache manager: sliding-window layers free out-of-window blocks "
                    "(--disable-hybrid-kv-cache-manager turns it off)",
                    "maximum concurrency counts every layer group's blocks "
                    "(0.9.1: kv_cache_utils.py::get_max_concurrency_for_kv_cache_config)"),
          budget="components", hybrid_manager=True)
_table.at("0.10.0", ("CUDA-graph sizes go up to min(2 x max_num_seqs, 512) "
                     "(0.10.0: vllm/config.py::SchedulerConfig.__post_init__)",
                     "a double-quantized bitsandbytes checkpoint's absmax is dequantized to fp32 at load: 4.5 bits a "
                     "weight (0.10.0: vllm/model_executor/model_loader/bitsandbytes_loader.py::_dequantize_dq)"),
          capture="v1_2x_seqs", bitsandbytes="absmax fp32")
_table.at("0.10.2", ("--kv-cache-memory-bytes sets the KV budget directly (0.10.2: vllm/config/cache.py)",
                     "--decode-context-parallel-size C shards an MLA model's KV over C of the tp ranks, token i "
                     "on rank i % C: each rank's pool as without it, the scheduler's block B x C tokens, a request of L tokens "
                     "cdiv(L, B x C) blocks (0.10.2: vllm/v1/worker/block_table.py::BlockTable.compute_slot_mapping, "
                     "vllm/v1/kv_cache_interface.py::FullAttentionSpec.max_memory_usage_bytes)"),
          kv_cache_memory_bytes=True, dcp="mla")
_table.at("0.11.0", ("the V0 engine is gone; 'GPU KV cache size' = num_blocks // groups x block_size "
                     "(0.11.0: vllm/v1/core/kv_cache_utils.py)",
                     "layers of one type with different page sizes share one group, a block costing the sum of "
                     "their pages (0.11.0: kv_cache_interface.py::UniformTypeKVCacheSpecs; absent in 0.10.2)",
                     "--kv-cache-dtype fp8_ds_mla: 656 B per token per sparse-MLA layer "
                     "(0.11.0: kv_cache_interface.py::MLAAttentionSpec.page_size_bytes)",
                     "scheduler: the oldest v1 scheduler kvplan simulates (kvplan/core/engines/vllm/scheduler_rules.py "
                     "V1_BASELINE): no whole-sequence admission gate, freed blocks appended to the free queue "
                     "(0.11.0: vllm/v1/core/block_pool.py::BlockPool.free_blocks), long_prefill_token_threshold on "
                     "every chunk, async scheduling off by default and one more decode scheduled for a request whose "
                     "last token is in flight (0.11.0: vllm/v1/core/sched/scheduler.py::Scheduler.schedule)"),
          capacity_log="blocks_per_group", uniform_type_group=True, layout_kv_dtypes=("fp8_ds_mla",),
          seqs_cut_to_batched_tokens=True, scheduler=_table.sched("0.11.0"))
_table.at("0.11.1", ("CUDA-graph sizes step by 16 from 256 (0.11.1: vllm/config/vllm.py::_set_cudagraph_sizes)",
                     "an MLA model keeps a --block-size that is a multiple of 64 (sparse MLA: only 64) "
                     "(0.11.1: vllm/platforms/cuda.py::CudaPlatformBase.check_and_update_config)",
                     "BlockSize adds 256 (0.11.1: vllm/config/cache.py::CacheConfig.block_size); CUDA refuses a size "
                     "no attention kernel block divides: 'No common block size for 8' "
                     "(0.11.1: vllm/v1/worker/gpu_model_runner.py::GPUModelRunner.select_common_block_size)",
                     "--decode-context-parallel-size shards GQA/MQA KV too, where tp exceeds the KV heads (0.11.1: "
                     "vllm/config/model.py::ModelConfig.verify_with_parallel_config)",
                     "scheduler, async: a request whose last token is in flight is not scheduled again (0.11.1: "
                     "vllm/v1/core/sched/scheduler.py::Scheduler.schedule, num_new_tokens capped at min(prompt + "
                     "max_tokens, max_model_len) - 1 - num_computed_tokens)"),
          scheduler=_table.sched("0.11.1", async_skip_last_in_flight=True), capture="v1_2x_seqs_step16",
          dcp="attention",
          mla_given_block="unless_multiple",
          block_sizes=_table.blocks(choices=(1, *_V0_BLOCKS, 256),
                                    choices_source="0.11.1: vllm/config/cache.py::CacheConfig.block_size",
                                    cuda_source=("0.11.1: vllm/v1/worker/gpu_model_runner.py::"
                                                 "GPUModelRunner.select_common_block_size")))
_table.at("0.12.0", ("LoRA: no extra vocabulary; the embedding and LM head adapters and the base vocabulary keep "
                     "vocab_size rows (0.12.0: vllm/lora/layers/vocal_parallel_embedding.py, logits_processor.py; "
                     "0.11.0 added lora_extra_vocab_size, 256, config/lora.py)",), lora_extra_vocab=False)
_table.at("0.13.0", ("the fused-MoE workspace stays allocated between layers and through the sampler run (0.13.0: "
                     "vllm/v1/worker/workspace.py::WorkspaceManager, vllm/model_executor/layers/fused_moe/"
                     "modular_kernel.py::_allocate_buffers)",), moe_workspace=True)
_table.at("0.14.0", ("scheduler: async scheduling on by default, two batches in flight "
                     "(0.14.0: vllm/config/vllm.py::VllmConfig.__post_init__)",
                     "max_model_len = -1 fits the longest context the KV memory holds "
                     "(0.14.0: kv_cache_utils.py::_auto_fit_max_model_len)",
                     "scheduler, data parallel: a dense model's engines run independently (no lockstep, no dummy "
                     "batches) and publish no counts, so the balancer spreads requests round-robin (0.14.0: "
                     "vllm/v1/engine/core.py::EngineCoreProc.run_engine_core)"),
          scheduler=_table.sched("0.14.0", async_default=True, router=_router(dense_counts=False,
                                                                               dense_lockstep=False)),
          auto_fit=True)
_table.at("0.15.0", ("scheduler, data parallel: `vllm serve -dp N` starts N API servers, each its own load balancer "
                     "(0.15.0: vllm/entrypoints/cli/serve.py::ServeSubcommand.cmd, --api-server-count defaults to "
                     "data_parallel_size)",),
          scheduler=_table.sched("0.15.0", router=_router(servers_per_engine=True)))
_table.at("0.16.0", ("--mamba-cache-mode: a Mamba layer holds 1 + num_speculative_blocks blocks a request, 2 + "
                     "num_speculative_blocks with 'align' (prefix caching) "
                     "(0.16.0: vllm/v1/kv_cache_interface.py::MambaSpec.max_memory_usage_bytes)",
                     "a vision tower is not built when --limit-mm-per-prompt gives each of its modalities 0 (0.16.0: "
                     "vllm/model_executor/models/interfaces.py::SupportsMultiModal._mark_tower_model)",
                     "speculative mtp: the drafter takes the target's LM head, where DeepSeek's MTP layer loaded its own "
                     "shared_head.head before (0.16.0: vllm/v1/spec_decode/eagle.py::EagleProposer.load_model; 0.14.0: "
                     "vllm/model_executor/models/deepseek_mtp.py)"),
          mamba_cache_modes=True, skips_unused_tower=True, mtp_shares_head=True)
_table.at("0.17.0", ("the profile run's top-k/top-p runs in Triton, in place, with a buffer of min(SMs, requests) rows "
                     "of the vocabulary (0.17.0: vllm/v1/sample/ops/topk_topp_triton.py::apply_top_k_top_p_triton)",),
          sampler="triton")
_table.at("0.18.0", ("CUDA-graph memory is estimated and logged, but subtracted from the KV budget only with "
                     "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 "
                     "(0.18.0: gpu_model_runner.py::profile_cudagraph_memory, vllm/envs.py)",
                     "the BlockSize literal is gone: --block-size takes any integer (0.18.0: vllm/config/cache.py::"
                     "CacheConfig.block_size); on CUDA any multiple of 16 (48, 80, 512) starts, others find 'No valid "
                     "attention backend' (0.18.0: vllm/platforms/cuda.py::CudaPlatformBase.get_attn_backend_cls, "
                     "vllm/v1/attention/backend.py::AttentionBackend.supports_block_size)",
                     "an MLA model's --block-size is no longer replaced: it picks among the MLA backends that take it "
                     "(0.18.0: vllm/platforms/cuda.py::CudaPlatformBase.check_and_update_config)"),
          cuda_graphs="estimated_not_subtracted", mla_given_block="kept",
          block_sizes=_table.blocks(
              choices=(), choices_source="0.18.0: vllm/config/cache.py::CacheConfig.block_size",
              cuda_source=("0.18.0: vllm/platforms/cuda.py::CudaPlatformBase.get_attn_backend_cls, "
                           "vllm/v1/attention/backend.py::AttentionBackend.supports_block_size")))
_table.at("0.19.0", ("scheduler: a waiting or preempted request is admitted only if its whole sequence, less prefix "
                     "hits, fits in the free blocks (scheduler_reserve_full_isl, default True; sliding and chunked "
                     "groups counted at full length) (0.19.0: vllm/config/scheduler.py; vllm/v1/core/sched/"
                     "scheduler.py::Scheduler.schedule; vllm/v1/core/kv_cache_manager.py::"
                     "KVCacheManager.can_fit_full_sequence)",),
          scheduler=_table.sched("0.19.0", full_sequence_gate=True))
_table.at("0.20.0", ("the CUDA-graph estimate is subtracted by default (0.20.0: vllm/envs.py; the log says "
                     "'default since v0.21.0')",
                     "gpu_memory_utilization defaults to 0.92 (0.20.0: vllm/config/cache.py; 0.9 up to 0.19)",
                     "--kv-cache-dtype fp8_per_token_head / int8_per_token_head: the dense page plus 2 x block x "
                     "kv_heads x 4 B of fp32 scales (0.20.0: kv_cache_interface.py::AttentionSpec.page_size_bytes)",
                     "scheduler: sliding and chunked groups count at most cdiv(min(W - 1 + max_num_batched_tokens, "
                     "max_model_len), B) + 1 blocks (chunked: cdiv(min(C + max_num_batched_tokens, max_model_len), "
                     "B)), in EVERY block count, so a running request past the cap never preempts (0.20.0: "
                     "vllm/v1/kv_cache_interface.py::SlidingWindowSpec.max_admission_blocks_per_request, "
                     "vllm/v1/core/single_type_kv_cache_manager.py::SingleTypeKVCacheManager."
                     "get_num_blocks_to_allocate)",
                     "DeepSeek-V4 (vllm/model_executor/models/deepseek_v4.py; kvplan.core.engines.vllm.plan.v4_layout): "
                     "five cache groups in one pool, window and state pages padded up to the next compressed page, a "
                     "block the most layer tuples of a group x the compressed group's distinct page sizes; the "
                     "logged concurrency weighs each group's pages by its page over the compressed group's (0.20.0: "
                     "vllm/v1/core/kv_cache_utils.py::_get_kv_cache_groups_uniform_groups, "
                     "get_max_concurrency_for_kv_cache_config)"),
          cuda_graphs="subtracted", default_utilization=0.92,
          layout_kv_dtypes=("fp8_ds_mla", "fp8_per_token_head", "int8_per_token_head"),
          scheduler=_table.sched("0.20.0", window_cap=WindowCap.EVERY_ALLOCATION), v4_pool="tuples")
_table.at("0.20.1", ("'GPU KV cache size' = int(max concurrency x max_model_len): up to 8x num_blocks x block_size "
                     "for sliding-window models (0.20.1: kv_cache_utils.py::_report_kv_cache_config)",
                     "--num-gpu-blocks-override also drives the fit check (0.20.1: get_kv_cache_configs)"),
          capacity_log="concurrency_x_len", override_in_fit=True)
_table.at("0.20.2", ("scheduler: the sliding/chunked cap applies at the admission gate only; each step's allocation "
                     "counts the blocks a request really needs again (0.20.2: vllm/v1/core/"
                     "single_type_kv_cache_manager.py::SingleTypeKVCacheManager.get_num_blocks_to_allocate "
                     "apply_admission_cap; vllm/v1/core/kv_cache_manager.py::KVCacheManager.can_fit_full_sequence)",),
          scheduler=_table.sched("0.20.2", window_cap=WindowCap.ADMISSION))
_table.at("0.23.0", ("scheduler, prefix caching: blocks freed behind a window and a sliding-window group's finished "
                     "blocks without a hash go to the front of the free queue (0.23.0: vllm/v1/core/"
                     "single_type_kv_cache_manager.py::SingleTypeKVCacheManager.remove_skipped_blocks, "
                     "SlidingWindowManager.free)",
                     "DeepSeek-V4: a pool block holds, of each page size, the most layers any group has (0.23.0: "
                     "vllm/v1/core/kv_cache_utils.py::_get_kv_cache_config_packed)"),
          scheduler=_table.sched("0.23.0", free_order=FreeOrder.WINDOW_UNHASHED_FIRST), v4_pool="summed")
_table.at("0.24.0", ("scheduler, prefix caching: every freed block without a hash goes to the front of the free queue, "
                     "hashed blocks to the back (0.24.0: vllm/v1/core/block_pool.py::BlockPool.free_blocks)",
                     "scheduler: the watermark option (default 0.0) keeps a share of the pool free at admission "
                     "(0.24.0: vllm/config/scheduler.py; vllm/v1/core/kv_cache_manager.py::KVCacheManager."
                     "allocate_slots)",
                     "an attention page that does not divide the largest is padded to it, keeping its block size, "
                     "where the backend indexes KV by the block stride: FlashAttention (the CUDA default), "
                     "FlashInfer, Triton, FlexAttention and the dense MLA backends do (0.24.0: vllm/v1/core/"
                     "kv_cache_utils.py::unify_kv_cache_spec_page_size; vllm/v1/attention/backend.py::"
                     "AttentionBackend.indexes_kv_by_block_stride); 0.23.x refused it"),
          scheduler=_table.sched("0.24.0", free_order=FreeOrder.UNHASHED_FIRST, watermark=True),
          page_padding="block_stride")
_table.at("0.25.0", ("scheduler, data parallel: the balancer's scan for the lowest score starts one engine further on after "
                     "each request (0.25.0: vllm/v1/engine/core_client.py::DPLBAsyncMPClient."
                     "get_core_engine_for_request)",),
          scheduler=_table.sched("0.25.0", router=_router(rotate=True)))
_table.at("0.26.0", ("sliding and chunked layers admit max_in_flight_tokens = batches in flight x "
                     "max_num_batched_tokens (0.26.0: vllm/v1/kv_cache_interface.py "
                     "max_admission_blocks_per_request)",
                     "scheduler: the sliding/chunked admission cap counts max_in_flight_tokens (2 x "
                     "max_num_batched_tokens with async scheduling) (0.26.0: vllm/config/vllm.py::"
                     "VllmConfig.max_in_flight_tokens); blocks behind a window are freed on the processed tokens, "
                     "num_computed - num_in_flight_tokens: a batch later with async scheduling (0.26.0: vllm/v1/core/"
                     "kv_cache_manager.py::KVCacheManager.allocate_slots)",
                     "batches in flight: pp + 1 with async scheduling on the V2 model runner, 2 at pp 1 on the V1 "
                     "runner, else pp (0.23.0-0.33.0: vllm/config/vllm.py::VllmConfig.max_concurrent_batches); the V2 "
                     "runner is the default for the listed MoE architectures and every model neither MoE nor hybrid "
                     "(0.26.0: vllm/config/vllm.py::VllmConfig._is_default_v2_model_runner_model, "
                     "DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES; the rule since 0.25.0, after Qwen3 alone in 0.22.0 and "
                     "a list in 0.23.0-0.24.x: no release before 0.26 plans with batches in flight)",
                     "a Mamba page smaller than the largest (a draft model's) is padded to it (0.26.0: vllm/v1/core/"
                     "kv_cache_utils.py::unify_kv_cache_spec_page_size); kvplan plans no draft model's layers"),
          scheduler=_table.sched("0.26.0", window_cap_in_flight=True, window_frees_processed=True),
          model_runner="v2 unless moe or hybrid", v2_architectures=_V2_ARCHITECTURES_0_26)
_table.at("0.27.0", ("the budget charges memory consumed by the profile run (free at start - free after) plus the "
                     "transient torch peak (0.27.0: vllm/utils/mem_utils.py::memory_profiling)",
                     "the V2 model runner's list adds KimiK3ForConditionalGeneration and takes a listed hybrid (0.27.0: "
                     "vllm/config/vllm.py::VllmConfig._is_default_v2_model_runner_model, "
                     "DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES)",
                     "scheduler: a preempted request whose output is still in flight waits in front of the queue "
                     "while the ones behind it are admitted (0.27.0: vllm/v1/core/sched/scheduler.py::"
                     "Scheduler.schedule, num_stale_output_tokens): it matters with three or more batches in flight "
                     "(pipeline parallelism)",
                     "scheduler, data parallel: the balancer scores max(client_count x its requests in flight, "
                     "waiting + "
                     "running) plus waiting x 6 x max(0, KV usage - 0.5), and every engine publishes its counts with "
                     "its KV usage (0.27.0: vllm/v1/engine/core_client.py::DPLBAsyncMPClient."
                     "get_core_engine_for_request, vllm/v1/engine/core.py::EngineCoreProc.run_busy_loop)",
                     "DeepSeek-V4: window and state pages no longer padded; a pool block is the widest group's page "
                     "and the logged concurrency sums each group's pages plainly (0.27.0: vllm/v1/core/"
                     "kv_cache_planning.py::_get_packed_kv_cache_groups, _get_kv_cache_bytes_per_block; "
                     "kv_cache_utils.py::get_max_concurrency_for_kv_cache_config)"),
          budget="consumed", v2_architectures=(*_V2_ARCHITECTURES_0_26, "KimiK3ForConditionalGeneration"),
          scheduler=_table.sched("0.27.0", router=_router(score=Score.IN_FLIGHT, dense_counts=True),
                                 stale_output_waits=True), v4_pool="widest")
_table.at("0.28.0", ("GPUs of 160 GiB or more (B200) get max_num_batched_tokens 16384 "
                     "(0.28.0: vllm/engine/arg_utils.py)",
                     "bitsandbytes checkpoints no longer load: vllm/model_executor/layers/quantization/bitsandbytes.py "
                     "and model_loader/bitsandbytes_loader.py are gone (0.28.0)",
                     "scheduler: prefix caching is on by default for hybrid Mamba/linear-attention models, Mamba "
                     "cache mode align (0.28.0: vllm/engine/arg_utils.py::"
                     "_set_default_chunked_prefill_and_prefix_caching_args); kvplan does not model align mode",
                     "the V2 model runner's list adds DeepseekV4ForCausalLM on CUDA (0.28.0: "
                     "vllm/config/vllm.py::default_v2_model_runner_architectures)"),
          batch_defaults="v1_0.28", bitsandbytes="removed", scheduler=_table.sched("0.28.0", hybrid_prefix_caching_default=True),
          v2_architectures=(*_table.rules.v2_architectures, "DeepseekV4ForCausalLM"))
_table.at("0.29.0", ("the fit check and the max-model-len search leave one block for the null block "
                     "(0.29.0: vllm/v1/core/kv_cache_utils.py::check_enough_kv_cache_memory)",
                     "scheduler, prefix caching: sliding-window and Mamba groups cache only checkpoint blocks "
                     "(prefix_cache_retention_interval 0) (0.29.0: vllm/config/cache.py; vllm/v1/core/"
                     "single_type_kv_cache_manager.py::SlidingWindowManager.reachable_block_mask); not modelled",
                     "the V2 model runner is the default for every model on CUDA, MoE and hybrid too: pp + 1 batches "
                     "in flight with async scheduling (0.29.0: vllm/config/vllm.py::VllmConfig.use_v2_model_runner)",
                     "any non-MLA attention page that does not divide the largest is padded to it, whatever the "
                     "backend; an MLA page no longer is (0.29.0: vllm/v1/core/kv_cache_utils.py::"
                     "unify_kv_cache_spec_page_size; 0.33.0: v1/core/kv_cache_planning.py)",
                     "DeepSeek-V4's startup check charges a pool block a page (0.29.0: v1/core/kv_cache_planning.py::"
                     "_max_memory_usage_bytes_from_groups)"),
          null_block_in_fit=True, page_padding="non_mla", v4_check_widest=True, scheduler=_table.sched("0.29.0", window_checkpoint_caching=True),
          model_runner="v2", v2_architectures=())
_table.at("0.30.0", ("DeepSeek-V4: --kv-cache-dtype auto means fp8 (fp8_ds_mla); before, the start fails (0.30.0: "
                     "vllm/models/deepseek_v4/attention.py::_resolve_dsv4_kv_cache_dtype)",),
          v4_auto_fp8=True)
_table.at("0.31.0", ("scheduler: long_prefill_token_threshold applies only when more than one request is running or "
                     "waiting (0.31.0: vllm/v1/core/sched/scheduler.py::Scheduler.schedule)",
                     "decode context parallelism runs with an fp8 MLA cache and on sparse MLA (read in 0.33.0: "
                     "vllm/model_executor/layers/attention/mla_attention.py::MLADCPManager, "
                     "vllm/v1/attention/backends/mla/flashmla_sparse.py; refused through 0.20.0)",
                     "DeepSeek-V4 with --disable-hybrid-kv-cache-manager fails at startup (0.31.0: a TypeError building "
                     "the unified MLAAttentionSpec, v1/core/kv_cache_planning.py)",),
          scheduler=_table.sched("0.31.0", threshold_needs_company=True), dcp_fp8_and_sparse_mla=True,
          v4_no_hybrid_fails=True)
_table.at("0.32.0", ("DeepSeek-V4 at a block size that does not divide 256: a pool block's bytes round up to the lcm of "
                     "the compressed pages at 256 tokens (0.32.0: vllm/v1/worker/utils.py::customize_attention_spec, "
                     "block_stride_alignment)",),
          v4_stride_align=True)


VLLM_PROFILES: tuple[EngineProfile, ...] = chain("vllm", "vLLM", _table.entries)
del _table


def default_seqs(rules: VLLMRules, gpu: GPUSpec, max_model_len: int, max_num_batched_tokens: int | None) -> int:
    """max_num_seqs where none is given: the OpenAI server's default for the GPU, cut to the token budget from
    0.11.0 (VLLMRules.seqs_cut_to_batched_tokens)."""
    mnbt, seqs = batch_defaults(rules, gpu, max_model_len)
    budget = max_num_batched_tokens or mnbt
    return min(seqs, budget) if rules.seqs_cut_to_batched_tokens else seqs


def batch_defaults(rules: VLLMRules, gpu: GPUSpec, max_model_len: int) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) the OpenAI server uses when not given
    (vllm/engine/arg_utils.py, release by release; docs/engine-versions-research.md section 2b)."""
    name = gpu.name.lower()
    big = gpu.memory_bytes >= 70 * GiB
    if rules.batch_defaults is BatchDefaults.V0:
        if max_model_len > V0_LONG_CONTEXT:  # chunked prefill turns on: the budget is one chunk
            return V0_MIN_BATCHED_TOKENS, 256
        return max(max_model_len, V0_MIN_BATCHED_TOKENS), 256
    if rules.batch_defaults in (BatchDefaults.V1_0_8_0, BatchDefaults.V1_0_8_4):
        hopper = "h100" in name or "h200" in name
        seqs = 1024 if rules.batch_defaults is BatchDefaults.V1_0_8_0 or hopper else 256
        return (8192 if hopper else 2048), seqs
    if rules.batch_defaults is BatchDefaults.V1_0_8_5:
        return (8192, 1024) if big else (2048, 256)
    large = big and not gpu.is_a100_class
    if rules.batch_defaults is BatchDefaults.V1_0_28 and gpu.memory_bytes >= 160 * GiB:
        return 16384, 1024
    return (8192, 1024) if large else (2048, 256)


# V0's SchedulerConfig without chunked prefill: max_num_batched_tokens = max(max_model_len, 2048)
# (0.6.6: vllm/config.py::SchedulerConfig.__post_init__).
V0_MIN_BATCHED_TOKENS = 2048
# V0 turns chunked prefill on by itself above 32K of context (0.6.6: vllm/engine/arg_utils.py use_long_context).
V0_LONG_CONTEXT = 32 * 1024


def blackwell_class(gpu: GPUSpec) -> bool:
    """Compute capability 10.x (B200, B300, GB200, GB300): vLLM 0.28+ captures larger graph batches there."""
    return gpu.name.upper().replace("-", "").startswith(("B200", "B300", "GB200", "GB300"))


def capture_sizes(rules: VLLMRules, *, max_num_seqs: int, max_num_batched_tokens: int,
                  blackwell: bool = False) -> list[int]:
    """The batch sizes vLLM captures CUDA graphs for (docs/engine-versions-research.md section 2a); from 0.28 the
    default cap is 1024 on compute capability 10.x (0.28.0: vllm/config/vllm.py), 512 elsewhere."""
    if rules.capture is Capture.V0:
        candidates = [1, 2, 4] + [8 * i for i in range(1, 1025)]
        top = next(c for c in candidates if c >= max_num_seqs) if max_num_seqs <= candidates[-1] else candidates[-1]
        return [c for c in candidates if c <= top]
    top = 1024 if blackwell and rules.batch_defaults is BatchDefaults.V1_0_28 else 512
    if rules.capture is Capture.V1_512:
        cap = 512
    else:
        cap = min(2 * max_num_seqs, top)
    if rules.capture is Capture.V1_2X_SEQS_STEP16:
        cap = min(cap, max_num_batched_tokens)
        return [s for s in [1, 2, 4, *range(8, 256, 8), *range(256, cap + 1, 16)] if s <= cap]
    return [s for s in [1, 2, 4, *range(8, cap + 1, 8)] if s <= max_num_batched_tokens]


def mla_block(rules: VLLMRules, given: int | None, *, sparse: bool) -> tuple[int, str | None]:
    """The block size an MLA model runs with on Hopper, and a note when vLLM replaces the --block-size given
    (vllm/platforms/cuda.py::CudaPlatformBase.check_and_update_config, 0.9.0 to 0.17.1)."""
    forced = rules.mla_block_size
    if given is None or given == forced or rules.mla_given_block is MlaGivenBlock.KEPT:
        return given or forced, None
    if rules.mla_given_block is MlaGivenBlock.UNLESS_MULTIPLE and not sparse and given % forced == 0:
        return given, None
    takes = f"{forced} only" if sparse or rules.mla_given_block is MlaGivenBlock.REPLACED else f"multiples of {forced}"
    return forced, (f"vLLM replaces --block-size {given} with {forced} for MLA models on Hopper "
                    f"(FlashMLA{' sparse' if sparse else ''} takes {takes}; vllm/platforms/cuda.py::"
                    "CudaPlatformBase.check_and_update_config)")


def check_block_size(profile: EngineProfile, block_size: int) -> None:
    """Refuse a ``--block-size`` the profile's release does not start with on CUDA, naming the rule and the
    sizes it takes."""
    rule: BlockSizeRule = profile.rules.block_sizes
    if rule.allows(block_size):
        return
    if rule.choices and block_size not in rule.choices:
        why = (f"has no --block-size {block_size}: it takes {', '.join(map(str, rule.choices))} "
               f"({rule.choices_source})")
        if set(rule.valid()) != set(rule.choices):
            why += f", and on CUDA {', '.join(map(str, rule.valid()))} ({rule.cuda_source})"
    else:
        need = f"a multiple of {rule.cuda_multiple_of}" + "".join(f" or {b}" for b in rule.cuda_also)
        if rule.cuda_max:
            need += f" no larger than {rule.cuda_max}"
        why = f"does not start with --block-size {block_size} on CUDA: it needs {need} ({rule.cuda_source})"
    raise InputError(f"{profile.label} {why}; {rule.suggestion()}")


def newest() -> EngineProfile:
    return VLLM_PROFILES[-1]


def v0_variant(profile: EngineProfile) -> EngineProfile:
    """The V0 engine inside a release whose default is V1 (0.8-0.10.2 with VLLM_USE_V1=0, or a platform V1
    did not support): V0's budget, graphs, log and defaults."""
    if not profile.rules.v1:
        return profile
    # V0 falls back to XFormers for a block FlashAttention refuses (0.8.0: vllm/platforms/cuda.py::
    # CudaPlatformBase.get_attn_backend_cls, "Cannot use FlashAttention-2 backend for block size not divisible by 16").
    blocks = dataclasses.replace(profile.rules.block_sizes, cuda_also=(8,),
                                 cuda_source="0.8.0: vllm/platforms/cuda.py::CudaPlatformBase.get_attn_backend_cls")
    scheduler = dataclasses.replace(profile.rules.scheduler, async_default=False, window_cap_in_flight=False)
    rules = dataclasses.replace(profile.rules, v1=False, budget="components", cuda_graphs="after_kv",
                                capacity_log="num_blocks", capture="v0", batch_defaults="v0", hybrid_manager=False,
                                scheduler=scheduler, block_sizes=blocks, sampler="none", moe_workspace=False)
    return dataclasses.replace(profile, rules=rules, display="vLLM (V0 engine)",
                               changes=(*profile.changes, "the V0 engine: V0's budget, CUDA graphs and log"))


def for_log(version: str | None, generation: str | None) -> tuple[EngineProfile, str | None]:
    """The profile of the release a startup log names, and a note when it had to be assumed."""
    from kvplan.core.profiles import Version

    note = None
    if version:
        v = Version.parse(version)
        if v < VLLM_PROFILES[0].since:
            profile = VLLM_PROFILES[0]
            note = f"vLLM {version} is older than kvplan's oldest profile: the {profile.version} rules are used"
        else:
            profile = next(p for p in VLLM_PROFILES if p.covers(v))
    else:
        # No version line: the log's own format tells V0 from V1; within V1 the newest rules are assumed.
        profile = VLLM_PROFILES[-1] if generation != "V0" else next(p for p in VLLM_PROFILES if p.version == "0.6.5")
        note = (f"the log prints no vLLM version: the {profile.version} profile ({'V0' if generation == 'V0' else 'V1'} "
                "format) is assumed; pass --engine vllm==X.Y.Z to say which release ran")
    if generation == "V0":
        profile = v0_variant(profile)
    return profile, note
