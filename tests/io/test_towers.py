"""Vision towers and projectors counted from config.json (kvplan.io.towers) against counts worked by hand from
the config and vLLM 0.19.0's modules (vllm/model_executor/models/: siglip.py + gemma3_mm.py, mllama4.py,
pixtral.py + mistral3.py)."""

from __future__ import annotations

import pytest

from kvplan.errors import ConfigError
from kvplan.io.hf_config import spec_from_hf_config
from kvplan.io.models import load_model

MISTRAL_SMALL = "tests/fixtures/configs/mistral-small-3.1-24b.json"


def test_gemma3_siglip_tower_and_projector():
    # SigLIP, vision_config: hidden 1152, intermediate 4304, 27 layers, 896 px images in 14 px patches.
    # Embeddings (whole): conv 3*14*14*1152 + 1152 bias = 678,528; positions (896/14)^2 = 4096 x 1152 = 4,718,592.
    # One layer: qkv 1152*3456 + 3456 = 3,984,768 (split); out_proj 1152*1152 = 1,327,104 split + 1152 bias whole;
    # fc1 1152*4304 + 4304 = 4,962,512 split; fc2 4304*1152 = 4,958,208 split + 1152 bias whole;
    # two LayerNorms 4 * 1152 = 4608 whole. Split per layer 15,232,592 (x27 = 411,279,984), whole 6912 (x27 = 186,624).
    # post_layernorm 2304. Projector (whole): mm_input_projection_weight 1152 x 3840 (12B's text hidden) = 4,423,680,
    # mm_soft_emb_norm 1152.
    tower = load_model("gemma3-12b").arch.tower
    assert tower.split_params == 411_279_984
    assert tower.whole_params == 678_528 + 4_718_592 + 186_624 + 2304 + 4_423_680 + 1152 == 10_010_880


def test_llama4_scout_vision_model_and_projector():
    # Llama 4 vision: hidden 1408, intermediate 5632, 34 layers, 336 px in 14 px patches, projector 4096 -> 4096,
    # vision_output_dim 4096, text hidden 5120. Split: patch_embedding linear 3*14*14*1408 = 827,904;
    # one layer qkv 1408*4224 + 4224 = 5,951,616, o_proj 1408^2 = 1,982,464, fc1 1408*5632 + 5632 = 7,935,488,
    # fc2 5632*1408 = 7,929,856: 23,799,424 (x34 = 809,180,416); pixel-shuffle MLP fc1 5632*4096 = 23,068,672,
    # fc2 4096^2 = 16,777,216; projector linear_1 4096*5120 = 20,971,520.
    # Whole: class_embedding 1408, positional_embedding_vlm ((336/14)^2 + 1) = 577 x 1408 = 812,416,
    # layernorm_pre/post 5632, per layer o_proj and fc2 biases 2816 and two LayerNorms 5632 (x34 = 287,232).
    # The same per-module figures as a published parameter table of the checkpoint (patch_embedding 827,904,
    # positional_embedding_vlm 812,416, vision_adapter fc1 23,068,672 / fc2 16,777,216, linear_1 20,971,520).
    tower = load_model("llama4-scout").arch.tower
    assert tower.split_params == 827_904 + 809_180_416 + 23_068_672 + 16_777_216 + 20_971_520 == 870_825_728
    assert tower.whole_params == 1408 + 812_416 + 5632 + 287_232 == 1_106_688


def test_mistral_small_pixtral_tower_and_projector():
    # Pixtral, vision_config: hidden 1024, intermediate 4096, 24 layers (vision_feature_layer -1: all built),
    # 14 px patches; text hidden 5120; spatial_merge_size 2; multimodal_projector_bias false.
    # Whole: patch_conv 3*14*14*1024 = 602,112 (no bias), ln_pre 1024, two RMSNorms per layer 2048 (x24 = 49,152),
    # projector norm 1024, patch_merger (4*1024) x 1024 = 4,194,304.
    # Split: per layer qkv 3*1024^2 = 3,145,728, o_proj 1,048,576, gate_up 2*1024*4096 = 8,388,608,
    # down 4,194,304: 16,777,216 (x24 = 402,653,184); linear_1 1024*5120 = 5,242,880, linear_2 5120^2 = 26,214,400.
    tower = load_model(MISTRAL_SMALL).arch.tower
    assert tower.whole_params == 602_112 + 1024 + 49_152 + 1024 + 4_194_304 == 4_847_616
    assert tower.split_params == 402_653_184 + 5_242_880 + 26_214_400 == 434_110_464


def test_qwen3_5_vision_transformer_and_merger():
    # Qwen3.5-27B, vision_config: hidden 1152, intermediate 4304, depth 27, 16 px patches over 2 frames, merge 2,
    # out_hidden_size 5120; num_position_embeddings 2304 (the config class default).
    # Whole: Conv3d 3*2*16*16*1152 = 1,769,472 + 1152 bias; pos_embed 2304 x 1152 = 2,654,208; two LayerNorms
    # per block 4608 (x27 = 124,416); proj and linear_fc2 biases 2 x 1152 per block (x27 = 62,208); merger
    # LayerNorm 2304 and linear_fc2 bias 5120.
    # Split: per block qkv 1152*3456 + 3456 = 3,984,768, proj 1,327,104, linear_fc1 1152*4304 + 4304 = 4,962,512,
    # linear_fc2 4,958,208: 15,232,592 (x27 = 411,279,984); merger linear_fc1 4608^2 + 4608 = 21,238,272,
    # linear_fc2 4608*5120 = 23,592,960.
    tower = load_model("qwen3.5-27b").arch.tower
    assert tower.whole_params == 1_769_472 + 1152 + 2_654_208 + 124_416 + 62_208 + 2304 + 5120 == 4_618_880
    assert tower.split_params == 411_279_984 + 21_238_272 + 23_592_960 == 456_111_216


def _mistral3(**top):
    text = {"model_type": "mistral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 256}
    vision = {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
              "num_attention_heads": 2, "patch_size": 4}
    raw = {"model_type": "mistral3", "text_config": text, "vision_config": vision, **top}
    return spec_from_hf_config(raw, name="tiny", origin="tiny.json")


def test_vision_feature_layer_limits_the_layers_built():
    # mistral3.py::_get_num_hidden_layers: -1 builds all 4 layers, -2 three, 2 two; each Pixtral layer splits
    # qkv 3*32^2 + o 32^2 + gate_up 2*32*64 + down 64*32 = 10,240
    full = _mistral3().arch.tower.split_params
    assert full - _mistral3(vision_feature_layer=-2).arch.tower.split_params == 10_240
    assert full - _mistral3(vision_feature_layer=[2, -3]).arch.tower.split_params == 2 * 10_240
    with pytest.raises(ConfigError, match="vision_feature_layer"):
        _mistral3(vision_feature_layer=9)


@pytest.mark.parametrize("name", ["gemma4-31b", "gemma3n-e4b"])
def test_a_tower_kvplan_does_not_model_is_named_as_not_counted(name):
    spec = load_model(name)
    assert spec.arch.tower is None
    assert any("is not modelled: its weights are not counted" in note for note in spec.notes), spec.notes
