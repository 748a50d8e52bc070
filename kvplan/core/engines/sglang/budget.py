"""SGLang's memory budget: ``mem_fraction_static`` and the token pool (``max_total_num_tokens``).

Sources (sgl-project/sglang, python/sglang/srt/; details in docs/engine-research.md):
- ``server_args.py:_handle_gpu_memory_settings``: by GPU memory (MiB) a chunked-prefill size and a
  CUDA-graph batch size are chosen; reserved = 512 + 1.5 x max(chunk, 2048) + 2 x cuda_graph_max_bs
  + tp x pp / 8 x 1024 MiB, at least 10,240 MiB above 60 GiB; mem_fraction_static =
  round((memory - reserved) / memory, 3) (0.835 on an H100 at tp 1); 0.5.10 adds its piecewise CUDA graphs
  (``piecewise_reserve_mib``: 0.829 there) and, from 0.4.8, DP attention's gathered buffers.
- ``model_executor/model_runner_kv_cache_mixin.py``: rest = memory free after loading weights -
  memory free before loading x (1 - mem_fraction_static); max_total_num_tokens = rest // cell_size,
  cell_size = the KV bytes of one token over this rank's attention layers (the MLA latent is not
  divided by TP). Activations and CUDA graphs live in the (1 - mem_fraction_static) reserve.
- Hybrid SWA models split the pool: full_tokens = tokens x (F + S) / (F + r x S) with r =
  ``swa_full_tokens_ratio`` 0.8 (F, S: bytes per token of the full and sliding layers); mamba
  hybrids give r / (1 + r) of the rest (r = ``mamba_full_memory_ratio`` 0.9) to mamba states.
- KV-shared layers (Gemma 3n/4 ``num_kv_shared_layers``) still get pool buffers, sized as the layer they
  read (kvplan.core.engines.sglang.allocated_layers).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvplan.core.capacity import estimates
from kvplan.core.capacity.budget import Capacity, Components, EngineBudget, Setup, Stage, run_budget
from kvplan.core.capacity.common import FitRequest, FitResult, GiB, resolve_kv_dtype
from kvplan.core.capacity.context import ContextLimit, config_length, rope_factor, rope_type
from kvplan.core.engines import engine_for, get_engine
from kvplan.core.engines.sglang.pages import allocated_layers
from kvplan.core.engines.sglang.profiles import default_fraction
from kvplan.core.sizing import pp_stages
from kvplan.core.spec import AttentionLayer, LayerKind, LinearLayer, MLALayer
from kvplan.errors import InputError

MiB = 1 << 20
SWA_FULL_TOKENS_RATIO = 0.8
MAMBA_FULL_MEMORY_RATIO = 0.9


def prefill_defaults(memory_bytes: int, tp: int) -> tuple[int, int]:
    """SGLang's (chunked_prefill_size, cuda_graph_max_bs) by GPU memory (server_args.py)."""
    mem_mib = memory_bytes / MiB
    big = tp >= 4
    if mem_mib < 20 * 1024:
        return 2048, 8
    if mem_mib < 35 * 1024:
        return 2048, 80 if big else 24
    if mem_mib < 60 * 1024:
        return 4096, 160 if big else 32
    if mem_mib < 160 * 1024:
        return 8192, 512 if big else 256
    return 16384, 512


def default_mem_fraction_static(memory_bytes: int, tp: int, pp: int, dp_attention: int = 0,
                                piecewise_mib: float = 0, spec_mib: float = 0) -> float:
    mem_mib = memory_bytes / MiB
    chunk, graph_bs = prefill_defaults(memory_bytes, tp)
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp * pp / 8 * 1024
    if dp_attention:
        # the decode graphs of every attention DP rank gather its tokens: 3 MiB a batch size a rank, 1.5 more above
        # 300 (0.5.3 and 0.5.10: server_args.py::ServerArgs._handle_gpu_memory_settings, before the 10 GiB floor)
        reserved += graph_bs * dp_attention * 3 + (graph_bs * dp_attention * 1.5 if graph_bs > 300 else 0)
    reserved += piecewise_mib
    if mem_mib > 60 * 1024:
        reserved = max(reserved, 10240)
    reserved += spec_mib  # after the floor (0.5.3 and 0.5.10: server_args.py::_handle_gpu_memory_settings)
    return round((mem_mib - reserved) / mem_mib, 3)


# SGLang refuses a context_length above the one it derives unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 is
# set (0.4.0: python/sglang/srt/configs/model_config.py::ModelConfig.__init__; 0.5.10: the same file,
# ModelConfig._derive_context_length). Derived (0.4.0: srt/hf_transformers_utils.py::get_context_length; 0.5.10:
# srt/utils/hf_transformers_utils.py::get_context_length, unchanged): the first of these keys the text config
# has, times rope_scaling's factor unless rope_scaling names original_max_position_embeddings or rope_type llama3.
_SGLANG_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings")


def sglang_context_limit(context: dict) -> ContextLimit | None:
    """SGLang's derived context_length for a model's config keys (``ModelSpec.context_config``)."""
    key = next((k for k in _SGLANG_LENGTH_KEYS if config_length(context, k)), None)
    if key is None:
        return None
    length = config_length(context, key) or 0
    limit = ContextLimit(engine="SGLang", max_model_len=length, source=key,
                         override="SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")
    scaling = context.get("rope_scaling")
    if scaling is None and rope_factor(context.get("rope_parameters")) not in (None, 1.0):
        # transformers 5's name: whether SGLang's getattr(config, "rope_scaling") sees it depends on the version
        return dataclasses.replace(limit, max_model_len=0, source="RoPE factor in rope_parameters")
    if not isinstance(scaling, dict) or not scaling:
        return limit
    factor = rope_factor(scaling) or 1.0
    # rope_type: transformers copies an older config's `type` into it, which SGLang then reads
    if "original_max_position_embeddings" in scaling or rope_type(scaling) == "llama3" or factor == 1:
        return limit
    return dataclasses.replace(limit, max_model_len=int(factor * length), source=f"{key} x RoPE factor {factor:g}")


@dataclass(frozen=True, kw_only=True)
class _Pool:
    """One stage's token pools: the full-attention tokens bind the stages (ties: the smaller memory)."""

    stage: Stage
    full_tokens: int
    tokens: int
    mamba_slots: int | None
    # the bytes the pools take where --max-total-tokens caps them (the rest stays free); None: all of stage.kv_bytes
    capped_bytes: int | None = None
    profiled: int = 0  # the tokens the memory holds, before the cap


class SGLangBudget(EngineBudget):
    engine = "sglang"
    draft_in_pool = False  # the draft's KV is a pool of its own, sized by the target's token count

    def context_limit(self, req: FitRequest) -> ContextLimit | None:
        return sglang_context_limit(req.spec.context_config)

    def default_utilization(self, req: FitRequest, profile) -> float:
        return default_fraction(profile.rules, req.gpu.memory_bytes, req.tp, req.pp, default_mem_fraction_static,
                                dp_attention=req.dp if req.dp_attention else 0, piecewise_mib=piecewise_reserve_mib(req),
                                spec_mib=_spec_reserve_mib(req, profile.rules))

    def prepare(self, req: FitRequest, profile, utilization: float, max_model_len: int):
        arch = (req.spec.raw_config.get("architectures") or ["?"])[0]
        if req.dp_attention and arch not in DP_ATTENTION_ARCHS:
            raise InputError(f"{req.spec.name}: SGLang's {arch} splits attention over the whole tp, not the "
                             "attention-TP group (--enable-dp-attention is for the models whose attention calls "
                             "get_attention_tp_size: DeepSeek, Qwen2/3-MoE, GLM-4-MoE, gpt-oss, ...); use -dp alone "
                             "for replicas")
        if req.block_size:
            return get_engine("sglang", block_size=req.block_size), []
        engine, note = engine_for(req.spec, "sglang")  # NSA (sparse-attention) models: 64-token pages
        return engine, [note] if note else []

    def loaded_buffers(self, req: FitRequest, setup: Setup) -> int:
        return absorbed_mla_bytes(req)

    def activation(self, req: FitRequest, setup: Setup, last_stage: bool, *, first_stage: bool = True) -> int:
        # DP attention divides the chunked prefill over the ranks (server_args.py, 0.4.5 on: chunked_prefill_size
        # //= dp_size)
        chunk = prefill_defaults(req.gpu.memory_bytes, req.tp)[0] // (req.dp if req.dp_attention else 1)
        return estimates.activation_peak_bytes(
            req.spec, tokens=req.max_num_batched_tokens or chunk,
            max_num_seqs=req.max_num_seqs or 256, tp=req.tp,
            act_bytes=resolve_kv_dtype(req.spec, "auto").vector_bytes(1))

    def cuda_graph(self, req: FitRequest, setup: Setup) -> int:
        graph_bs = 0 if req.enforce_eager else prefill_defaults(req.gpu.memory_bytes, req.tp)[1]
        # batch sizes 1, 2, 4, then every 8 up to cuda_graph_max_bs: kvplan's approximation of SGLang's capture list
        num_graphs = len([b for b in (1, 2, 4, *range(8, graph_bs + 1, 8)) if b <= graph_bs])
        return estimates.cuda_graph_bytes(req.spec, num_graphs=num_graphs, tp=req.tp, pp=req.pp)

    def kv_memory(self, req: FitRequest, setup: Setup, memory_bytes: int, c: Components) -> int:
        # rest = free after the weights - free before them x (1 - mem_fraction_static); free before = total - non-torch
        return int((memory_bytes - c.non_torch) * setup.utilization) - c.weights - c.lora

    def _pool(self, req: FitRequest, setup: Setup, stage: Stage) -> _Pool:
        eng, dtype, tp = setup.engine, resolve_kv_dtype(req.spec, req.kv_dtype), attn_tp(req)
        layers, rest = allocated_layers(req.spec, stage.layers), stage.kv_bytes  # KV-shared layers: buffers too
        full_cell = sum(eng.slot_bytes(x, dtype, tp)[0] for x in layers  # a linear layer's: its parallel attention's
                        if not (isinstance(x, AttentionLayer) and x.kind is LayerKind.SLIDING))
        swa_cell = sum(eng.slot_bytes(x, dtype, tp)[0] for x in layers
                       if isinstance(x, AttentionLayer) and x.kind is LayerKind.SLIDING)
        # the Mamba state at the attention tp too (configs/qwen3_next.py: tp_world_size=get_attention_tp_size())
        mamba_per_req = sum(eng.linear_state_bytes(x, req.spec.dtype, tp)[0] for x in layers if isinstance(x, LinearLayer))
        kv_rest = rest
        mamba_slots = None
        if mamba_per_req and rest > 0:
            mamba_mem = int(rest * MAMBA_FULL_MEMORY_RATIO / (1 + MAMBA_FULL_MEMORY_RATIO))
            mamba_slots = mamba_mem // mamba_per_req
            kv_rest = rest - mamba_mem
        cell = full_cell + swa_cell
        tokens = max(0, kv_rest) // cell if cell else 0
        cap, capped_bytes, profiled = req.sglang.max_total_tokens, None, tokens
        if cap is not None and tokens > cap:
            # --max-total-tokens: min(profiled, cap), then the page floor (model_runner.py::init_memory_pool, 0.4.6;
            # 0.5.5: the same lines); the pools take the capped tokens' cells, the rest of the budget stays free
            tokens = cap
            capped_bytes = (rest - kv_rest) + cap // eng.block_size * eng.block_size * cell
        full_tokens = tokens
        if swa_cell and full_cell:
            full_tokens = int(tokens * (full_cell + swa_cell) / (full_cell + SWA_FULL_TOKENS_RATIO * swa_cell))
        return _Pool(stage=stage, full_tokens=full_tokens, tokens=tokens, mamba_slots=mamba_slots,
                     capped_bytes=capped_bytes, profiled=profiled)

    def capacity(self, req: FitRequest, setup: Setup, stages: list[Stage]) -> Capacity:
        spec, eng, frac, max_len = req.spec, setup.engine, setup.utilization, setup.max_model_len
        dtype = resolve_kv_dtype(spec, req.kv_dtype)
        pool = min((self._pool(req, setup, st) for st in stages), key=lambda p: (p.full_tokens, p.stage.kv_bytes))
        stage, full_tokens, mamba_slots, rest = pool.stage, pool.full_tokens, pool.mamba_slots, pool.stage.kv_bytes
        w, a, nt, cg = (stage.components.weights, stage.components.activation, stage.components.non_torch,
                        stage.components.cuda_graph)
        free_before = stage.memory_bytes - nt
        page = eng.block_size
        cap = req.sglang.max_total_tokens
        # a speculative draft's extra tokens are added to the profiled count before --max-total-tokens caps both
        # workers' pools (model_runner.py::init_memory_pool, 0.4.3 to 0.5.6)
        draft = _DraftPool.of(req, setup, eng, dtype, pool.profiled // page * page, cap=cap)
        tokens = pool.tokens // page * page if draft is None else draft.target_tokens
        # A request holds max_model_len tokens in the full pool and at most its window in the SWA pool.
        pooled = allocated_layers(spec, spec.layers)  # as SGLang allocates them (windows only for hybrid-SWA models)
        windows = [x.window for x in pooled if isinstance(x, AttentionLayer) and x.kind is LayerKind.SLIDING]
        full_layers = any(isinstance(x, MLALayer) or (isinstance(x, AttentionLayer) and x.kind is not LayerKind.SLIDING)
                          or (isinstance(x, LinearLayer) and x.holds_tokens) for x in pooled)
        window = max(windows) if windows else 0
        swa_pool = (int(full_tokens * SWA_FULL_TOKENS_RATIO) if full_layers else tokens) if windows else 0

        def request_fits(length: int) -> bool:
            return (not full_layers or full_tokens >= length) and (not windows or swa_pool >= min(length, window))

        limits = []
        if full_layers:
            limits.append(full_tokens / max_len)
        if windows:
            limits.append(swa_pool / min(window, max_len))
        if mamba_slots is not None:
            limits.append(float(mamba_slots))
        concurrency = min(limits) if limits and rest > 0 else 0.0
        lo, hi = 0, max_len  # the longest context one request can have, up to max_model_len (FitResult)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if request_fits(mid) else (lo, mid - 1)
        max_fit = lo if rest > 0 else 0
        reasons = []
        if cap is not None and rest > 0 and tokens == 0:
            reasons.append(f"--max-total-tokens {cap:,} floors to no page of {page} tokens: SGLang stops with 'Not "
                           f"enough memory' (model_runner.py::init_memory_pool); give --max-total-tokens {page} or "
                           "more")
        elif rest <= 0:
            reasons.append(f"weights {w / GiB:.2f} GiB exceed mem_fraction_static {frac} x {free_before / GiB:.2f} GiB "
                           f"= {free_before * frac / GiB:.2f} GiB (short by {-rest / GiB:.2f} GiB)")
        elif not request_fits(max_len) or (mamba_slots is not None and mamba_slots < 1):
            reasons.append(f"the token pools ({full_tokens:,} full, {swa_pool:,} sliding-window tokens) cannot hold "
                           f"one request of {max_len:,} tokens; the longest that fits: --max-model-len {max_fit}")
        notes = []
        if pool.capped_bytes is not None:
            notes.append(f"--max-total-tokens {req.sglang.max_total_tokens:,} caps the token pool (floored to pages of "
                         f"{page}): the memory would hold {pool.profiled:,} tokens; "
                         f"{(rest - pool.capped_bytes) / GiB:.2f} GiB of the budget stays free")
        reserve = stage.memory_bytes - max(0, rest) - w - nt
        if draft is not None and rest > 0:
            held = draft.bytes + stage.components.draft
            if held > reserve:  # allocated for certain once the pool is: the start runs out of memory there
                lower = max(0.0, frac - (held - reserve) / free_before)
                reasons.append(f"the speculative draft's pool ({draft.tokens:,} tokens, {draft.bytes / GiB:.2f} GiB"
                               f"{draft.extra_note}) and weights ({stage.components.draft / GiB:.2f} GiB) exceed the "
                               f"{1 - frac:.3f} reserve ({reserve / GiB:.2f} GiB): SGLang runs out of memory after "
                               f"the target's pool; set mem_fraction_static to {lower:.3f} or less")
            elif held + a + cg > reserve:
                notes.append(f"the reserve ({reserve / GiB:.2f} GiB) holds the speculative draft's pool and weights "
                             f"({held / GiB:.2f} GiB) but not also the estimated activation and CUDA graphs "
                             f"({(a + cg) / GiB:.2f} GiB): SGLang may run out of memory; lower mem_fraction_static")
        elif reserve < a + cg:
            notes.append(f"the {1 - frac:.3f} reserve ({reserve / GiB:.2f} GiB) is smaller than the estimated "
                         f"activation + CUDA graphs ({(a + cg) / GiB:.2f} GiB): SGLang may run out of memory; lower "
                         "mem_fraction_static")
        kv_cells = sum(eng.slot_bytes(x, dtype, attn_tp(req))[0] for x in allocated_layers(spec, stage.layers))
        return Capacity(
            stage=stage, max_model_len=max_len,  # the token pool and any mamba pool
            kv_cache_bytes=max(0, rest) if pool.capped_bytes is None else pool.capped_bytes,
            block_size=page, page_size_bytes=page * kv_cells, num_blocks=tokens // page, kv_cache_tokens=tokens,
            max_concurrency=concurrency, max_model_len_fit=max_fit, reasons=tuple(reasons),
            settings={"mem_fraction_static": frac, "page_size": page,
                      **({"draft_pool_tokens": draft.tokens, "draft_pool_bytes": draft.bytes} if draft else {})},
            notes=tuple(notes))

    def concurrency_reason(self, req: FitRequest, max_model_len: int, concurrency: float) -> str:
        return (f"{req.concurrency} concurrent requests of {max_model_len:,} tokens do not fit the token pools; "
                f"{concurrency:.2f} do")


def _spec_reserve_mib(req: FitRequest, rules) -> int:  # type: ignore[no-untyped-def]
    """What the default mem_fraction_static holds back for a speculative draft (SGLangRules.spec_reserve_mib)."""
    spec = req.sglang_spec
    if spec is None or spec.algorithm == "NGRAM":
        return 0
    eagle, standalone = rules.spec_reserve_mib
    return standalone if spec.algorithm == "STANDALONE" else eagle


@dataclass(frozen=True, kw_only=True)
class _DraftPool:
    """The EAGLE draft's token pool beside the target's, by release (SGLangRules.spec_pool)."""

    target_tokens: int  # the target's pool as SGLang logs it (max_total_num_tokens)
    tokens: int  # the draft's pool
    bytes: int  # what the pools hold beyond the target's profiled budget: the draft's pool and the target's extra
    extra_note: str = ""

    @classmethod
    def of(cls, req: FitRequest, setup: Setup, eng, dtype, profiled: int,  # type: ignore[no-untyped-def]
           cap: int | None = None) -> "_DraftPool | None":
        spec = req.sglang_spec
        if spec is None or spec.algorithm == "NGRAM" or not spec.drafter.layers:
            return None
        tp = attn_tp(req)
        draft_cell = sum(eng.slot_bytes(x, dtype, tp)[0] for x in spec.drafter.layers)
        target_cell = sum(eng.slot_bytes(x, dtype, tp)[0] for x in allocated_layers(req.spec, req.spec.layers))
        how = setup.profile.rules.spec_pool
        # max_running_requests where it is unset: 48 for speculative decoding from 0.4.5 (server_args.py), before
        # SGLang's own clamp of the profiled tokens (SGLangRules.spec_requests)
        own = min(max(int(profiled / setup.max_model_len * 512), 2048), 4096)
        reqs = req.max_num_seqs or setup.profile.rules.spec_requests or own
        def capped(n: int) -> int:  # --max-total-tokens caps each worker's pool (the draft's too)
            return min(n, cap) if cap is not None else n
        if how == "target":
            n = capped(profiled)
            return cls(target_tokens=n, tokens=n, bytes=n * draft_cell)
        if how == "draft_extra":  # 0.4.3: the draft's pool = profiled + requests x steps + 100
            n = capped(profiled + reqs * spec.num_steps + 100)
            return cls(target_tokens=capped(profiled), tokens=n, bytes=n * draft_cell)
        n = capped(profiled + reqs * spec.tokens_a_request + 100)  # both pools, 0.4.4 to 0.5.6
        extra = max(0, n - profiled)
        return cls(target_tokens=n, tokens=n, bytes=n * draft_cell + extra * target_cell,
                   extra_note=f", and the target's {extra:,} tokens beyond its profiled {profiled:,}" if extra else "")


# SGLang's multimodal architectures (0.5.10: configs/model_config.py::multimodal_model_archs), and those whose
# multimodal side it leaves off unless --enable-multimodal (ModelConfig.__init__, mm_disabled_models)
MULTIMODAL_ARCHS = frozenset((
    "CLIPModel", "DeepseekVL2ForCausalLM", "Ernie4_5_VLMoeForConditionalGeneration", "Gemma3ForConditionalGeneration",
    "Gemma3nForConditionalGeneration", "Glm4vForConditionalGeneration", "Glm4vMoeForConditionalGeneration",
    "GlmOcrForConditionalGeneration", "GlmAsrForConditionalGeneration", "Grok1VForCausalLM", "Grok1AForCausalLM",
    "LlavaLlamaForCausalLM", "Llama4ForConditionalGeneration", "LlavaMistralForCausalLM", "LlavaQwenForCausalLM",
    "LlavaForConditionalGeneration", "LlavaVidForCausalLM", "Lfm2VlForConditionalGeneration",
    "LightOnOCRForConditionalGeneration", "MiniCPMO", "MiniCPMV", "Mistral3ForConditionalGeneration",
    "MultiModalityCausalLM", "MllamaForConditionalGeneration", "NemotronH_Nano_VL_V2", "PixtralForConditionalGeneration",
    "Qwen2AudioForConditionalGeneration", "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
    "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration", "Qwen3OmniMoeForConditionalGeneration", "KimiVLForConditionalGeneration",
    "InternVLChatModel", "InternS1ForConditionalGeneration", "InternS1ProForConditionalGeneration", "Phi4MMForCausalLM",
    "WhisperForConditionalGeneration", "Step3VLForConditionalGeneration", "POINTSV15ChatModel", "DotsVLMForCausalLM",
    "DotsOCRForCausalLM", "Sarashina2VisionForCausalLM", "NVILAForConditionalGeneration",
    "NVILALiteForConditionalGeneration", "DeepseekOCRForCausalLM", "JetVLMForConditionalGeneration",
    "PaddleOCRVLForConditionalGeneration", "MiDashengLMModel", "StepVLForConditionalGeneration",
    "KimiK25ForConditionalGeneration"))
MULTIMODAL_OFF_BY_DEFAULT = ("Gemma3ForConditionalGeneration", "Llama4ForConditionalGeneration",
                             "Step3VLForConditionalGeneration")


def sglang_multimodal(raw_config: dict) -> bool:
    """SGLang's ModelConfig.is_multimodal with its defaults (0.5.10): a listed architecture, or a config with a text,
    vision or audio sub-config; never for the architectures whose multimodal side is off by default."""
    archs = raw_config.get("architectures") or [""]
    if archs[0] in MULTIMODAL_OFF_BY_DEFAULT:
        return False
    return (any(a in MULTIMODAL_ARCHS for a in archs)
            or any(k in raw_config for k in ("text_config", "vision_config", "audio_config")))


# Architectures whose piecewise CUDA graphs SGLang turns off (0.5.10: configs/model_config.py::
# piecewise_cuda_graph_disabled_model_archs)
PIECEWISE_OFF_ARCHS = ("DeepseekV32ForCausalLM", "Qwen3NextForCausalLM", "GlmMoeDsaForCausalLM",
                       "BailingMoeV2_5ForCausalLM", "LLaDAModelLM")


def piecewise_capture_sizes(max_tokens: int) -> list[int]:
    """The token counts SGLang captures piecewise graphs at (0.5.10: server_args.py::
    _generate_piecewise_cuda_graph_tokens)."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, max_tokens + 1, 512)]
    return [s for s in sizes if s <= max_tokens]


def piecewise_reserve_mib(req: FitRequest) -> float:
    """What 0.5.10's default mem_fraction_static holds back for piecewise CUDA graphs (server_args.py::
    _handle_gpu_memory_settings): 8 MiB a capture size up to chunked_prefill_size, or 1.5 GiB for an MLA model;
    none where _handle_piecewise_cuda_graph turns them off: DP attention, pp > 1, a multimodal model as SGLang
    reads it (sglang_multimodal), a listed architecture, any --speculative-algorithm (NGRAM too) and LoRA (an
    all-to-all MoE backend and the rest are not modelled). The sizes go up to chunked_prefill_size
    (--max-num-batched-tokens, else the default)."""
    spec = req.spec
    archs = spec.raw_config.get("architectures") or []
    if req.dp_attention or req.pp > 1 or sglang_multimodal(spec.raw_config) or any(
            a in PIECEWISE_OFF_ARCHS for a in archs) or req.sglang_spec is not None or req.lora is not None:
        return 0
    if any(isinstance(x, MLALayer) for x in spec.layers):
        return 1.5 * 1024
    chunk = req.max_num_batched_tokens or prefill_defaults(req.gpu.memory_bytes, req.tp)[0]
    return len(piecewise_capture_sizes(chunk)) * 8


# The architectures whose SGLang model splits attention over the attention-TP group (get_attention_tp_size), which
# DP attention needs: the EntryClass of every 0.5.10 model file that calls it, and Kimi-K2.5 (a DeepseekV3ForCausalLM
# inside, models/kimi_k25.py); the others split attention over the whole tp (models/llama.py, mixtral.py)
DP_ATTENTION_ARCHS = frozenset((
    "BailingMoEForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM", "BailingMoeV2_5ForCausalLM",
    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "Exaone4ForCausalLM",
    "ExaoneMoEForCausalLM", "FalconH1ForCausalLM", "Glm4MoeForCausalLM", "GlmMoeDsaForCausalLM",
    "Glm4MoeLiteForCausalLM", "GptOssForCausalLM", "InternS1ProForConditionalGeneration", "KimiLinearForCausalLM",
    "LLaDA2MoeModelLM", "Llama4ForCausalLM", "LongcatFlashForCausalLM", "MiMoV2FlashForCausalLM", "PhiMoEForCausalLM",
    "Qwen2MoeForCausalLM", "Qwen3ForCausalLM", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
    "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM", "Qwen3VLForConditionalGeneration", "SarvamMLAForCausalLM",
    "SarvamMoEForCausalLM", "SDARForCausalLM", "SDARMoeForCausalLM", "Step3VLForConditionalGeneration",
    "Step3p5ForCausalLM", "KimiK25ForConditionalGeneration"))


# The architectures whose SGLang model is DeepseekV2ForCausalLM or a subclass (models/deepseek_v2.py, glm4_moe.py,
# glm4_moe_lite.py, mistral_large_3.py; Kimi-K2.5's language model, kimi_k25.py), or LongCat-Flash, whose
# post_load_weights absorbs kv_b_proj into w_kc and w_vc
MLA_ABSORBING_ARCHS = frozenset((
    "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM",
    "Glm4MoeLiteForCausalLM", "MistralLarge3ForCausalLM", "KimiK25ForConditionalGeneration",
    "LongcatFlashForCausalLM"))  # models/longcat_flash.py::LongcatFlashForCausalLM.post_load_weights: both MLA blocks


def absorbed_mla_bytes(req: FitRequest) -> int:
    """SGLang's absorbed MLA matrices on one GPU of the most loaded stage: each MLA layer's w_kc [heads, qk_nope,
    kv_lora] and w_vc [heads, kv_lora, v_head], new contiguous copies beside kv_b_proj, which stays for the prefill
    path, at the attention TP's heads (models/deepseek_v2.py::DeepseekV2ForCausalLM.post_load_weights, 0.4.6 to
    0.5.5; 0.5.10: models/deepseek_common/deepseek_weight_loader.py). In bf16 (the model's dtype, or an FP8
    checkpoint's kv_b_proj dequantized), in FP8 for an FP8 block checkpoint before 0.4.7
    (SGLangRules.mla_absorbed_fp8). An MTP draft's layer adds one more (not counted)."""
    arch = (req.spec.raw_config.get("architectures") or ["?"])[0]
    if arch not in MLA_ABSORBING_ARCHS:
        return 0
    fp8 = (req.spec.raw_config.get("quantization_config") or {}).get("quant_method") == "fp8"
    elt = 1 if fp8 and getattr(req.engine_profile().rules, "mla_absorbed_fp8", False) else 2
    tp = attn_tp(req)
    per_layer = [-(-x.num_heads // tp) * x.kv_lora_rank * (x.qk_nope_head_dim + x.v_head_dim) * elt
                 if isinstance(x, MLALayer) else 0 for x in req.spec.layers]
    return max(sum(per_layer[r.start:r.stop]) for r in pp_stages(len(per_layer), req.pp))


def attn_tp(req: FitRequest) -> int:
    """The GPUs one attention layer is split over: tp, or tp // dp with DP attention, whose KV heads a rank holds
    (model_runner_kv_cache_mixin.py::get_cell_size_per_token: get_num_kv_heads(attn_tp); MLA's latent whole;
    layers/dp_attention.py::compute_dp_attention_world_info, 0.5.10)."""
    return req.tp // req.dp if req.dp_attention else req.tp


SGLANG_BUDGET = SGLangBudget()


def fit_sglang(req: FitRequest) -> FitResult:
    return run_budget(req, SGLANG_BUDGET)
