"""kvplan.validate.run: the model is built without random initialisation (not measurement: the cost of
`kvplan validate` on CPU, benchmarks/bench_validate.py), and what is measured is unchanged by it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvplan.io.models import load_model
from kvplan.validate import CPU_TORCH, require_torch

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "configs"


def test_the_missing_torch_hint_is_the_cpu_build(monkeypatch):
    from kvplan.errors import InputError

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    with pytest.raises(InputError) as exc:
        require_torch()
    message = str(exc.value)
    assert CPU_TORCH in message and "--index-url https://download.pytorch.org/whl/cpu" in message
    assert message.index(CPU_TORCH) < message.index("pip install -e '.[validate]'")  # torch first
    assert "\n" not in message


torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def _refuse(*args, **kwargs):
    raise AssertionError("random weight initialisation ran")


@pytest.mark.parametrize("config", ["tiny-gemma2.json", "tiny-deepseek-v3.json"])
def test_no_random_init_and_the_measurement_is_exact(monkeypatch, config):
    """Gemma 2 ties its LM head to the embedding: the tie survives the skipped init_weights (weights exact)."""
    from transformers.modeling_utils import PreTrainedModel

    from kvplan.validate.run import Case, run_case

    monkeypatch.setattr(PreTrainedModel, "_init_weights", _refuse)
    for name in ("normal_", "uniform_", "kaiming_uniform_", "trunc_normal_"):
        monkeypatch.setattr(torch.nn.init, name, _refuse)
    spec = load_model(str(CONFIGS / config))
    rows = {r.component: r for r in run_case(Case(model=spec.name, seq_len=12, layers=1, device="cpu"), spec)
            if not r.scaled}
    assert rows["kv_cache"].measured_bytes > 0 and rows["kv_cache"].error_bytes == 0
    assert rows["weights"].measured_bytes > 0 and rows["weights"].error_bytes == 0


def test_the_built_weights_are_zero_and_tied(monkeypatch):
    import kvplan.validate.run as run

    built = []
    original = run._tied_and_zeroed
    monkeypatch.setattr(run, "_tied_and_zeroed", lambda model: built.append(original(model)) or built[-1])
    spec = load_model(str(CONFIGS / "tiny-gemma2.json"))
    run.run_case(run.Case(model=spec.name, seq_len=12, device="cpu"), spec)
    model = built[0]
    assert all(not p.any() for p in model.parameters())  # no value from recycled memory
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
