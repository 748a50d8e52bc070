"""kvplan's parameter count for each bundled hybrid against the model transformers 5.23 builds from the same
config.json on the meta device (no memory, no download): the modules' shapes are the independent figure.

This is what backs the two models whose cards round far: Kimi-Linear's "48B" is 49.12B of modules
(num_nextn_predict_layers 0, so no MTP weights hide in the difference) and Falcon-H1-34B's "34B" is 33.64B;
the other bundled hybrids are also checked against their published totals in
tests/io/test_families_hybrid.py."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvplan.core.weights import count_params  # noqa: E402
from kvplan.io.models import load_model  # noqa: E402


def _meta_params(config: dict) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = {k: v for k, v in config.items() if k not in ("architectures", "auto_map", "quantization_config")}
    model_type = cfg.pop("model_type")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **cfg))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["kimi-linear-48b-a3b", "minimax-m1-80k", "nemotron-3-nano-30b",
                                  "granite-4.0-h-small", "falcon-h1-34b", "lfm2-1.2b", "qwen3.5-27b",
                                  "qwen3.5-35b-a3b"])
def test_parameter_count_equals_transformers_modules(name):
    spec = load_model(name)
    built = _meta_params(dict(spec.raw_config))  # the language model (Qwen3.5: the text-only causal LM)
    ours = count_params(spec, spec.arch).language_model  # Qwen3.5's vision tower: tests/validate/test_weights_towers.py
    # kvplan leaves out the per-head q/k RMSNorm weights of LFM2's and Qwen3.5's attention layers
    # (2 x head_dim per attention layer: a few thousand parameters)
    assert ours <= built and built - ours < 1e-6 * built, f"{name}: kvplan {ours:,} vs transformers {built:,}"

