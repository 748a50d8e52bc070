"""``kvplan size``, ``kvplan models``, ``kvplan show``."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Optional

import typer
from rich.table import Table

from kvplan.cli.root import app
from kvplan.cli.format import bytes_cell, format_bytes, make_console, new_table, print_json, print_table, summary_table
from kvplan.cli.hub import FETCH_OPTION, REVISION_OPTION, fetched_json, say_fetched
from kvplan.cli.options import LENGTH_HINT, tokens
from kvplan.core.dtypes import get_dtype
from kvplan.core.engines import ENGINES, engine_for, get_engine
from kvplan.core.sizing import SizeResult, layer_token_bytes, size_kv, uneven_tp_note
from kvplan.core.spec import CompressedLayer, LayerKind, LinearLayer, MLALayer, ModelSpec, NoCacheLayer
from kvplan.errors import InputError, UnmodeledError
from kvplan.io.models import bundled_index, bundled_published, load_bundled, resolve_model

console = make_console()

ENGINE_HELP = (f"Whose allocation rules: {', '.join(ENGINES)}, optionally pinned to a release, e.g. "
               "vllm==0.11.0 (default ideal: exactly the token states; no version: the newest rules; "
               "`kvplan engines` lists the releases).")
DTYPE_HELP = ("KV cache dtype: auto (default: the model's torch_dtype), fp32, bf16, fp16, fp8 (= fp8_e4m3), "
              "fp8_e5m2, fp8_per_token_head, int8_per_token_head, fp8_ds_mla (vLLM), int8, int4, nvfp4; an engine "
              "refuses formats it has no option for.")
BLOCK_HELP = ("Tokens per KV block (default: the engine's: vllm 16, 64 for MLA models; trtllm 32; sglang 1). "
              "Paged engines only.")


def format_indices(indices: tuple[int, ...] | list[int]) -> str:
    """[0,1,2,3,5,7] -> '0-3,5,7'; an arithmetic stride of >2 items -> '1,3,...,31 (every 2nd)'."""
    idx = list(indices)
    if len(idx) > 3:
        step = idx[1] - idx[0]
        if step > 1 and all(b - a == step for a, b in zip(idx, idx[1:])):
            return f"{idx[0]},{idx[1]},...,{idx[-1]}"
    parts, start = [], idx[0]
    for a, b in zip(idx, idx[1:] + [None]):
        if b is None or b != a + 1:
            parts.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    text = ",".join(parts)
    return text if len(text) <= 20 else f"{idx[0]}..{idx[-1]}, mixed"


def resolve_seq_len(spec: ModelSpec, seq_len: Optional[int]) -> tuple[int, bool]:
    if seq_len is not None:
        return seq_len, False
    if spec.max_model_len <= 0:
        raise InputError(f"{spec.name} gives no maximum context; pass --seq-len")
    return spec.max_model_len, True


def size_notes(spec: ModelSpec, seq_len: int) -> list[str]:
    notes = list(spec.notes)
    if 0 < spec.max_model_len < seq_len:
        notes.append(f"seq_len {seq_len:,} exceeds the model's max context {spec.max_model_len:,}")
    return notes


def size_json(spec: ModelSpec, result: SizeResult, *, seq_len_default: bool, block_size: int, ideal: SizeResult) -> dict[str, Any]:
    return {
        "model": result.model,
        "engine": result.engine,
        "kv_cache_dtype": result.kv_dtype,
        "batch": result.batch,
        "seq_len": result.seq_len,
        "seq_len_is_model_max": seq_len_default,
        "tensor_parallel_size": result.tp,
        "pipeline_parallel_size": result.pp,
        "num_gpus": result.num_gpus,
        "block_size": block_size,
        "bytes_per_token": result.bytes_per_token,
        "bytes_per_token_per_gpu": result.bytes_per_token_per_gpu,
        "bytes_per_sequence": result.bytes_per_sequence,
        "total_bytes": result.total_bytes,
        "per_gpu_bytes": result.per_gpu_bytes,
        "token_state_bytes": ideal.total_bytes,
        "layers": [
            {
                "kind": g.layer.kind.value,
                "description": g.description,
                "count": g.count,
                "layer_indices": list(g.layer_indices),
                "tokens_held": g.tokens_held_per_layer,
                "bytes_per_token": g.bytes_per_token,
                "bytes_per_sequence": g.bytes_per_sequence,
                "bytes": g.total_bytes,
                "per_gpu_bytes": g.per_gpu_bytes,
                "formula": g.formula,
            }
            for g in result.groups
        ],
        "notes": size_notes(spec, result.seq_len),
    }


@app.command()
def size(
    model: str = typer.Argument(..., help="Bundled name (`kvplan models`), hub id, or path to a config.json "
                                          "(or its folder)."),
    batch: int = typer.Option(1, "--batch", "-b", help="Concurrent sequences (default 1)."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", "-s", "--max-model-len",
                                          parser=tokens("--seq-len"),
                                          help=f"Tokens per sequence, e.g. {LENGTH_HINT} (default: the model's "
                                               "max context, max_position_embeddings)."),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", help=DTYPE_HELP),
    tp: int = typer.Option(1, "--tensor-parallel-size", "-tp", help="Tensor parallel size: KV heads are split "
                                                                     "over this many GPUs (default 1)."),
    pp: int = typer.Option(1, "--pipeline-parallel-size", "-pp", help="Pipeline parallel size: layers are split "
                                                                       "over this many stages (default 1)."),
    engine: str = typer.Option("ideal", "--engine", "-e", help=ENGINE_HELP),
    block_size: Optional[int] = typer.Option(None, "--block-size", help=BLOCK_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    fetch: Optional[bool] = FETCH_OPTION,
    revision: Optional[str] = REVISION_OPTION,
) -> None:
    """KV-cache bytes per token, per sequence, total and per GPU, layer group by layer group."""
    from kvplan.core.profiles import parse_engine  # here: `--engine ideal` needs no profile registry

    choice = parse_engine(engine)
    # reject a bad engine or block size (the release's rule) before loading anything
    get_engine(choice.name, block_size=block_size, profile=choice.profile)
    if kv_cache_dtype != "auto":
        get_dtype(kv_cache_dtype)
    try:
        resolved = resolve_model(model, fetch=fetch, revision=revision)
    except UnmodeledError as exc:
        if choice.name != "hf":
            raise
        _size_measured(exc, model, choice, batch=batch, seq_len=seq_len, tp=tp, pp=pp,
                       kv_cache_dtype=kv_cache_dtype, block_size=block_size, as_json=as_json)
        return
    spec = resolved.spec
    say_fetched(resolved.hub, as_json)
    eng, engine_note = engine_for(spec, choice.name, block_size=block_size, profile=choice.profile)
    seq, defaulted = resolve_seq_len(spec, seq_len)
    result = size_kv(spec, eng, batch=batch, seq_len=seq, kv_dtype=kv_cache_dtype, tp=tp, pp=pp)
    ideal = result if eng.name == "ideal" else size_kv(spec, get_engine("ideal"), batch=batch, seq_len=seq, kv_dtype=kv_cache_dtype, tp=tp, pp=pp)
    extra = [n for n in (choice.note, engine_note, None if eng.strict_tp else uneven_tp_note(spec, tp)) if n]
    if as_json:
        out = size_json(spec, result, seq_len_default=defaulted, block_size=eng.block_size, ideal=ideal)
        out["engine_version"] = choice.version
        out["fetched"] = fetched_json(resolved.hub)
        out["notes"].extend(extra)
        print_json(out)
        return
    rules = eng.describe_rules() + (f" ({choice.profile.display} {choice.version} rules)" if choice.profile else "")
    _render_size(spec, result, rules, defaulted, ideal)
    for note in extra:
        console.print(f"[yellow]note:[/] {note}")


def _size_measured(error: UnmodeledError, model: str, choice: Any, *, batch: int, seq_len: Optional[int], tp: int,
                   pp: int, kv_cache_dtype: str, block_size: Optional[int], as_json: bool) -> None:
    """``--engine hf`` on a config kvplan does not model: transformers' own cache for it, measured on the meta device
    (kvplan.validate.meta), for one GPU and the model's dtype."""
    from kvplan.validate.meta import max_positions, measure_unmodeled

    for given, flag in ((tp != 1, "-tp"), (pp != 1, "-pp"), (kv_cache_dtype != "auto", "--kv-cache-dtype"),
                        (block_size is not None, "--block-size")):
        if given:
            raise InputError(f"{error.what}; measuring transformers' cache instead takes no {flag} (one device, the "
                             "model's dtype): leave it out")
    defaulted = seq_len is None
    seq = seq_len if seq_len is not None else max_positions(error.config)
    if not seq:
        raise InputError(f"{model}: the config gives no maximum context to measure at; pass --seq-len")
    m = measure_unmodeled(error, batch=batch, seq_len=seq, origin=model)
    notes = [f"{error.what}: transformers {m.transformers_version}'s own cache was measured instead, on the meta device "
             "(a prefill and a decode step, no weights, nothing downloaded)"]
    if choice.asked and choice.asked != m.transformers_version:
        notes.append(f"measured with the installed transformers {m.transformers_version}, not {choice.asked}")
    if as_json:
        print_json({
            "model": model, "engine": "hf", "engine_version": m.transformers_version, "measured": True,
            "kv_cache_dtype": m.dtype, "batch": batch, "seq_len": seq, "seq_len_is_model_max": defaulted,
            "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "num_gpus": 1, "block_size": 1,
            "bytes_per_token": None, "bytes_per_token_per_gpu": None,
            "bytes_per_sequence": m.total_bytes // batch if m.total_bytes % batch == 0 else None,
            "total_bytes": m.total_bytes, "per_gpu_bytes": m.total_bytes, "token_state_bytes": None,
            "layers": [{"kind": "measured", "description": "measured", "count": len(idx), "layer_indices": idx,
                        "bytes": held * len(idx), "per_gpu_bytes": held * len(idx)}
                       for held, idx in m.layer_groups()],
            "notes": notes, "fetched": None,
        })
        return
    console.print(f"[bold]{model}[/]  engine [cyan]hf[/]: measured, transformers {m.transformers_version} on the meta "
                  "device")
    console.print(f"cache dtype {m.dtype} | batch {batch:,} x {seq:,} tokens"
                  f"{' (the model max context; set --seq-len)' if defaulted else ''} | 1 GPU")
    table = new_table("layers", "bytes per layer", "total", numeric=("bytes per layer", "total"), no_wrap=("layers",),
                      title="Per layer group (measured)")
    for held, idx in m.layer_groups():
        table.add_row(f"{len(idx)} x [{format_indices(idx)}]", format_bytes(held), format_bytes(held * len(idx)))
    print_table(console, table)
    summary = summary_table()
    summary.add_row("total (1 GPU)", bytes_cell(m.total_bytes))
    print_table(console, summary)
    for note in notes:
        console.print(f"[yellow]note:[/] {note}")


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' if n > 1 else ''}"


def _render_size(spec: ModelSpec, r: SizeResult, rules: str, defaulted: bool, ideal: SizeResult) -> None:
    seq_note = " (the model's max context; set --seq-len)" if defaulted else ""
    console.print(f"[bold]{r.model}[/]  engine [cyan]{r.engine}[/]: {rules}")
    console.print(
        f"KV dtype {r.kv_dtype} | batch {r.batch:,} x {r.seq_len:,} tokens{seq_note} | "
        f"tp {r.tp} x pp {r.pp} = {_gpus(r.num_gpus)}"
    )
    for note in size_notes(spec, r.seq_len):
        console.print(f"[yellow]note:[/] {note}")

    multi = r.num_gpus > 1
    cols = ("layers", "kind", "held/seq", "B/token", "per seq", "total", "per GPU") if multi else \
        ("layers", "kind", "held/seq", "B/token", "per seq", "total")
    table = new_table(*cols, numeric=("held/seq", "B/token", "per seq", "total", "per GPU"), no_wrap=("layers",),
                      title="Per layer group" + (f" (B/token, per seq and total: all {r.num_gpus} GPUs)" if multi else ""))
    for g in r.groups:
        held = ("fixed state" if isinstance(g.layer, LinearLayer) and not g.layer.holds_tokens
                else f"{g.tokens_held_per_layer:,}" + (" + state" if isinstance(g.layer, LinearLayer) else ""))
        if isinstance(g.layer, CompressedLayer) and g.layer.compress_ratio:
            held += f" + {g.layer.entries(r.seq_len):,} entries"
        row = [f"{g.count} x [{format_indices(g.layer_indices)}]", g.description, held,
               format_bytes(g.bytes_per_token), format_bytes(g.bytes_per_sequence), format_bytes(g.total_bytes)]
        table.add_row(*row, *([format_bytes(g.per_gpu_bytes)] if multi else []))
    print_table(console, table)

    summary = summary_table()
    every = f", all {r.num_gpus} GPUs" if multi else ""
    summary.add_row("bytes per token" + every, bytes_cell(r.bytes_per_token))
    if multi:
        summary.add_row("bytes per token, per GPU", bytes_cell(r.bytes_per_token_per_gpu))
    summary.add_row("per sequence" + every, bytes_cell(r.bytes_per_sequence))
    summary.add_row(f"total ({_gpus(r.num_gpus)})", bytes_cell(r.total_bytes))
    if multi:
        summary.add_row("per GPU (most loaded)", bytes_cell(r.per_gpu_bytes))
    if ideal.total_bytes != r.total_bytes:
        summary.add_row("token states only (ideal)", bytes_cell(ideal.total_bytes))
        summary.add_row(f"{r.engine} adds", format_bytes(r.total_bytes - ideal.total_bytes))
    print_table(console, summary)
    console.print("[bold]formula[/] (bytes per token, one sequence, all GPUs):" if multi
                  else "[bold]formula[/] (bytes per token, one sequence):")
    for g in r.groups:
        if isinstance(g.layer, CompressedLayer):
            console.print(f"  {g.formula}: {g.bytes_per_sequence:,} B per sequence")
        elif g.bytes_per_token and isinstance(g.layer, LinearLayer):  # parallel attention + fixed state (Falcon-H1)
            state = g.bytes_per_sequence - g.bytes_per_token * g.tokens_held_per_layer
            console.print(f"  {g.formula} = {g.bytes_per_token:,} B per token + {state:,} B per sequence")
        elif g.bytes_per_token:
            console.print(f"  {g.formula} = {g.bytes_per_token:,} B")
        elif isinstance(g.layer, LinearLayer):
            console.print(f"  {g.formula} = {g.bytes_per_sequence:,} B per sequence (does not grow with tokens)")


@app.command()
def models(as_json: bool = typer.Option(False, "--json", help="Print JSON (with hub ids and sources) instead "
                                                                 "of a table.")) -> None:
    """The bundled model configs."""
    from kvplan.core.weights import count_params

    rows = []
    for entry in bundled_index().values():
        spec = load_bundled(entry)
        dtype = get_dtype(spec.dtype)
        ideal = get_engine("ideal")
        per_token = sum(layer_token_bytes(layer, ideal, dtype) for layer in spec.layers)
        kinds = spec.kind_counts()
        family = ", ".join(f"{n} {k.value}" for k, n in kinds.items())
        rows.append(
            {
                "name": spec.name,
                "aliases": list(entry.aliases),
                "layers": spec.num_layers,
                "attention": family,
                "dtype": spec.dtype,
                "max_model_len": spec.max_model_len,
                "bytes_per_token": per_token,
                "source": entry.source,
                "model_type": spec.model_type,
                # parameters as `fit` counts them, and the published figure the bundled file cites (or null)
                "params": count_params(spec, spec.arch).total if spec.arch else None,
                "published": bundled_published(entry),
            }
        )
    if as_json:
        print_json({"models": rows})
        return
    table = Table(title=f"{len(rows)} bundled models (any config.json path or cached hub id works too; --json "
                        "lists their hub ids and sources)")
    for col in ("name", "layers", "attention", "dtype", "max context", "KV/token"):
        table.add_column(col, justify="right" if col in ("layers", "max context", "KV/token") else "left",
                         no_wrap=col == "name")
    for row in rows:
        table.add_row(row["name"], str(row["layers"]), row["attention"].replace(", ", " + "), row["dtype"],
                      f"{row['max_model_len']:,}", format_bytes(row["bytes_per_token"]))
    console.print(table)


def _layer_rows(spec: ModelSpec) -> list[dict[str, Any]]:
    dtype = get_dtype(spec.dtype)
    rows = []
    for layer, indices in spec.layer_groups():
        row: dict[str, Any] = {
            "layers": indices,
            "kind": layer.kind.value,
            "description": layer.describe(spec.num_attention_heads),
        }
        if isinstance(layer, MLALayer):
            latent = layer_token_bytes(layer, get_engine("ideal"), dtype)
            expanded = layer_token_bytes(layer, dataclasses.replace(get_engine("ideal"), mla_latent=False), dtype)
            row.update(
                kv_lora_rank=layer.kv_lora_rank, qk_rope_head_dim=layer.qk_rope_head_dim,
                qk_nope_head_dim=layer.qk_nope_head_dim, v_head_dim=layer.v_head_dim, num_heads=layer.num_heads,
                latent_bytes_per_token=latent, expanded_bytes_per_token=expanded,
            )
            if layer.indexer_head_dim:  # DSA: the lightning indexer's key, per token (included in the bytes above)
                row.update(indexer_head_dim=layer.indexer_head_dim, indexer_heads=layer.indexer_heads,
                           indexer_bytes_per_token=get_engine("ideal").indexer_slot_bytes(layer, dtype))
        elif isinstance(layer, CompressedLayer):
            row.update(head_dim=layer.head_dim, window=layer.window, compress_ratio=layer.compress_ratio,
                       indexer_head_dim=layer.indexer_head_dim, overlap=layer.overlap,
                       bytes_per_token=layer_token_bytes(layer, get_engine("ideal"), dtype),
                       entry_bytes=dtype.vector_bytes(layer.head_dim) if layer.compress_ratio else 0,
                       indexer_bytes_per_entry=get_engine("ideal").indexer_slot_bytes(layer, dtype))
        elif isinstance(layer, LinearLayer):
            conv, state = get_engine("ideal").linear_state_elems(layer)
            row.update(family=layer.family, conv_elems=conv, state_elems=state,
                       state_bytes_per_sequence=sum(get_engine("ideal").linear_state_bytes(layer, spec.dtype, 1)),
                       conv_channels=layer.conv_channels, conv_kernel=layer.conv_kernel,
                       state_shape=list(layer.state_shape))
            if layer.attention is not None:  # a parallel attention in the same layer (Falcon-H1)
                row.update(attention=layer.attention.describe(spec.num_attention_heads),
                           bytes_per_token=layer_token_bytes(layer, get_engine("ideal"), dtype))
        elif isinstance(layer, NoCacheLayer):
            if layer.reads_layer >= 0:  # cross-layer KV sharing: attends over that layer's cache, stores none
                row.update(reads_layer=layer.reads_layer, bytes_per_token=0)
        elif layer.kind is not LayerKind.NONE:
            row.update(num_kv_heads=layer.num_kv_heads, k_head_dim=layer.k_head_dim, v_head_dim=layer.v_head_dim,  # type: ignore[union-attr]
                       window=layer.window or None,  # type: ignore[union-attr]
                       bytes_per_token=layer_token_bytes(layer, get_engine("ideal"), dtype))
        rows.append(row)
    return rows


@app.command()
def show(
    model: str = typer.Argument(..., help="Bundled name (`kvplan models`), hub id, or path to a config.json."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    fetch: Optional[bool] = FETCH_OPTION,
    revision: Optional[str] = REVISION_OPTION,
) -> None:
    """The parsed model spec, layer by layer."""
    try:
        resolved = resolve_model(model, fetch=fetch, revision=revision)
    except UnmodeledError as exc:
        if choice.name != "hf":
            raise
        _size_measured(exc, model, choice, batch=batch, seq_len=seq_len, tp=tp, pp=pp,
                       kv_cache_dtype=kv_cache_dtype, block_size=block_size, as_json=as_json)
        return
    spec = resolved.spec
    say_fetched(resolved.hub, as_json)
    rows = _layer_rows(spec)
    if as_json:
        print_json({
            "model": spec.name, "model_type": spec.model_type, "num_layers": spec.num_layers,
            "num_attention_heads": spec.num_attention_heads, "hidden_size": spec.hidden_size,
            "dtype": spec.dtype, "max_model_len": spec.max_model_len, "source": spec.source,
            "provenance": spec.provenance,
            "groups": rows, "notes": list(spec.notes), "fetched": fetched_json(resolved.hub),
        })
        return
    console.print(f"[bold]{spec.name}[/] ({spec.model_type or 'unknown type'}): {spec.num_layers} layers, "
                  f"{spec.num_attention_heads} attention heads, hidden {spec.hidden_size:,}, {spec.dtype}, "
                  f"max context {spec.max_model_len:,}")
    if spec.source:
        console.print(f"source: {spec.source}")
    if spec.provenance:
        console.print(f"[dim]provenance: {spec.provenance}[/]")
    for note in spec.notes:
        console.print(f"[yellow]note:[/] {note}")
    # folding columns (new_table): a long layer list or description wraps instead of losing its end
    table = new_table("layers", "kind", "what is cached", f"KV bytes/token/layer ({spec.dtype})")
    for row in rows:
        if row["kind"] == "mla":
            cached = (f"latent: {row['kv_lora_rank']} + {row['qk_rope_head_dim']} rope, one vector\n"
                      f"expanded: {row['num_heads']} heads x (K {row['qk_nope_head_dim']}+{row['qk_rope_head_dim']}, V {row['v_head_dim']})")
            per_tok = f"latent {bytes_cell(row['latent_bytes_per_token'])}\nexpanded {bytes_cell(row['expanded_bytes_per_token'])}"
            if row.get("indexer_head_dim"):
                cached += f"\n+ indexer key: {row['indexer_head_dim']} per token ({row['indexer_heads']} query heads)"
                per_tok += f"\n(incl. indexer {bytes_cell(row['indexer_bytes_per_token'])})"
        elif row["kind"] == "compressed":
            cached = f"K=V {row['head_dim']} over the last {row['window']} tokens"
            per_tok = f"window {bytes_cell(row['bytes_per_token'])}"
            if row["compress_ratio"]:
                cached += f"\n+ 1 entry of {row['head_dim']} per {row['compress_ratio']} tokens"
                per_tok += f"\n+ {bytes_cell(row['entry_bytes'])} per {row['compress_ratio']} tokens"
            if row["indexer_head_dim"]:
                cached += f"\n+ indexer key {row['indexer_head_dim']} per entry"
                per_tok += f"\n+ {bytes_cell(row['indexer_bytes_per_entry'])} per entry"
        elif row["kind"] == "linear":
            shape = " x ".join(map(str, row["state_shape"])) if row["state_shape"] else f"{row['state_elems']:,}"
            state = f"state {shape}" if row["state_elems"] else "no recurrent state"
            conv = (f"conv {row['conv_channels']:,} ch x {row['conv_kernel'] - 1} cols" if row["conv_channels"]
                    else "no conv")
            cached = f"{row['family']}: {conv} + {state}"
            per_tok = f"fixed {format_bytes(row['state_bytes_per_sequence'])} per sequence"
            if "attention" in row:
                cached = f"{row['attention']}\n+ {cached}"
                per_tok = f"{bytes_cell(row['bytes_per_token'])}\n+ {per_tok}"
        elif row["kind"] == "none":
            cached, per_tok = ("nothing", "0") if "reads_layer" not in row else (row["description"], "0 (shared)")
        else:
            cached = row["description"]
            per_tok = bytes_cell(row["bytes_per_token"])
        table.add_row(f"{len(row['layers'])} x [{format_indices(row['layers'])}]", row["kind"], cached, per_tok)
    print_table(console, table)


@app.command()
def examples(
    name: Optional[str] = typer.Argument(None, help="An example's name: print its file (to copy and edit)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """The bundled example workloads and budgets; `kvplan simulate NAME` and `kvplan check NAME` take their names."""
    from kvplan.io.examples import examples as bundled
    from kvplan.io.examples import resolve_input
    from kvplan.io.yamlio import read_text

    if name is not None:
        kind = next((e.kind for e in bundled() if e.name == name), "workload")
        sys.stdout.write(read_text(resolve_input(name, kind)))  # a device or FIFO named here is refused, not read
        return
    rows = [{"kind": e.kind, "name": e.name, "path": str(e.path), "summary": e.summary} for e in bundled()]
    if as_json:
        print_json({"examples": rows})
        return
    table = new_table("name", "kind", "what it is", no_wrap=("name",),
                      title="Bundled examples: give the name where a file is expected")
    for row in rows:
        table.add_row(row["name"], row["kind"], row["summary"])
    print_table(console, table)
    console.print("kvplan examples NAME > my.yaml   # a copy to edit")
