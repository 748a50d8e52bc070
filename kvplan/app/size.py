"""``kvplan size``: a model's KV-cache bytes for an engine, or, for a config kvplan does not model and
``--engine hf``, transformers' own cache measured on the meta device."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TYPE_CHECKING

from kvplan.core.dtypes import get_dtype
from kvplan.core.engines import engine_for, get_engine
from kvplan.core.sizing import SizeResult, size_kv, uneven_tp_note
from kvplan.core.spec import ModelSpec
from kvplan.errors import InputError, UnmodeledError
from kvplan.io.models import resolve_model

if TYPE_CHECKING:  # imported where they are used: `kvplan size` needs neither at start-up
    from kvplan.core.profiles import EngineChoice
    from kvplan.io.hub import HubConfig
    from kvplan.validate.meta import MeasuredSize


@dataclass(frozen=True, kw_only=True)
class SizeReport:
    """A model sized by kvplan's own rules for one engine."""

    spec: ModelSpec
    result: SizeResult
    ideal: SizeResult  # the token states alone (``result`` itself under --engine ideal)
    rules: str  # what the engine holds, and whose release's rules
    block_size: int  # the engine's, as chosen for this model
    engine_version: str | None  # the profile's release (None: an engine without releases)
    seq_len_is_model_max: bool  # no --seq-len: the model's max context
    model_notes: tuple[str, ...]  # the config's resolutions, and a length past the model's
    engine_notes: tuple[str, ...]  # the engine's choices: release, block size, an uneven tp
    hub: HubConfig | None = None  # what the Hub answered, when asked
    drafter: Any = None  # --speculative-config's drafter (kvplan.core.spec_decode.Drafter), its layers in ``spec``

    @property
    def notes(self) -> tuple[str, ...]:
        return (*self.model_notes, *self.engine_notes)


@dataclass(frozen=True, kw_only=True)
class MeasuredSizeReport:
    """transformers' own cache for a config kvplan does not model, measured on the meta device."""

    model: str  # as given
    measured: MeasuredSize
    seq_len_is_model_max: bool
    notes: tuple[str, ...]


def size_model(model: str, *, batch: int = 1, seq_len: int | None = None, kv_cache_dtype: str = "auto", tp: int = 1,
               pp: int = 1, dp: int = 1, dcp: int = 1, engine: str = "ideal", block_size: int | None = None,
               fetch: bool | None = None, revision: str | None = None,
               speculative: Any = None) -> SizeReport | MeasuredSizeReport:
    """KV bytes of ``batch`` sequences of ``seq_len`` tokens (default: the model's max context) under ``engine``
    (``NAME`` or ``NAME==VERSION``), at tensor- and pipeline-parallel sizes ``tp`` and ``pp``, over ``dp`` engines
    side by side, each sequence sharded over ``dcp`` of the tp ranks (vLLM's decode context parallelism);
    ``speculative`` (kvplan.io.speculative.SpeculativeSettings): a drafter's KV layers beside the model's."""
    from kvplan.core.profiles import parse_engine  # here: `--engine ideal` needs no profile registry

    choice = parse_engine(engine)
    # a bad engine or block size (the release's rule) is refused before anything is loaded
    get_engine(choice.name, block_size=block_size, profile=choice.profile)
    if kv_cache_dtype != "auto":
        get_dtype(kv_cache_dtype)
    try:
        resolved = resolve_model(model, fetch=fetch, revision=revision)
    except UnmodeledError as exc:
        if choice.name != "hf":
            raise
        return _measured(exc, model, choice, batch=batch, seq_len=seq_len, given=_given_flags(
            tp=tp, pp=pp, kv_cache_dtype=kv_cache_dtype, block_size=block_size, dp=dp, dcp=dcp))
    spec = resolved.spec
    draft_note, drafted = None, None
    if speculative is not None:
        from kvplan.app.fit import make_drafter
        from kvplan.core.spec_decode import with_drafter

        if choice.name in ("hf", "trtllm") or (choice.name == "sglang" and speculative.method != "mtp"):
            who = {"hf": "transformers' cache", "trtllm": "TensorRT-LLM", "sglang": "SGLang with an EAGLE head"}
            raise InputError(f"--speculative-config: {who[choice.name]} is not modelled with this drafter; size it "
                             "with vllm or ideal (sglang for mtp)")
        d = make_drafter(spec, choice.profile, speculative, pp=pp)
        spec, draft_note, drafted = with_drafter(spec, d), d.note, d
    eng, engine_note = engine_for(spec, choice.name, block_size=block_size, profile=choice.profile)
    seq, defaulted = resolve_seq_len(spec, seq_len)
    parallel = _parallel_notes(spec, choice, eng, tp=tp, dp=dp, dcp=dcp, batch=batch, seq_len=seq,
                               kv_cache_dtype=kv_cache_dtype)
    sized, stored = sizing_dtype(spec, choice, eng, kv_cache_dtype)
    result = size_kv(spec, eng, batch=batch, seq_len=seq, kv_dtype=sized, tp=tp, pp=pp, dp=dp, dcp=dcp)
    if stored:
        result = dataclasses.replace(result, kv_dtype=stored)
    ideal = result if eng.name == "ideal" else size_kv(spec, get_engine("ideal"), batch=batch, seq_len=seq,
                                                       kv_dtype=sized, tp=tp, pp=pp, dp=dp)
    if dcp > 1:  # the token states themselves: each token once on tp / dcp ranks, no rank's share rounded up
        ideal = dataclasses.replace(ideal, total_bytes=ideal.total_bytes // dcp)
    rules = eng.describe_rules() + (f" ({choice.profile.display} {choice.version} rules)" if choice.profile else "")
    uneven = None if eng.strict_tp else uneven_tp_note(spec, tp)
    return SizeReport(spec=spec, result=result, ideal=ideal, rules=rules, block_size=eng.block_size,
                      engine_version=choice.version, seq_len_is_model_max=defaulted,
                      model_notes=tuple(size_notes(spec, seq)),
                      engine_notes=tuple(n for n in (choice.note, engine_note, uneven, draft_note, *parallel) if n),
                      hub=resolved.hub, drafter=drafted)


def sizing_dtype(spec: ModelSpec, choice: EngineChoice, engine: Any, kv_dtype: str) -> tuple[str, str | None]:
    """The KV dtype to size ``spec`` with under ``choice``, and the name of what the engine stores where it is not
    that dtype (vLLM keeps DeepSeek-V4's caches as fp8_ds_mla rows and refuses any other --kv-cache-dtype, and
    releases before 0.20.0: kvplan.core.engines.vllm.plan.v4_size_dtype); None where it is."""
    if choice.name != "vllm" or choice.profile is None:
        return kv_dtype, None
    from kvplan.core.engines.vllm.plan import v4_size_dtype

    return v4_size_dtype(choice.profile, spec.layers, kv_dtype, engine.block_size, spec.name)


def resolve_seq_len(spec: ModelSpec, seq_len: int | None) -> tuple[int, bool]:
    """The length to size at, and whether it is the model's max context (no length given)."""
    if seq_len is not None:
        return seq_len, False
    if spec.max_model_len <= 0:
        raise InputError(f"{spec.name} gives no maximum context; pass --seq-len")
    return spec.max_model_len, True


def size_notes(spec: ModelSpec, seq_len: int) -> list[str]:
    """The config's resolutions, and a length past the model's max context."""
    notes = list(spec.notes)
    if 0 < spec.max_model_len < seq_len:
        notes.append(f"seq_len {seq_len:,} exceeds the model's max context {spec.max_model_len:,}")
    return notes


def _parallel_notes(spec: ModelSpec, choice: EngineChoice, eng: Any, *, tp: int, dp: int, dcp: int, batch: int,
                    seq_len: int, kv_cache_dtype: str) -> list[str]:
    """How data-parallel engines and decode context parallelism share the sequences (refused where the engine or
    the release does not take it)."""
    notes = []
    if dp > 1 and choice.name in ("hf", "trtllm"):
        raise InputError(f"--data-parallel-size: {choice.name}'s data parallelism is not modelled (vLLM, SGLang and "
                         "the ideal engine share the batch between engines); size one engine's share with --batch")
    if dp > 1:
        notes.append(f"data parallel {dp}: {dp} engines of tp x pp GPUs, each its own KV pool; the most loaded holds "
                     f"{-(-batch // dp):,} of the {batch:,} sequences (per GPU: that engine's; total: all of them)")
    if dcp > 1:
        if choice.name != "vllm":
            raise InputError(f"--decode-context-parallel-size is vLLM's (from 0.10.2); size with --engine vllm, not "
                             f"{choice.name}")
        from kvplan.core.engines.vllm.dcp import check_dcp

        check_dcp(spec, choice.profile.rules, choice.version, tp=tp, dcp=dcp, kv_dtype=kv_cache_dtype)
        per = -(-seq_len // dcp)
        notes.append(f"decode context parallel {dcp}: token i of a sequence on rank i % {dcp} of each {dcp} tp ranks, "
                     f"so each holds {per:,} of its {seq_len:,} tokens in blocks of its own ({-(-per // eng.block_size):,}"
                     f" blocks of {eng.block_size} tokens: vllm/v1/worker/block_table.py::BlockTable."
                     "compute_slot_mapping); the tokens held per layer are a rank's")
    return notes


def _given_flags(*, tp: int, pp: int, kv_cache_dtype: str, block_size: int | None, dp: int = 1,
                 dcp: int = 1) -> tuple[str, ...]:
    """The flags a measurement cannot honour, when given."""
    given = ((tp != 1, "-tp"), (pp != 1, "-pp"), (dp != 1, "-dp"), (dcp != 1, "-dcp"),
             (kv_cache_dtype != "auto", "--kv-cache-dtype"), (block_size is not None, "--block-size"))
    return tuple(flag for is_given, flag in given if is_given)


def _measured(error: UnmodeledError, model: str, choice: EngineChoice, *, batch: int, seq_len: int | None,
              given: tuple[str, ...]) -> MeasuredSizeReport:
    """``--engine hf`` on a config kvplan does not model: transformers' own cache for it, measured on the meta
    device (kvplan.validate.meta), for one GPU and the model's dtype."""
    from kvplan.validate.meta import max_positions, measure_unmodeled

    if given:
        raise InputError(f"{error.what}; measuring transformers' cache instead takes no {given[0]} (one device, the "
                         "model's dtype): leave it out")
    seq = seq_len if seq_len is not None else max_positions(error.config)
    if not seq:
        raise InputError(f"{model}: the config gives no maximum context to measure at; pass --seq-len")
    m = measure_unmodeled(error, batch=batch, seq_len=seq, origin=model)
    notes = [f"{error.what}: transformers {m.transformers_version}'s own cache was measured instead, on the meta "
             "device (a prefill and a decode step, no weights, nothing downloaded)"]
    if choice.asked and choice.asked != m.transformers_version:
        notes.append(f"measured with the installed transformers {m.transformers_version}, not {choice.asked}")
    return MeasuredSizeReport(model=model, measured=m, seq_len_is_model_max=seq_len is None, notes=tuple(notes))
