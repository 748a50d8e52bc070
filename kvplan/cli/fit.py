"""``kvplan fit``: the rendering of ``kvplan.app.fit.fit_model``, as tables or one JSON object; exit 1 when it
does not fit."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from kvplan.app.fit import FitReport, LoRAFlags, Memory, SGLangFlags, fit_model
from kvplan.cli.format import bytes_cell, format_bytes, make_console, new_table, print_json, print_table, summary_table
from kvplan.cli.hub import fetched_json, say_fetched
from kvplan.cli.options import (LENGTH_HINT, BlockSizeOption, DataParallelOption, DecodeContextParallelOption,
                                FetchOption, JsonOption, KvCacheDtypeOption, ModelArg, PipelineParallelOption,
                                RevisionOption, TensorParallelOption, byte_size, engine_option,
                                gpu_memory_option, gpu_option, max_model_len_option, max_num_batched_tokens_option,
                                max_num_seqs_option)
from kvplan.cli.root import app
from kvplan.io.mm_limits import parse_mm_limits
from kvplan.io.speculative import parse_speculative_config

if TYPE_CHECKING:  # the capacity core is imported when a command runs, not when `kvplan size` starts
    from kvplan.core.capacity.common import FitResult
    from kvplan.core.capacity.fit import FewestGPUs, WhatIf

console = make_console()
_BAR_COLORS = {"weights": "blue", "draft_weights": "bright_blue", "lora": "bright_cyan", "activation": "magenta", "non_torch": "yellow", "cuda_graph": "cyan",
               "kv_cache": "green", "unused": "grey50"}


def _measured(flag: str, what: str, eg: str) -> Any:
    """A measured per-GPU figure replacing kvplan's estimate: a size such as 24GiB, read into bytes."""
    return typer.Option(flag, parser=byte_size(flag), metavar="<str>", help=(
        f"Measured {what} per GPU (e.g. {eg}, from a startup log); overrides kvplan's estimate (default: estimated)."))


GpuOpt = Annotated[Optional[str], gpu_option("GPU name or alias (`kvplan gpus`); no default: give it or --gpu-memory.")]
GpuMemoryOpt = Annotated[Optional[str], gpu_memory_option(
    "Memory of one GPU as the driver reports it, e.g. 24GiB (default: the catalog's for --gpu); one per GPU, "
    "comma-separated, when they differ (vLLM plans with the smallest).")]
EngineOpt = Annotated[str, engine_option(
    "Whose budget: vllm (default), sglang, trtllm, optionally pinned to a release: vllm==0.11.0 (no version: the "
    "newest rules; see `kvplan engines`).")]
UtilizationOpt = Annotated[Optional[float], typer.Option("--gpu-memory-utilization", help=(
    "vLLM gpu_memory_utilization / SGLang mem_fraction_static / TRT-LLM free_gpu_memory_fraction (default: the "
    "release's: vLLM 0.9, 0.92 from 0.20; SGLang by GPU memory and tp; TRT-LLM 0.9)."))]
MaxModelLenOpt = Annotated[Optional[int], max_model_len_option(
    f"Context per request, e.g. {LENGTH_HINT} (default: the model's max_position_embeddings, or the engine's own "
    "length where it derives a shorter one); past the model's, see --allow-long-max-model-len; -1: the longest that "
    "fits (vLLM's auto-fit, from 0.14; vLLM only).", auto=True)]
AllowLongOpt = Annotated[bool, typer.Option("--allow-long-max-model-len", help=(
    "The engine's variable for a max_model_len longer than the model's will be set where it runs: "
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, SGLang's SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, TensorRT-LLM's "
    "TLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (default: not set; vLLM and SGLang refuse to start, TensorRT-LLM lowers it "
    "to the model's)."))]
WeightDtypeOpt = Annotated[str, typer.Option("--weight-dtype", help=(
    "Weight format: auto (default: the checkpoint's, quantization_config read), bf16, fp16, fp8, int8, int4-g128, "
    "mxfp4."))]
MaxNumSeqsOpt = Annotated[Optional[int], max_num_seqs_option(
    "Sequences per step (default: the vLLM release's: 256 in V0; from 0.9, 1024 on GPUs of 70 GiB or more other "
    "than A100, else 256).")]
MaxNumBatchedTokensOpt = Annotated[Optional[int], max_num_batched_tokens_option(
    "Tokens per step, which sizes the profiling run (default: the vLLM release's: V0 max(max_model_len, 2048), "
    "2048 above 32K; V1 8192 on GPUs of 70 GiB or more other than A100, 16384 on B200 from 0.28, else 2048).")]
KvCacheMemoryOpt = Annotated[Optional[int], typer.Option(
    "--kv-cache-memory-bytes", parser=byte_size("--kv-cache-memory-bytes"), metavar="<str>",
    help="KV memory per GPU, e.g. 40GiB: skips the budget (vLLM --kv-cache-memory-bytes; default: the budget's).")]
WeightsMemoryOpt = Annotated[Optional[int], _measured("--weights-memory", "weights", "14.99GiB")]
ActivationMemoryOpt = Annotated[Optional[int], _measured("--activation-memory", "activation peak", "4.35GiB")]
NonTorchMemoryOpt = Annotated[Optional[int], _measured("--non-torch-memory", "non-torch memory", "0.13GiB")]
CudaGraphMemoryOpt = Annotated[Optional[int], _measured("--cuda-graph-memory", "CUDA-graph memory", "0.58GiB")]
EnforceEagerOpt = Annotated[bool, typer.Option("--enforce-eager", help=(
    "No CUDA graphs: their memory is not reserved (default: graphs captured)."))]
BlocksOverrideOpt = Annotated[Optional[int], typer.Option("--num-gpu-blocks-override", help=(
    "vLLM: use this many KV blocks (default: as many as the memory holds)."))]
DisableHybridOpt = Annotated[bool, typer.Option("--disable-hybrid-kv-cache-manager", help=(
    "vLLM: size sliding-window layers as full attention (default: the hybrid manager frees out-of-window blocks, "
    "from 0.9.1)."))]
MambaCacheModeOpt = Annotated[str, typer.Option("--mamba-cache-mode", help=(
    "vLLM: none (default: one state block a request) or align (prefix caching: two), from 0.16."))]
SpeculativeTokensOpt = Annotated[int, typer.Option("--num-speculative-tokens", help=(
    "vLLM: speculative tokens, extra Mamba state blocks a request (default 0)."))]
SpeculativeConfigOpt = Annotated[Optional[str], typer.Option("--speculative-config", help=(
    "vLLM: speculative decoding as vLLM takes it, e.g. '{\"method\": \"mtp\", \"num_speculative_tokens\": 1}': "
    "the MTP layers join the KV cache and the weights (default: none)."))]
SpecAlgorithmOpt = Annotated[Optional[str], typer.Option("--speculative-algorithm", help=(
    "SGLang: NEXTN (or EAGLE from the model's own MTP layers), EAGLE or EAGLE3 with "
    "--speculative-draft-model-path, or NGRAM: the draft's pool and weights out of the reserve (default: none)."))]
SpecDraftOpt = Annotated[Optional[str], typer.Option("--speculative-draft-model-path", help=(
    "SGLang: the EAGLE or EAGLE-3 head's checkpoint (a bundled name, hub id or config.json path) (default: the "
    "model's own MTP layers)."))]
SpecStepsOpt = Annotated[Optional[int], typer.Option("--speculative-num-steps", help=(
    "SGLang: draft steps (default: SGLang's choice for the architecture, 3 or 5)."))]
SpecTopkOpt = Annotated[Optional[int], typer.Option("--speculative-eagle-topk", help=(
    "SGLang: branches a step (default 1, Llama 4)."))]
SpecDraftTokensOpt = Annotated[Optional[int], typer.Option("--speculative-num-draft-tokens", help=(
    "SGLang: tokens verified a step (default 4, Llama 8)."))]
EnableLoraOpt = Annotated[bool, typer.Option("--enable-lora", help=(
    "vLLM, SGLang: LoRA adapters' slots allocated at start, a line of their own (default: off)."))]
MaxLorasOpt = Annotated[Optional[int], typer.Option("--max-loras", help=(
    "LoRA slots on the GPU: vLLM --max-loras (default 1), SGLang --max-loras-per-batch (default 8)."))]
MaxLoraRankOpt = Annotated[Optional[int], typer.Option("--max-lora-rank", help="Largest adapter rank (default 16).")]
LoraTargetsOpt = Annotated[Optional[str], typer.Option("--lora-target-modules", help=(
    "Comma-separated modules the adapters target: q_proj,k_proj,...,down_proj, embed_tokens, lm_head, all-linear "
    "(default: vLLM every module, SGLang all-linear)."))]
AttentionBackendOpt = Annotated[Optional[str], typer.Option("--attention-backend", help=(
    "vLLM MLA backend, which sets the block size: FLASHMLA 64 (default), FLASHMLA_SPARSE 64, CUTLASS_MLA 128, "
    "FLASHINFER_MLA 32 or 64, TRITON_MLA."))]
MoeBackendOpt = Annotated[str, typer.Option("--moe-backend", help=(
    "vLLM: auto (default), or deep_gemm_mega_moe (DeepSeek-V4 with --enable-expert-parallel: DeepGEMM MegaMoE, "
    "whose buffer is counted as non-torch memory)."))]
AsyncSchedulingOpt = Annotated[Optional[bool], typer.Option("--async-scheduling/--no-async-scheduling", help=(
    "vLLM: schedule the next batch while one runs (default: the release's: on from 0.14); from 0.26 it sizes "
    "sliding-window and chunked layers by the batches in flight."))]
MmLimitOpt = Annotated[Optional[str], typer.Option("--limit-mm-per-prompt", help=(
    "vLLM: multimodal items a prompt may carry, as vLLM takes it, e.g. '{\"image\": 2}' (default 999 each); 0 "
    "for every modality of a vision tower leaves the tower out (from 0.16) and its encoder profile."))]
ConcurrencyOpt = Annotated[Optional[int], typer.Option("--concurrency", "-c", help=(
    "Requests of max-model-len tokens that must fit at once, over every DP rank (default: one)."))]
DpAttentionOpt = Annotated[bool, typer.Option("--enable-dp-attention", help=(
    "SGLang: attention at tp // dp in dp groups inside the tp GPUs, each its own token pool, the MoE and dense "
    "layers over all tp (default: off)."))]
ExpertParallelOpt = Annotated[bool, typer.Option("--enable-expert-parallel", help=(
    "Each GPU holds whole routed experts instead of a share of every expert: over dp x tp GPUs in vLLM, over tp in "
    "SGLang (--ep-size tp) (default: off)."))]
A2aBackendOpt = Annotated[str, typer.Option("--moe-a2a-backend", help=(
    "SGLang: none (default), deepep or mooncake: whole experts over the tp GPUs and the shared experts whole on "
    "each (--enable-deepep-moe before 0.5)."))]
RedundantExpertsOpt = Annotated[int, typer.Option("--ep-num-redundant-experts", help=(
    "SGLang: expert copies loaded beside the routed experts, spread whole over the expert-parallel GPUs "
    "(default 0)."))]
DenseTpOpt = Annotated[Optional[int], typer.Option("--moe-dense-tp-size", help=(
    "SGLang: 1 builds the dense MLP layers whole on every GPU (default: split over tp)."))]
DpLmHeadOpt = Annotated[bool, typer.Option("--enable-dp-lm-head", help=(
    "SGLang with --enable-dp-attention: the LM head over the attention group (tp // dp) (default: off)."))]
MaxTotalTokensOpt = Annotated[Optional[int], typer.Option("--max-total-tokens", help=(
    "SGLang: a cap on the token pool, before its page floor (default: what the memory holds)."))]


@app.command(name="fit")
def fit_cmd(
    model: ModelArg,
    *,
    gpu: GpuOpt = None,
    gpu_memory: GpuMemoryOpt = None,
    engine: EngineOpt = "vllm",
    utilization: UtilizationOpt = None,
    max_model_len: MaxModelLenOpt = None,
    allow_long: AllowLongOpt = False,
    tp: TensorParallelOption = 1,
    pp: PipelineParallelOption = 1,
    dp: DataParallelOption = 1,
    expert_parallel: ExpertParallelOpt = False,
    dcp: DecodeContextParallelOption = 1,
    dp_attention: DpAttentionOpt = False,
    moe_a2a_backend: A2aBackendOpt = "none",
    redundant_experts: RedundantExpertsOpt = 0,
    moe_dense_tp: DenseTpOpt = None,
    dp_lm_head: DpLmHeadOpt = False,
    max_total_tokens: MaxTotalTokensOpt = None,
    kv_cache_dtype: KvCacheDtypeOption = "auto",
    weight_dtype: WeightDtypeOpt = "auto",
    block_size: BlockSizeOption = None,
    max_num_seqs: MaxNumSeqsOpt = None,
    max_num_batched_tokens: MaxNumBatchedTokensOpt = None,
    kv_cache_memory_bytes: KvCacheMemoryOpt = None,
    weights_memory: WeightsMemoryOpt = None,
    activation_memory: ActivationMemoryOpt = None,
    non_torch_memory: NonTorchMemoryOpt = None,
    cuda_graph_memory: CudaGraphMemoryOpt = None,
    enforce_eager: EnforceEagerOpt = False,
    num_gpu_blocks_override: BlocksOverrideOpt = None,
    disable_hybrid: DisableHybridOpt = False,
    mamba_cache_mode: MambaCacheModeOpt = "none",
    num_speculative_tokens: SpeculativeTokensOpt = 0,
    speculative_config: SpeculativeConfigOpt = None,
    speculative_algorithm: SpecAlgorithmOpt = None,
    speculative_draft_model_path: SpecDraftOpt = None,
    speculative_num_steps: SpecStepsOpt = None,
    speculative_eagle_topk: SpecTopkOpt = None,
    speculative_num_draft_tokens: SpecDraftTokensOpt = None,
    enable_lora: EnableLoraOpt = False,
    max_loras: MaxLorasOpt = None,
    max_lora_rank: MaxLoraRankOpt = None,
    lora_target_modules: LoraTargetsOpt = None,
    attention_backend: AttentionBackendOpt = None,
    moe_backend: MoeBackendOpt = "auto",
    concurrency: ConcurrencyOpt = None,
    async_scheduling: AsyncSchedulingOpt = None,
    limit_mm_per_prompt: MmLimitOpt = None,
    as_json: JsonOption = False,
    fetch: FetchOption = None,
    revision: RevisionOption = None,
) -> None:
    """What fits on these GPUs: KV memory, blocks, concurrency, the longest context, and what to change."""
    from kvplan.core.capacity.common import SGLangArgs

    memory = Memory(kv_cache=kv_cache_memory_bytes, weights=weights_memory, activation=activation_memory,
                    non_torch=non_torch_memory, cuda_graph=cuda_graph_memory)
    report = fit_model(
        model, gpu=gpu, gpu_memory=gpu_memory, engine=engine, gpu_memory_utilization=utilization,
        max_model_len=max_model_len, allow_long_max_model_len=allow_long, tp=tp, pp=pp, dp=dp,
        expert_parallel=expert_parallel, dcp=dcp, dp_attention=dp_attention, kv_cache_dtype=kv_cache_dtype,
        weight_dtype=weight_dtype, block_size=block_size, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, memory=memory, enforce_eager=enforce_eager,
        num_gpu_blocks_override=num_gpu_blocks_override, disable_hybrid_kv_cache_manager=disable_hybrid,
        mamba_cache_mode=mamba_cache_mode, num_speculative_tokens=num_speculative_tokens,
        attention_backend=attention_backend, moe_backend=moe_backend, concurrency=concurrency, async_scheduling=async_scheduling,
        mm_limits=parse_mm_limits(limit_mm_per_prompt), speculative=parse_speculative_config(speculative_config),
        lora=_lora_flags(enable_lora, max_loras, max_lora_rank, lora_target_modules),
        sglang_speculative=_sglang_flags(speculative_algorithm, speculative_num_steps, speculative_eagle_topk,
                                         speculative_num_draft_tokens, speculative_draft_model_path),
        sglang=SGLangArgs(a2a_backend=moe_a2a_backend, redundant_experts=redundant_experts, dense_tp=moe_dense_tp,
                          dp_lm_head=dp_lm_head, max_total_tokens=max_total_tokens),
        fetch=fetch, revision=revision)
    say_fetched(report.hub, as_json)
    if as_json:
        print_json({**fit_json(report), "fetched": fetched_json(report.hub)})
    else:
        _render(report)
    if not report.fits:
        raise typer.Exit(1)


def _sglang_flags(algorithm: str | None, steps: int | None, topk: int | None,
                  drafts: int | None, draft_model: str | None = None) -> SGLangFlags | None:
    if algorithm is None:
        if steps is not None or topk is not None or drafts is not None or draft_model is not None:
            raise typer.BadParameter("--speculative-num-steps, --speculative-eagle-topk, "
                                     "--speculative-num-draft-tokens and --speculative-draft-model-path go with "
                                     "--speculative-algorithm")
        return None
    return SGLangFlags(algorithm=algorithm, num_steps=steps, eagle_topk=topk, num_draft_tokens=drafts,
                       draft_model=draft_model)


def _lora_flags(enable: bool, max_loras: int | None, max_rank: int | None, targets: str | None) -> LoRAFlags | None:
    if not enable:
        if max_loras is not None or max_rank is not None or targets is not None:
            raise typer.BadParameter("--max-loras, --max-lora-rank and --lora-target-modules go with --enable-lora")
        return None
    return LoRAFlags(max_loras=max_loras, max_rank=max_rank,
                     target_modules=tuple(t.strip() for t in (targets or "").split(",") if t.strip()))


def _fewest_json(few: FewestGPUs | None) -> dict[str, Any] | None:
    if few is None:
        return None
    r = few.result
    return {"change": few.change or None, "tensor_parallel_size": few.tp or None,
            "pipeline_parallel_size": few.pp or None, "num_gpus": few.tp * few.pp or None, "fits": r is not None,
            "kv_cache_memory_bytes": r.kv_cache_memory_bytes if r else None,
            "max_concurrency": round(r.max_concurrency, 4) if r else None,
            "max_model_len_fit": r.max_model_len_fit if r else None, "searched_up_to_gpus": few.searched_up_to}


def _what_if_json(w: WhatIf) -> dict[str, Any]:
    out: dict[str, Any] = {"change": w.change, "error": w.error or None}
    if w.result:
        out.update(fits=w.result.fits, num_gpus=w.result.num_gpus, kv_cache_memory_bytes=w.result.kv_cache_memory_bytes,
                   max_concurrency=round(w.result.max_concurrency, 4), max_model_len_fit=w.result.max_model_len_fit)
    return out


def fit_json(report: FitReport) -> dict[str, Any]:
    """``kvplan fit --json`` less ``fetched``: the keys are a contract (tests/cli/test_fit_cli.py)."""
    r = report.result
    return {
        "model": report.model, "gpu": r.gpu.name, "gpu_memory_bytes": r.gpu.memory_bytes, "engine": r.engine,
        "engine_version": r.engine_version, "tensor_parallel_size": r.tp, "pipeline_parallel_size": r.pp,
        # data parallelism (vLLM engines, SGLang replicas or attention groups): the figures below are one rank's;
        # all_ranks sums the dp ranks (whole requests a rank)
        "data_parallel_size": r.dp, "expert_parallel_size": r.expert_parallel_size or None, "num_gpus": r.num_gpus,
        "decode_context_parallel_size": r.dcp, "dp_attention": r.dp_attention,
        # every rank: their tokens, and the requests of max_model_len they hold at once (whole ones on each rank)
        "all_ranks": {"kv_cache_tokens": r.all_kv_cache_tokens, "max_concurrency": round(r.all_concurrency, 4)},
        "kv_cache_dtype": r.kv_dtype, "weight_dtype": r.weight_dtype, "max_model_len": r.max_model_len,
        "kv_cache_memory_bytes": r.kv_cache_memory_bytes, "block_size": r.block_size,
        "page_size_bytes": r.page_size_bytes, "num_blocks": r.num_blocks, "usable_blocks": r.usable_blocks,
        "kv_cache_tokens": r.kv_cache_tokens, "logged_kv_cache_tokens": r.logged_kv_cache_tokens,
        "logged_capacity_rule": r.logged_capacity_rule,
        "max_concurrency": round(r.max_concurrency, 4), "max_model_len_fit": r.max_model_len_fit, "fits": r.fits,
        "borderline": r.borderline, "borderline_why": r.borderline_why or None,
        "reasons": list(r.reasons), "breakdown": r.breakdown.as_dict(), "estimated": list(r.estimated),
        "settings": r.settings, "params": r.params, "notes": list(r.notes),
        "what_if": [_what_if_json(w) for w in report.alternatives],
        # the engine's own longest max_model_len (null: the config gives none), and the fewest GPUs that fit
        # when neither the deployment nor any single change does (null otherwise)
        "context_limit": (r.context_limit.as_dict(exceeded=r.context_exceeded, allowed=r.context_override)
                          if r.context_limit is not None else None),
        "fewest_gpus": _fewest_json(report.fewest),
        # --speculative-config: the drafter's KV layers and bytes a token beside the model's, and its weights
        "speculative": dataclasses.asdict(report.speculative) if report.speculative is not None else None,
    }


def _bar(r: FitResult, width: int = 60) -> str:
    total = max(r.gpu.memory_bytes, sum(r.breakdown.as_dict().values()))  # over-full: the bar shows the excess
    parts = []
    for key, value in r.breakdown.as_dict().items():
        n = round(width * value / total) if total else 0
        if n:
            parts.append(f"[{_BAR_COLORS[key]}]{'█' * n}[/]")
    return "".join(parts)



def _render(report: FitReport) -> None:
    r = report.result
    settings = ", ".join(f"{k} {v}" for k, v in r.settings.items() if k != "activation_band")  # shown on its row
    dp = (f" dp {r.dp}" + (" attention" if r.dp_attention else "")
          + (" with expert parallel" if r.expert_parallel_size else "") if r.dp > 1 else "")
    dp += f" dcp {r.dcp}" if r.dcp > 1 else ""
    console.print(f"[bold]{report.model}[/] on {r.num_gpus} x {r.gpu.name} ({format_bytes(r.gpu.memory_bytes)} "
                  f"each), engine [cyan]{r.engine} {r.engine_version}[/] rules, tp {r.tp} pp {r.pp}{dp}, KV "
                  f"{r.kv_dtype}, weights {r.weight_dtype}")
    console.print(f"[dim]{settings}; max_model_len {r.max_model_len}[/]")
    for note in r.notes:
        console.print(f"[yellow]note:[/] {note}")
    table = new_table("component", "bytes", "share", "", numeric=("bytes", "share"),
                      title="Memory per GPU (the binding one)")
    for key, value in r.breakdown.as_dict().items():
        if key in ("draft_weights", "lora") and not value:
            continue  # no drafter, no adapters
        tag = "estimate" if key in r.estimated else ""
        if tag and key == "activation" and "activation_band" in r.settings:  # the engine's own band (vLLM V1)
            tag = f"estimate ±{float(r.settings['activation_band']):.0%}"
        table.add_row(f"[{_BAR_COLORS[key]}]{key.replace('_', ' ')}[/]", format_bytes(value),
                      f"{100 * value / r.gpu.memory_bytes:.1f}%", tag)
    print_table(console, table)
    if console.is_terminal:  # colour on a screen; in a file or a CI log the share column says the same
        console.print(_bar(r, width=min(60, console.width - 2)))
    _render_summary(r)
    if r.fits:
        each = f" ({r.max_concurrency:.2f} on each of {r.dp} DP ranks)" if r.dp > 1 else ""
        held = f"{r.all_concurrency:.0f}" if r.dp > 1 else f"{r.max_concurrency:.2f}"
        console.print(f"[bold green]fits[/]: {held} requests of {r.max_model_len:,} tokens at once{each}")
        return
    for reason in r.reasons:
        console.print(f"[bold red]does not fit[/]: {reason}")
    if report.fewest is not None:
        _render_fewest(r, report.alternatives, report.fewest)
    elif report.alternatives:
        _render_what_if(report.alternatives, r.dp)


def _render_summary(r: FitResult) -> None:
    summary = summary_table()
    summary.add_row("KV cache per GPU", bytes_cell(r.kv_cache_memory_bytes))
    summary.add_row("blocks", f"{r.num_blocks:,} x {r.block_size} tokens")
    if r.usable_blocks != r.num_blocks and r.engine == "vllm":
        summary.add_row("usable blocks (less the null block)", f"{r.usable_blocks:,}")
    summary.add_row("KV cache tokens", f"{r.kv_cache_tokens:,}")
    if r.logged_kv_cache_tokens and r.logged_kv_cache_tokens != r.kv_cache_tokens:
        summary.add_row("GPU KV cache size as logged", f"{r.logged_kv_cache_tokens:,}")
    summary.add_row(f"max concurrency at {r.max_model_len:,} tokens", f"{r.max_concurrency:.2f}x")
    if r.dp > 1:
        summary.add_row(f"KV cache tokens, all {r.dp} DP ranks", f"{r.all_kv_cache_tokens:,}")
        summary.add_row(f"requests held at once, all {r.dp} DP ranks", f"{r.all_concurrency:.0f}")
    # searched up to the configured length, for every engine (FitResult.max_model_len_fit); bare: a flag value
    summary.add_row(f"longest max_model_len that fits (<= {r.max_model_len})", f"{r.max_model_len_fit}")
    print_table(console, summary)
    if r.logged_capacity_rule:
        console.print(f"[dim]the log's 'GPU KV cache size' in this release: {r.logged_capacity_rule}[/]")
    if r.borderline:
        console.print(f"[bold yellow]borderline[/]: {r.borderline_why}")


def _render_what_if(alternatives: tuple[WhatIf, ...], dp: int = 1) -> None:
    """The single changes tried; with data parallelism the GPUs each takes and one rank's concurrency."""
    each = f" of one of the {dp} DP ranks" if dp > 1 else ""
    gpus = ("GPUs",) if dp > 1 else ()
    wt = new_table("change", *gpus, "fits", "KV/GPU", "conc.", "max len", numeric=(*gpus, "KV/GPU", "conc.", "max len"),
                   no_wrap=("change",), title=f"What would make it fit (KV per GPU, max concurrency{each}, longest "
                                              "max_model_len that fits, up to the one set)")
    for w in alternatives:
        n = (f"{w.result.num_gpus}" if w.result else "",) if dp > 1 else ()
        if w.result is None:
            wt.add_row(w.change, *n, "error", w.error, "", "")
        else:
            wt.add_row(w.change, *n, "[green]yes[/]" if w.result.fits else "[red]no[/]",
                       format_bytes(w.result.kv_cache_memory_bytes), f"{w.result.max_concurrency:.2f}x",
                       f"{w.result.max_model_len_fit}")
    print_table(console, wt)
    if dp > 1 and not any(w.result is not None and w.result.fits for w in alternatives):
        console.print("none fits; the fewest-GPUs search shapes one engine and is not run with -dp: try another -tp or "
                      "-dp")


def _render_fewest(r: FitResult, alternatives: tuple[WhatIf, ...], few: FewestGPUs) -> None:
    """Nothing fits on these GPUs: the single changes tried, in one line, then the fewest GPUs that fit."""
    tried = ", ".join(w.change for w in alternatives)
    if tried:
        console.print(f"none of these fits on {r.tp * r.pp} x {r.gpu.name}: {tried}")
    if few.result is None:
        console.print(f"[bold red]no tp x pp up to {few.searched_up_to} GPUs fits[/] with these settings (tp up to "
                      f"{few.max_tp}, pipeline stages across nodes)")
        return
    f = few.result
    table = new_table("change", "GPUs", "KV/GPU", "conc.", "max len", numeric=("GPUs", "KV/GPU", "conc.", "max len"),
                      no_wrap=("change",), title="The fewest GPUs that fit")
    table.add_row(few.change, f"{few.tp * few.pp}", format_bytes(f.kv_cache_memory_bytes),
                  f"{f.max_concurrency:.2f}x", f"{f.max_model_len_fit}")
    print_table(console, table)
