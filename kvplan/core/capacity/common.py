"""What a fit question is, what its answer holds, and the pieces every engine's budget shares."""

from __future__ import annotations

import math

import dataclasses

from dataclasses import dataclass, field
from typing import Any, Callable

from kvplan.core.dtypes import KVDtype, get_dtype
from kvplan.core.gpus import GPUSpec
from kvplan.core.sizing import pp_stages
from kvplan.core.spec import ModelSpec
from kvplan.core.quant import quant_rule
from kvplan.core.weights import WeightBytes, get_weight_format, weight_bytes
from kvplan.core.units import GiB  # noqa: F401  (the capacity modules import it from here)
from kvplan.errors import ConfigError, InputError
from kvplan.core.engines.registry import SERVING


@dataclass(frozen=True, kw_only=True)
class SGLangArgs:
    """SGLang server arguments of large expert-parallel deployments (server_args.py; docs/engines.md "SGLang's large
    expert-parallel placements"): where the MoE layers' parts live and the token pool's cap."""

    # --moe-a2a-backend (0.5 on; --enable-deepep-moe from 0.4.5): an all-to-all backend puts whole experts over the tp
    # GPUs (ep_size = tp_size) and builds the shared experts whole on every GPU (models/deepseek_v2.py::DeepseekV2MoE)
    a2a_backend: str = "none"
    redundant_experts: int = 0  # --ep-num-redundant-experts: expert copies loaded beside the routed experts
    dense_tp: int | None = None  # --moe-dense-tp-size 1: the dense MLP layers whole on every GPU
    dp_lm_head: bool = False  # --enable-dp-lm-head: the LM head over the attention-TP group (tp // dp)
    max_total_tokens: int | None = None  # --max-total-tokens: the token pool's cap, before the page floor

    @property
    def whole_experts(self) -> bool:
        return self.a2a_backend != "none"


@dataclass(frozen=True, kw_only=True)
class FitRequest:
    spec: ModelSpec
    gpu: GPUSpec
    engine: str = "vllm"
    tp: int = 1
    pp: int = 1
    # vLLM --data-parallel-size: engines of tp x pp GPUs each, each its own KV pool and scheduler; the result is
    # one engine's (FitResult.dp: all of them), with the routed experts over dp x tp GPUs
    dp: int = 1
    expert_parallel: bool = False  # vLLM --enable-expert-parallel: whole experts over dp x tp GPUs (EP)
    dcp: int = 1  # vLLM --decode-context-parallel-size: each sequence's KV over dcp of the tp ranks
    # SGLang --enable-dp-attention with --dp-size dp: attention at tp // dp in dp groups inside the tp GPUs, each
    # group its own token pool (without it, SGLang's --dp-size is dp replicas of tp GPUs, as vLLM's engines)
    dp_attention: bool = False
    kv_dtype: str = "auto"
    weight_dtype: str = "auto"
    gpu_memory_utilization: float | None = None  # engine default when None
    max_model_len: int | None = None  # the model's max context when None
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_memory_bytes: int | None = None  # skip the budget: KV memory per GPU given
    weights_memory: int | None = None  # measured overrides, per GPU
    activation_memory: int | None = None
    non_torch_memory: int | None = None
    cuda_graph_memory: int | None = None
    enforce_eager: bool = False
    concurrency: int | None = None  # requests of max_model_len tokens that must fit at once
    # The release's rules (kvplan.core.profiles.EngineProfile); None: the engine's newest profile.
    profile: Any = None
    num_gpu_blocks_override: int | None = None  # vLLM --num-gpu-blocks-override
    disable_hybrid_kv_cache_manager: bool = False  # vLLM: sliding layers then hold every token
    # Total memory of each GPU, rank order (tp x pp entries) when they differ; None: every rank has gpu's.
    # vLLM plans every rank with the smallest of its pipeline stage, then the smallest block count.
    gpu_memory_per_rank: tuple[int, ...] | None = None
    # vLLM --mamba-cache-mode: "none" (a Mamba layer holds 1 + num_speculative_tokens blocks a request) or
    # "align" (prefix caching: 2 + num_speculative_tokens); from 0.16.0.
    mamba_cache_mode: str = "none"
    num_speculative_tokens: int = 0  # vLLM speculative decoding: extra Mamba state blocks a request
    # vLLM --speculative-config: the drafter (kvplan.core.spec_decode.Drafter): its KV layers and weights; None: none
    drafter: Any = None
    # SGLang --speculative-algorithm (kvplan.core.spec_decode.SGLangSpeculative: steps, topk, draft tokens); its draft
    # is in ``drafter`` too, whose KV SGLang keeps in a pool of its own (not in the target's cell)
    sglang_spec: Any = None
    # LoRA adapters' slots (kvplan.core.lora.LoRASettings: vLLM --enable-lora, SGLang --max-loras-per-batch); None: none
    lora: Any = None
    # vLLM --limit-mm-per-prompt: items a prompt may carry, by modality (a modality left out: 999, vLLM's default)
    mm_limits: tuple[tuple[str, int], ...] = ()
    # vLLM attention backend (FLASHMLA, FLASHMLA_SPARSE, CUTLASS_MLA, FLASHINFER_MLA, ...): picks the
    # block size of MLA models; None: the release's default (FlashMLA's 64 from 0.9.0).
    attention_backend: str | None = None
    # vLLM --moe-backend: "auto", or deep_gemm_mega_moe (DeepSeek-V4 with expert parallelism: DeepGEMM's MegaMoE,
    # whose symmetric buffer is non-torch memory: kvplan.core.engines.vllm.deepseek_v4)
    moe_backend: str = "auto"
    auto_fit_max_model_len: bool = False  # vLLM max_model_len = -1: the longest that fits (from 0.14.0)
    # The engine's variable for a max_model_len longer than the model's will be set where it runs
    # (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, ...: kvplan.core.capacity.context).
    allow_long_max_model_len: bool = False
    # vLLM: two batches in flight (async scheduling), which doubles what a sliding-window layer admits (from 0.26);
    # None: the release's default (on from 0.14). The same setting `simulate` runs the scheduler with.
    async_scheduling: bool | None = None
    sglang: SGLangArgs = SGLangArgs()  # SGLang's expert-parallel placements and token cap (defaults: none)

    def engine_profile(self) -> Any:
        from kvplan.core.profiles import registry

        return self.profile if self.profile is not None else registry().newest(self.engine)


@dataclass(frozen=True, kw_only=True)
class Breakdown:
    """Bytes on the binding GPU. ``unused`` is what the engine leaves alone (1 - utilization)."""

    weights: int
    activation: int
    non_torch: int
    cuda_graph: int
    kv_cache: int
    unused: int
    draft_weights: int = 0  # a speculative drafter's weights (MTP layers, their projection and norms)
    lora: int = 0  # LoRA adapters' slots

    def as_dict(self) -> dict[str, int]:
        return {"weights": self.weights, "draft_weights": self.draft_weights, "lora": self.lora,
                "activation": self.activation,
                "non_torch": self.non_torch, "cuda_graph": self.cuda_graph, "kv_cache": self.kv_cache,
                "unused": self.unused}


@dataclass(frozen=True, kw_only=True)
class FitResult:
    engine: str
    gpu: GPUSpec
    tp: int
    pp: int
    kv_dtype: str
    weight_dtype: str
    max_model_len: int
    breakdown: Breakdown
    kv_cache_memory_bytes: int
    block_size: int
    page_size_bytes: int  # one block across the layers that share it (engine's allocation unit)
    num_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    # The longest max_model_len, up to the configured one, with which one request fits the KV cache (0: none).
    # Every engine alike: vLLM's own estimate (kv_cache_utils.py::estimate_max_model_len) searches up to
    # max_model_len, so a deployment that fits shows its max_model_len, one that does not the length to set.
    max_model_len_fit: int
    fits: bool
    reasons: tuple[str, ...]
    estimated: tuple[str, ...]  # breakdown components that are estimates, not given
    settings: dict[str, float | int | str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    params: int = 0
    engine_version: str = ""  # the profile whose rules were used
    usable_blocks: int = 0  # num_blocks less the engine's reserved blocks (vLLM's null block)
    logged_kv_cache_tokens: int = 0  # the capacity the release prints at startup ("GPU KV cache size")
    logged_capacity_rule: str = ""  # how that figure is computed in this release
    borderline: bool = False  # the verdict's margin is within the estimates' error
    borderline_why: str = ""
    # The engine's own longest max_model_len for this model (kvplan.core.capacity.context.ContextLimit; None:
    # the config gives no length), whether the one asked for is longer, and whether the engine's override is set.
    context_limit: Any = None
    context_exceeded: bool = False
    context_override: bool = False
    # The engine's own plan of the pool (vLLM: kvplan.core.engines.vllm.plan.VLLMPlan, its cache groups and blocks):
    # the vllm-v1 simulator runs the pool `fit` planned, not a second plan of its own.
    pool_plan: Any = field(default=None, compare=False, repr=False)
    dp: int = 1  # engines (vLLM DP ranks) like this one: each holds kv_cache_tokens and max_concurrency
    dcp: int = 1  # vLLM decode context parallel size: kv_cache_tokens counts the tokens on all dcp ranks
    dp_attention: bool = False  # SGLang: the dp ranks are attention groups inside the tp GPUs
    expert_parallel_size: int = 0  # GPUs the routed experts are spread over as whole experts (0: no EP)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * (1 if self.dp_attention else self.dp)

    @property
    def all_kv_cache_tokens(self) -> int:
        """The tokens of every DP rank's pool."""
        return self.dp * self.kv_cache_tokens

    @property
    def all_concurrency(self) -> float:
        """Requests of max_model_len tokens every DP rank holds at once: the fraction of one engine, or with
        dp > 1 whole requests on each (a request is held by one rank: 2.64 a rank is 2, not 2.64)."""
        return self.max_concurrency if self.dp == 1 else self.dp * math.floor(self.max_concurrency)


def given_or_estimate(given: int | None, name: str, estimated: set[str], estimate: Callable[[], int]) -> int:
    """A measured figure when the user gave one; else kvplan's estimate, recorded in ``estimated``."""
    if given is not None:
        return given
    value = estimate()
    if value:
        estimated.add(name)
    return value


def resolve_kv_dtype(spec: ModelSpec, kv_dtype: str) -> KVDtype:
    return get_dtype(spec.dtype if kv_dtype == "auto" else kv_dtype)


def model_weights(req: FitRequest) -> tuple[WeightBytes | None, list[str]]:
    """Weight bytes per GPU in the requested (or the checkpoint's) format, and notes."""
    spec = req.spec
    notes: list[str] = []
    if spec.arch is None:
        if req.weights_memory is None:
            raise ConfigError(f"{spec.name}: the config does not say enough to count weights (vocab_size missing); "
                              "pass --weights-memory, e.g. --weights-memory 14.99GiB")
        return None, notes
    keep = get_weight_format(spec.dtype)
    quant = spec.raw_config.get("quantization_config") or (spec.raw_config.get("text_config") or {}).get("quantization_config")
    method = (quant or {}).get("quant_method") if isinstance(quant, dict) else None
    expert_fmt = None
    rule = None
    if req.weight_dtype in ("fp32", "fp16", "bf16"):
        # vLLM's --dtype: the whole model in that dtype, embedding and LM head included (model_loader/utils.py::
        # set_default_torch_dtype around the model's construction)
        fmt = keep = get_weight_format(req.weight_dtype)
    elif req.weight_dtype != "auto":
        fmt = get_weight_format(req.weight_dtype)
    elif method == "fp8" and spec.model_type == "deepseek_v4":
        # DeepSeek-V4's checkpoints store the routed experts in FP4 (E2M1 pairs packed in int8 with one UE8M0 scale
        # per 32 values: experts.*.w1 [3072, 3584] int8 + scale [3072, 224] in DeepSeek-V4-Pro's tensor list), the
        # rest FP8 with 128x128 block scales; MXFP4 is the same layout
        fmt, expert_fmt = get_weight_format("fp8"), get_weight_format("mxfp4")
        notes.append("weights: FP8 with block scales, routed experts FP4 with a scale per 32 (DeepSeek-V4 checkpoint)")
    elif method == "fp8":
        fmt = get_weight_format("fp8")
        notes.append("weights: the checkpoint is FP8 (quantization_config), block scales counted")
        _check_expert_blocks(req, quant)
    elif method == "mxfp4":
        fmt, expert_fmt = keep, get_weight_format("mxfp4")
        notes.append("weights: routed experts are MXFP4 (quantization_config), the rest in the model dtype")
    elif (rule := quant_rule(quant, model_bits=keep.bits, hidden_size=spec.arch.hidden_size,
                             bnb_absmax_fp32=getattr(req.engine_profile().rules, "bnb_absmax_fp32", False))) is not None:
        # compressed-tensors, ModelOpt, fbgemm_fp8, GPTQ, AWQ, bitsandbytes: a format per layer part (part_fmt),
        # the modules they leave out kept; fmt only names the weights in the report. bnb_absmax_fp32 is a vLLM
        # release's rule (VLLMRules.bnb_absmax_fp32); other engines keep the checkpoint's scales.
        fmt = rule.groups[0][1]
        notes.append(rule.note)
    else:
        fmt = keep
    if spec.arch.tower is not None and (fmt != keep or expert_fmt is not None):
        # kvplan.core.weights: Llama 4 builds its tower unquantized, quantized Gemma 3 / Mistral 3 checkpoints
        # leave theirs out of the quantization
        notes.append(f"weights: the vision tower and projector ({spec.arch.tower.params / 1e9:.2f}B) are counted in "
                     f"the model dtype ({keep.name}), beside the quantized language model")
    stages = pp_stages(spec.num_layers, req.pp)
    arch = spec.arch
    tower = arch.tower
    if tower is not None and all(mm_limit(req, m) == 0 for m in tower.modalities) and getattr(
            req.engine_profile().rules, "skips_unused_tower", False):
        arch = dataclasses.replace(arch, tower=None)
        notes.append(f"--limit-mm-per-prompt leaves every {'/'.join(tower.modalities)} input out: vLLM builds no "
                     f"{tower.name} (language model only)")
    # vLLM (model_executor/layers/fused_moe/config.py::FusedMoEParallelConfig.make): the MoE layers' group spans
    # every DP rank, dp x tp GPUs; without --enable-expert-parallel each expert is split over them, with it each
    # GPU holds whole experts (fused_moe/layer.py::determine_expert_map: the first num_experts % ep one more)
    sg = req.sglang
    attn = req.tp // req.dp if req.dp_attention else None
    moe = spec.arch.moe
    return weight_bytes(spec, arch, fmt=fmt, expert_fmt=expert_fmt, keep_fmt=keep, tp=req.tp, stages=stages,
                        part_fmt=rule.part_fmt if rule else None, expert_ranks=expert_ranks(req),
                        whole_experts=req.expert_parallel or sg.whole_experts, attn_ranks=attn,
                        mlp_ranks=sg.dense_tp, shared_ranks=1 if sg.whole_experts else None,
                        head_ranks=attn if sg.dp_lm_head else None,
                        physical_experts=moe.num_experts + sg.redundant_experts if moe and sg.redundant_experts else None,
                        repeat=req.drafter.repeat_layers if req.drafter is not None else ()), notes


def lora_stage_bytes(req: FitRequest, ranges: list[range], stage: int | None) -> Any:
    """The LoRA slots (and, in vLLM before 0.12.0, the base vocabulary's growth) on one GPU of pipeline stage
    ``stage`` (None: the most loaded GPU of an engine that budgets one, the whole model's layers)."""
    from kvplan.core.lora import LoRABytes, lora_bytes

    if req.lora is None:
        return LoRABytes(buffers=0, base_growth=0)
    keep = get_weight_format(req.weight_dtype if req.weight_dtype in ("fp32", "fp16", "bf16") else req.spec.dtype)
    extra = bool(getattr(req.engine_profile().rules, "lora_extra_vocab", False))
    if stage is None:
        return lora_bytes(req.spec, req.lora, tp=req.tp, dtype_bytes=keep.bits // 8, extra_vocab=extra)
    return lora_bytes(req.spec, req.lora, tp=req.tp, dtype_bytes=keep.bits // 8, extra_vocab=extra,
                      first_stage=stage == 0, last_stage=stage == len(ranges) - 1, layers=ranges[stage])


def draft_weight_bytes(req: FitRequest, weights: WeightBytes | None) -> int:
    """A speculative drafter's weights on one GPU of the last stage: its copies of decoder layers (in the model's
    format), the parameters every rank holds whole, and an LM head of its own (split over TP), in the model dtype."""
    d = req.drafter
    if d is None or weights is None:
        return 0
    keep = get_weight_format(req.weight_dtype if req.weight_dtype in ("fp32", "fp16", "bf16") else req.spec.dtype)
    arch = req.spec.arch
    head = -(-arch.vocab_size * arch.hidden_size // req.tp) if d.own_head and arch is not None else 0
    return (weights.repeat_bytes + keep.bytes_for(d.extra_whole_params)
            + keep.bytes_for(-(-d.extra_split_params // req.tp)) + keep.bytes_for(head) + d.extra_bytes)


def expert_ranks(req: FitRequest) -> int:
    """GPUs the routed experts are spread over: vLLM's MoE group spans every DP rank (dp x tp); SGLang's replicas
    (--dp-size without DP attention) each hold every expert over their tp, and DP attention keeps the MoE layers
    over the tp GPUs (python/sglang/srt/layers/moe/fused_moe_triton/layer.py::FusedMoE.__init__, 0.5.10)."""
    return req.tp * req.dp if req.engine == "vllm" else req.tp


def _check_expert_blocks(req: FitRequest, quant: dict) -> None:
    """An FP8 checkpoint with block scales splits each expert's intermediate over the GPUs that share it (tp, or dp x
    tp in vLLM, without expert parallelism) only in whole blocks: vLLM's Fp8MoEMethod.create_weights (quantization/
    fp8.py) and SGLang refuse at load 'The output_size of gate's and up's weight = N is not divisible by weight
    quantization block_n = 128'."""
    block = quant.get("weight_block_size")
    moe = req.spec.arch.moe if req.spec.arch is not None else None
    if req.expert_parallel or req.sglang.whole_experts or moe is None or not isinstance(block, list) or not block:
        return
    ranks, inter, block_n = expert_ranks(req), moe.expert_intermediate, int(block[0])
    if ranks > 1 and (inter % ranks or inter // ranks % block_n):
        raise ConfigError(f"{req.spec.name}: its experts' intermediate {inter} over {ranks} GPUs is {inter / ranks:g} "
                          f"a GPU, not a multiple of the FP8 block {block_n}: {req.engine} refuses it at load ('The "
                          "output_size of gate's and up's weight ... is not divisible by weight quantization "
                          "block_n'); use --enable-expert-parallel (whole experts), or fewer GPUs a model copy")


def mm_limit(req: FitRequest, modality: str) -> int:
    """Items of ``modality`` a prompt may carry (vLLM's MultiModalConfig.get_limit_per_prompt: 999 unless given)."""
    return dict(req.mm_limits).get(modality, 999)


A2A_BACKENDS = ("deepep", "mooncake")  # SGLang 0.5.5's --moe-a2a-backend choices beside none
# The architectures whose SGLang model builds its dense MLP layers whole under --moe-dense-tp-size 1 (0.5.10: the
# model files that call layers/communicator.py::enable_moe_dense_fully_dp; Kimi-K2.5's language model is
# DeepseekV3ForCausalLM)
DENSE_TP_ARCHS = frozenset((
    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "Glm4MoeForCausalLM",
    "GlmMoeDsaForCausalLM", "Glm4MoeLiteForCausalLM", "BailingMoEForCausalLM", "BailingMoeForCausalLM",
    "BailingMoeV2ForCausalLM", "Ernie4_5_MoeForCausalLM", "MiMoV2FlashForCausalLM", "SarvamMLAForCausalLM",
    "SarvamMoEForCausalLM", "LLaDA2MoeModelLM", "KimiK25ForConditionalGeneration", "MistralLarge3ForCausalLM"))


def check_sglang_args(req: FitRequest) -> None:
    """SGLang's expert-parallel placement flags, refused as SGLang's server_args.py refuses them."""
    sg = req.sglang
    if sg == SGLangArgs():
        return
    if req.engine != "sglang":
        raise InputError("--moe-a2a-backend, --ep-num-redundant-experts, --moe-dense-tp-size, --enable-dp-lm-head and "
                         f"--max-total-tokens are SGLang's; {req.engine} takes none of them (leave them out)")
    moe = req.spec.arch.moe if req.spec.arch is not None else None
    if sg.a2a_backend not in ("none", *A2A_BACKENDS):
        raise InputError(f"--moe-a2a-backend {sg.a2a_backend!r}: kvplan knows none, {', '.join(A2A_BACKENDS)}")
    if sg.dense_tp not in (None, 1):
        raise InputError(f"--moe-dense-tp-size {sg.dense_tp}: SGLang takes 1 only ('moe_dense_tp_size only support 1 "
                         "and None currently', server_args.py)")
    if (sg.whole_experts or sg.redundant_experts) and moe is None:
        raise InputError(f"{req.spec.name} has no routed experts: leave --moe-a2a-backend and "
                         "--ep-num-redundant-experts out")
    rules, version = req.engine_profile().rules, req.engine_profile().version
    for given, flag, rule, since in ((sg.whole_experts, "--moe-a2a-backend", "deepep", "0.4.5"),
                                     (sg.dense_tp is not None, "--moe-dense-tp-size", "moe_dense_tp", "0.4.6"),
                                     (sg.dp_lm_head, "--enable-dp-lm-head", "dp_lm_head", "0.4.7"),
                                     (sg.redundant_experts > 0, "--ep-num-redundant-experts", "dp_lm_head", "0.4.7")):
        if given and not getattr(rules, rule, False):
            raise InputError(f"SGLang {version} has no {flag} (from {since}); pin --engine sglang=={since} or later")
    arch = (req.spec.raw_config.get("architectures") or ["?"])[0]
    if sg.dense_tp is not None and arch not in DENSE_TP_ARCHS:
        raise InputError(f"--moe-dense-tp-size: SGLang's {arch} does not read it (the MoE models whose dense layers "
                         "do: DeepSeek-V2/V3/V3.2, GLM-4.5+ and GLM-5, Bailing, ERNIE 4.5, MiMo-V2, Sarvam, LLaDA2); "
                         "leave it out")
    if sg.dp_lm_head and not req.dp_attention:
        raise InputError("--enable-dp-lm-head needs --enable-dp-attention ('Please enable dp attention when setting "
                         "enable_dp_lm_head', server_args.py)")
    if sg.redundant_experts < 0:
        raise InputError(f"--ep-num-redundant-experts must be >= 0 (got {sg.redundant_experts})")
    if sg.redundant_experts and not (req.expert_parallel or sg.whole_experts):
        raise InputError("--ep-num-redundant-experts copies whole experts between expert-parallel ranks: add "
                         "--enable-expert-parallel or --moe-a2a-backend deepep")
    if sg.max_total_tokens is not None and sg.max_total_tokens < 1:
        raise InputError(f"--max-total-tokens must be >= 1 (got {sg.max_total_tokens})")


def check_request(req: FitRequest) -> None:
    from kvplan.core.engines import MAX_BLOCK_SIZE
    from kvplan.core.sizing import MAX_PARALLEL, check_positive

    check_positive("tensor parallel size", req.tp, MAX_PARALLEL)
    check_positive("pipeline parallel size", req.pp, MAX_PARALLEL)
    check_positive("data parallel size", req.dp, MAX_PARALLEL)
    check_positive("decode context parallel size", req.dcp, MAX_PARALLEL)
    if req.dcp > 1 and req.engine != "vllm":
        raise InputError(f"--decode-context-parallel-size is modelled for vLLM; {req.engine}'s is not yet: fit it "
                         "at -dcp 1, or with --engine vllm")
    if (req.dp > 1 or req.expert_parallel) and req.engine not in ("vllm", "sglang"):
        raise InputError(f"--data-parallel-size and --enable-expert-parallel are modelled for vLLM and SGLang; "
                         f"{req.engine}'s attention data parallelism is not modelled yet: fit it at -dp 1")
    if req.dp_attention:
        if req.engine != "sglang":
            raise InputError("--enable-dp-attention is SGLang's (attention DP inside the tp GPUs); vLLM's -dp runs "
                             "engines side by side: leave the flag out, or use --engine sglang")
        if req.dp < 2 or req.tp % req.dp:
            raise InputError(f"--enable-dp-attention needs --data-parallel-size above 1 dividing the tensor parallel "
                             f"size {req.tp} (SGLang: 1 < dp-size <= tp-size, attention at tp // dp); got {req.dp}")
    check_sglang_args(req)
    if req.block_size is not None:
        check_positive("block size", req.block_size, MAX_BLOCK_SIZE)
    util = req.gpu_memory_utilization
    if util is not None and not 0 < util <= 1:
        raise InputError(f"gpu memory utilization must be in (0, 1] (got {util}); e.g. 0.9")
    for name, value in (("max_model_len", req.max_model_len), ("max_num_seqs", req.max_num_seqs),
                        ("max_num_batched_tokens", req.max_num_batched_tokens), ("concurrency", req.concurrency)):
        if value is not None and value < 1:
            raise InputError(f"{name} must be >= 1 (got {value})")
    # SGLang's DP attention splits the heads over the attention-TP group, tp // dp (layers/dp_attention.py)
    heads_tp = req.tp // req.dp if req.dp_attention else req.tp
    if req.spec.num_attention_heads % heads_tp and req.engine in SERVING:
        raise InputError(f"{req.engine} needs tensor parallel size {heads_tp} to divide the "
                         f"{req.spec.num_attention_heads} attention heads; try tp = "
                         + ", ".join(str(d) for d in (1, 2, 4, 8, 16) if req.spec.num_attention_heads % d == 0))
