"""kvplan.app.models: the use cases behind `kvplan models` and `kvplan show`, called directly."""

from __future__ import annotations

from kvplan.app.models import bundled_models, show_model
from kvplan.io.models import bundled_index


def test_every_bundled_model_is_listed_with_its_bytes_per_token():
    rows = {row.name: row for row in bundled_models()}
    assert set(rows) == set(bundled_index())
    llama = rows["llama2-7b"]
    assert (llama.layers, llama.attention, llama.dtype, llama.bytes_per_token) == (32, "32 full", "fp16", 524_288)
    assert llama.params is not None and 6.7e9 < llama.params < 6.8e9


def test_show_gives_an_mla_layer_its_latent_and_expanded_bytes():
    shown = show_model("deepseek-v3")
    assert shown.spec.name == "deepseek-v3" and shown.hub is None
    (group,) = shown.groups
    assert group["kind"] == "mla" and len(group["layers"]) == 61
    # bf16: (kv_lora_rank 512 + rope 64) x 2 B as the latent; 128 heads x (K 128+64, V 128) x 2 B expanded
    assert group["latent_bytes_per_token"] == (512 + 64) * 2
    assert group["expanded_bytes_per_token"] == 128 * (128 + 64 + 128) * 2


def test_show_says_whose_cache_a_shared_layer_reads():
    groups = show_model("gemma3n-e4b").groups
    shared = [g for g in groups if "reads_layer" in g]
    assert shared and all(g["kind"] == "none" and g["bytes_per_token"] == 0 for g in shared)
