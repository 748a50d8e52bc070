"""``kvplan models`` and ``kvplan show``: the renderings of ``kvplan.app.models``."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.table import Table

from kvplan.app.models import ShownModel, bundled_models, show_model
from kvplan.cli.format import (bytes_cell, format_bytes, layers_cell, make_console, new_table, print_json,
                               print_table)
from kvplan.cli.hub import fetched_json, say_fetched
from kvplan.cli.options import FetchOption, JsonOption, ModelArg, RevisionOption
from kvplan.cli.root import app

console = make_console()


@app.command()
def models(*, as_json: JsonOption = False) -> None:
    """The bundled model configs."""
    rows = bundled_models()
    if as_json:
        print_json({"models": [dataclasses.asdict(row) for row in rows]})
        return
    table = Table(title=f"{len(rows)} bundled models (any config.json path or cached hub id works too; --json "
                        "lists their hub ids and sources)")
    for col in ("name", "layers", "attention", "dtype", "max context", "KV/token"):
        table.add_column(col, justify="right" if col in ("layers", "max context", "KV/token") else "left",
                         no_wrap=col == "name")
    for row in rows:
        table.add_row(row.name, str(row.layers), row.attention.replace(", ", " + "), row.dtype,
                      f"{row.max_model_len:,}", format_bytes(row.bytes_per_token))
    console.print(table)


@app.command()
def show(
    model: ModelArg,
    *,
    as_json: JsonOption = False,
    fetch: FetchOption = None,
    revision: RevisionOption = None,
) -> None:
    """The parsed model spec, layer by layer."""
    shown = show_model(model, fetch=fetch, revision=revision)
    say_fetched(shown.hub, as_json)
    if as_json:
        print_json(show_json(shown))
        return
    spec = shown.spec
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
    for row in shown.groups:
        table.add_row(layers_cell(row["layers"]), row["kind"], *_cached_cells(row))
    print_table(console, table)


def show_json(shown: ShownModel) -> dict[str, Any]:
    spec = shown.spec
    return {
        "model": spec.name, "model_type": spec.model_type, "num_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads, "hidden_size": spec.hidden_size, "dtype": spec.dtype,
        "max_model_len": spec.max_model_len, "source": spec.source, "provenance": spec.provenance,
        "groups": list(shown.groups), "notes": list(spec.notes), "fetched": fetched_json(shown.hub),
    }


def _cached_cells(row: dict[str, Any]) -> tuple[str, str]:
    """What a layer group caches, and its bytes per token and layer."""
    if row["kind"] == "mla":
        cached = (f"latent: {row['kv_lora_rank']} + {row['qk_rope_head_dim']} rope, one vector\n"
                  f"expanded: {row['num_heads']} heads x (K {row['qk_nope_head_dim']}+{row['qk_rope_head_dim']}, "
                  f"V {row['v_head_dim']})")
        per_tok = (f"latent {bytes_cell(row['latent_bytes_per_token'])}\n"
                   f"expanded {bytes_cell(row['expanded_bytes_per_token'])}")
        if row.get("indexer_head_dim"):
            cached += f"\n+ indexer key: {row['indexer_head_dim']} per token ({row['indexer_heads']} query heads)"
            per_tok += f"\n(incl. indexer {bytes_cell(row['indexer_bytes_per_token'])})"
        return cached, per_tok
    if row["kind"] == "compressed":
        return _compressed_cells(row)
    if row["kind"] == "linear":
        return _linear_cells(row)
    if row["kind"] == "none":
        return ("nothing", "0") if "reads_layer" not in row else (row["description"], "0 (shared)")
    return row["description"], bytes_cell(row["bytes_per_token"])


def _compressed_cells(row: dict[str, Any]) -> tuple[str, str]:
    cached = f"K=V {row['head_dim']} over the last {row['window']} tokens"
    per_tok = f"window {bytes_cell(row['bytes_per_token'])}"
    if row["compress_ratio"]:
        cached += f"\n+ 1 entry of {row['head_dim']} per {row['compress_ratio']} tokens"
        per_tok += f"\n+ {bytes_cell(row['entry_bytes'])} per {row['compress_ratio']} tokens"
    if row["indexer_head_dim"]:
        cached += f"\n+ indexer key {row['indexer_head_dim']} per entry"
        per_tok += f"\n+ {bytes_cell(row['indexer_bytes_per_entry'])} per entry"
    return cached, per_tok


def _linear_cells(row: dict[str, Any]) -> tuple[str, str]:
    shape = " x ".join(map(str, row["state_shape"])) if row["state_shape"] else f"{row['state_elems']:,}"
    state = f"state {shape}" if row["state_elems"] else "no recurrent state"
    conv = f"conv {row['conv_channels']:,} ch x {row['conv_kernel'] - 1} cols" if row["conv_channels"] else "no conv"
    cached = f"{row['family']}: {conv} + {state}"
    per_tok = f"fixed {format_bytes(row['state_bytes_per_sequence'])} per sequence"
    if "attention" in row:
        cached = f"{row['attention']}\n+ {cached}"
        per_tok = f"{bytes_cell(row['bytes_per_token'])}\n+ {per_tok}"
    return cached, per_tok
