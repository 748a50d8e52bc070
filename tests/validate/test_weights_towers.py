"""kvplan's vision tower and projector counts (kvplan.io.towers, read from vLLM 0.19.0's modules) against the
vision and projector modules transformers 5.x builds from the same config.json on the meta device: two
independent readings of the checkpoint's shapes."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvplan.io.models import load_model  # noqa: E402

MISTRAL_SMALL = "tests/fixtures/configs/mistral-small-3.1-24b.json"
# transformers' SiglipVisionModel builds the attention-pooling head (vision_use_head defaults to true); vLLM's
# siglip.py::SiglipVisionModel is built with use_head=False by gemma3_mm.py and skips its weights on load:
# probe 1152 + MultiheadAttention 4 x 1152^2 + 4 x 1152 + LayerNorm 2304 + MLP 2 x 1152 x 4304 + 4304 + 1152
SIGLIP_POOLING_HEAD = 1152 + 4 * 1152 ** 2 + 4 * 1152 + 2 * 1152 + 2 * 1152 * 4304 + 4304 + 1152


def _meta_tower_params(config: dict) -> int:
    import torch
    import transformers

    cfg = {k: v for k, v in config.items() if not k.startswith("_") and k not in ("architectures",)}
    model_type = cfg.pop("model_type")
    classes = {"gemma3": "Gemma3ForConditionalGeneration", "llama4": "Llama4ForConditionalGeneration",
               "mistral3": "Mistral3ForConditionalGeneration", "qwen3_5": "Qwen3_5ForConditionalGeneration",
               "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration"}
    with torch.device("meta"):
        model = getattr(transformers, classes[model_type])(transformers.AutoConfig.for_model(model_type, **cfg))
    return sum(p.numel() for name, p in model.named_parameters()
               if any(part in name for part in ("vision_tower", "vision_model", "visual", "multi_modal_projector")))


@pytest.mark.parametrize("name,unbuilt", [
    ("gemma3-4b", SIGLIP_POOLING_HEAD), ("gemma3-12b", SIGLIP_POOLING_HEAD), ("gemma3-27b", SIGLIP_POOLING_HEAD),
    ("llama4-scout", 0), (MISTRAL_SMALL, 0), ("qwen3.5-27b", 0), ("qwen3.5-35b-a3b", 0),
])
def test_tower_count_equals_transformers_vision_modules(name, unbuilt):
    spec = load_model(name)
    assert spec.arch.tower is not None
    assert spec.arch.tower.params == _meta_tower_params(dict(spec.raw_config)) - unbuilt
