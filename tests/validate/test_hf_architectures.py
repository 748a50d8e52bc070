"""Every decoder architecture the installed transformers knows, against kvplan: a config kvplan sizes must match
transformers' own cache byte for byte; anything else must be refused. None may come back sized wrong.

The corpus: each model type in transformers' causal-LM mapping, built from its own config class at the class
defaults and written as ``save_pretrained`` writes a config.json; one bundled model per model type (a released
checkpoint's values, each cited in configs/models/); and released checkpoints' values
(tests/fixtures/configs/checkpoints/) for types whose class defaults cannot run or leave a feature off. The cache is
measured on the meta device (kvplan.validate.meta): a prefill and a decode step with no weights, exact storage sizes.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()  # config classes warn about their own defaults (token ids past a vocab)

from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

from kvplan.core.sizing import size_kv  # noqa: E402
from kvplan.core.spec import ModelSpec  # noqa: E402
from kvplan.errors import ConfigError, UnmodeledError  # noqa: E402
from kvplan.io.architectures import GENERIC, NOT_MODELED  # noqa: E402
from kvplan.io.families import FAMILY_TYPES  # noqa: E402
from kvplan.io.hf_config import spec_from_hf_config  # noqa: E402
from kvplan.io.models import bundled_index, load_bundled, _read_bundled  # noqa: E402
from kvplan.validate import installed_hf_engine  # noqa: E402
from kvplan.validate.meta import measure_on_meta  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS = ROOT / "tests" / "fixtures" / "configs" / "checkpoints"
CAUSAL_TYPES = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
BATCH = 2

# Model types kvplan reads whose forward cannot run on the meta device (a data-dependent op), each held byte for
# byte on CPU by a tiny random model in the module named.
CPU_CHECKED = {
    "longcat_flash": "tests/validate/test_hf_cache_mla.py",  # MoE routing calls torch.nonzero
    "gemma4": "tests/validate/test_hf_cache_attention.py",  # the multimodal wrapper reads a mask's values
    "gemma3n": "tests/validate/test_hf_cache_attention.py",  # the multimodal wrapper needs timm
}


def class_default_config(model_type: str) -> dict | None:
    """The config class's defaults as ``save_pretrained`` writes them (None: the class refuses its own defaults)."""
    try:
        return json.loads(CONFIG_MAPPING[model_type]().to_json_string(use_diff=True))
    except Exception:  # noqa: BLE001 - transformers' own validation of its defaults
        return None


def _bundled_one_per_type() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for name, entry in sorted(bundled_index().items()):
        spec = load_bundled(entry)
        out.setdefault(spec.model_type, dict(_read_bundled(entry.path).config, _case=f"bundled {name}"))
    return out


def _checkpoints() -> dict[str, dict]:
    files = sorted(CHECKPOINTS.glob("*.json"))
    assert files, f"no checkpoint configs in {CHECKPOINTS}"
    return {f.stem: dict(json.loads(f.read_text()), _case=f"checkpoint {f.stem}") for f in files}


CASES: dict[str, dict] = {}
for _type in CAUSAL_TYPES:
    _cfg = class_default_config(_type)
    if _cfg is not None:
        CASES[f"defaults:{_type}"] = dict(_cfg, _case=f"{_type} class defaults")
for _name, _cfg in _checkpoints().items():
    CASES[f"checkpoint:{_name}"] = _cfg
# A bundled model (a released checkpoint's values, cited in configs/models/) is measured for a model type only when
# no case above holds it exactly (its class defaults cannot run, or it is not in transformers' causal-LM mapping):
# measuring all of them would double the time of this module.
BUNDLED = {f"bundled:{t}": cfg for t, cfg in _bundled_one_per_type().items()}
CASES.update(BUNDLED)


@dataclass(frozen=True)
class Outcome:
    model_types: tuple[str, ...]  # the case's, the config's and its text model's (a multimodal wrapper's parts)
    status: str  # "refused", "unmeasurable" (transformers cannot run it on meta), "exact"
    detail: str = ""


def _model_types(case: str, config: dict) -> tuple[str, ...]:
    text = config.get("text_config")
    types = [case.split(":", 1)[1] if case.startswith("defaults:") else "", str(config.get("model_type", "")),
             str(text.get("model_type", "")) if isinstance(text, dict) else ""]
    return tuple(t for t in dict.fromkeys(types) if t)


def _seq_len(spec: ModelSpec) -> int:
    """Tokens in the cache when measured: past the longest window, chunk or compression ratio, so the kinds' own
    rules show (the tiny CPU models of tests/validate/test_hf_cache*.py cover the lengths below them)."""
    reach = max(max(getattr(layer, "window", 0), getattr(layer, "compress_ratio", 0)) for layer in spec.layers)
    return max(7, reach + 5)


@functools.lru_cache(maxsize=None)
def outcome(case: str) -> Outcome:
    config = {k: v for k, v in CASES[case].items() if k != "_case"}
    config["torch_dtype"] = "bfloat16"
    if isinstance(config.get("text_config"), dict):
        config["text_config"] = dict(config["text_config"], torch_dtype="bfloat16")
    model_type = _model_types(case, config)
    try:
        spec = spec_from_hf_config(config, name=case, origin=case)
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith(f"{case}:") and "\n" not in message, message  # one line naming the config
        return Outcome(model_type, "refused", message)
    seq_len = _seq_len(spec)
    try:
        measured = measure_on_meta(config, batch=BATCH, seq_len=seq_len, dtype="bfloat16", origin=case)
    except ConfigError as exc:
        return Outcome(model_type, "unmeasurable", str(exc))
    predicted = size_kv(spec, installed_hf_engine(), batch=BATCH, seq_len=seq_len)
    assert predicted.total_bytes == measured.total_bytes, (case, seq_len, measured.per_layer_bytes)
    if len(measured.per_layer_bytes) == spec.num_layers:
        for group in predicted.groups:
            held = [measured.per_layer_bytes[i] for i in group.layer_indices]
            assert sum(held) == group.total_bytes, (case, seq_len, group.description, held)
    return Outcome(model_type, "exact")


@pytest.mark.parametrize("case", sorted(set(CASES) - set(BUNDLED)))
def test_sized_configs_match_transformers_cache_or_are_refused(case):
    """The assertions are in ``outcome``: a sized config equals the measured cache, total and per layer group."""
    assert outcome(case).status in ("refused", "unmeasurable", "exact")


def test_every_type_kvplan_reads_is_held_exactly():
    """A model type kvplan reads (generic reader or a family module) that this transformers knows has at least one
    config sized exactly as measured, or a CPU check of its own."""
    by_type: dict[str, set[str]] = {}
    def record(case: str) -> None:
        result = outcome(case)
        for model_type in result.model_types:
            by_type.setdefault(model_type, set()).add(result.status)

    for case in sorted(set(CASES) - set(BUNDLED)):
        record(case)
    for case in sorted(BUNDLED):  # a released checkpoint's values where nothing above held the type
        if any("exact" not in by_type.get(t, set()) for t in _model_types(case, CASES[case])):
            record(case)
    unchecked = sorted(t for t in (GENERIC | FAMILY_TYPES) & set(CAUSAL_TYPES)
                       if "exact" not in by_type.get(t, set()) and t not in CPU_CHECKED)
    assert not unchecked, f"read by kvplan but never held exactly against transformers: {unchecked}"
    for model_type, module in CPU_CHECKED.items():
        assert f'"{model_type}' in (ROOT / module).read_text(), (model_type, module)


def test_every_type_transformers_knows_is_classified():
    """A model type a newer transformers adds fails here until it is read and checked, or refused with a reason
    (kvplan.io.architectures)."""
    known = GENERIC | FAMILY_TYPES | set(NOT_MODELED)
    assert not [t for t in CAUSAL_TYPES if t not in known]


def test_types_kvplan_does_not_model_are_refused_with_their_reason():
    checked = 0
    for case, config in CASES.items():
        refused = [t for t in _model_types(case, config) if t in NOT_MODELED]
        if refused:
            model_type = refused[0]
            with pytest.raises(UnmodeledError, match="kvplan does not model") as info:
                spec_from_hf_config({k: v for k, v in config.items() if k != "_case"}, name=case, origin=case)
            assert NOT_MODELED[model_type] in str(info.value) and info.value.config
            checked += 1
    assert checked >= 30  # the encoder-decoder, encoder and recurrent families at least


def test_no_type_is_both_read_and_refused():
    assert not (GENERIC | FAMILY_TYPES) & set(NOT_MODELED)
