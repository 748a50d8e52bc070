"""The vision encoder and multimodal projector of a multimodal config.json, counted module by module as vLLM
0.19.0 builds them (``vllm/model_executor/models/``; file::class at each rule).

Four families are read, by the outer config's ``model_type``:

- ``gemma3``: SigLIP (``siglip.py::SiglipVisionModel``, no pooling head, post-layernorm kept) and
  ``gemma3_mm.py::Gemma3MultiModalProjector``.
- ``llama4``: ``mllama4.py::Llama4VisionModel`` (its pixel-shuffle MLP included) and
  ``Llama4MultiModalProjector``.
- ``mistral3``: ``pixtral.py::PixtralHFVisionModel`` up to ``vision_feature_layer`` and
  ``mistral3.py::Mistral3MultiModalProjector``. A mistral-format checkpoint (params.json) loads as
  ``pixtral.py::PixtralForConditionalGeneration`` with the same modules in plain ``nn.Linear`` (held whole by
  every rank: the same count at tp 1, more per GPU above it).
- ``qwen3_5`` / ``qwen3_5_moe``: ``qwen3_vl.py::Qwen3_VisionTransformer`` with its patch merger, as
  ``qwen3_5.py::Qwen3_5ForConditionalGeneration`` / ``Qwen3_5MoeForConditionalGeneration`` build it.

Tensor parallelism (``mm_encoder_tp_mode`` "weights", vLLM's default, ``config/multimodal.py``): a
QKV/Column/MergedColumnParallelLinear splits its weight and bias over the ranks, a RowParallelLinear its
weight (its bias, ``output_size`` long, is whole on every rank: ``layers/linear.py::RowParallelLinear``);
convolutions, embeddings, norms, ``nn.Parameter`` and ``nn.Linear`` are whole. Other multimodal families are
not modelled here: their towers are named in the spec's notes as not counted.
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from typing import Any

from kvplan.core.spec import TowerShape
from kvplan.errors import ConfigError
from kvplan.io.config_reader import _Cfg


# transformers' Llama4ImageProcessor(Fast) default max_patches: the tiles of vLLM's largest dummy image
LLAMA4_MAX_PATCHES = 16

@dataclass(kw_only=True)
class _Params:
    """Parameters of a tower as they accumulate: split over TP ranks, or whole on every rank."""

    split: int = 0
    whole: int = 0

    def column(self, n_in: int, n_out: int, *, bias: bool) -> None:
        """A Column/QKV/MergedColumnParallelLinear: weight and bias split."""
        self.split += n_in * n_out + (n_out if bias else 0)

    def row(self, n_in: int, n_out: int, *, bias: bool) -> None:
        """A RowParallelLinear: weight split, bias whole."""
        self.split += n_in * n_out
        self.whole += n_out if bias else 0

    def shape(self, name: str, source: str, *, item: tuple[int, int, int] = (0, 0, 0)) -> TowerShape:
        """``item``: the profile run's dummy item, (prompt tokens, encoder embeddings, pixel values)."""
        tokens, embeds, pixels = item
        return TowerShape(name=name, split_params=self.split, whole_params=self.whole, source=source,
                          item_tokens=tokens, item_embeds=embeds, item_pixels=pixels)


def _siglip_gemma3(v: _Cfg, top: _Cfg, text_hidden: int) -> TowerShape:
    # transformers' SiglipVisionConfig defaults for absent keys
    d = v.int("hidden_size", default=768)
    inter = v.int("intermediate_size", default=3072)
    layers = v.int("num_hidden_layers", default=12)
    channels = v.int("num_channels", default=3)
    image, patch = v.int("image_size", default=224), v.int("patch_size", default=16)
    p = _Params()
    # siglip.py::SiglipVisionEmbeddings: Conv2dLayer (bias by default) and a learned position per patch
    p.whole += channels * patch * patch * d + d + (image // patch) ** 2 * d
    for _ in range(layers):
        # SiglipAttention: qkv_proj QKVParallelLinear, out_proj RowParallelLinear, both with bias;
        # SiglipMLP: fc1 ColumnParallelLinear, fc2 RowParallelLinear, with bias; layer_norm1/2 LayerNorm
        p.column(d, 3 * d, bias=True)
        p.row(d, d, bias=True)
        p.column(d, inter, bias=True)
        p.row(inter, d, bias=True)
        p.whole += 2 * 2 * d
    # SiglipVisionTransformer: post_layernorm (require_post_norm defaults to True when every layer is built);
    # SiglipVisionModel is built with use_head=False: no attention-pooling head
    p.whole += 2 * d
    # gemma3_mm.py::Gemma3MultiModalProjector: mm_input_projection_weight (an nn.Parameter, vision x text
    # hidden) and mm_soft_emb_norm (GemmaRMSNorm over the vision hidden size); the avg pool has no weights
    p.whole += d * text_hidden + d
    # the profile run's image: image_size square (pan-and-scan off by default: one crop), mm_tokens_per_image
    # tokens and embeddings (gemma3_mm.py::Gemma3ProcessingInfo.get_num_image_tokens, (crops + 1) x image_seq_len)
    tokens = top.int("mm_tokens_per_image", default=256)
    return p.shape("SigLIP vision tower + Gemma 3 projector",
                   "vLLM 0.19.0 siglip.py::SiglipVisionModel, gemma3_mm.py::Gemma3MultiModalProjector",
                   item=(tokens, tokens, channels * image * image))


def _llama4(v: _Cfg, text_hidden: int) -> TowerShape:
    # transformers' Llama4VisionConfig defaults for absent keys
    d = v.int("hidden_size", default=768)
    inter = v.int("intermediate_size", default=5632)
    layers = v.int("num_hidden_layers", default=34)
    channels = v.int("num_channels", default=3)
    image, patch = v.int("image_size", default=448), v.int("patch_size", default=14)
    proj_in = v.int("projector_input_dim", default=4096)
    proj_out = v.int("projector_output_dim", default=4096)
    output_dim = v.int("vision_output_dim", default=7680)
    proj_bias = v.bool("multi_modal_projector_bias", False)
    p = _Params()
    # mllama4.py::Llama4UnfoldConvolution: a ColumnParallelLinear (gather_output) over the unfolded patches
    p.column(channels * patch * patch, d, bias=False)
    # Llama4VisionModel: class_embedding, positional_embedding_vlm (one per patch + the class token),
    # layernorm_pre and layernorm_post (LayerNorm)
    p.whole += d + ((image // patch) ** 2 + 1) * d + 2 * 2 * d
    for _ in range(layers):
        # Llama4VisionAttention: qkv_proj QKVParallelLinear and o_proj RowParallelLinear, with bias;
        # Llama4VisionMLP(bias=True): fc1 Column, fc2 Row; input_layernorm/post_attention_layernorm LayerNorm
        p.column(d, 3 * d, bias=True)
        p.row(d, d, bias=True)
        p.column(d, inter, bias=True)
        p.row(inter, d, bias=True)
        p.whole += 2 * 2 * d
    # Llama4VisionPixelShuffleMLP: a Llama4VisionMLP from intermediate_size (the pixel-shuffled width) to
    # projector_input_dim to projector_output_dim, biased by multi_modal_projector_bias
    p.column(inter, proj_in, bias=proj_bias)
    p.row(proj_in, proj_out, bias=proj_bias)
    # Llama4MultiModalProjector: linear_1, a ColumnParallelLinear (gather_output) without bias
    p.column(output_dim, text_hidden, bias=False)
    # the profile run's image (mllama4.py::Mllama4ProcessingInfo.get_image_size_with_most_features): max_patches
    # tiles of image_size stacked (16, the Llama4 image processor's default), a global tile beside them; each tile
    # (image_size / patch)^2 / round(1 / pixel_shuffle_ratio^2) embeddings (get_patch_per_chunk); the prompt adds
    # one separator a tile row and image start, global and end tokens (_prompt_split_image)
    tiles = LLAMA4_MAX_PATCHES + 1
    ratio = v.get("pixel_shuffle_ratio", 0.5)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise ConfigError(f"{v.origin}: pixel_shuffle_ratio must be a number in (0, 1] (got {ratio!r})")
    per_tile = (image // patch) ** 2 // round(1 / ratio**2)
    embeds = tiles * per_tile
    return p.shape("Llama 4 vision model + projector",
                   "vLLM 0.19.0 mllama4.py::Llama4VisionModel, Llama4MultiModalProjector",
                   item=(embeds + LLAMA4_MAX_PATCHES + 3, embeds, tiles * channels * image * image))


def _feature_layers(top: _Cfg, num_layers: int) -> int:
    """mistral3.py::_get_num_hidden_layers: the tower is built up to the deepest vision_feature_layer
    (utils.py::get_layer_index: a negative index counts from the end, -1 is the last layer)."""
    value = top.get("vision_feature_layer", -1)  # Mistral3Config default
    indices = value if isinstance(value, list) else [value]
    if not indices or any(isinstance(i, bool) or not isinstance(i, int) for i in indices):
        raise ConfigError(f"{top.origin}: vision_feature_layer must be a layer index or a list of them "
                          f"(got {value!r})")
    built = max(num_layers + i + 1 if i < 0 else i for i in indices)
    if not 0 <= built <= num_layers:
        raise ConfigError(f"{top.origin}: vision_feature_layer {value!r} is outside the vision tower's "
                          f"{num_layers} layers")
    return built


def _pixtral_mistral3(v: _Cfg, top: _Cfg, text_hidden: int) -> TowerShape:
    # transformers' PixtralVisionConfig and Mistral3Config defaults for absent keys
    d = v.int("hidden_size", default=1024)
    inter = v.int("intermediate_size", default=4096)
    layers = _feature_layers(top, v.int("num_hidden_layers", default=24))
    channels = v.int("num_channels", default=3)
    patch = v.int("patch_size", default=16)
    merge = top.int("spatial_merge_size", default=2)
    proj_bias = top.bool("multimodal_projector_bias", False)
    p = _Params()
    # pixtral.py::PixtralHFVisionModel: patch_conv (Conv2dLayer, no bias) and ln_pre (RMSNorm)
    p.whole += channels * patch * patch * d + d
    for _ in range(layers):
        # PixtralHFTransformerBlock: attention_norm and ffn_norm (RMSNorm); PixtralHFAttention: qkv_proj
        # QKVParallelLinear, o_proj RowParallelLinear; PixtralHFMLP: gate_up_proj MergedColumnParallelLinear,
        # down_proj RowParallelLinear; no biases
        p.whole += 2 * d
        p.column(d, 3 * d, bias=False)
        p.row(d, d, bias=False)
        p.column(d, 2 * inter, bias=False)
        p.row(inter, d, bias=False)
    # mistral3.py::Mistral3MultiModalProjector: norm (RMSNorm), patch_merger.merging_layer (nn.Linear,
    # spatial_merge_size^2 patches to one, no bias), linear_1 Column and linear_2 Row
    p.whole += d + d * merge * merge * d
    p.column(d, text_hidden, bias=proj_bias)
    p.row(text_hidden, text_hidden, bias=proj_bias)
    # the profile run's image: image_size square (mistral3.py::Mistral3ProcessingInfo.
    # get_image_size_with_most_features), (image_size / (patch x spatial_merge_size))^2 tokens and embeddings
    # (pixtral.py::PixtralHFEncoderInfo.get_num_image_tokens)
    image = v.int("image_size", default=1024)
    embeds = (image // (patch * merge)) ** 2
    return p.shape("Pixtral vision tower + Mistral 3 projector",
                   "vLLM 0.19.0 pixtral.py::PixtralHFVisionModel, mistral3.py::Mistral3MultiModalProjector",
                   item=(embeds, embeds, channels * image * image))


def _qwen3_vision(v: _Cfg, text_hidden: int) -> TowerShape:
    # transformers' Qwen3_5VisionConfig (and Qwen3_5MoeVisionConfig) defaults for absent keys; vLLM's own
    # config classes (transformers_utils/configs/qwen3_5.py) default num_position_embeddings to 2304 too
    d = v.int("hidden_size", default=1152)
    inter = v.int("intermediate_size", default=4304)
    depth = v.int("depth", default=27)
    channels = v.int("in_channels", default=3)
    patch, frames = v.int("patch_size", default=16), v.int("temporal_patch_size", default=2)
    positions = v.int("num_position_embeddings", default=2304)
    merge = v.int("spatial_merge_size", default=2)
    out = v.int("out_hidden_size", default=text_hidden)
    # Qwen3-VL's deepstack mergers: Qwen3_VisionTransformer builds one per deepstack_visual_indexes entry, and
    # Qwen3.5's configs have none
    deepstack = len(v.int_list("deepstack_visual_indexes", maximum=1 << 10))
    p = _Params()
    # qwen3_vl.py::Qwen3_VisionPatchEmbed: Conv3dLayer (temporal x spatial patch, bias); pos_embed nn.Embedding
    p.whole += channels * frames * patch * patch * d + d + positions * d
    for _ in range(depth):
        # Qwen3_VisionBlock: norm1/norm2 LayerNorm; qwen2_5_vl.py::Qwen2_5_VisionAttention: qkv QKVParallelLinear
        # (bias), proj RowParallelLinear (bias, its default); Qwen3_VisionMLP(bias=True): linear_fc1 Column,
        # linear_fc2 Row
        p.whole += 2 * 2 * d
        p.column(d, 3 * d, bias=True)
        p.row(d, d, bias=True)
        p.column(d, inter, bias=True)
        p.row(inter, d, bias=True)
    merged = d * merge * merge
    for postshuffle in [False] + [True] * deepstack:
        # Qwen3_VisionPatchMerger: norm LayerNorm (over the merged width when use_postshuffle_norm),
        # linear_fc1 Column and linear_fc2 Row, with bias
        p.whole += 2 * (merged if postshuffle else d)
        p.column(merged, merged, bias=True)
        p.row(merged, out, bias=True)
    tower = p.shape("Qwen3 vision transformer + patch merger",
                    "vLLM 0.19.0 qwen3_vl.py::Qwen3_VisionTransformer (qwen3_5.py::Qwen3_5ForConditionalGeneration)")
    return dataclasses.replace(tower, modalities=("image", "video"))  # qwen3_5.py marks it for both


def tower_shape(raw: dict[str, Any], *, text_hidden: int, origin: str, notes: list[str]) -> TowerShape | None:
    """The vision tower and projector of a multimodal config (one with a ``vision_config``), None where
    kvplan does not model the family (noted)."""
    vision = raw.get("vision_config")
    if not isinstance(vision, dict):
        return None
    top = _Cfg(raw, origin)
    v = _Cfg(vision, f"{origin}: vision_config")
    outer = top.str("model_type")
    if outer == "gemma3":
        tower = _siglip_gemma3(v, top, text_hidden)
    elif outer == "llama4":
        tower = _llama4(v, text_hidden)
    elif outer == "mistral3":
        tower = _pixtral_mistral3(v, top, text_hidden)
    elif outer in ("qwen3_5", "qwen3_5_moe"):
        tower = _qwen3_vision(v, text_hidden)
    else:
        kind = v.str("model_type") or "its vision_config"
        notes.append(f"the vision tower ({kind}) of model_type {outer or '(none)'!r} is not modelled: its weights are "
                     "not counted (language model only)")
        return None
    notes.append(f"the vision tower and projector are counted: {tower.name}, {tower.params / 1e9:.3f}B parameters "
                 f"({tower.source}), in the model dtype, split over tensor-parallel ranks where vLLM splits them")
    return tower
