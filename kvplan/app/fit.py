"""``kvplan fit``: a deployment's memory budget under an engine's rules, whether it is borderline, and when it
does not fit, the single changes that would (what-if) or else the fewest GPUs that do."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvplan.errors import InputError

if TYPE_CHECKING:  # the capacity core is imported when a fit runs, not when `kvplan size` starts
    from kvplan.core.capacity.common import FitResult, SGLangArgs
    from kvplan.core.capacity.fit import FewestGPUs, WhatIf
    from kvplan.core.gpus import GPUSpec
    from kvplan.io.hub import HubConfig
    from kvplan.io.speculative import SpeculativeSettings


@dataclass(frozen=True, kw_only=True)
class Memory:
    """Measured memory per GPU in bytes (e.g. from a startup log), each replacing kvplan's estimate; and a KV
    memory that replaces the engine's budget (vLLM --kv-cache-memory-bytes). None: estimated."""

    kv_cache: int | None = None
    weights: int | None = None
    activation: int | None = None
    non_torch: int | None = None
    cuda_graph: int | None = None


@dataclass(frozen=True, kw_only=True)
class SGLangFlags:
    """SGLang's --speculative-algorithm and its steps as given (None: SGLang's auto_choose_speculative_params)."""

    algorithm: str
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    draft_model: str | None = None  # --speculative-draft-model-path: an EAGLE / EAGLE-3 head's checkpoint


@dataclass(frozen=True, kw_only=True)
class LoRAFlags:
    """--enable-lora and its settings as given (None: the engine's default)."""

    max_loras: int | None = None  # vLLM --max-loras (default 1), SGLang --max-loras-per-batch (default 8)
    max_rank: int | None = None  # --max-lora-rank (default 16)
    target_modules: tuple[str, ...] = ()  # --lora-target-modules (default: vLLM every module; SGLang all-linear)


# The engines' defaults: vLLM config/lora.py (max_loras 1, max_lora_rank 16); SGLang server_args.py 0.5.10
# (max_loras_per_batch 8; the rank and modules come from the adapters at --lora-paths, which kvplan does not read)
_LORA_DEFAULTS = {"vllm": (1, 16), "sglang": (8, 16)}


def _lora(engine: str, flags: LoRAFlags | None):  # type: ignore[no-untyped-def]
    """The LoRA slots the engine allocates for these flags (kvplan.core.lora), and a note; None: no LoRA."""
    if flags is None:
        return None, None
    from kvplan.core.lora import LoRASettings, targets

    if engine not in _LORA_DEFAULTS:
        raise InputError(f"--enable-lora: {engine}'s LoRA memory is not modelled (vLLM and SGLang are)")
    n, r = _LORA_DEFAULTS[engine]
    chosen = targets(list(flags.target_modules)) or (targets(["all-linear"]) if engine == "sglang" else None)
    settings = LoRASettings(max_loras=n if flags.max_loras is None else flags.max_loras,
                            max_rank=r if flags.max_rank is None else flags.max_rank, targets=chosen)
    modules = "every module the engine supports" if chosen is None else ", ".join(sorted(chosen))
    return settings, (f"LoRA: {settings.max_loras} slot{'s' if settings.max_loras > 1 else ''} of rank "
                      f"{settings.max_rank} on {modules}, allocated at start beside the weights")


@dataclass(frozen=True, kw_only=True)
class Speculative:
    """A drafter's share of the start: its KV layers beside the model's (bytes a token on one GPU) and its weights."""

    method: str
    num_speculative_tokens: int
    draft_kv_layers: int
    model_kv_layers: int
    draft_kv_bytes_per_token: int  # one GPU, in the KV dtype (the model's layers' figure beside it)
    model_kv_bytes_per_token: int
    draft_weights_bytes: int  # one GPU of the last stage


@dataclass(frozen=True, kw_only=True)
class FitReport:
    model: str  # the spec's name
    result: FitResult  # borderline marked, the engine choice's and the config's notes first
    alternatives: tuple[WhatIf, ...]  # single changes fitted with the same rules (empty when it fits)
    fewest: FewestGPUs | None  # when nothing else fits: the fewest tp x pp GPUs that do
    hub: HubConfig | None = None
    speculative: Speculative | None = None  # what --speculative-config's drafter adds (None: none asked)

    @property
    def fits(self) -> bool:
        return self.result.fits


def fit_model(model: str, *, gpu: str | None = None, gpu_memory: str | None = None, engine: str = "vllm",
              gpu_memory_utilization: float | None = None, max_model_len: int | None = None,
              allow_long_max_model_len: bool = False, tp: int = 1, pp: int = 1, dp: int = 1,
              expert_parallel: bool = False, dcp: int = 1, dp_attention: bool = False, kv_cache_dtype: str = "auto",
              weight_dtype: str = "auto", block_size: int | None = None, max_num_seqs: int | None = None,
              max_num_batched_tokens: int | None = None, memory: Memory = Memory(), enforce_eager: bool = False,
              num_gpu_blocks_override: int | None = None, disable_hybrid_kv_cache_manager: bool = False,
              mamba_cache_mode: str = "none", num_speculative_tokens: int = 0, attention_backend: str | None = None,
              moe_backend: str = "auto", concurrency: int | None = None, async_scheduling: bool | None = None,
              mm_limits: dict[str, int] | None = None, speculative: SpeculativeSettings | None = None,
              lora: LoRAFlags | None = None, sglang_speculative: SGLangFlags | None = None,
              sglang: SGLangArgs | None = None, fetch: bool | None = None, revision: str | None = None) -> FitReport:
    """Fit ``model`` on ``tp`` x ``pp`` GPUs named ``gpu`` or of ``gpu_memory`` (e.g. ``24GiB``; comma-separated
    when they differ), ``dp`` such engines side by side (vLLM data parallelism; ``expert_parallel``: whole experts
    over the dp x tp GPUs), under ``engine`` (``NAME`` or ``NAME==VERSION``). ``max_model_len`` -1 is vLLM's auto-fit
    (the longest that fits); every other setting left None takes the engine release's default (``async_scheduling``:
    vLLM's, on from 0.14, which sizes sliding-window layers from 0.26)."""
    from kvplan.core.capacity.common import FitRequest
    from kvplan.core.capacity.fit import FITTERS, fewest_gpus, fit, what_if, with_borderline
    from kvplan.core.profiles import parse_engine
    from kvplan.io.models import resolve_model

    choice = parse_engine(engine, allowed=tuple(FITTERS))
    gpu_spec, per_rank = _gpus(gpu, gpu_memory)
    auto_fit = max_model_len == -1
    if auto_fit and choice.name != "vllm":
        raise InputError(f"--max-model-len -1 (auto-fit) is vLLM's; {choice.name} takes a length")
    if moe_backend != "auto" and choice.name != "vllm":
        raise InputError(f"--moe-backend is vLLM's; {choice.name} takes none (leave it out)")
    resolved = resolve_model(model, fetch=fetch, revision=revision)
    spec = resolved.spec
    ext = extras(spec, choice, speculative=speculative, sglang_speculative=sglang_speculative, lora=lora, pp=pp,
                 fetch=fetch)
    if ext.num_speculative_tokens is not None:
        num_speculative_tokens = ext.num_speculative_tokens  # vLLM's Mamba layers hold a block for each
    req = FitRequest(
        spec=spec, gpu=gpu_spec, engine=choice.name, profile=choice.profile, tp=tp, pp=pp, dp=dp,
        expert_parallel=expert_parallel, dcp=dcp, dp_attention=dp_attention, kv_dtype=kv_cache_dtype,
        weight_dtype=weight_dtype, gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=None if auto_fit else max_model_len, block_size=block_size, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, kv_cache_memory_bytes=memory.kv_cache,
        weights_memory=memory.weights, activation_memory=memory.activation, non_torch_memory=memory.non_torch,
        cuda_graph_memory=memory.cuda_graph, enforce_eager=enforce_eager, concurrency=concurrency,
        gpu_memory_per_rank=per_rank, num_gpu_blocks_override=num_gpu_blocks_override,
        disable_hybrid_kv_cache_manager=disable_hybrid_kv_cache_manager, mamba_cache_mode=mamba_cache_mode,
        num_speculative_tokens=num_speculative_tokens, attention_backend=attention_backend, moe_backend=moe_backend,
        auto_fit_max_model_len=auto_fit, allow_long_max_model_len=allow_long_max_model_len,
        async_scheduling=async_scheduling, mm_limits=tuple(sorted((mm_limits or {}).items())),
        drafter=ext.drafter, lora=ext.lora, sglang_spec=ext.sglang_spec, **({"sglang": sglang} if sglang else {}),
    )
    result = with_borderline(req, fit(req))
    head = (choice.note,) if choice.note else ()
    result = dataclasses.replace(result, notes=(*head, *spec.notes, *ext.notes, *result.notes,
                                                *_without_extras(req, result), *_parallel_notes(req, result)))
    alternatives = what_if(req, result) if not result.fits else []
    return FitReport(model=spec.name, result=result, alternatives=tuple(alternatives),
                     fewest=fewest_gpus(req, result, alternatives), hub=resolved.hub,
                     speculative=_speculative(req, result))


def _speculative(req, result: FitResult) -> Speculative | None:  # type: ignore[no-untyped-def]
    """The drafter's KV bytes a token beside the model's (the ideal engine's figure at the start's tp and KV dtype)."""
    d = req.drafter
    if d is None:
        return None
    from kvplan.core.engines import get_engine
    from kvplan.core.sizing import size_kv
    from kvplan.core.spec import CompressedLayer

    def per_token(layers) -> int:  # type: ignore[no-untyped-def]
        if not layers:
            return 0
        part = dataclasses.replace(req.spec, layers=tuple(layers))
        if req.spec.has_layer(CompressedLayer):
            # DeepSeek-V4: vLLM's fp8_ds_mla rows, sized as fp8 by the ideal engine; a token's share of a sequence of
            # max_model_len (its windows and compressor state are per sequence, not per token)
            n = max(1, result.max_model_len)
            return size_kv(part, get_engine("ideal"), batch=1, seq_len=n, kv_dtype="fp8", tp=req.tp).per_gpu_bytes // n
        return size_kv(part, get_engine("ideal"), batch=1, seq_len=1, kv_dtype=result.kv_dtype, tp=req.tp).per_gpu_bytes

    held = [layer for layer in req.spec.layers if layer.holds_tokens]
    return Speculative(method=d.method, num_speculative_tokens=d.num_speculative_tokens, draft_kv_layers=d.kv_layers,
                       model_kv_layers=len(held), draft_kv_bytes_per_token=per_token(d.layers),
                       model_kv_bytes_per_token=per_token(held),
                       draft_weights_bytes=result.breakdown.draft_weights)


@dataclass(frozen=True, kw_only=True)
class Extras:
    """What a start loads beside the model: a speculative drafter and LoRA slots, as the engine builds them."""

    drafter: Any = None  # kvplan.core.spec_decode.Drafter
    sglang_spec: Any = None  # kvplan.core.spec_decode.SGLangSpeculative
    lora: Any = None  # kvplan.core.lora.LoRASettings
    num_speculative_tokens: int | None = None  # vLLM: the Mamba layers' extra state blocks (None: as given)
    notes: tuple[str, ...] = ()


def extras(spec, choice, *, speculative=None, sglang_speculative=None, lora=None, pp: int = 1,  # type: ignore[no-untyped-def]
           fetch: bool | None = None) -> Extras:
    """The drafter (vLLM --speculative-config, SGLang --speculative-algorithm) and the LoRA slots for ``choice``'s
    engine; each engine's flag refused by the other."""
    if speculative is not None and choice.name != "vllm":
        hint = "; SGLang takes --speculative-algorithm" if choice.name == "sglang" else " (not modelled yet)"
        raise InputError(f"--speculative-config is vLLM's{hint}")
    if sglang_speculative is not None and choice.name != "sglang":
        raise InputError("--speculative-algorithm is SGLang's; vLLM takes --speculative-config")
    drafter, sglang_spec, tokens = make_drafter(spec, choice.profile, speculative, pp=pp, fetch=fetch), None, None
    if drafter is not None:
        tokens = drafter.num_speculative_tokens
    if sglang_speculative is not None:
        from kvplan.core.spec_decode import sglang_drafter

        _sglang_spec_release(choice)
        f = sglang_speculative
        if f.algorithm.upper() == "EAGLE3" and not getattr(choice.profile.rules, "eagle3", True):
            raise InputError(f"SGLang {choice.profile.version} has no EAGLE3 (from 0.4.5); pin --engine "
                             "sglang==0.4.5 or later")
        head = None
        if f.draft_model is not None:
            from kvplan.io.models import resolve_model

            head = resolve_model(f.draft_model, fetch=fetch).spec
        sglang_spec = sglang_drafter(spec, f.algorithm, num_steps=f.num_steps, topk=f.eagle_topk,
                                     num_draft_tokens=f.num_draft_tokens, head=head)
        drafter = sglang_spec.drafter
    settings, lora_note = _lora(choice.name, lora)
    unpinned = (f"SGLang {SGLANG_SPEC_REWRITTEN} and later count the draft in the static budget: these are the rules "
                "to 0.5.13 (pin --engine sglang==X.Y.Z)") if sglang_spec is not None and not choice.asked else None
    notes = tuple(n for n in (drafter.note if drafter is not None else None, unpinned, lora_note) if n)
    return Extras(drafter=drafter, sglang_spec=sglang_spec, lora=settings, num_speculative_tokens=tokens,
                  notes=notes)


# SGLang 0.5.14 counts the draft's weights and KV in the static budget (pool_configurator.py: cell x (1 + D / L)) and
# drops the draft's reserve (docs/research/spec-decode-lora.md 2.2, 2.3); kvplan's SGLang rules are read through 0.5.10
SGLANG_SPEC_REWRITTEN = "0.5.14"


def _sglang_spec_release(choice) -> None:  # type: ignore[no-untyped-def]
    """Refuse a pinned SGLang release whose draft budget kvplan has not read."""
    from kvplan.core.profiles import Version

    if choice.asked and Version.parse(choice.asked) >= Version.parse(SGLANG_SPEC_REWRITTEN):
        raise InputError(f"--speculative-algorithm with SGLang {choice.asked}: from {SGLANG_SPEC_REWRITTEN} SGLang "
                         "counts the draft in the static budget (cell x (1 + draft layers / layers)), which kvplan's "
                         "SGLang rules (read through 0.5.10) do not; plan with --engine sglang==0.5.13 or earlier")


def _without_extras(req, result: FitResult) -> tuple[str, ...]:  # type: ignore[no-untyped-def]
    """What the same GPUs hold without the drafter and the LoRA slots: the price of each, in requests."""
    drafted = req.drafter is not None and bool(req.drafter.layers)  # ngram and suffix load nothing
    if not drafted and req.lora is None:
        return ()
    from kvplan.core.capacity.fit import fit
    from kvplan.errors import KvplanError

    what = " and ".join(w for w, on in (("the draft", drafted), ("the LoRA slots", req.lora is not None)) if on)
    try:
        bare = fit(dataclasses.replace(req, drafter=None, sglang_spec=None, lora=None, concurrency=None,
                                       num_speculative_tokens=0 if req.sglang_spec is None and req.drafter is not None
                                       else req.num_speculative_tokens))
    except KvplanError:
        return ()
    return (f"without {what}: {bare.kv_cache_tokens:,} KV cache tokens and {bare.max_concurrency:.2f} requests of "
            f"{bare.max_model_len:,} tokens at once (here {result.kv_cache_tokens:,} and "
            f"{result.max_concurrency:.2f})",)


# The MTP modules that build an LM head of their own (shared_head.head) before vLLM 0.16.0 took the target's: 0.14.0
# model_executor/models/deepseek_mtp.py, glm4_moe_mtp.py, longcat_flash_mtp.py and mimo_mtp.py
MTP_OWN_HEAD_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32", "glm4_moe", "longcat_flash", "mimo"})


def make_drafter(spec, profile, speculative, *, pp: int = 1, fetch: bool | None = None):  # type: ignore[no-untyped-def]
    """The drafter vLLM ``profile``'s release builds for --speculative-config (kvplan.core.spec_decode); None: none."""
    if speculative is None:
        return None
    from kvplan.core.spec_decode import drafter, head_drafter

    if speculative.method in ("eagle", "eagle3") and speculative.model:
        from kvplan.io.models import resolve_model

        return head_drafter(spec, speculative.method, speculative.num_speculative_tokens,
                            resolve_model(speculative.model, fetch=fetch).spec, pp=pp)
    # an engine without releases (size's ideal) keeps the newest rule: the target's LM head
    own_head = (profile is not None and not getattr(profile.rules, "mtp_shares_head", True)
                and spec.model_type in MTP_OWN_HEAD_TYPES)
    return drafter(spec, speculative.method, speculative.num_speculative_tokens, mtp_own_head=own_head)


def _gpus(gpu: str | None, gpu_memory: str | None) -> tuple[GPUSpec, tuple[int, ...] | None]:
    """The GPU to plan with, and each rank's memory when ``gpu_memory`` lists several (vLLM plans every rank
    with the smallest: the GPU is that one)."""
    from kvplan.io.gpus import get_gpu
    from kvplan.io.units import parse_size

    if gpu_memory is None or "," not in gpu_memory:
        return get_gpu(gpu, memory=gpu_memory), None
    parts = [part.strip() for part in gpu_memory.split(",")]
    per_rank = tuple(parse_size(part, what="--gpu-memory") for part in parts)
    smallest = min(parts, key=lambda part: parse_size(part, what="--gpu-memory"))
    return get_gpu(gpu, memory=smallest), per_rank


def _parallel_notes(req, result: FitResult) -> tuple[str, ...]:  # type: ignore[no-untyped-def]
    """What data parallelism gives: the engines or attention groups side by side, or for an MoE or MLA model served
    at tp > 1, what the engine's data parallelism (vLLM -dp with expert parallel, SGLang's DP attention) would hold
    on the same GPUs."""
    r = result
    moe = req.spec.arch is not None and req.spec.arch.moe is not None
    notes = []
    if req.expert_parallel and not moe:
        notes.append("--enable-expert-parallel: ignored, the model has no routed experts")
    if r.dp > 1:
        ep = (f"; the routed experts whole over {r.expert_parallel_size} GPUs (expert parallel)"
              if r.expert_parallel_size else "")
        every = (f"the figures are one {'group' if r.dp_attention else 'engine'}'s, all {r.dp} hold "
                 f"{r.all_kv_cache_tokens:,} tokens and {r.all_concurrency:.0f} requests of {r.max_model_len:,} "
                 f"tokens at once, each request on one{ep}")
        if r.dp_attention:
            notes.append(f"data-parallel attention: {r.dp} groups of {r.tp // r.dp} GPU(s) inside the {r.tp}, each its "
                         f"own token pool (SGLang layers/dp_attention.py); {every}; the default mem_fraction_static "
                         "holds back their gathered decode buffers (server_args.py)")
        elif r.engine == "sglang":
            notes.append(f"data parallel: {r.dp} replicas of {r.tp * r.pp} GPU(s) behind SGLang's router, each its "
                         f"own token pool; {every}")
        else:
            notes.append(f"data parallel: {r.dp} engines of {r.tp * r.pp} GPU(s), each its own KV pool and scheduler "
                         f"(vLLM v1/engine/core.py, one EngineCore a DP rank); {every}")
        if moe and r.engine == "vllm":
            notes.append(_NOT_MODELLED)
        return tuple(notes)
    mla = any(layer.kind.value == "mla" for layer in req.spec.layers)
    if req.tp < 2 or req.pp > 1 or not (moe or (mla and req.engine == "sglang")):
        return tuple(notes)
    if req.engine == "vllm":
        flags, alt = (f"-dp {req.tp} -tp 1 --enable-expert-parallel",
                      dataclasses.replace(req, tp=1, dp=req.tp, expert_parallel=True))
    elif req.engine == "sglang":
        flags, alt = f"-dp {req.tp} --enable-dp-attention", dataclasses.replace(req, dp=req.tp, dp_attention=True)
    else:
        return tuple(notes)
    # the user's settings carry over (utilization included); measured per-GPU figures do not
    alt = dataclasses.replace(alt, weights_memory=None, kv_cache_memory_bytes=None, concurrency=None)
    return (*notes, *_instead(flags, alt, r))


# vLLM's profile run and non-torch memory are estimated as for one engine at its tp: the tokens the MoE layers gather
# from every DP rank and the all-to-all buffers between them are not (docs/engines.md, "Data parallel")
_NOT_MODELLED = ("data parallel with routed experts: the activation and non-torch figures are one engine's at its "
                 "tp; the tokens the MoE layers gather from every rank and the all-to-all buffers are not counted "
                 "(give --activation-memory and --non-torch-memory from a start)")


def _instead(flags: str, alt, r: FitResult) -> tuple[str, ...]:  # type: ignore[no-untyped-def]
    from kvplan.core.capacity.fit import fit
    from kvplan.errors import KvplanError

    try:
        a = fit(alt)
    except KvplanError:  # the engine does not take it for this model (a note would only say so)
        return ()
    here = math.floor(r.max_concurrency)  # whole requests, as the DP total counts them
    if not a.fits or a.all_concurrency <= here:
        return ()  # said only where it holds more
    caveat = f"; {_NOT_MODELLED}" if a.engine == "vllm" else ""
    return (f"data parallel instead: {flags} on the same {r.num_gpus} GPUs gives {a.dp} "
            f"{'groups' if a.dp_attention else 'engines'} of {a.kv_cache_tokens:,} tokens each, "
            f"{a.all_concurrency:.0f} requests of {a.max_model_len:,} tokens at once in all, each on one (here "
            f"{here}), with {a.breakdown.weights / 2**30:.1f} GiB of weights a GPU against "
            f"{r.breakdown.weights / 2**30:.1f}{caveat}",)
