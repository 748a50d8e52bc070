"""``kvplan fit`` and ``kvplan gpus``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Optional

import typer

from kvplan.cli.root import app
from kvplan.cli.format import bytes_cell, format_bytes, make_console, new_table, print_json, print_table, summary_table
from kvplan.cli.hub import FETCH_OPTION, REVISION_OPTION, fetched_json, say_fetched
from kvplan.cli.options import LENGTH_HINT, tokens

if TYPE_CHECKING:  # the capacity core is imported when a command runs, not when `kvplan size` starts
    from kvplan.core.capacity.common import FitResult
    from kvplan.core.capacity.fit import FewestGPUs, WhatIf

console = make_console()
_BAR_COLORS = {"weights": "blue", "activation": "magenta", "non_torch": "yellow", "cuda_graph": "cyan",
               "kv_cache": "green", "unused": "grey50"}


def _size_opt(value: Optional[str], flag: str) -> Optional[int]:
    from kvplan.io.units import parse_size

    return None if value is None else parse_size(value, what=flag)


def _fewest_json(few: FewestGPUs | None) -> dict[str, Any] | None:
    if few is None:
        return None
    r = few.result
    return {"change": few.change or None, "tensor_parallel_size": few.tp or None,
            "pipeline_parallel_size": few.pp or None, "num_gpus": few.tp * few.pp or None, "fits": r is not None,
            "kv_cache_memory_bytes": r.kv_cache_memory_bytes if r else None,
            "max_concurrency": round(r.max_concurrency, 4) if r else None,
            "max_model_len_fit": r.max_model_len_fit if r else None, "searched_up_to_gpus": few.searched_up_to}


def fit_json(model: str, r: FitResult, alternatives: list[WhatIf], fewest: FewestGPUs | None = None) -> dict[str, Any]:
    return {
        "model": model, "gpu": r.gpu.name, "gpu_memory_bytes": r.gpu.memory_bytes, "engine": r.engine,
        "engine_version": r.engine_version,
        "tensor_parallel_size": r.tp, "pipeline_parallel_size": r.pp, "kv_cache_dtype": r.kv_dtype,
        "weight_dtype": r.weight_dtype, "max_model_len": r.max_model_len,
        "kv_cache_memory_bytes": r.kv_cache_memory_bytes, "block_size": r.block_size,
        "page_size_bytes": r.page_size_bytes, "num_blocks": r.num_blocks, "usable_blocks": r.usable_blocks,
        "kv_cache_tokens": r.kv_cache_tokens, "logged_kv_cache_tokens": r.logged_kv_cache_tokens,
        "logged_capacity_rule": r.logged_capacity_rule,
        "max_concurrency": round(r.max_concurrency, 4), "max_model_len_fit": r.max_model_len_fit, "fits": r.fits,
        "borderline": r.borderline, "borderline_why": r.borderline_why or None,
        "reasons": list(r.reasons), "breakdown": r.breakdown.as_dict(), "estimated": list(r.estimated),
        "settings": r.settings, "params": r.params, "notes": list(r.notes),
        "what_if": [
            {"change": w.change, "error": w.error or None,
             **({"fits": w.result.fits, "kv_cache_memory_bytes": w.result.kv_cache_memory_bytes,
                 "max_concurrency": round(w.result.max_concurrency, 4),
                 "max_model_len_fit": w.result.max_model_len_fit} if w.result else {})}
            for w in alternatives
        ],
        # added keys: the engine's own longest max_model_len (null: the config gives none), and the fewest
        # GPUs that fit when neither the deployment nor any single change does (null otherwise)
        "context_limit": (r.context_limit.as_dict(exceeded=r.context_exceeded, allowed=r.context_override)
                          if r.context_limit is not None else None),
        "fewest_gpus": _fewest_json(fewest),
    }


def _bar(r: FitResult, width: int = 60) -> str:
    total = max(r.gpu.memory_bytes, sum(r.breakdown.as_dict().values()))  # over-full: the bar shows the excess
    parts = []
    for key, value in r.breakdown.as_dict().items():
        n = round(width * value / total) if total else 0
        if n:
            parts.append(f"[{_BAR_COLORS[key]}]{'█' * n}[/]")
    return "".join(parts)


MEASURED = "Measured {what} per GPU (e.g. {eg}, from a startup log); overrides kvplan's estimate."


@app.command(name="fit")
def fit_cmd(
    model: str = typer.Argument(..., help="Bundled name (`kvplan models`), hub id, or path to a config.json."),
    gpu: Optional[str] = typer.Option(None, "--gpu", "-g", help="GPU name or alias (`kvplan gpus`); "
                                                                   "or give --gpu-memory."),
    gpu_memory: Optional[str] = typer.Option(None, "--gpu-memory", help="Memory of one GPU as the driver reports "
                                                                        "it, e.g. 24GiB (overrides the catalog's); "
                                                                        "one per GPU, comma-separated, when they "
                                                                        "differ (vLLM plans with the smallest)."),
    engine: str = typer.Option("vllm", "--engine", "-e", help="Whose budget: vllm (default), sglang, trtllm, "
                                                              "optionally pinned to a release: vllm==0.11.0 (no "
                                                              "version: the newest rules; see `kvplan engines`)."),
    utilization: Optional[float] = typer.Option(
        None, "--gpu-memory-utilization",
        help="vLLM gpu_memory_utilization / SGLang mem_fraction_static / TRT-LLM free_gpu_memory_fraction "
             "(default: the release's: vLLM 0.9, 0.92 from 0.20; SGLang by GPU memory and tp; TRT-LLM 0.9)."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", parser=tokens("--max-model-len", auto=True),
                                                help=f"Context per request, e.g. {LENGTH_HINT} (default: the "
                                                     "model's max_position_embeddings, or the engine's own length "
                                                     "where it derives a shorter one); past the model's, see "
                                                     "--allow-long-max-model-len; -1: the longest that fits "
                                                     "(vLLM's auto-fit, from 0.14; vLLM only)."),
    allow_long: bool = typer.Option(False, "--allow-long-max-model-len",
                                    help="The engine's variable for a max_model_len longer than the model's will "
                                         "be set where it runs: VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, SGLang's "
                                         "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, TensorRT-LLM's "
                                         "TLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (default: not set; vLLM and SGLang "
                                         "refuse to start, TensorRT-LLM lowers it to the model's)."),
    tp: int = typer.Option(1, "--tensor-parallel-size", "-tp", help="GPUs that split each layer (default 1)."),
    pp: int = typer.Option(1, "--pipeline-parallel-size", "-pp", help="Pipeline stages (default 1)."),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", help="KV cache dtype: auto (default: the "
                                                                        "model's), bf16, fp16, fp8, fp8_e5m2, "
                                                                        "fp8_per_token_head, fp8_ds_mla, int8, "
                                                                        "nvfp4, as the engine accepts."),
    weight_dtype: str = typer.Option("auto", "--weight-dtype", help="Weight format: auto (default: the "
                                                                    "checkpoint's, quantization_config read), "
                                                                    "bf16, fp16, fp8, int8, int4-g128, mxfp4."),
    block_size: Optional[int] = typer.Option(None, "--block-size", help="Tokens per KV block (default: the "
                                                                        "engine's: vLLM 16, 64 for MLA; "
                                                                        "TRT-LLM 32; SGLang 1)."),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help="Sequences per step (default: the vLLM "
                                                                            "release's: 256 in V0; from 0.9, 1024 "
                                                                            "on GPUs of 70 GiB or more other than "
                                                                            "A100, else 256)."),
    max_num_batched_tokens: Optional[int] = typer.Option(
        None, "--max-num-batched-tokens", parser=tokens("--max-num-batched-tokens"),
        help="Tokens per step, which sizes the profiling run (default: the vLLM release's: V0 max(max_model_len, "
             "2048), 2048 above 32K; V1 8192 on GPUs of 70 GiB or more other than A100, 16384 on B200 from 0.28, "
             "else 2048)."),
    kv_cache_memory_bytes: Optional[str] = typer.Option(None, "--kv-cache-memory-bytes",
                                                        help="KV memory per GPU, e.g. 40GiB: skips the budget "
                                                             "(vLLM --kv-cache-memory-bytes)."),
    weights_memory: Optional[str] = typer.Option(None, "--weights-memory",
                                                 help=MEASURED.format(what="weights", eg="14.99GiB")),
    activation_memory: Optional[str] = typer.Option(None, "--activation-memory",
                                                    help=MEASURED.format(what="activation peak", eg="4.35GiB")),
    non_torch_memory: Optional[str] = typer.Option(None, "--non-torch-memory",
                                                   help=MEASURED.format(what="non-torch memory", eg="0.13GiB")),
    cuda_graph_memory: Optional[str] = typer.Option(None, "--cuda-graph-memory",
                                                    help=MEASURED.format(what="CUDA-graph memory", eg="0.58GiB")),
    enforce_eager: bool = typer.Option(False, "--enforce-eager", help="No CUDA graphs: their memory is not "
                                                                      "reserved (default: graphs captured)."),
    num_gpu_blocks_override: Optional[int] = typer.Option(None, "--num-gpu-blocks-override",
                                                          help="vLLM: use this many KV blocks (default: as many "
                                                               "as the memory holds)."),
    disable_hybrid: bool = typer.Option(False, "--disable-hybrid-kv-cache-manager",
                                        help="vLLM: size sliding-window layers as full attention (default: the "
                                             "hybrid manager frees out-of-window blocks, from 0.9.1)."),
    mamba_cache_mode: str = typer.Option("none", "--mamba-cache-mode",
                                         help="vLLM: none (default: one state block a request) or align (prefix "
                                              "caching: two), from 0.16."),
    num_speculative_tokens: int = typer.Option(0, "--num-speculative-tokens",
                                               help="vLLM: speculative tokens, extra Mamba state blocks a request "
                                                    "(default 0)."),
    attention_backend: Optional[str] = typer.Option(None, "--attention-backend",
                                                    help="vLLM MLA backend, which sets the block size: FLASHMLA 64 "
                                                         "(default), FLASHMLA_SPARSE 64, CUTLASS_MLA 128, "
                                                         "FLASHINFER_MLA 32 or 64, TRITON_MLA."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", "-c",
                                              help="Requests of max-model-len tokens that must fit at once "
                                                   "(default: one)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    fetch: Optional[bool] = FETCH_OPTION,
    revision: Optional[str] = REVISION_OPTION,
) -> None:
    """What fits on these GPUs: KV memory, blocks, concurrency, the longest context, and what to change."""
    from kvplan.core.capacity.common import FitRequest
    from kvplan.core.capacity.fit import FITTERS, fewest_gpus, fit, what_if, with_borderline
    from kvplan.core.profiles import parse_engine
    from kvplan.io.gpus import get_gpu
    from kvplan.io.models import resolve_model

    choice = parse_engine(engine, allowed=tuple(FITTERS))
    per_rank = None
    if gpu_memory is not None and "," in gpu_memory:
        from kvplan.io.units import parse_size

        per_rank = tuple(parse_size(part.strip(), what="--gpu-memory") for part in gpu_memory.split(","))
        gpu_memory = min(gpu_memory.split(","), key=lambda part: parse_size(part.strip(), what="--gpu-memory")).strip()
    gpu_spec = get_gpu(gpu, memory=gpu_memory)
    auto_fit = max_model_len == -1
    if auto_fit:
        if choice.name != "vllm":
            from kvplan.errors import InputError

            raise InputError(f"--max-model-len -1 (auto-fit) is vLLM's; {choice.name} takes a length")
        max_model_len = None
    resolved = resolve_model(model, fetch=fetch, revision=revision)
    spec = resolved.spec
    say_fetched(resolved.hub, as_json)
    req = FitRequest(
        spec=spec, gpu=gpu_spec, engine=choice.name, profile=choice.profile, tp=tp, pp=pp, kv_dtype=kv_cache_dtype, weight_dtype=weight_dtype,
        gpu_memory_utilization=utilization, max_model_len=max_model_len, block_size=block_size,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        kv_cache_memory_bytes=_size_opt(kv_cache_memory_bytes, "--kv-cache-memory-bytes"),
        weights_memory=_size_opt(weights_memory, "--weights-memory"),
        activation_memory=_size_opt(activation_memory, "--activation-memory"),
        non_torch_memory=_size_opt(non_torch_memory, "--non-torch-memory"),
        cuda_graph_memory=_size_opt(cuda_graph_memory, "--cuda-graph-memory"),
        enforce_eager=enforce_eager, concurrency=concurrency, gpu_memory_per_rank=per_rank,
        num_gpu_blocks_override=num_gpu_blocks_override, disable_hybrid_kv_cache_manager=disable_hybrid,
        mamba_cache_mode=mamba_cache_mode, num_speculative_tokens=num_speculative_tokens,
        attention_backend=attention_backend, auto_fit_max_model_len=auto_fit, allow_long_max_model_len=allow_long,
    )
    result = with_borderline(req, fit(req))
    head = (choice.note,) if choice.note else ()
    result = dataclasses.replace(result, notes=(*head, *spec.notes, *result.notes))  # the config's resolutions first
    alternatives = what_if(req, result) if not result.fits else []
    fewest = fewest_gpus(req, result, alternatives)
    if as_json:
        print_json({**fit_json(spec.name, result, alternatives, fewest), "fetched": fetched_json(resolved.hub)})
    else:
        _render(spec.name, result, alternatives, fewest)
    if not result.fits:
        raise typer.Exit(1)


def _render(model: str, r: FitResult, alternatives: list[WhatIf], fewest: FewestGPUs | None = None) -> None:
    settings = ", ".join(f"{k} {v}" for k, v in r.settings.items())
    console.print(f"[bold]{model}[/] on {r.tp * r.pp} x {r.gpu.name} ({format_bytes(r.gpu.memory_bytes)} each), "
                  f"engine [cyan]{r.engine} {r.engine_version}[/] rules, tp {r.tp} pp {r.pp}, KV {r.kv_dtype}, "
                  f"weights {r.weight_dtype}")
    console.print(f"[dim]{settings}; max_model_len {r.max_model_len}[/]")
    for note in r.notes:
        console.print(f"[yellow]note:[/] {note}")
    table = new_table("component", "bytes", "share", "", numeric=("bytes", "share"),
                      title="Memory per GPU (the binding one)")
    for key, value in r.breakdown.as_dict().items():
        tag = "estimate" if key in r.estimated else ""
        table.add_row(f"[{_BAR_COLORS[key]}]{key.replace('_', ' ')}[/]", format_bytes(value),
                      f"{100 * value / r.gpu.memory_bytes:.1f}%", tag)
    print_table(console, table)
    if console.is_terminal:  # colour on a screen; in a file or a CI log the share column says the same
        console.print(_bar(r, width=min(60, console.width - 2)))
    summary = summary_table()
    summary.add_row("KV cache per GPU", bytes_cell(r.kv_cache_memory_bytes))
    summary.add_row("blocks", f"{r.num_blocks:,} x {r.block_size} tokens")
    if r.usable_blocks != r.num_blocks and r.engine == "vllm":
        summary.add_row("usable blocks (less the null block)", f"{r.usable_blocks:,}")
    summary.add_row("KV cache tokens", f"{r.kv_cache_tokens:,}")
    if r.logged_kv_cache_tokens and r.logged_kv_cache_tokens != r.kv_cache_tokens:
        summary.add_row("GPU KV cache size as logged", f"{r.logged_kv_cache_tokens:,}")
    summary.add_row(f"max concurrency at {r.max_model_len:,} tokens", f"{r.max_concurrency:.2f}x")
    # searched up to the configured length, for every engine (FitResult.max_model_len_fit); bare: a flag value
    summary.add_row(f"longest max_model_len that fits (<= {r.max_model_len})", f"{r.max_model_len_fit}")
    print_table(console, summary)
    if r.logged_capacity_rule:
        console.print(f"[dim]the log's 'GPU KV cache size' in this release: {r.logged_capacity_rule}[/]")
    if r.borderline:
        console.print(f"[bold yellow]borderline[/]: {r.borderline_why}")
    if r.fits:
        console.print(f"[bold green]fits[/]: {r.max_concurrency:.2f} requests of {r.max_model_len:,} tokens at once")
        return
    for reason in r.reasons:
        console.print(f"[bold red]does not fit[/]: {reason}")
    if fewest is not None:
        _render_fewest(r, alternatives, fewest)
        return
    if alternatives:
        wt = new_table("change", "fits", "KV/GPU", "conc.", "max len", numeric=("KV/GPU", "conc.", "max len"),
                       no_wrap=("change",), title="What would make it fit (KV per GPU, max concurrency, longest "
                                                  "max_model_len that fits, up to the one set)")
        for w in alternatives:
            if w.result is None:
                wt.add_row(w.change, "error", w.error, "", "")
            else:
                wt.add_row(w.change, "[green]yes[/]" if w.result.fits else "[red]no[/]",
                           format_bytes(w.result.kv_cache_memory_bytes), f"{w.result.max_concurrency:.2f}x",
                           f"{w.result.max_model_len_fit}")
        print_table(console, wt)


def _render_fewest(r: FitResult, alternatives: list[WhatIf], few: FewestGPUs) -> None:
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


@app.command()
def gpus(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """The GPU catalog: memory as the driver reports it, bandwidth, dense throughput."""
    from kvplan.io.gpus import gpu_catalog

    rows = [{"name": g.name, "aliases": list(g.aliases), "memory_bytes": g.memory_bytes,
             "hbm_bandwidth_bytes_per_s": g.hbm_bandwidth_bytes_per_s, "bf16_dense_tflops": g.bf16_dense_tflops,
             "fp8_dense_tflops": g.fp8_dense_tflops, "source": g.source} for g in gpu_catalog()]
    if as_json:
        print_json({"gpus": rows})
        return
    table = new_table("name", "memory", "bandwidth", "bf16 TFLOP/s", "fp8 TFLOP/s", numeric="*", no_wrap=("name",),
                      title=f"{len(rows)} GPUs (or --gpu-memory 24GiB for any other)")
    for row in rows:
        table.add_row(row["name"], format_bytes(row["memory_bytes"]),
                      f"{row['hbm_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s",
                      f"{row['bf16_dense_tflops']:,g}" if row["bf16_dense_tflops"] else "-",
                      f"{row['fp8_dense_tflops']:,g}" if row["fp8_dense_tflops"] else "-")
    print_table(console, table)
