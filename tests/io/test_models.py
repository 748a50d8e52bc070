"""Bundled models: published figures, aliases, lookups, and agreement with transformers' own configs."""

from __future__ import annotations

import json

import pytest

from kvplan.core.engines import get_engine
from kvplan.core.sizing import size_kv
from kvplan.core.spec import AttentionLayer, CompressedLayer, LayerKind
from kvplan.errors import ConfigError, InputError
from kvplan.io.models import bundled_index, load_bundled, load_model

GiB = 1 << 30


@pytest.mark.parametrize(
    "name,bytes_per_token",
    [
        ("llama2-7b", 524_288),
        ("opt-13b", 819_200),
        ("llama3.1-405b", 516_096),
        ("qwen2.5-72b", 327_680),
        ("deepseek-v3", 70_272),
        ("llama3-70b", 327_680),
        ("llama3-8b", 131_072),
    ],
)
def test_published_bytes_per_token(name, bytes_per_token):
    spec = load_model(name)
    assert size_kv(spec, get_engine("ideal"), batch=1, seq_len=1).bytes_per_token == bytes_per_token


def test_llama2_7b_4096_tokens_is_2_gib():
    assert size_kv(load_model("llama2-7b"), get_engine("ideal"), batch=1, seq_len=4096).total_bytes == 2 * GiB


@pytest.mark.parametrize("batch,gib", [(4, 72), (16, 288), (64, 1152)])
def test_gpt3_175b_at_4096_tokens(batch, gib):
    r = size_kv(load_model("gpt3-175b"), get_engine("ideal"), batch=batch, seq_len=4096)
    assert r.total_bytes == gib * GiB


def test_deepseek_v3_expanded_is_far_larger_than_latent():
    spec = load_model("deepseek-v3")
    import dataclasses

    expanded = size_kv(spec, dataclasses.replace(get_engine("ideal"), mla_latent=False), batch=1, seq_len=1)
    assert expanded.bytes_per_token == 61 * 128 * (192 + 128) * 2
    assert expanded.bytes_per_token > 70 * 70_272


def test_hub_alias_resolves_to_the_bundled_file():
    assert load_model("meta-llama/Llama-2-7b-hf").name == "llama2-7b"
    assert load_model("LLAMA2-7B").name == "llama2-7b"


def test_every_bundled_model_loads_and_cites_a_source():
    index = bundled_index()
    assert len(index) >= 30
    for entry in index.values():
        spec = load_bundled(entry)
        assert spec.layers and spec.source.strip(), entry.name
        assert spec.max_model_len > 0, entry.name


def test_unknown_model_suggests_close_names():
    with pytest.raises(InputError, match="did you mean llama2-7b"):
        load_model("llama2-7")


def test_config_json_file_and_folder(tmp_path):
    cfg = dict(model_type="llama", hidden_size=512, num_hidden_layers=2, num_attention_heads=8,
               num_key_value_heads=2, max_position_embeddings=1024, torch_dtype="float16")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load_model(str(tmp_path)).num_layers == 2
    assert load_model(str(tmp_path / "config.json")).layers[0].num_kv_heads == 2


def test_folder_without_config_and_broken_json(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text('{"model_type": "llama",\n  oops}')
    with pytest.raises(ConfigError, match="line 2: not valid JSON"):
        load_model(str(tmp_path))


def test_hub_id_from_local_hf_cache_without_download(tmp_path, monkeypatch):
    snap = tmp_path / "models--acme--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(dict(model_type="mistral", hidden_size=256, num_hidden_layers=2,
                                                      num_attention_heads=4, num_key_value_heads=1, sliding_window=64)))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    spec = load_model("acme/tiny")
    assert spec.layers[0].kind is LayerKind.SLIDING and spec.layers[0].window == 64
    with pytest.raises(InputError, match="unknown model 'acme/other'"):
        load_model("acme/other")


@pytest.mark.parametrize("name", sorted(bundled_index()))
def test_layer_kinds_agree_with_transformers(name):
    """Where transformers knows the architecture, its cache layer types equal ours, layer by layer."""
    pytest.importorskip("transformers")  # here, not at module level: the tests below need no transformers
    from transformers import AutoConfig
    from transformers.cache_utils import get_layer_types_and_kwargs

    entry = bundled_index()[name]
    spec = load_bundled(entry)
    raw = dict(spec.raw_config)
    model_type = raw.pop("model_type")
    try:
        config = AutoConfig.for_model(model_type, **raw)
    except (ValueError, KeyError, TypeError) as exc:
        pytest.skip(f"transformers cannot build a {model_type} config here: {exc}")
    text = config.get_text_config(decoder=True)
    types, kwargs = get_layer_types_and_kwargs(text)
    to_kind = {"full_attention": LayerKind.FULL, "sliding_attention": LayerKind.SLIDING,
               "chunked_attention": LayerKind.CHUNKED, "linear_attention": LayerKind.LINEAR,
               "mamba": LayerKind.LINEAR, "dummy": LayerKind.NONE,
               "indexed_attention": LayerKind.FULL,  # MLA with a DSA indexer (DynamicIndexedLayer)
               "conv": LayerKind.LINEAR, "hybrid": LayerKind.LINEAR}  # hybrid: linear state + full attention
    # MLA is full attention; DeepSeek-V4's layers are named by their compression ratio in transformers
    v4_types = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    ours = [LayerKind.FULL if layer.kind is LayerKind.MLA
            else v4_types[layer.compress_ratio] if isinstance(layer, CompressedLayer)
            else layer.kind for layer in spec.layers]
    assert [to_kind.get(t, t) if not isinstance(layer, CompressedLayer) else t
            for t, layer in zip(types, spec.layers)] == ours
    # transformers' "hybrid" layers (Falcon-H1) hold a full attention beside the state, and only they do
    assert [t == "hybrid" for t in types] == [getattr(layer, "attention", None) is not None for layer in spec.layers]
    for layer, kw in zip(spec.layers, kwargs):
        if isinstance(layer, AttentionLayer) and layer.kind is not LayerKind.FULL:
            assert kw["sliding_window"] == layer.window


@pytest.mark.parametrize("batch,table_gib", [(4, 75.5), (16, 302), (64, 1208)])
def test_the_misprinted_gpt3_table_is_reproduced_by_its_custom_spec(batch, table_gib):
    from kvplan.io.models import configs_dir

    spec = load_model(str(configs_dir() / "examples" / "gpt3-175b-d12888.json"))
    r = size_kv(spec, get_engine("ideal"), batch=batch, seq_len=4096)
    assert round(r.total_bytes / GiB, 1 if table_gib < 100 else 0) == table_gib


def test_bundled_format_errors_name_file_key_and_line(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("name: m\nsource: here\nconfig: {}\nsize: 7\n")
    with pytest.raises(ConfigError, match=r"m.yaml: line 4: size: unknown key"):
        load_model(str(path))
    path.write_text("name: m\nconfig: {}\n")
    with pytest.raises(ConfigError, match=r"m.yaml: source: Field required"):
        load_model(str(path))
    path.write_text("name: m\nsource: [1]\nconfig: {}\n")
    with pytest.raises(ConfigError, match=r"line 2: source: Input should be a valid string"):
        load_model(str(path))


def test_every_bundled_file_passes_the_strict_schema():
    from kvplan.io.schemas import BundledModelFile
    from kvplan.io.yamlio import load_yaml

    for entry in bundled_index().values():
        BundledModelFile.model_validate(load_yaml(entry.path))
