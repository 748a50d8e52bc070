"""Drive vLLM's own v1 Scheduler and KV cache manager on CPU over a request set; write the fixture.

Runs only in a venv where vLLM is installed as pure Python (tools/vllm_reference/README.md); kvplan's own
tests read the fixtures this writes and never import vLLM.

What it does, as vLLM's own tests do (tests/v1/core/utils.py::create_scheduler, tests/v1/core/test_scheduler.py):
- a VllmConfig with a SchedulerConfig, a CacheConfig (num_gpu_blocks_override = the request set's pool) and
  no ModelConfig; the few model facts the scheduler reads are given by a small stand-in object (_ModelFacts);
- one vLLM KV cache spec per decoder layer of the kvplan model spec (FullAttentionSpec, SlidingWindowSpec,
  ChunkedLocalAttentionSpec, MLAAttentionSpec, MambaSpec), grouped and sized by vLLM's own
  kv_cache_planning.get_global_kv_cache_groups / get_kv_cache_configs, then
  kv_cache_utils.generate_scheduler_kv_cache_config / resolve_kv_cache_block_sizes, as
  v1/engine/core.py::EngineCore._initialize_kv_caches does;
- a fake model runner: after each schedule(), one sampled token for every scheduled request whose prompt
  (and, after a preemption, its earlier output) is now fully computed; nothing for a prefill chunk that
  ends mid-prompt; then update_from_output(). Requests stop on max_tokens (ignore_eos).

Releases 0.11.0 to 0.33.0: where vLLM's API changed between them, the harness asks vLLM what it has (an import,
a signature, an attribute) and says in a comment which release changed what; the scheduler and KV cache
manager themselves are always vLLM's, unchanged. Each release was recorded in its own environment
(tools/vllm_reference/README.md, "Older releases").

Usage (in the vLLM venv):  python tools/vllm_reference/run.py --all
                           python tools/vllm_reference/run.py tests/fixtures/vllm_scheduler/long-prompts.requests.json
"""

from __future__ import annotations

import argparse
import os
import inspect
import json
import math
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "vllm_scheduler"
EOS_TOKEN_ID = 50256  # outside the token-id range of the request sets (1..30000): never sampled
STEP_CAP = 200_000
KERNEL_BLOCK_ALIGN = 16  # FLASH_ATTN's kernel block sizes, MultipleOf(16) (v1/attention/backends/flash_attn.py)


def token_id(seg: int, i: int) -> int:
    """The contract's token id of position i of segment seg (/work/notes/v1contract.md, kvplan's reader too)."""
    return 1 + (seg * 1_000_003 + i * 7_919 + (seg * i) % 104_729) % 30_000


def segment_tokens(seg: int, n: int) -> list[int]:
    return [token_id(seg, i) for i in range(n)]


# ----------------------------------------------------------------------------------------------------------
# model -> vLLM KV cache specs


def _torch_dtype(name: str):
    import torch

    table = {"fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
             "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32}
    if name not in table:
        raise SystemExit(f"model dtype {name!r} is not one the harness maps to torch; add it to _torch_dtype")
    return table[name]


def load_model_spec(rs: dict):
    if rs.get("model"):
        from kvplan.io.models import load_model

        return load_model(rs["model"])
    from kvplan.io.hf_config import spec_from_hf_config

    return spec_from_hf_config(rs["model_config"], name=rs["name"], origin=f"{rs['name']}.requests.json")


@dataclass
class _ModelFacts:
    """What the scheduler, the KV planner and StructuredOutputManager read from ModelConfig, for a text-only
    decoder served by the 'generate' runner. Stands in for vllm.config.ModelConfig, whose constructor would
    fetch config.json and a tokenizer from the Hub."""

    max_model_len: int
    dtype: object
    use_mla: bool
    is_hybrid: bool
    original_max_model_len: int = 0
    uses_mrope: bool = False
    is_encoder_decoder: bool = False
    runner_type: str = "generate"
    is_diffusion: bool = False
    supports_multimodal_inputs: bool = False
    is_multimodal_model: bool = False
    multimodal_config: object = None
    return_sampling_mask: bool = False
    skip_tokenizer_init: bool = True
    enable_trace_replay: bool = False
    enable_sleep_mode: bool = False
    is_moe: bool = False
    is_submodel_config: bool = False
    supports_kv_cache_grouping: bool = False  # no model class in 0.33.0 implements SupportsKVCacheGrouping
    enforce_eager: bool = True
    quantization: object = None
    pooler_config: object = None
    architecture: str = "KvplanReference"
    architectures: list = field(default_factory=lambda: ["KvplanReference"])
    model: str = "kvplan-reference"
    served_model_name: str = "kvplan-reference"

    def __post_init__(self):
        self.original_max_model_len = self.original_max_model_len or self.max_model_len

    def __getattr__(self, name):
        # Other releases read other ModelConfig fields (0.14.0: enable_return_routed_experts); for a plain text
        # decoder they are all off. Each one read is listed in the fixture's config_set_by_harness.
        if name.startswith("__"):
            raise AttributeError(name)
        MODEL_FACTS_DEFAULTED.add(name)


MODEL_FACTS_DEFAULTED: set[str] = set()


def _accepts(fn, name: str) -> bool:
    return name in inspect.signature(fn).parameters


def _str_dtype_to_torch():
    try:
        from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE  # 0.11.1+
    except ImportError:  # 0.11.0: vllm/utils/__init__.py
        from vllm.utils import STR_DTYPE_TO_TORCH_DTYPE
    return STR_DTYPE_TO_TORCH_DTYPE


def _hash_fn_by_name(name: str):
    try:
        from vllm.utils.hashing import get_hash_fn_by_name  # 0.11.1+
    except ImportError:  # 0.11.0: vllm/utils/__init__.py
        from vllm.utils import get_hash_fn_by_name
    return get_hash_fn_by_name(name)


def _gdn_state(raw: dict, layer, tp: int, model_dtype):
    """Gated delta net (Qwen3-Next) state shapes and dtypes, by vLLM's own calculators
    (model_executor/models/qwen3_next.py::get_mamba_state_shape_from_config / ..._dtype_from_config)."""
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator, MambaStateShapeCalculator

    cfg = raw.get("text_config", raw)
    shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(
        tp, cfg["linear_num_key_heads"], cfg["linear_num_value_heads"], cfg["linear_key_head_dim"],
        cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"], 0)
    dtypes = MambaStateDtypeCalculator.gated_delta_net_state_dtype(model_dtype, "auto", "auto")
    return shapes, dtypes


def build_layer_specs(model, rs: dict, block_size: int, mamba_block_size: int, mamba_cache_mode: str):
    """One vLLM spec per decoder layer; returns (specs, notes). Hybrid attention+Mamba block-size alignment is
    applied by the caller (align_hybrid_block_size) before this is called with the final block size."""
    from vllm.v1 import kv_cache_interface as kvi
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    from kvplan.core.spec import AttentionLayer, LayerKind, LinearLayer, MLALayer

    tp = int(rs.get("tp", 1))
    cache_dtype = rs.get("kv_cache_dtype", "auto")
    model_dtype = _torch_dtype(model.dtype)
    kv_dtype = model_dtype if cache_dtype == "auto" else _str_dtype_to_torch()[cache_dtype]
    # 0.20.0 added the KV quantization mode and separate value head sizes to the attention specs
    # (kv_cache_interface.py::get_kv_quant_mode, AttentionSpec.head_size_v); before, K and V had one head size.
    new_specs = hasattr(kvi, "get_kv_quant_mode")
    quant = {"kv_quant_mode": kvi.get_kv_quant_mode(cache_dtype)} if new_specs else {}
    specs = {}
    for i, layer in enumerate(model.layers):
        name = f"model.layers.{i}.attn"
        if isinstance(layer, MLALayer):
            specs[name] = MLAAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=layer.latent_dim,
                                           dtype=kv_dtype, cache_dtype_str=cache_dtype, **quant)
        elif isinstance(layer, AttentionLayer):
            # vLLM's ModelConfig.get_num_kv_heads: max(1, total // tp) (replicated below one head per rank)
            common = {"block_size": block_size, "num_kv_heads": max(1, layer.num_kv_heads // tp),
                      "head_size": layer.k_head_dim, "dtype": kv_dtype, **quant}
            if new_specs:
                common["head_size_v"] = layer.v_head_dim
            elif layer.v_head_dim != layer.k_head_dim:
                raise SystemExit("this vLLM release (before 0.20.0) has one head size for K and V; the model's differ")
            if layer.kind is LayerKind.SLIDING:
                specs[name] = SlidingWindowSpec(sliding_window=layer.window, **common)
            elif layer.kind is LayerKind.CHUNKED:
                specs[name] = ChunkedLocalAttentionSpec(attention_chunk_size=layer.window, **common)
            else:
                specs[name] = FullAttentionSpec(**common)
        elif isinstance(layer, LinearLayer):
            if layer.family != "gated_delta_net":
                raise SystemExit(f"linear layer family {layer.family!r}: the harness maps only gated_delta_net")
            if not new_specs:
                raise SystemExit("linear-attention layers: the harness builds Mamba specs for vLLM 0.20.0 and later")
            from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

            shapes, dtypes = _gdn_state(model.raw_config, layer, tp, model_dtype)
            # mamba_type is a string up to 0.25 ("gdn_attention") and an enum from 0.26.0 (kv_cache_interface.py)
            field_type = {f.name: f.type for f in __import__("dataclasses").fields(MambaSpec)}["mamba_type"]
            gdn = "gdn_attention" if "str" in str(field_type) else MambaAttentionBackendEnum.GDN_ATTN
            specs[name] = MambaSpec(block_size=mamba_block_size, shapes=tuple(shapes), dtypes=tuple(dtypes),
                                    mamba_type=gdn, mamba_cache_mode=mamba_cache_mode)
        # NoCacheLayer: no spec, as vLLM's attention-free layers return None
    return specs


def align_hybrid_block_size(specs: dict, block_size: int) -> tuple[int, int | None]:
    """vLLM's rule for hybrid attention + Mamba models (platforms/interface.py::Platform._align_hybrid_block_size,
    with FLASH_ATTN's kernel alignment 16): the attention block grows to the smallest multiple of
    max(16, block_size) whose page holds one Mamba state; the Mamba page is then padded to that page.
    Returns (block_size, mamba_page_size_padded or None)."""
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec

    mamba = [s for s in specs.values() if isinstance(s, MambaSpec)]
    attn = [s for s in specs.values() if isinstance(s, AttentionSpec)]
    if not mamba or not attn:
        return block_size, None
    mamba_page = max(s.page_size_bytes for s in mamba)
    per_token = attn[0].page_size_bytes // attn[0].block_size
    align = max(KERNEL_BLOCK_ALIGN, block_size)
    aligned = align * math.ceil(mamba_page / (align * per_token))
    aligned = KERNEL_BLOCK_ALIGN * math.ceil(aligned / KERNEL_BLOCK_ALIGN)
    new_block = max(block_size, aligned)
    page = new_block * per_token
    return new_block, (page if page != mamba_page else None)


def _group_kind(spec) -> str:
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
        UniformTypeKVCacheSpecs,
    )

    if isinstance(spec, UniformTypeKVCacheSpecs):
        return _group_kind(next(iter(spec.kv_cache_specs.values())))
    if isinstance(spec, MLAAttentionSpec):
        return "mla"
    if isinstance(spec, SlidingWindowSpec):
        return "sliding_window"
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return "chunked_local"
    if isinstance(spec, MambaSpec):
        return "mamba"
    return "full"


# ----------------------------------------------------------------------------------------------------------
# scheduler construction


def _scheduler_config(s: dict, max_model_len: int, async_scheduling: bool):
    from vllm.config import SchedulerConfig

    kw = {"max_num_seqs": int(s["max_num_seqs"]), "max_num_batched_tokens": int(s["max_num_batched_tokens"]),
          "max_model_len": max_model_len, "long_prefill_token_threshold": int(s.get("long_prefill_token_threshold", 0)),
          "enable_chunked_prefill": True, "async_scheduling": async_scheduling, "is_encoder_decoder": False,
          "policy": "fcfs"}
    watermark = float(s.get("watermark", 0.0))
    # config/scheduler.py::SchedulerConfig: is_encoder_decoder is an InitVar from 0.11.1 (max_model_len a field
    # in 0.11.0, an InitVar later); watermark exists from 0.24.0
    if _accepts(SchedulerConfig, "watermark"):
        kw["watermark"] = watermark
    elif watermark:
        raise SystemExit("watermark: this vLLM release has no such option (added in 0.24.0)")
    return SchedulerConfig(**{k: v for k, v in kw.items() if _accepts(SchedulerConfig, k)})


def _plan_kv_cache(vllm_config, specs: dict, cache_config):
    """vLLM's own KV cache planning, called as v1/engine/core.py::EngineCore._initialize_kv_caches does in the
    release installed; returns (kv_cache_config, scheduler block size, hash block size)."""
    from vllm.v1.core import kv_cache_utils as kcu

    try:  # 0.23.0+: layer kinds are registered before planning
        from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    except ImportError:
        register_all_kvcache_specs = None
    if register_all_kvcache_specs is not None:
        register_all_kvcache_specs(vllm_config)
    try:  # 0.29.0+: the layout only places bytes; resolved before planning. Legacy NHD first, then a
        # block-compact layout (hybrid pools mixing page shapes need one).
        from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
    except ImportError:
        resolve_kv_cache_layout = None
    if resolve_kv_cache_layout is not None:
        resolve_kv_cache_layout(vllm_config, [["LBNHC", "BLHNC"]], list(specs.values()))
    try:  # 0.33.0: planning moved to kv_cache_planning, groups computed once for all workers
        from vllm.v1.core import kv_cache_planning
    except ImportError:
        kv_cache_planning = None
    # Any memory large enough: num_gpu_blocks_override replaces the block count derived from it.
    if kv_cache_planning is not None:
        groups = kv_cache_planning.get_global_kv_cache_groups(vllm_config, [specs])
        configs = kv_cache_planning.get_kv_cache_configs(vllm_config, [specs], [1 << 50], groups)
    else:
        configs = kcu.get_kv_cache_configs(vllm_config, [specs], [1 << 50])
    kv_cache_config = kcu.generate_scheduler_kv_cache_config(configs)
    cache_config.num_gpu_blocks = kv_cache_config.num_blocks
    groups = kv_cache_config.kv_cache_groups
    participating = [g.kv_cache_spec.block_size for g in groups if getattr(g.kv_cache_spec, "prefix_cacheable", True)]
    cache_config.block_size = min(participating or [g.kv_cache_spec.block_size for g in groups])
    if not hasattr(kcu, "resolve_kv_cache_block_sizes"):  # before 0.20.0: one block size for the scheduler
        return kv_cache_config, cache_config.block_size, cache_config.block_size
    sched_block, hash_block = kcu.resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    if hasattr(kcu, "resolve_cache_hit_alignment_tokens"):  # 0.33.0
        kv_cache_config.hash_block_size = hash_block
        kv_cache_config.cache_hit_alignment_tokens = kcu.resolve_cache_hit_alignment_tokens(
            kv_cache_config, vllm_config, sched_block, hash_block)
    return kv_cache_config, sched_block, hash_block


def build_scheduler(rs: dict):
    import dataclasses

    from vllm.config import CacheConfig, DeviceConfig, ParallelConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import MambaSpec
    from vllm.v1.structured_output import StructuredOutputManager

    s = rs["scheduler"]
    async_scheduling = bool(s.get("async_scheduling"))
    if s.get("max_num_partial_prefills", 1) != 1:
        raise SystemExit("max_num_partial_prefills: only 1 is recorded (vLLM 0.27.0 removed the option)")
    model = load_model_spec(rs)
    max_model_len = int(s["max_model_len"])
    enable_pc = bool(s["enable_prefix_caching"])
    block_size = int(s["block_size"])
    has_linear = any(layer.kind.value == "linear" for layer in model.layers)
    # model_executor/models/config.py::MambaModelConfig.verify_and_update_config: prefix caching turns the Mamba
    # cache mode to "align" with mamba_block_size = block_size; without it "none" and mamba_block_size = max_model_len.
    mamba_cache_mode = "align" if (has_linear and enable_pc) else "none"
    probe = build_layer_specs(model, rs, block_size, max_model_len, mamba_cache_mode)
    block_size, mamba_page_padded = align_hybrid_block_size(probe, block_size)
    mamba_block_size = block_size if mamba_cache_mode == "align" else max_model_len
    specs = build_layer_specs(model, rs, block_size, mamba_block_size, mamba_cache_mode)
    if mamba_page_padded is not None:
        specs = {k: (dataclasses.replace(v, page_size_padded=mamba_page_padded) if isinstance(v, MambaSpec) else v)
                 for k, v in specs.items()}

    scheduler_config = _scheduler_config(s, max_model_len, async_scheduling)
    cache_config = CacheConfig(
        block_size=block_size,
        gpu_memory_utilization=0.9,
        cache_dtype=rs.get("kv_cache_dtype", "auto"),
        enable_prefix_caching=enable_pc,
        num_gpu_blocks_override=int(rs["num_gpu_blocks"]),
    )
    if has_linear:
        cache_config.mamba_cache_mode = mamba_cache_mode
        cache_config.mamba_block_size = mamba_block_size
        cache_config.mamba_page_size_padded = mamba_page_padded

    vllm_config = VllmConfig(scheduler_config=scheduler_config, cache_config=cache_config,
                             parallel_config=ParallelConfig(), device_config=DeviceConfig(device="cpu"))
    # pipeline parallelism: the scheduler reads the stage count (AsyncScheduler.decode_stagger on the V2 model
    # runner: a request decodes at most every pp steps, 0.33.0 v1/core/sched/async_scheduler.py); the engine loop
    # keeps VllmConfig.max_concurrent_batches batches in flight: pp + 1 with async scheduling on the V2 model
    # runner, 2 with it at pp 1, else pp (0.33.0 config/vllm.py)
    pp, v2 = int(s.get("pipeline_parallel_size", 1)), bool(s.get("v2_model_runner", False))
    if async_scheduling and pp > 1 and not v2:
        raise SystemExit("async scheduling with pipeline parallelism needs the V2 model runner (vLLM refuses it)")
    batches = (pp + 1 if v2 else 2 if pp <= 1 else pp) if async_scheduling else pp
    vllm_config.parallel_config.pipeline_parallel_size = pp
    facts = _ModelFacts(max_model_len=max_model_len, dtype=_torch_dtype(model.dtype),
                        use_mla=any(layer.kind.value == "mla" for layer in model.layers), is_hybrid=has_linear)
    object.__setattr__(vllm_config, "model_config", facts)
    # From 0.14.0 async_scheduling=None means "auto", which config/vllm.py::VllmConfig.__post_init__ resolves from
    # the ModelConfig this harness does not build: set what the request set asks for.
    vllm_config.scheduler_config.async_scheduling = async_scheduling
    # config/vllm.py::VllmConfig.__post_init__ disables the hybrid KV cache manager on platforms without
    # support_hybrid_kv_cache() (the "empty" CPU platform here); on CUDA it stays on unless a KV connector
    # or chunked-local attention (without VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1) turns it off.
    # The reference is a CUDA deployment, so turn it back on, and off where CUDA would.
    has_chunked = any(layer.kind.value == "chunked" for layer in model.layers)
    vllm_config.scheduler_config.disable_hybrid_kv_cache_manager = has_chunked

    kv_cache_config, sched_block, hash_block = _plan_kv_cache(vllm_config, specs, cache_config)
    # v1/engine/core.py::EngineCore.__init__: AsyncScheduler when scheduler_config.async_scheduling. The
    # scheduler takes its block size from 0.14.0 and the hash block size from 0.20.0.
    kw = {"block_size": sched_block, "hash_block_size": hash_block}
    saved = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if v2 else "0"  # read by VllmConfig.use_v2_model_runner
    try:
        scheduler = (AsyncScheduler if async_scheduling else Scheduler)(
            vllm_config=vllm_config, kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(vllm_config), log_stats=True,
            **{k: v for k, v in kw.items() if _accepts(Scheduler.__init__, k)})
    finally:
        if saved is None:
            os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        else:
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = saved
    kv = {
        "num_blocks": kv_cache_config.num_blocks,
        "block_size": sched_block,
        "hash_block_size": hash_block,
        "groups": [{
            "kind": _group_kind(g.kv_cache_spec),
            "num_layers": len(g.layer_names),
            "block_size": g.kv_cache_spec.block_size,
            "sliding_window": getattr(g.kv_cache_spec, "sliding_window", None)
            or getattr(g.kv_cache_spec, "attention_chunk_size", None),
            "page_size_bytes": g.kv_cache_spec.page_size_bytes,
        } for g in kv_cache_config.kv_cache_groups],
    }
    sc = vllm_config.scheduler_config
    config_set = {
        "async_scheduling": sc.async_scheduling,
        "enable_chunked_prefill": sc.enable_chunked_prefill,
        "policy": str(sc.policy),
        # None: the release has no such option (watermark: 0.24.0; scheduler_reserve_full_isl: 0.19.0;
        # long_prefill_token_threshold_adaptive: 0.31.0; max_num_scheduled_tokens: 0.17.0;
        # max_in_flight_tokens: 0.26.0; kv_cache_layout: 0.29.0)
        "watermark": getattr(sc, "watermark", None),
        "scheduler_reserve_full_isl": getattr(sc, "scheduler_reserve_full_isl", None),
        "long_prefill_token_threshold": sc.long_prefill_token_threshold,
        "long_prefill_token_threshold_adaptive": getattr(sc, "long_prefill_token_threshold_adaptive", None),
        "max_num_scheduled_tokens": getattr(sc, "max_num_scheduled_tokens", None),
        "max_in_flight_tokens": getattr(vllm_config, "max_in_flight_tokens", None),
        "num_gpu_blocks_override": cache_config.num_gpu_blocks_override,
        "cache_dtype": cache_config.cache_dtype,
        "kv_cache_layout": getattr(cache_config, "kv_cache_layout", None),
        "disable_hybrid_kv_cache_manager": sc.disable_hybrid_kv_cache_manager,
        "prefix_caching_hash_algo": cache_config.prefix_caching_hash_algo,
        "mamba_cache_mode": mamba_cache_mode if has_linear else None,
        "mamba_block_size": mamba_block_size if has_linear else None,
        "mamba_page_size_padded": mamba_page_padded,
        "speculative_decoding": None,
        "kv_connector": None,
        "model_config": "none (a stand-in with the model facts the scheduler reads: tools/vllm_reference/run.py::_ModelFacts)",
    }
    config_set["batches_in_flight"] = batches
    if pp > 1 or v2:
        config_set["pipeline_parallel_size"], config_set["v2_model_runner"] = pp, v2
    return scheduler, kv, config_set, hash_block


# ----------------------------------------------------------------------------------------------------------
# the run


def _rle(values: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out


def _samples_async(req) -> bool:
    """Async scheduling: whether the fake runner samples a token for a scheduled request. Request.is_prefill_chunk
    says so from 0.16.0; before it, AsyncScheduler._update_after_schedule has just counted a placeholder for the
    token being sampled, so the request has num_computed_tokens = num_tokens + placeholders - 1."""
    flag = getattr(req, "is_prefill_chunk", None)
    if flag is not None:
        return not flag
    placeholders = req.num_output_placeholders
    return placeholders > 0 and req.num_computed_tokens >= req.num_tokens + placeholders - 1


def run_request_set(rs: dict, *, keep_per_step: bool = True) -> dict:
    import vllm
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus

    t0 = time.perf_counter()
    MODEL_FACTS_DEFAULTED.clear()
    scheduler, kv, config_set, hash_block = build_scheduler(rs)
    # Request takes the EOS token up to 0.16.0 (later it comes with the sampling parameters); ModelRunnerOutput's
    # logprobs, prompt_logprobs_dict and pooler_output have no defaults in 0.11.0 (v1/request.py, v1/outputs.py)
    request_kw = {"eos_token_id": EOS_TOKEN_ID} if _accepts(Request.__init__, "eos_token_id") else {}
    params = inspect.signature(ModelRunnerOutput).parameters
    output_kw = {k: v for k, v in {"logprobs": None, "prompt_logprobs_dict": {}, "pooler_output": []}.items()
                 if k in params and params[k].default is inspect.Parameter.empty}
    preempted_count: dict[str, int] = {}  # 0.11.0 has neither preempted_req_ids nor Request.num_preemptions
    hasher = None
    if rs["scheduler"]["enable_prefix_caching"]:
        hash_fn = _hash_fn_by_name(config_set["prefix_caching_hash_algo"])
        init_none_hash(hash_fn)
        hasher = get_request_block_hasher(hash_block, hash_fn)

    reqs = rs["requests"]
    pending = sorted(range(len(reqs)), key=lambda k: (reqs[k]["arrival_step"], k))
    out_seg: dict[str, tuple[int, int]] = {}
    objs: dict[str, Request] = {}
    per_req: dict[str, dict] = {}
    prompt_tokens = 0
    for r in reqs:
        out_seg[r["id"]] = (int(r["output"][0]), int(r["output"][1]))
        per_req[r["id"]] = {"first_scheduled_step": None, "first_token_step": None, "finish_step": None,
                            "num_preemptions": 0, "num_cached_tokens": 0}
    running_per_step, usage_per_step, tokens_per_step = [], [], []
    async_mode = bool(config_set["async_scheduling"])
    queue_size = config_set["batches_in_flight"]
    batches: deque = deque()  # scheduled batches whose output is not yet processed, newest first
    n_sampled = {r["id"]: 0 for r in reqs}  # output tokens sampled so far (in flight or delivered)
    preemptions = 0
    step = 0
    nxt = 0
    unfinished = len(reqs)
    idle_steps = 0
    error = None
    loop_t0 = time.perf_counter()  # the loop alone (bench_vs_vllm.py): arrivals, schedule(), the fake runner, update
    while unfinished:
        while nxt < len(pending) and reqs[pending[nxt]]["arrival_step"] <= step:
            r = reqs[pending[nxt]]
            prompt = []
            for seg, n in r["prompt"]:
                prompt.extend(segment_tokens(int(seg), int(n)))
            prompt_tokens += len(prompt)
            sp = SamplingParams(max_tokens=int(r["output"][1]), ignore_eos=True)
            sp.update_from_generation_config({}, EOS_TOKEN_ID)
            req = Request(request_id=r["id"], prompt_token_ids=prompt, sampling_params=sp, pooling_params=None,
                          arrival_time=float(r["arrival_step"]), block_hasher=hasher, **request_kw)
            objs[r["id"]] = req
            scheduler.add_request(req)
            nxt += 1
        if not scheduler.has_requests() and nxt < len(pending):
            step = reqs[pending[nxt]]["arrival_step"]  # idle: the empty schedule() calls would change nothing
            continue
        never_scheduled = {rid for rid, d in per_req.items() if d["first_scheduled_step"] is None and rid in objs}
        so = None
        if scheduler.has_requests():
            running_before = list(scheduler.running)
            try:
                so = scheduler.schedule()
            except Exception as exc:  # noqa: BLE001 - whatever vLLM raises (0.20.0-0.20.1: a dry pool) is the record
                error = (f"vLLM raised {type(exc).__name__}: {exc} (schedule() call {step}, counted step "
                         f"{len(running_per_step)})")
                break
            n_sched = so.num_scheduled_tokens
            if so.total_num_scheduled_tokens > 0:
                running_per_step.append(len(scheduler.running))
                usage_per_step.append(scheduler.kv_cache_manager.usage)
                tokens_per_step.append(so.total_num_scheduled_tokens)
                idle_steps = 0
            else:
                idle_steps += 1
            # SchedulerOutput.preempted_req_ids from 0.12.0; before, a request running before schedule() and
            # PREEMPTED after it was preempted by it (nothing is admitted in a step that preempts)
            victims = [r.request_id for r in running_before if r.status == RequestStatus.PREEMPTED]
            ids = getattr(so, "preempted_req_ids", None)
            preemptions += len(ids) if ids is not None else len(victims)
            for rid in victims:
                preempted_count[rid] = preempted_count.get(rid, 0) + 1
            req_ids, sampled = [], []
            for rid, n in n_sched.items():
                req = objs[rid]
                d = per_req[rid]
                if rid in never_scheduled:
                    d["first_scheduled_step"] = step
                    d["num_cached_tokens"] = req.num_computed_tokens - n
                req_ids.append(rid)
                # the fake runner samples one token for a request whose prefill is complete (sync: computed
                # tokens reach the known ones; async: not a prefill chunk, counting the placeholders)
                if _samples_async(req) if async_mode else req.num_computed_tokens >= req.num_tokens:
                    seg, _ = out_seg[rid]
                    sampled.append([token_id(seg, n_sampled[rid])])
                    n_sampled[rid] += 1
                    if d["first_token_step"] is None:
                        d["first_token_step"] = step
                else:
                    sampled.append([])
            mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={rid: k for k, rid in enumerate(req_ids)},
                                    sampled_token_ids=sampled, **output_kw)
            batches.appendleft((so, mro, step))
            step += 1
            # v1/engine/core.py::EngineCore.step_with_batch_queue: with room in the queue (two batches with
            # async scheduling, one without), schedule the next batch before waiting for this one's output
            if len(batches) < queue_size and (so.total_num_scheduled_tokens > 0 or scheduler.has_requests()):
                continue
        if not batches:
            step += 1
            continue
        so, mro, at = batches.pop()
        scheduler.update_from_output(so, mro)
        for rid in mro.req_ids:
            req = objs[rid]
            if req.is_finished() and per_req[rid]["finish_step"] is None:
                per_req[rid]["finish_step"] = at
                per_req[rid]["num_preemptions"] = getattr(req, "num_preemptions", preempted_count.get(rid, 0))
                unfinished -= 1
        # empty schedule() calls in a row: up to queue_size - 1 while every running request's batch is in flight
        if step >= STEP_CAP or (idle_steps > max(2, queue_size) and nxt >= len(pending)):
            error = f"stopped at step {step}: {unfinished} requests unfinished (no progress or step cap)"
            break

    loop_seconds = time.perf_counter() - loop_t0
    n_steps = len(running_per_step)
    cached_tokens = sum(d["num_cached_tokens"] for d in per_req.values())
    pcs = scheduler.kv_cache_manager.prefix_cache_stats
    metrics = {
        "steps": n_steps,
        "mean_running": sum(running_per_step) / n_steps if n_steps else 0.0,
        "peak_running": max(running_per_step, default=0),
        "preemptions": preemptions,
        "mean_kv_usage": sum(usage_per_step) / n_steps if n_steps else 0.0,
        "peak_kv_usage": max(usage_per_step, default=0.0),
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached_tokens,
        "prefix_hit_rate": cached_tokens / prompt_tokens if prompt_tokens else 0.0,
        "last_step": step - 1,
        "generated_tokens": sum(int(r["output"][1]) for r in reqs),
        "scheduled_tokens": sum(tokens_per_step),
    }
    del pcs  # vLLM's PrefixCacheStats are reset per make_stats(); the per-request record above is exact
    if MODEL_FACTS_DEFAULTED:
        config_set["model_config_fields_answered_none"] = sorted(MODEL_FACTS_DEFAULTED)
    fixture = {
        "vllm_version": vllm.__version__.split("+")[0],
        "vllm_build": vllm.__version__,
        "request_set": rs["name"],
        "harness": "tools/vllm_reference/run.py",
        "definitions": "tests/fixtures/vllm_scheduler/README.md",
        "config_set_by_harness": config_set,
        "kv_cache": kv,
        "metrics": metrics,
        "error": error,
        "per_request": per_req,
    }
    if keep_per_step:
        fixture["encoding"] = "per_step arrays are run-length encoded: [[value, count], ...] over non-empty steps"
        fixture["per_step"] = {
            "running": _rle(running_per_step),
            "kv_usage_permille": _rle([round(u * 1000) for u in usage_per_step]),
            "scheduled_tokens": _rle(tokens_per_step),
        }
    fixture["harness_seconds"] = round(time.perf_counter() - t0, 1)
    fixture["loop_seconds"] = round(loop_seconds, 3)
    return fixture


def fixture_path(rs_path: Path, version: str) -> Path:
    name = rs_path.name.removesuffix(".requests.json")
    return rs_path.with_name(f"{name}.vllm-{version}.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("request_sets", nargs="*", type=Path, help="*.requests.json files")
    ap.add_argument("--all", action="store_true", help=f"every request set in {FIXTURES.relative_to(REPO)}")
    ap.add_argument("--no-per-step", action="store_true", help="leave the per_step arrays out")
    ap.add_argument("--print-only", action="store_true", help="print metrics, write nothing")
    ap.add_argument("--out", type=Path, help="write the fixtures to this folder (default: beside each request set)")
    args = ap.parse_args(argv)
    paths = sorted(FIXTURES.glob("*.requests.json")) if args.all else args.request_sets
    if not paths:
        ap.error("name request sets or pass --all")
    import vllm

    version = vllm.__version__.split("+")[0]
    for p in paths:
        rs = json.loads(Path(p).read_text())
        try:
            fx = run_request_set(rs, keep_per_step=not (args.no_per_step or rs.get("per_step") is False))
        except SystemExit as exc:  # a set this release (or the harness for it) cannot build: say so, go on
            print(f"{rs['name']}: skipped: {exc}", flush=True)
            continue
        m = fx["metrics"]
        print(f"{rs['name']}: steps {m['steps']}  running mean {m['mean_running']:.2f} peak {m['peak_running']}  "
              f"preemptions {m['preemptions']}  usage {m['mean_kv_usage']:.4f}  hit {m['prefix_hit_rate']:.4f}  "
              f"groups {[(g['kind'], g['num_layers'], g['block_size']) for g in fx['kv_cache']['groups']]}  "
              f"blocks {fx['kv_cache']['num_blocks']}  ({fx['harness_seconds']} s, loop {fx['loop_seconds']} s){'  ERROR ' + fx['error'] if fx['error'] else ''}",
              flush=True)
        if not args.print_only:
            out = fixture_path(Path(p), version)
            if args.out:
                out = args.out / out.name
            out.write_text(json.dumps(fx, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
