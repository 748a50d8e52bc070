"""The attention family reader (kvplan.io.families.attention): per-layer shapes, cross-layer KV sharing,
MoE weight layouts. Expected figures are worked by hand from the config values in each test."""

from __future__ import annotations

import dataclasses

import pytest

from kvplan.core.engines import get_engine
from kvplan.core.sizing import size_kv
from kvplan.core.spec import AttentionLayer, LayerKind, NoCacheLayer
from kvplan.core.weights import count_params
from kvplan.errors import ConfigError
from kvplan.io import families
from kvplan.io.families import attention
from kvplan.io.hf_config import spec_from_hf_config
from kvplan.io.models import load_model

S, F = "sliding_attention", "full_attention"


def spec_of(cfg: dict, name: str = "t"):
    return spec_from_hf_config(dict(cfg), name=name, origin=name)


def bytes_per_token(spec) -> int:
    return size_kv(spec, get_engine("ideal"), batch=1, seq_len=1).bytes_per_token


def gemma4(**over) -> dict:
    cfg = {"model_type": "gemma4_text", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 6,
           "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32, "global_head_dim": 64,
           "num_global_key_value_heads": 2, "attention_k_eq_v": True, "sliding_window": 16, "vocab_size": 1000,
           "hidden_size_per_layer_input": 0, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
    cfg.update(over)
    return cfg


def test_module_types_equal_the_hook_entry():
    assert families._MODULE_TYPES["kvplan.io.families.attention"] == attention.MODEL_TYPES
    for model_type in attention.MODEL_TYPES:
        assert families.family_module(model_type) is attention


def test_gemma4_31b_layers_and_bytes_per_token():
    spec = load_model("gemma4-31b")
    assert spec.num_layers == 60 and spec.max_model_len == 262_144 and spec.dtype == "bf16"
    for i, layer in enumerate(spec.layers):
        assert isinstance(layer, AttentionLayer)
        if (i + 1) % 6 == 0:  # 5 local : 1 global
            assert (layer.kind, layer.num_kv_heads, layer.k_head_dim, layer.v_head_dim) == (LayerKind.FULL, 4, 512, 512)
        else:
            assert (layer.kind, layer.num_kv_heads, layer.k_head_dim, layer.window) == (LayerKind.SLIDING, 16, 256, 1024)
    # 50 sliding x 16 heads x (256 K + 256 V) x 2 B + 10 full x 4 heads x (512 + 512) x 2 B
    assert bytes_per_token(spec) == 50 * 16 * 512 * 2 + 10 * 4 * 1024 * 2 == 901_120
    # 8 sequences of 100,000 tokens, ideal: sliding layers hold 1,024 tokens, full layers all of them
    r = size_kv(spec, get_engine("ideal"), batch=8, seq_len=100_000)
    assert r.total_bytes == 8 * (50 * 16 * 512 * 2 * 1024 + 10 * 4 * 1024 * 2 * 100_000)


def test_gemma4_global_layers_without_k_eq_v_keep_the_kv_heads():
    """transformers applies num_global_key_value_heads only with attention_k_eq_v; head_dim still changes."""
    spec = spec_of(gemma4(attention_k_eq_v=False, layer_types=[S, S, F, S, S, F]))
    full = [x for x in spec.layers if x.kind is LayerKind.FULL]
    assert {(x.num_kv_heads, x.k_head_dim) for x in full} == {(4, 64)}
    assert any("num_global_key_value_heads 2 ignored" in n for n in spec.notes)


def test_gemma4_defaults_pattern_and_forced_last_full_layer():
    spec = spec_of(gemma4(num_hidden_layers=8))  # no layer_types: layer 5 full; 7 forced full
    kinds = [x.kind for x in spec.layers]
    assert kinds == [LayerKind.SLIDING] * 5 + [LayerKind.FULL, LayerKind.SLIDING, LayerKind.FULL]
    spec = spec_of(gemma4(layer_types=[S] * 6))
    assert spec.layers[-1].kind is LayerKind.FULL and spec.layers[-1].k_head_dim == 64
    assert any("last layer is full attention" in n for n in spec.notes)


def test_gemma4_global_head_dim_default_is_512():
    cfg = gemma4(layer_types=[S, F])
    cfg.pop("global_head_dim")
    cfg["num_hidden_layers"] = 2
    spec = spec_of(cfg)
    assert spec.layers[1].k_head_dim == 512 and any("global_head_dim" in n for n in spec.notes)


def test_gemma4_per_layer_config_overrides_win():
    """transformers 5.x saves heterogeneous configs as per_layer_config; global_head_dim is then unused."""
    cfg = gemma4(layer_types=[S, F, S, F], num_hidden_layers=4,
                 per_layer_config={"1": {"head_dim": 128, "num_key_value_heads": 1}, "3": {"head_dim": 96}})
    spec = spec_of(cfg)
    shapes = [(x.num_kv_heads, x.k_head_dim) for x in spec.layers]
    assert shapes == [(4, 32), (1, 128), (4, 32), (4, 96)]
    with pytest.raises(ConfigError, match="per_layer_config keys"):
        spec_of(gemma4(per_layer_config={"9": {"head_dim": 8}}))


def test_gemma4_bidirectional_attention_halves_the_window():
    spec = spec_of(gemma4(layer_types=[S, F], num_hidden_layers=2, use_bidirectional_attention="all"))
    assert spec.layers[0].window == 16 // 2 + 1


def test_gemma4_kv_sharing_like_e2b():
    """35 layers (4 local : 1 global), the last 20 shared: layer 15 on reuse; sliding layers read 13,
    global layers read 14 (the last of each type before 15)."""
    spec = spec_of(gemma4(num_hidden_layers=35, layer_types=([S] * 4 + [F]) * 7, num_kv_shared_layers=20))
    for i, layer in enumerate(spec.layers):
        if i < 15:
            assert isinstance(layer, AttentionLayer)
        else:
            assert isinstance(layer, NoCacheLayer) and layer.reads_layer == (14 if (i + 1) % 5 == 0 else 13)
    # 15 producing layers: 12 sliding x 4 heads x (32 + 32) x 2 B + 3 global x 2 heads x (64 + 64) x 2 B
    assert bytes_per_token(spec) == 12 * 4 * 64 * 2 + 3 * 2 * 128 * 2
    assert spec.layers[20].describe(8) == "shares layer 13's KV cache"


def test_gemma3n_e4b_layers_sharing_and_bytes():
    spec = load_model("gemma3n-e4b")
    assert spec.num_layers == 35 and spec.max_model_len == 32_768
    own = spec.layers[:20]
    assert [x.kind for x in own] == ([LayerKind.SLIDING] * 4 + [LayerKind.FULL]) * 4
    assert {(x.num_kv_heads, x.k_head_dim) for x in own} == {(2, 256)}
    assert {x.window for x in own if x.kind is LayerKind.SLIDING} == {512}
    # layers 20-34 read the last sliding (18) or full (19) layer before 20
    reads = [x.reads_layer for x in spec.layers[20:]]
    assert reads == ([18] * 4 + [19]) * 3
    assert bytes_per_token(spec) == 20 * 2 * 2 * 256 * 2 == 40_960
    assert any("layers 20-34 store no KV cache" in n for n in spec.notes)


def test_shared_layers_are_grouped_by_the_layer_they_read():
    spec = load_model("gemma3n-e4b")
    groups = {layer.describe(8): idx for layer, idx in spec.layer_groups() if isinstance(layer, NoCacheLayer)}
    assert groups == {"shares layer 18's KV cache": [20, 21, 22, 23, 25, 26, 27, 28, 30, 31, 32, 33],
                      "shares layer 19's KV cache": [24, 29, 34]}


def gemma3n(**over) -> dict:
    cfg = {"model_type": "gemma3n_text", "hidden_size": 64, "intermediate_size": [128, 128, 64, 64, 64],
           "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 6,
           "vocab_size": 128, "vocab_size_per_layer_input": 128, "hidden_size_per_layer_input": 8,
           "num_kv_shared_layers": 2, "laurel_rank": 4, "layer_types": [S, S, F, S, F], "torch_dtype": "float32"}
    cfg.update(over)
    return cfg


@pytest.mark.parametrize("over,match", [
    ({"num_kv_shared_layers": 5}, "leaves no layer to produce a cache"),
    ({"layer_types": [S, S, S, S, F]}, "no earlier layer of that type"),  # layer 4 is full, none before 3
    ({"intermediate_size": [128, 64]}, "intermediate_size lists 2 widths for 5 layers"),
    ({"layer_types": [S, S, "chunked_attention", S, F], "attention_chunk_size": 8}, "sliding_attention or full"),
])
def test_gemma3n_bad_configs_say_what_to_change(over, match):
    with pytest.raises(ConfigError, match=match):
        spec = spec_of(gemma3n(**over))
        count_params(spec, spec.arch)


def test_gemma3n_per_layer_intermediate_sizes_reach_the_weights():
    spec = spec_of(gemma3n())
    assert spec.arch.layer_intermediate == (128, 128, 64, 64, 64)
    # shared layers (3, 4) keep q_proj and o_proj (64 x 64 each) and no k/v projections
    wide = spec_of(gemma3n(intermediate_size=[128] * 5))
    assert count_params(wide, wide.arch).total - count_params(spec, spec.arch).total == 3 * 3 * 64 * 64


def test_olmo3_defaults_to_three_sliding_per_full_layer():
    cfg = {"model_type": "olmo3", "hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
           "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 4096}
    spec = spec_of(cfg)
    assert [x.kind for x in spec.layers] == ([LayerKind.SLIDING] * 3 + [LayerKind.FULL]) * 2
    assert spec.layers[0].window == 4096  # Olmo3Config default
    assert any("every 4th layer full" in n for n in spec.notes)


def test_olmo3_1_32b_bundled():
    spec = load_model("olmo3.1-32b")
    assert [x.kind for x in spec.layers] == ([LayerKind.SLIDING] * 3 + [LayerKind.FULL]) * 16
    assert bytes_per_token(spec) == 64 * 2 * 8 * 128 * 2 == 262_144
    # 1 sequence of 65,536 tokens: 48 sliding layers hold 4,096 tokens, 16 full layers all of them
    r = size_kv(spec, get_engine("ideal"), batch=1, seq_len=65_536)
    assert r.total_bytes == (48 * 4096 + 16 * 65_536) * 2 * 8 * 128 * 2


@pytest.mark.parametrize("name,layers,kv_heads,head_dim,max_len", [
    ("seed-oss-36b", 64, 8, 128, 524_288),  # head_dim 128, not 5120 / 80 = 64
    ("hunyuan-a13b", 32, 8, 128, 32_768),
    ("minimax-m2.7", 62, 8, 128, 204_800),
    ("minimax-m2.5", 62, 8, 128, 196_608),
    ("glm4.7", 92, 8, 128, 202_752),
])
def test_full_attention_moe_and_dense_families(name, layers, kv_heads, head_dim, max_len):
    spec = load_model(name)
    assert spec.num_layers == layers and spec.max_model_len == max_len
    assert {(x.kind, x.num_kv_heads, x.k_head_dim) for x in spec.layers} == {(LayerKind.FULL, kv_heads, head_dim)}
    assert bytes_per_token(spec) == layers * 2 * kv_heads * head_dim * 2


def test_moe_shapes_read_from_each_family():
    glm = load_model("glm4.7").arch
    assert glm.moe.num_experts == 160 and glm.moe.experts_per_token == 8 and glm.moe.expert_intermediate == 1536
    assert glm.moe.shared_intermediate == 1536 and glm.moe_layers == (False,) * 3 + (True,) * 89
    assert glm.qkv_bias and not glm.o_bias
    mm = load_model("minimax-m2.7").arch
    assert (mm.moe.num_experts, mm.moe.experts_per_token, mm.moe.expert_intermediate, mm.moe.shared_intermediate) \
        == (256, 8, 1536, 0)
    hy = load_model("hunyuan-a13b").arch
    # transformers sizes experts and the shared MLP by intermediate_size (moe_topk is a per-layer list)
    assert (hy.moe.num_experts, hy.moe.experts_per_token, hy.moe.expert_intermediate, hy.moe.shared_intermediate) \
        == (64, 8, 3072, 3072)
    seed = load_model("seed-oss-36b").arch
    assert seed.qkv_bias and not seed.o_bias


def test_hunyuan_per_layer_lists_that_differ_are_refused():
    cfg = {"model_type": "hunyuan_v1_moe", "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "num_experts": 4,
           "moe_topk": [2, 3]}
    with pytest.raises(ConfigError, match="moe_topk differs between layers"):
        spec_of(cfg)


# Published totals (model cards) of the language model: a vision tower kvplan counts (kvplan.io.towers) is left
# out (ParamCounts.language_model), audio towers are not counted, multi-token-prediction layers not counted
# (vLLM loads them only as a speculative-decoding draft).
@pytest.mark.parametrize("name,published", [
    ("gemma4-31b", 30.7e9),  # google/gemma-4-31B model card: 30.7B (the ~0.55B vision encoder apart)
    ("olmo3.1-32b", 32e9),  # allenai Olmo 3 model card: 32B
    ("seed-oss-36b", 36e9),  # ByteDance-Seed/Seed-OSS-36B-Instruct model card: 36B
    ("hunyuan-a13b", 80e9),  # tencent/Hunyuan-A13B-Instruct model card: 80B total, 13B active
    ("minimax-m2.7", 229e9),  # MiniMaxAI/MiniMax-M2.7 model card: 229B total (MTP modules apart)
    ("minimax-m2.5", 228_703_644_928),  # the Hub's safetensors total for MiniMax-M2.5 (quoted by a public test)
    ("glm4.7", 355e9),  # zai-org/GLM-4.7 model card: 355B total, 32B active (MTP layer apart)
])
def test_parameter_counts_within_one_percent_of_published(name, published):
    spec = load_model(name)
    total = count_params(spec, spec.arch).language_model
    assert abs(total - published) / published < 0.01, f"{name}: {total / 1e9:.3f}B vs {published / 1e9:.3f}B"


def test_hunyuan_active_parameters():
    spec = load_model("hunyuan-a13b")  # model card: 13B active
    active = count_params(spec, spec.arch).active(spec.arch.moe)
    assert abs(active - 13e9) / 13e9 < 0.03


def test_gemma3n_e4b_text_count_is_below_the_8b_raw_total():
    """The model card's 8B raw parameters include the vision and audio encoders kvplan does not count:
    the text decoder alone (with 2.35B per-layer embeddings, 262,144 x 35 x 256) is below it."""
    spec = load_model("gemma3n-e4b")
    counts = count_params(spec, spec.arch)
    assert spec.arch.embedding_extra_params >= 262_144 * 35 * 256
    assert 6.5e9 < counts.total < 8e9


def test_every_published_figure_a_bundled_file_cites_is_met_within_one_percent():
    """The README's published-figures table prints each bundled file's ``published`` entry beside kvplan's
    count: every one of them is held here to 1%."""
    from kvplan.io.models import bundled_index, bundled_published, load_bundled

    cited = {name: bundled_published(entry) for name, entry in bundled_index().items() if bundled_published(entry)}
    assert {"gemma4-31b", "glm4.7", "hunyuan-a13b", "minimax-m2.7"} <= cited.keys()
    for name, published in cited.items():
        spec = load_bundled(bundled_index()[name])
        total = count_params(spec, spec.arch).language_model  # the cited figures are language models'
        assert abs(total - published["params"]) / published["params"] < 0.01, (name, total, published)


def test_gemma4_26b_a4b_moe_counts_match_the_model_card():
    """Gemma 4 26B-A4B (not bundled; its text_config values as public copies quote them): every layer runs a
    dense MLP (2112) beside 128 experts of 704, top 8. Model card: 25.2B total, 3.8B active."""
    cfg = gemma4(hidden_size=2816, num_hidden_layers=30, num_attention_heads=16, num_key_value_heads=8,
                 num_global_key_value_heads=2, head_dim=256, global_head_dim=512, intermediate_size=2112,
                 enable_moe_block=True, num_experts=128, top_k_experts=8, moe_intermediate_size=704,
                 vocab_size=262_144, sliding_window=1024)
    spec = spec_of(cfg)
    counts = count_params(spec, spec.arch)
    assert abs(counts.total - 25.2e9) / 25.2e9 < 0.01
    assert abs(counts.active(spec.arch.moe) - 3.8e9) / 3.8e9 < 0.03
    # the same layers without the dense MLP: 30 x 3 x 2816 x 2112 fewer parameters
    alone = count_params(spec, dataclasses.replace(spec.arch, dense_with_moe=False))
    assert counts.total - alone.total == 30 * 3 * 2816 * 2112
