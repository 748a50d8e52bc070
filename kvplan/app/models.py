"""``kvplan models`` and ``kvplan show``: the bundled models in a line each, and one model's parsed spec layer
group by layer group, with the bytes each kind of layer caches per token (ideal engine, the model's dtype)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvplan.core.dtypes import KVDtype, get_dtype
from kvplan.core.engines import get_engine
from kvplan.core.sizing import layer_token_bytes
from kvplan.core.spec import CompressedLayer, Layer, LayerKind, LinearLayer, MLALayer, ModelSpec, NoCacheLayer
from kvplan.io.models import bundled_index, bundled_published, load_bundled, resolve_model

if TYPE_CHECKING:
    from kvplan.io.hub import HubConfig


@dataclass(frozen=True, kw_only=True)
class BundledModel:
    """One bundled model, as ``kvplan models`` lists it (the fields are its JSON keys, in order)."""

    name: str
    aliases: tuple[str, ...]
    layers: int
    attention: str  # the layer kinds and their counts, e.g. "52 sliding, 10 full"
    dtype: str
    max_model_len: int
    bytes_per_token: int  # the ideal engine's, in the model's dtype
    source: str
    model_type: str
    params: int | None  # parameters as `fit` counts them (None: the config gives no architecture)
    language_model_params: int | None  # less the vision tower and projector (kvplan.io.towers)
    published: dict[str, Any] | None  # the published figure the bundled file cites


@dataclass(frozen=True, kw_only=True)
class ShownModel:
    """A parsed model spec; ``groups`` holds one row per layer group (``kvplan show --json``'s ``groups``)."""

    spec: ModelSpec
    groups: tuple[dict[str, Any], ...]
    hub: HubConfig | None = None


def bundled_models() -> tuple[BundledModel, ...]:
    """Every bundled model config, by name."""
    from kvplan.core.weights import count_params

    rows = []
    ideal = get_engine("ideal")
    for entry in bundled_index().values():
        spec = load_bundled(entry)
        dtype = get_dtype(spec.dtype)
        counts = count_params(spec, spec.arch) if spec.arch else None
        rows.append(BundledModel(
            name=spec.name, aliases=tuple(entry.aliases), layers=spec.num_layers,
            attention=", ".join(f"{n} {k.value}" for k, n in spec.kind_counts().items()), dtype=spec.dtype,
            max_model_len=spec.max_model_len,
            bytes_per_token=sum(layer_token_bytes(layer, ideal, dtype) for layer in spec.layers),
            source=entry.source, model_type=spec.model_type,
            params=counts.total if counts else None, language_model_params=counts.language_model if counts else None,
            published=bundled_published(entry)))
    return tuple(rows)


def show_model(model: str, *, fetch: bool | None = None, revision: str | None = None) -> ShownModel:
    """The spec of ``model`` (a bundled name, hub id or config.json), layer group by layer group."""
    resolved = resolve_model(model, fetch=fetch, revision=revision)
    return ShownModel(spec=resolved.spec, groups=tuple(layer_rows(resolved.spec)), hub=resolved.hub)


def layer_rows(spec: ModelSpec) -> list[dict[str, Any]]:
    """One row per layer group: its layers, kind, description, and what its kind caches."""
    dtype = get_dtype(spec.dtype)
    rows = []
    for layer, indices in spec.layer_groups():
        row: dict[str, Any] = {"layers": indices, "kind": layer.kind.value,
                               "description": layer.describe(spec.num_attention_heads)}
        row.update(_cached(layer, spec, dtype))
        rows.append(row)
    return rows


def _cached(layer: Layer, spec: ModelSpec, dtype: KVDtype) -> dict[str, Any]:
    """What one layer of this kind caches, per token or per sequence (the ideal engine's bytes)."""
    ideal = get_engine("ideal")
    if isinstance(layer, MLALayer):
        return _mla(layer, dtype)
    if isinstance(layer, CompressedLayer):
        return dict(head_dim=layer.head_dim, window=layer.window, compress_ratio=layer.compress_ratio,
                    indexer_head_dim=layer.indexer_head_dim, overlap=layer.overlap,
                    bytes_per_token=layer_token_bytes(layer, ideal, dtype),
                    entry_bytes=dtype.vector_bytes(layer.head_dim) if layer.compress_ratio else 0,
                    indexer_bytes_per_entry=ideal.indexer_slot_bytes(layer, dtype))
    if isinstance(layer, LinearLayer):
        return _linear(layer, spec, dtype)
    if isinstance(layer, NoCacheLayer):
        # cross-layer KV sharing: attends over that layer's cache, stores none
        return dict(reads_layer=layer.reads_layer, bytes_per_token=0) if layer.reads_layer >= 0 else {}
    if layer.kind is LayerKind.NONE:
        return {}
    return dict(num_kv_heads=layer.num_kv_heads, k_head_dim=layer.k_head_dim,  # type: ignore[union-attr]
                v_head_dim=layer.v_head_dim, window=layer.window or None,  # type: ignore[union-attr]
                bytes_per_token=layer_token_bytes(layer, ideal, dtype))


def _mla(layer: MLALayer, dtype: KVDtype) -> dict[str, Any]:
    """The latent as vLLM and SGLang cache it, beside the per-head K and V it expands to."""
    ideal = get_engine("ideal")
    row = dict(kv_lora_rank=layer.kv_lora_rank, qk_rope_head_dim=layer.qk_rope_head_dim,
               qk_nope_head_dim=layer.qk_nope_head_dim, v_head_dim=layer.v_head_dim, num_heads=layer.num_heads,
               latent_bytes_per_token=layer_token_bytes(layer, ideal, dtype),
               expanded_bytes_per_token=layer_token_bytes(layer, dataclasses.replace(ideal, mla_latent=False), dtype))
    if layer.indexer_head_dim:  # DSA: the lightning indexer's key, per token (included in the bytes above)
        row.update(indexer_head_dim=layer.indexer_head_dim, indexer_heads=layer.indexer_heads,
                   indexer_bytes_per_token=ideal.indexer_slot_bytes(layer, dtype))
    return row


def _linear(layer: LinearLayer, spec: ModelSpec, dtype: KVDtype) -> dict[str, Any]:
    """A fixed state per sequence (conv columns and a recurrent state), and a parallel attention's tokens."""
    ideal = get_engine("ideal")
    conv, state = ideal.linear_state_elems(layer)
    row = dict(family=layer.family, conv_elems=conv, state_elems=state,
               state_bytes_per_sequence=sum(ideal.linear_state_bytes(layer, spec.dtype, 1)),
               conv_channels=layer.conv_channels, conv_kernel=layer.conv_kernel, state_shape=list(layer.state_shape))
    if layer.attention is not None:  # a parallel attention in the same layer (Falcon-H1)
        row.update(attention=layer.attention.describe(spec.num_attention_heads),
                   bytes_per_token=layer_token_bytes(layer, ideal, dtype))
    return row
