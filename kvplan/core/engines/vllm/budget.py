"""vLLM v1's memory budget and KV block layout.

Sources (vllm-project/vllm; details and commits in docs/engine-research.md):
- ``vllm/v1/worker/gpu_worker.py:Worker.determine_available_memory``: KV memory =
  ceil(total x gpu_memory_utilization) - (weights + torch activation peak of ``profile_run`` over
  max_num_batched_tokens + non-torch increase) - CUDA graph estimate (subtracted by default since
  v0.21); ``kv_cache_memory_bytes`` replaces all of it.
- The block layout, fit check and capacity: kvplan.core.engines.vllm.plan.
- Defaults (``vllm/engine/arg_utils.py``, ``vllm/config/cache.py``): gpu_memory_utilization 0.92 (0.9
  before late 2025), block size 16 (64 for MLA with FlashMLA, ``vllm/platforms/cuda.py``);
  max_num_batched_tokens 8192 and max_num_seqs 1024 for the OpenAI server on GPUs with >= 70 GiB
  other than A100, else 2048 and 256.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from kvplan.core.capacity import estimates
from kvplan.core.capacity.budget import Capacity, Components, EngineBudget, Setup, Stage, run_budget
from kvplan.core.capacity.common import FitRequest, FitResult, GiB, mm_limit, resolve_kv_dtype
from kvplan.core.capacity.context import ContextLimit, config_length, rope_factor, rope_type
from kvplan.core.engines.vllm.plan import (  # noqa: F401  (the planning API, importable from here too)
    DEFAULT_BLOCK_SIZE,
    Bucket,
    KVLayout,
    VLLMPlan,
    attention_page_bytes,
    build_layout,
    check_layout_dtype,
    estimate_max_model_len,
    layout_from_groups,
    logged_kv_cache_tokens,
    max_concurrency,
    plan_stages,
    plan_vllm,
    resolve_block_size,
    v4_kv_dtype,
)
from kvplan.core.dtypes import KVDtype
from kvplan.core.gpus import GPUSpec
from kvplan.core.engines.vllm.activation import (ACTIVATION_BAND_MEASURED, ACTIVATION_BAND_UNMEASURED, Sampler,
                                                encoder_items, profile_run)
from kvplan.core.engines.vllm import deepseek_v4
from kvplan.core.engines.vllm.dcp import check_dcp
from kvplan.core.engines.vllm.profiles import (Bitsandbytes, CudaGraphs, VLLMRules, batch_defaults, blackwell_class, capture_sizes,
                                              default_seqs, mla_block)
from kvplan.core.spec import AttentionLayer, CompressedLayer, Layer, LayerKind, LinearLayer, MLALayer, ModelSpec
from kvplan.errors import ConfigError, InputError


def kv_layout(layers: list[Layer], req: FitRequest, block_size: int, *, hybrid: bool = True) -> KVLayout | None:
    """``build_layout`` with a fit request's model, dtype, tp and the rules of its release."""
    return build_layout(layers, rules=req.engine_profile().rules, kv_dtype=resolve_kv_dtype(req.spec, req.kv_dtype),
                        model_dtype=req.spec.dtype, block_size=block_size, tp=req.tp,
                        requested_block_size=req.block_size, hybrid=hybrid, mamba_cache_mode=req.mamba_cache_mode,
                        num_speculative_tokens=req.num_speculative_tokens, name=req.spec.name)




def _act_bytes(req: FitRequest) -> int:
    """The activation dtype's bytes: vLLM's --dtype where the request states a float format (the weights'), else
    the model's dtype."""
    if req.weight_dtype in ("fp32", "fp16", "bf16"):
        return 4 if req.weight_dtype == "fp32" else 2
    return resolve_kv_dtype(req.spec, "auto").vector_bytes(1)


def _mxfp4_experts(req: FitRequest) -> bool:
    """The routed experts are MXFP4 (gpt-oss): vLLM runs them in a kernel that keeps no fused-MoE workspace."""
    quant = req.spec.raw_config.get("quantization_config")
    return req.weight_dtype == "mxfp4" or (isinstance(quant, dict) and quant.get("quant_method") == "mxfp4")


def activation_band(rules: VLLMRules, v2_runner: bool, gpu: GPUSpec) -> float:
    """The activation estimate's error band: measured where real starts stand behind the release's sampler and
    runner on the GPU's architecture (activation.py: Triton sampler, V1 runner, Hopper), wider where only the
    source does (the 0.21.0 point C6 on an Ampere card sits 17% above the estimate)."""
    measured = rules.sampler is Sampler.TRITON and not v2_runner and gpu.compute_capability == 9.0
    return ACTIVATION_BAND_MEASURED if measured else ACTIVATION_BAND_UNMEASURED


@dataclass(frozen=True, kw_only=True)
class InFlight:
    """What a sliding/chunked layer admits: max_in_flight_tokens = batches x max_num_batched_tokens (0.26.0 on),
    and how the batches were counted."""

    tokens: int
    batches: int
    async_scheduling: bool  # as resolved: the flag, else the release's default
    v2_runner: bool


def in_flight(rules: VLLMRules, spec: ModelSpec, mnbt: int, pp: int, async_scheduling: bool | None) -> InFlight:
    """Tokens a sliding/chunked layer must admit: max_num_batched_tokens until 0.26; then
    max_concurrent_batches x max_num_batched_tokens (0.26.0: vllm/config/vllm.py::VllmConfig.max_in_flight_tokens),
    the batches by the model runner the release picks for the model (VLLMRules.max_concurrent_batches).
    ``async_scheduling`` None: the release's default."""
    async_ = rules.async_default if async_scheduling is None else async_scheduling
    listed = spec.raw_config.get("architectures")  # a user's config.json may hold anything here (a number, null)
    architectures = tuple(a for a in listed if isinstance(a, str)) if isinstance(listed, (list, tuple)) else ()
    v2 = rules.runs_v2(architectures=architectures, moe=spec.arch is not None and spec.arch.moe is not None,
                       hybrid=spec.has_layer(LinearLayer))
    if not rules.in_flight_admission:
        return InFlight(tokens=mnbt, batches=1, async_scheduling=async_, v2_runner=v2)
    batches = rules.max_concurrent_batches(pp=pp, async_scheduling=async_, v2_runner=v2)
    return InFlight(tokens=batches * mnbt, batches=batches, async_scheduling=async_, v2_runner=v2)


# vLLM refuses a max_model_len above the length it derives from the config unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
# is set (0.6.2: vllm/config.py::_get_and_verify_max_len; 0.33.0: vllm/config/model.py::_get_and_verify_max_len,
# the keys in vllm/transformers_utils/model_arch_config_convertor.py::derive_max_model_len_and_key; the variable
# came with vLLM PR #7080, 0.5.4, before every profile). Derived: the smallest of these keys, or
# model_max_length when the config gives it (0.33 takes it; 0.6.2 accepts up to it), times the RoPE factor of a
# rope type other than su, longrope and llama3; 0.33 also leaves YaRN and Gemma 3 unscaled where 0.6.2 takes
# original_max_position_embeddings x factor for YaRN. Only `vllm serve` of a pooling model with absolute positions
# also reads the tokenizer's model_max_length (0.33.0: ModelConfig.get_and_verify_max_len).
_VLLM_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                     "max_sequence_length", "max_seq_length", "seq_len")
_VLLM_UNSCALED = ("su", "longrope", "llama3")


_LIMITS: dict[int, tuple[dict, ContextLimit | None]] = {}


def vllm_context_limit(context: dict) -> ContextLimit | None:
    """vLLM's derived max_model_len for a model's config keys (``ModelSpec.context_config``); max_model_len 0
    where the releases treat its RoPE scaling differently. Memoized by the dict object: a spec's context_config
    is read, never changed, and a plan asks thousands of times."""
    hit = _LIMITS.get(id(context))
    if hit is not None and hit[0] is context:
        return hit[1]
    limit = _context_limit(context)
    if len(_LIMITS) > 256:
        _LIMITS.clear()
    _LIMITS[id(context)] = (context, limit)
    return limit


def _context_limit(context: dict) -> ContextLimit | None:
    found = {key: n for key in _VLLM_LENGTH_KEYS if (n := config_length(context, key))}
    if not found:
        return None
    key = "model_max_length" if "model_max_length" in found else min(found, key=lambda k: found[k])
    length = found[key]
    limit = ContextLimit(engine="vLLM", max_model_len=length, source=key, override="VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    scaling = context.get("rope_scaling", context.get("rope_parameters"))
    factor = rope_factor(scaling)
    if factor is None or factor == 1 or rope_type(scaling) in _VLLM_UNSCALED:
        if isinstance(scaling, dict) and scaling and all(isinstance(v, dict) for v in scaling.values()):
            # per-layer-type RoPE parameters (transformers 5): a factor in any of them is read by 0.33 only
            if any(rope_factor(v) not in (None, 1.0) for v in scaling.values()):
                return dataclasses.replace(limit, max_model_len=0, source="per-layer RoPE factors")
        return limit
    original = config_length(scaling, "original_max_position_embeddings")  # type: ignore[arg-type]
    if rope_type(scaling) == "yarn" and key != "model_max_length" and original and original * factor == length:
        return limit  # 0.6.2's original x factor and 0.33's unscaled length agree
    return dataclasses.replace(limit, max_model_len=0, source=(
        f"RoPE {rope_type(scaling)} factor {factor:g}: releases differ in applying it"))


def _rank_memory(req: FitRequest) -> list[int]:
    """Each pipeline stage's smallest GPU: vLLM sizes every rank of a stage alike, and the smallest rank's
    blocks become every rank's (docs/engine-versions-research.md section 1j)."""
    if req.gpu_memory_per_rank is None:
        return [req.gpu.memory_bytes] * req.pp
    ranks = req.gpu_memory_per_rank
    if len(ranks) != req.tp * req.pp:
        raise InputError(f"--gpu-memory lists {len(ranks)} GPUs; tp {req.tp} x pp {req.pp} needs "
                         f"{req.tp * req.pp} (one size per GPU, or one size for all)")
    if min(ranks) <= 0:
        raise InputError(f"--gpu-memory: every GPU needs memory > 0 (got {min(ranks)})")
    return [min(ranks[s * req.tp:(s + 1) * req.tp]) for s in range(req.pp)]


@dataclass(frozen=True, kw_only=True)
class _Settings:
    """vLLM's settings for one request, resolved under the release's rules."""

    rules: VLLMRules
    block_size: int
    kv_dtype: KVDtype
    max_num_batched_tokens: int
    max_num_seqs: int
    in_flight: InFlight
    hybrid: bool
    graphs: tuple[int, ...]  # the captured batch sizes (none when eager)


@dataclass(frozen=True, kw_only=True)
class _StagePool:
    stage: Stage
    layout: KVLayout | None
    blocks: int


class VLLMBudget(EngineBudget):
    engine = "vllm"

    def default_utilization(self, req: FitRequest, profile) -> float:
        return profile.rules.default_utilization

    def context_limit(self, req: FitRequest) -> ContextLimit | None:
        return vllm_context_limit(req.spec.context_config)

    def prepare(self, req: FitRequest, profile, utilization: float, max_model_len: int):
        rules: VLLMRules = profile.rules
        quant = req.spec.raw_config.get("quantization_config")
        if (rules.bitsandbytes is Bitsandbytes.REMOVED and req.weight_dtype == "auto" and isinstance(quant, dict)
                and quant.get("quant_method") == "bitsandbytes"):
            raise InputError(f"vLLM {profile.version} does not load bitsandbytes checkpoints ({req.spec.name}): 0.28.0 "
                             "removed the method; plan with --engine vllm==0.27.0, or serve a GPTQ, AWQ or "
                             "compressed-tensors checkpoint")
        v4 = deepseek_v4.is_v4(req.spec)
        if req.moe_backend not in deepseek_v4.MOE_BACKENDS:
            raise InputError(f"--moe-backend {req.moe_backend!r}: kvplan models {', '.join(deepseek_v4.MOE_BACKENDS)} "
                             "(other backends: leave it at auto)")
        if req.moe_backend == deepseek_v4.MEGA_MOE_BACKEND and not v4:
            raise InputError("--moe-backend deep_gemm_mega_moe is DeepSeek-V4's (MegaMoE runs its FP4 experts and "
                             "routing only); leave it at auto")
        if req.moe_backend == deepseek_v4.MEGA_MOE_BACKEND and not req.expert_parallel:
            raise InputError("--moe-backend deep_gemm_mega_moe runs DeepSeek-V4's routed experts with expert "
                             "parallelism only (DeepseekV4MoE): add --enable-expert-parallel, or leave it at auto")
        if v4 and req.pp > 1:
            raise ConfigError("DeepSeek-V4 under pipeline parallelism: vLLM groups its caches over every stage's layers "
                             "and gives each worker its share, which kvplan does not model (it plans a stage's own "
                             "layers); plan with -pp 1 (tensor or data parallel)")
        block_size = resolve_block_size(rules, req.block_size, req.attention_backend,
                                        has_mla=req.spec.has_layer(MLALayer), sparse=req.spec.sparse_mla, v4=v4)
        kv_dtype = resolve_kv_dtype(req.spec, v4_kv_dtype(rules, req.spec.layers, req.kv_dtype, profile.version))
        check_layout_dtype(rules, kv_dtype, profile.version)
        mnbt = req.max_num_batched_tokens or batch_defaults(rules, req.gpu, max_model_len)[0]
        max_num_seqs = req.max_num_seqs or default_seqs(rules, req.gpu, max_model_len, mnbt)
        if mnbt < max_num_seqs:  # vllm/config/scheduler.py::SchedulerConfig (every release): vLLM does not start
            given = "" if req.max_num_seqs else ", the release's default for this GPU"
            raise InputError(f"vLLM {profile.version} refuses to start: max_num_batched_tokens {mnbt} must be at "
                             f"least max_num_seqs ({max_num_seqs}{given}); set --max-num-seqs {mnbt} or raise "
                             f"--max-num-batched-tokens to {max_num_seqs}")
        graphs = () if req.enforce_eager else tuple(capture_sizes(rules, max_num_seqs=max_num_seqs,
                                                                  max_num_batched_tokens=mnbt,
                                                                  blackwell=blackwell_class(req.gpu)))
        notes = []
        if req.block_size and block_size != req.block_size and req.attention_backend is None:  # MLA on Hopper
            notes.append(mla_block(rules, req.block_size, sparse=req.spec.sparse_mla)[1])
        if req.kv_cache_memory_bytes is not None and not rules.kv_cache_memory_bytes:
            notes.append(f"vLLM {profile.version} has no --kv-cache-memory-bytes (from 0.10.2): the figure is used as "
                         "the KV memory to plan with")
        if rules.v1 and req.tp >= 2 and req.gpu.nvswitch_hopper_class and req.non_torch_memory is None:
            notes.append(f"non-torch memory {estimates.NON_TORCH_NVSWITCH_TP_BYTES / GiB:.2f} GiB a GPU for the "
                         "tensor-parallel all-reduce on an NVSwitch board: an estimate from vLLM 0.19.0's H100 SXM "
                         "starts at tp 2 and 4 (2.06-2.21 GiB); other releases and GPUs are not measured "
                         "(--non-torch-memory to give yours)")
        if req.gpu_memory_per_rank is not None and len(set(req.gpu_memory_per_rank)) > 1:
            notes.append(f"the GPUs differ in memory: vLLM plans with the smallest, "
                         f"{min(req.gpu_memory_per_rank) / GiB:.2f} GiB, and gives every rank the smallest rank's "
                         "block count")
        return _Settings(rules=rules, block_size=block_size, kv_dtype=kv_dtype, max_num_batched_tokens=mnbt,
                         max_num_seqs=max_num_seqs,
                         in_flight=in_flight(rules, req.spec, mnbt, req.pp, req.async_scheduling),
                         hybrid=rules.hybrid_manager and not req.disable_hybrid_kv_cache_manager,
                         graphs=graphs), notes

    def stage_memory(self, req: FitRequest, setup: Setup) -> list[int]:
        return _rank_memory(req)

    def activation(self, req: FitRequest, setup: Setup, last_stage: bool, *, first_stage: bool = True) -> int:
        v: _Settings = setup.engine
        if not v.rules.v1:  # V0: the fitted estimate of its calibration points (estimates.py)
            return estimates.activation_peak_bytes(
                req.spec, tokens=v.max_num_batched_tokens, max_num_seqs=v.max_num_seqs, tp=req.tp,
                act_bytes=_act_bytes(req), last_stage=last_stage, sampler_run=False)
        workspace = (deepseek_v4.indexer_workspace(req.spec, max_model_len=setup.max_model_len,
                                                   max_num_batched_tokens=v.max_num_batched_tokens)
                     if deepseek_v4.is_v4(req.spec) else 0)
        return workspace + profile_run(req.spec, tokens=v.max_num_batched_tokens, max_num_seqs=v.max_num_seqs, tp=req.tp,
                           act_bytes=_act_bytes(req), gpu=req.gpu, sampler=v.rules.sampler,
                           moe_workspace=v.rules.moe_workspace, monolithic_moe=_mxfp4_experts(req),
                           first_stage=first_stage, last_stage=last_stage,
                           mm_items=encoder_items(req.spec, tokens=v.max_num_batched_tokens,
                                                  max_num_seqs=v.max_num_seqs, max_model_len=setup.max_model_len,
                                                  limit=mm_limit(req, "image"))).peak

    def non_torch(self, req: FitRequest, setup: Setup) -> int:
        v: _Settings = setup.engine
        nvswitch = v.rules.v1 and req.gpu.nvswitch_hopper_class
        out = estimates.non_torch_bytes(req.tp, req.pp, nvswitch_all_reduce=nvswitch, v1=v.rules.v1)
        moe = req.spec.arch.moe if req.spec.arch is not None else None
        if req.moe_backend == deepseek_v4.MEGA_MOE_BACKEND and moe is not None:
            out += deepseek_v4.mega_moe_buffer(ranks=req.tp * req.dp, experts=moe.num_experts,
                                               tokens=v.max_num_batched_tokens, topk=moe.experts_per_token,
                                               hidden=req.spec.hidden_size, inter=moe.expert_intermediate)
        return out

    def kv_dtype_name(self, req: FitRequest) -> str:
        """DeepSeek-V4 runs fp8_ds_mla rows whatever --kv-cache-dtype says (v4_kv_dtype refuses the others)."""
        return "fp8_ds_mla" if deepseek_v4.is_v4(req.spec) else super().kv_dtype_name(req)

    def loaded_buffers(self, req: FitRequest, setup: Setup) -> int:
        v: _Settings = setup.engine
        if not deepseek_v4.is_v4(req.spec):
            return 0
        return deepseek_v4.loaded_buffers(req.spec, max_num_batched_tokens=v.max_num_batched_tokens)

    def cuda_graph(self, req: FitRequest, setup: Setup) -> int:
        v: _Settings = setup.engine
        return estimates.cuda_graph_bytes(req.spec, num_graphs=len(v.graphs), tp=req.tp, pp=req.pp,
                                          era=estimates.cuda_graph_era(v.rules))

    def kv_memory(self, req: FitRequest, setup: Setup, memory_bytes: int, c: Components) -> int:
        graphs = c.cuda_graph if setup.engine.rules.cuda_graphs.subtracted else 0
        return (_requested(memory_bytes, setup.utilization) - c.weights - c.draft - c.lora - c.activation
                - c.non_torch - graphs)

    def capacity(self, req: FitRequest, setup: Setup, stages: list[Stage]) -> Capacity:
        v: _Settings = setup.engine
        pools = []
        for st in stages:
            layout = build_layout(st.layers, rules=v.rules, kv_dtype=v.kv_dtype, model_dtype=req.spec.dtype,
                                  block_size=v.block_size, tp=req.tp, requested_block_size=req.block_size,
                                  hybrid=v.hybrid, mamba_cache_mode=req.mamba_cache_mode,
                                  num_speculative_tokens=req.num_speculative_tokens, name=req.spec.name)
            if layout is not None and req.dcp > 1:
                check_dcp(req.spec, v.rules, setup.profile.version, tp=req.tp, dcp=req.dcp, kv_dtype=v.kv_dtype.name)
                layout = dataclasses.replace(layout, dcp=req.dcp)
            blocks = max(0, st.kv_bytes) // layout.pool_block_bytes if layout else 1
            pools.append(_StagePool(stage=st, layout=layout, blocks=blocks))
        binding = min(pools, key=lambda p: (p.blocks, p.stage.kv_bytes)).stage
        if all(p.layout is None for p in pools):
            return _attention_free(req, setup, binding)
        return _plan_capacity(req, setup, pools, binding)

    def concurrency_reason(self, req: FitRequest, max_model_len: int, concurrency: float) -> str:
        return (f"{req.concurrency} concurrent requests of {max_model_len:,} tokens need "
                f"{req.concurrency / max(concurrency, 1e-9):.2f}x the KV cache; {concurrency:.2f} fit")


def _requested(memory_bytes: int, utilization: float) -> int:
    """The memory vLLM may use: ceil(total x gpu_memory_utilization) (Worker.determine_available_memory)."""
    return math.ceil(memory_bytes * utilization)


def _plan_capacity(req: FitRequest, setup: Setup, pools: list[_StagePool], binding: Stage) -> Capacity:
    """Blocks, fit check and capacity from vLLM's KV planning over the stages' layouts."""
    v: _Settings = setup.engine
    rules, util, max_len = v.rules, setup.utilization, setup.max_model_len
    subtract_graphs = rules.cuda_graphs.subtracted
    plan = plan_stages([(p.layout, p.stage.kv_bytes) for p in pools], rules, max_len,
                       in_flight_tokens=v.in_flight.tokens, num_gpu_blocks_override=req.num_gpu_blocks_override,
                       auto_fit=req.auto_fit_max_model_len)
    layout = plan.layout
    assert layout is not None
    blocks = plan.num_blocks
    notes = []
    if req.auto_fit_max_model_len:
        notes.append(f"max_model_len -1: vLLM fits the longest context the KV memory holds, {plan.max_model_len:,} "
                     f"(searched up to {max_len:,})")
        max_len = plan.max_model_len
    usable = max(0, blocks - 1) if rules.v1 else blocks  # V1's block pool keeps block 0 as the null block
    kv, memory, c = binding.kv_bytes, binding.memory_bytes, binding.components
    requested = _requested(memory, util)
    reasons = _capacity_reasons(req, v, plan, binding, util=util, max_len=max_len)
    notes += _plan_notes(req, setup, pools, layout, c)
    return Capacity(
        stage=binding, max_model_len=max_len, kv_cache_bytes=max(0, kv), block_size=layout.block_size,
        page_size_bytes=layout.pool_block_bytes, num_blocks=blocks,
        # DeepSeek-V4's groups draw blocks of one pool by their own block sizes: its tokens are requests of
        # max_model_len at vLLM's concurrency (what 0.20.1 and later log)
        kv_cache_tokens=int(plan.max_concurrency * max_len) if layout.packed
        else blocks // layout.num_groups * layout.min_block_size * layout.dcp,
        max_concurrency=plan.max_concurrency,
        max_model_len_fit=plan.estimated_max_model_len, reasons=tuple(reasons),
        # given KV memory: the skeleton's unused (what the components and the KV memory leave)
        unused=max(0, memory - requested - (0 if subtract_graphs else c.cuda_graph))
        if req.kv_cache_memory_bytes is None else None,
        settings={"gpu_memory_utilization": util, "block_size": layout.block_size,
                  "max_num_batched_tokens": v.max_num_batched_tokens, "max_num_seqs": v.max_num_seqs,
                  "cuda_graph_sizes": len(v.graphs),
                  **({"activation_band": activation_band(rules, v.in_flight.v2_runner, req.gpu)} if rules.v1 else {}),
                  **({"async_scheduling": v.in_flight.async_scheduling, "max_in_flight_tokens": v.in_flight.tokens}
                     if windowed(layout, rules) else {})},
        notes=tuple(notes), usable_blocks=usable, logged_kv_cache_tokens=plan.logged_kv_cache_tokens,
        logged_capacity_rule=plan.logged_capacity_rule, pool_plan=plan,
    )


def _capacity_reasons(req: FitRequest, v: _Settings, plan: VLLMPlan, binding: Stage, *, util: float,
                      max_len: int) -> list[str]:
    """Why vLLM would not start: no KV memory, no room for one request of max_model_len, or (before 0.20) no room
    left for the CUDA graphs."""
    kv, memory, c = binding.kv_bytes, binding.memory_bytes, binding.components
    requested = _requested(memory, util)
    subtract_graphs = v.rules.cuda_graphs.subtracted
    reasons = []
    if kv <= 0:
        graphs_txt = f" + CUDA graphs {c.cuda_graph / GiB:.2f} GiB" if subtract_graphs else ""
        draft_txt = (f" + draft {c.draft / GiB:.2f} GiB" if c.draft else "") + (
            f" + LoRA {c.lora / GiB:.2f} GiB" if c.lora else "")
        reasons.append(f"no memory left for the KV cache: weights {c.weights / GiB:.2f} GiB{draft_txt} + activation "
                       f"{c.activation / GiB:.2f} GiB + non-torch {c.non_torch / GiB:.2f} GiB{graphs_txt} exceed "
                       f"{util} x {memory / GiB:.2f} GiB = {requested / GiB:.2f} GiB "
                       f"(short by {-kv / GiB:.2f} GiB)")
    elif not plan.fits:
        reasons.append(_no_fit_reason(plan, max_len, v.in_flight.tokens))
    slack = memory - requested
    if v.graphs and not subtract_graphs and req.kv_cache_memory_bytes is None and c.cuda_graph > slack:
        # before 0.20 the KV cache takes the whole budget first; the graphs are captured afterwards in what is
        # left of the GPU (vllm/v1/worker/gpu_worker.py::compile_or_warm_up_model): they must fit there
        reasons.append(f"CUDA graphs ({len(v.graphs)} batch sizes, {c.cuda_graph / GiB:.2f} GiB) are captured after "
                       f"the KV cache fills {util} of the GPU, in the {max(0, slack) / GiB:.2f} GiB left: lower "
                       "--gpu-memory-utilization, --max-num-seqs, or --enforce-eager")
    return reasons


def _no_fit_reason(plan: VLLMPlan, max_len: int, in_flight: int) -> str:
    """vLLM's refusal when one request of max_model_len does not fit the KV memory of a stage."""
    layout = plan.layout
    assert layout is not None
    short = [(st.layout.bytes_needed(max_len, in_flight), st.planning_bytes) for st in plan.stages
             if st.layout is not None and st.layout.bytes_needed(max_len, in_flight) > st.planning_bytes]
    needed, avail = short[0] if short else (0, 0)
    if max_len <= 0:
        return (f"no context fits: one block per layer group needs {layout.pool_block_bytes / GiB:.2f} GiB "
                f"of KV cache, {max(0, avail) / GiB:.2f} GiB available")
    return (f"one request of max_model_len {max_len} needs {needed / GiB:.2f} GiB of KV cache, "
            f"{max(0, avail) / GiB:.2f} GiB available; the longest that fits: --max-model-len "
            f"{plan.estimated_max_model_len}")


def _plan_notes(req: FitRequest, setup: Setup, pools: list[_StagePool], layout: KVLayout,
                c: Components) -> list[str]:
    """What the fit result says about vLLM's grouping, the pool's block, the settings that change them, and when
    the CUDA graphs are captured."""
    v: _Settings = setup.engine
    rules, spec = v.rules, req.spec
    notes = []
    if windowed(layout, rules):
        notes.append(_in_flight_note(req, v))
    if layout.num_groups > 1 and not layout.packed:
        notes.append(f"vLLM groups the layers into {layout.num_groups} groups of {layout.group_size}; "
                     f"a block spans one layer of each group")
    for padding, layers in layout.padding():
        # vllm/v1/core/kv_cache_utils.py::_get_kv_cache_groups_uniform_page_size (0.20.0; kv_cache_planning.py 0.33.0)
        notes.append(f"vLLM warns \"Add {padding} padding layers, may waste at most {100 * padding / layers:.2f}% KV "
                     f"cache memory\": {layers} layers of a type fill {-(-layers // layout.group_size)} groups of "
                     f"{layout.group_size}")
    if layout.packed and layout.num_groups == 1:
        notes.append(f"DeepSeek-V4 without the hybrid manager: every window and state cache is sized as growing, "
                     f"{layout.buckets[0].num_layers} caches of {layout.block_size} tokens a block in one group, "
                     f"{layout.pool_block_bytes:,} B a block")
    elif layout.packed:
        groups = ", ".join(f"{b.num_layers} x {b.block_size}" + (f" (window {b.window})" if b.window else "")
                           for b in layout.buckets)
        notes.append(f"DeepSeek-V4: vLLM packs {layout.num_groups} cache groups (caches x tokens a block: {groups}) in "
                     f"one pool of {layout.pool_block_bytes:,}-B blocks, fp8_ds_mla rows of 584 B; a request of "
                     f"{setup.max_model_len:,} tokens counts {layout.blocks_per_request(setup.max_model_len, v.in_flight.tokens):,} "
                     "blocks in the logged concurrency (the window and state groups at their admission bound)")
    if layout.tensor_pages and not layout.packed:
        notes.append(f"layers of one attention type with different page sizes share one group: a block costs "
                     f"{layout.pool_block_bytes:,} B, the sum of their pages")
    if not v.hybrid and any(isinstance(x, AttentionLayer) and x.kind is not LayerKind.FULL for x in spec.layers):
        notes.append("sliding-window layers are sized as full attention: " + (
            "--disable-hybrid-kv-cache-manager" if rules.hybrid_manager else
            f"vLLM {setup.profile.version} has no hybrid KV cache manager (from 0.9.1)"))
    if req.num_gpu_blocks_override:
        memory_blocks = min(p.blocks for p in pools if p.layout is not None)
        notes.append(f"--num-gpu-blocks-override {req.num_gpu_blocks_override} replaces the {memory_blocks} "
                     "blocks the memory holds" + (" and is what the fit check plans with" if rules.override_in_fit
                                                  else " (the fit check still plans with the memory before 0.20.1)"))
    if v.graphs and not rules.cuda_graphs.subtracted:
        notes.append(f"CUDA graphs ({len(v.graphs)} batch sizes, {c.cuda_graph / GiB:.2f} GiB) are captured after "
                     "the KV cache " + ("is allocated, from the 1 - utilization slack" if rules.cuda_graphs is CudaGraphs.AFTER_KV
                                        else "is sized: estimated and logged, not subtracted unless VLLM_MEMORY_"
                                        "PROFILER_ESTIMATE_CUDAGRAPHS=1"))
    return notes


def windowed(layout: KVLayout | None, rules: VLLMRules) -> bool:
    """Whether the batches in flight move the plan: sliding or chunked layers, from 0.26.0."""
    return (layout is not None and rules.in_flight_admission
            and any(b.kind in (LayerKind.SLIDING, LayerKind.CHUNKED) for b in layout.buckets))


def _in_flight_note(req: FitRequest, v: _Settings) -> str:
    """Which async setting and model runner the sliding/chunked layers' admission was sized with."""
    f = v.in_flight
    if req.async_scheduling is None:
        how = ("on: vLLM's default, --no-async-scheduling to turn it off" if f.async_scheduling
               else "off: vLLM's default, --async-scheduling to turn it on")
    else:
        how = "on: --async-scheduling" if f.async_scheduling else "off: --no-async-scheduling"
    runner = "V2 model runner" if f.v2_runner else "V1 model runner"
    why = (f"pp {req.pp} + 1 on the {runner}" if f.async_scheduling and f.v2_runner
           else f"async at pp 1 on the {runner}" if f.async_scheduling and req.pp <= 1 else f"pp {req.pp}")
    return (f"async scheduling {how}; sliding/chunked layers admit max_in_flight_tokens {f.tokens} = {f.batches} "
            f"batch{'es' if f.batches > 1 else ''} in flight ({why}) x max_num_batched_tokens "
            f"{v.max_num_batched_tokens} (vllm/config/vllm.py::VllmConfig.max_concurrent_batches)")


def _attention_free(req: FitRequest, setup: Setup, binding: Stage) -> Capacity:
    """A model with no KV layers: vLLM allocates one (null) block and checks no KV memory."""
    v: _Settings = setup.engine
    return Capacity(
        stage=binding, max_model_len=setup.max_model_len, kv_cache_bytes=0,
        block_size=req.block_size or DEFAULT_BLOCK_SIZE, page_size_bytes=0, num_blocks=1, kv_cache_tokens=0,
        max_concurrency=float(v.max_num_seqs), max_model_len_fit=setup.max_model_len, check_concurrency=False,
        unused=min(_rank_memory(req)) - _requested(binding.memory_bytes, setup.utilization),
        settings={"gpu_memory_utilization": setup.utilization, "max_num_seqs": v.max_num_seqs},
        notes=("no layer holds a KV cache: vLLM allocates one null block and requests are bounded by max_num_seqs",),
        logged_capacity_rule="no KV cache",
    )


VLLM_BUDGET = VLLMBudget()


def fit_vllm(req: FitRequest) -> FitResult:
    return run_budget(req, VLLM_BUDGET)
