"""The known traps of config.json come out right."""

from __future__ import annotations

import pytest

from kvplan.core.spec import AttentionLayer, LayerKind, LinearLayer, MLALayer
from kvplan.errors import ConfigError, UnmodeledError
from kvplan.io.hf_config import spec_from_hf_config


def spec(**cfg):
    return spec_from_hf_config(cfg, name="t", origin="cfg.json")


LLAMA = dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
             num_key_value_heads=8, max_position_embeddings=8192, torch_dtype="bfloat16")


def test_plain_gqa():
    s = spec(**LLAMA)
    layer = s.layers[0]
    assert isinstance(layer, AttentionLayer)
    assert (layer.num_kv_heads, layer.k_head_dim, s.dtype, s.max_model_len) == (8, 128, "bf16", 8192)


def test_deepseek_kv_heads_128_beside_mla_means_mla():
    s = spec(model_type="deepseek_v3", hidden_size=7168, num_hidden_layers=61, num_attention_heads=128,
             num_key_value_heads=128, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
             torch_dtype="bfloat16")
    assert all(isinstance(layer, MLALayer) and layer.latent_dim == 576 for layer in s.layers)
    assert any("num_key_value_heads 128 ignored" in n for n in s.notes)


def test_falcon_7b_multi_query_stores_one_head():
    s = spec(model_type="falcon", hidden_size=4544, num_hidden_layers=32, num_attention_heads=71,
             multi_query=True, new_decoder_architecture=False)
    assert s.layers[0].num_kv_heads == 1 and s.layers[0].k_head_dim == 64
    assert s.max_model_len == 2048  # FalconConfig default, noted
    assert any("multi_query" in n for n in s.notes)


def test_falcon_40b_new_architecture_uses_num_kv_heads():
    s = spec(model_type="falcon", hidden_size=8192, num_hidden_layers=60, num_attention_heads=128,
             num_kv_heads=8, new_decoder_architecture=True)
    assert s.layers[0].num_kv_heads == 8
    assert "hf_kv_broadcast" in s.quirks


def test_qwen2_window_unused_means_no_window():
    s = spec(model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
             num_key_value_heads=4, sliding_window=131072, use_sliding_window=False, max_window_layers=28)
    assert {layer.kind for layer in s.layers} == {LayerKind.FULL}
    assert any("use_sliding_window is false" in n for n in s.notes)


def test_qwen2_window_used_slides_from_max_window_layers():
    s = spec(model_type="qwen2", hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, sliding_window=64, use_sliding_window=True, max_window_layers=2)
    assert [layer.kind for layer in s.layers] == [LayerKind.FULL, LayerKind.FULL, LayerKind.SLIDING, LayerKind.SLIDING]


def test_explicit_head_dim_wins():
    s = spec(model_type="gemma2", hidden_size=3584, num_hidden_layers=4, num_attention_heads=16,
             num_key_value_heads=8, head_dim=256, sliding_window=4096)
    assert s.layers[0].k_head_dim == 256  # not 3584 / 16 = 224
    assert [layer.kind for layer in s.layers] == [LayerKind.SLIDING, LayerKind.FULL] * 2


def test_multimodal_text_config_and_top_level_dtype():
    s = spec(model_type="gemma3", torch_dtype="bfloat16",
             text_config=dict(model_type="gemma3_text", hidden_size=5376, num_hidden_layers=12, num_attention_heads=32,
                              num_key_value_heads=16, head_dim=128, sliding_window=1024))
    assert s.dtype == "bf16" and s.num_layers == 12
    assert [layer.kind for layer in s.layers].count(LayerKind.FULL) == 2  # layers 5 and 11
    assert s.layers[0].window == 1024
    assert any("text_config" in n for n in s.notes)


def test_layer_types_list_is_followed():
    s = spec(**LLAMA | dict(num_hidden_layers=3, sliding_window=128,
                           layer_types=["sliding_attention", "full_attention", "sliding_attention"]))
    assert [layer.kind for layer in s.layers] == [LayerKind.SLIDING, LayerKind.FULL, LayerKind.SLIDING]


def test_qwen3_next_linear_state_sizes():
    s = spec(model_type="qwen3_next", hidden_size=2048, num_hidden_layers=8, num_attention_heads=16,
             num_key_value_heads=2, head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128,
             linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32)
    kinds = [layer.kind for layer in s.layers]
    assert kinds == [LayerKind.LINEAR] * 3 + [LayerKind.FULL] + [LayerKind.LINEAR] * 3 + [LayerKind.FULL]
    lin = s.layers[0]
    assert isinstance(lin, LinearLayer)
    assert lin.conv_channels == 2 * 16 * 128 + 32 * 128 and lin.state_elems == 32 * 128 * 128


def test_gpt2_keys():
    s = spec(model_type="gpt2", n_embd=768, n_layer=12, n_head=12, n_positions=1024)
    assert (s.num_layers, s.layers[0].num_kv_heads, s.layers[0].k_head_dim, s.max_model_len) == (12, 12, 64, 1024)


@pytest.mark.parametrize(
    "cfg,match",
    [
        (dict(model_type="llama", hidden_size=4096, num_attention_heads=32), "num_hidden_layers .* is missing"),
        (dict(LLAMA, num_hidden_layers="32"), "num_hidden_layers must be an integer"),
        (dict(LLAMA, num_hidden_layers=0), "num_hidden_layers must be >= 1"),
        (dict(LLAMA, num_key_value_heads=5), "must divide num_attention_heads"),
        (dict(LLAMA, hidden_size=4097), "add head_dim"),
        (dict(LLAMA, torch_dtype="float13"), "torch_dtype 'float13'"),
        (dict(LLAMA, layer_types=["full_attention"]), "one type per layer"),
        (dict(LLAMA, num_hidden_layers=1, layer_types=["weird"]), r"layer_types\[0\] = 'weird'"),
        (dict(LLAMA, num_hidden_layers=1, layer_types=["linear_attention"]), "state sizes"),
    ],
)
def test_malformed_configs_name_the_file_and_key(cfg, match):
    with pytest.raises(ConfigError, match=f"cfg.json: .*{match}"):
        spec_from_hf_config(cfg, name="t", origin="cfg.json")


# -- configs as transformers 5.x writes them, and architectures kvplan does not model ------------------------------

def test_head_dim_written_as_null_is_derived():
    """transformers 5.x writes ``head_dim: null`` where the attention derives it (MinistralConfig, HunYuan)."""
    assert spec(**LLAMA, head_dim=None).layers[0].k_head_dim == 4096 // 32


def test_a_derived_head_dim_that_is_not_an_integer_is_refused_not_truncated():
    """transformers' own attention floors hidden / heads (Glm4MoeConfig's defaults, 4096 / 96, give 42 there); kvplan
    refuses to guess which the checkpoint means."""
    with pytest.raises(ConfigError, match="hidden_size 6000 is not a multiple of num_attention_heads 64"):
        spec(**dict(LLAMA, hidden_size=6000, num_attention_heads=64, num_key_value_heads=8))
    with pytest.raises(ConfigError, match="not a multiple"):
        spec(model_type="glm4_moe", hidden_size=4096, num_hidden_layers=2, num_attention_heads=96,
             num_key_value_heads=8, torch_dtype="bfloat16")


def test_nemotron_h_without_num_hidden_layers_counts_its_block_list():
    """NemotronHConfig (5.x) derives num_hidden_layers from layers_block_type and writes only the list."""
    s = spec(model_type="nemotron_h", hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             mamba_num_heads=8, mamba_head_dim=32, ssm_state_size=16, n_groups=2,
             layers_block_type=["linear_attention", "moe", "full_attention", "mlp"])
    assert s.num_layers == 4
    assert [layer.kind for layer in s.layers] == [LayerKind.LINEAR, LayerKind.NONE, LayerKind.FULL, LayerKind.NONE]


def test_mla_without_a_rope_part_reads():
    s = spec(model_type="deepseek_v3", hidden_size=1024, num_hidden_layers=2, num_attention_heads=8,
             kv_lora_rank=256, qk_rope_head_dim=0, qk_nope_head_dim=64, v_head_dim=64, torch_dtype="bfloat16")
    assert s.layers[0].latent_dim == 256


def test_a_window_beside_full_attention_only_is_not_read():
    """Qwen2MoeConfig writes sliding_window 0 with use_sliding_window false: no layer slides, no window is read."""
    s = spec(**dict(LLAMA, model_type="qwen2_moe", sliding_window=0, use_sliding_window=False))
    assert {layer.kind for layer in s.layers} == {LayerKind.FULL}


def test_an_unknown_model_type_is_read_with_a_note_saying_it_is_unchecked():
    s = spec(**dict(LLAMA, model_type="my_new_llama"))
    assert any("model_type 'my_new_llama' is not one kvplan has checked" in n for n in s.notes)
    assert not any("has checked" in n for n in spec(**LLAMA).notes)  # llama is checked: no note


@pytest.mark.parametrize("change,names", [
    ({"model_type": "mamba"}, "model_type 'mamba'"),
    ({"model_type": "bart"}, "encoder-decoder"),
    ({"layer_types": ["full_attention", "indexed_attention"] * 16}, "'indexed_attention' is not a layer type"),
    ({"layer_types": ["hybrid_sliding"] * 32}, "'hybrid_sliding'"),
])
def test_what_kvplan_does_not_model_is_refused_by_name_with_the_config(change, names):
    with pytest.raises(UnmodeledError, match=names) as info:
        spec(**dict(LLAMA, **change))
    message = str(info.value)
    assert message.startswith("cfg.json: ") and "\n" not in message and "--engine hf" in message
    assert info.value.config["hidden_size"] == 4096 and info.value.what in message


def test_a_multimodal_wrapper_kvplan_refuses_is_refused_whatever_its_text_model():
    """Llama 3.2 Vision (mllama) nests a llama-like text model whose cross-attention layers cache the image."""
    with pytest.raises(UnmodeledError, match="'mllama'"):
        spec(model_type="mllama", text_config=dict(LLAMA, model_type="mllama_text_model"))
