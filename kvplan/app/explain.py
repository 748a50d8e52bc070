"""``kvplan explain LOG``: a vLLM startup log's memory figures, kvplan's prediction for the same deployment
beside each, and kvplan's arithmetic replayed from the log's own measurements (kvplan.core.capacity.explain
says which figure comes from which)."""

from __future__ import annotations

import re

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvplan.core.units import GiB
from kvplan.errors import HubError, InputError, KvplanError

if TYPE_CHECKING:  # imported when a log is explained, keeping `kvplan size` start-up small
    from kvplan.core.capacity.common import FitRequest, FitResult
    from kvplan.core.capacity.explain import ExplainRow, Replay
    from kvplan.core.gpus import GPUSpec
    from kvplan.core.profiles import EngineProfile
    from kvplan.core.spec import ModelSpec
    from kvplan.io.hub import HubConfig
    from kvplan.io.vllm_log import VLLMLog


@dataclass(frozen=True, kw_only=True)
class ExplainReport:
    log: VLLMLog  # as read, with --max-model-len and --max-num-batched-tokens put in its place
    gpu: GPUSpec | None  # the GPU predicted for (None: neither given nor read from the log)
    rows: tuple[ExplainRow, ...]  # each logged figure, kvplan's prediction and the replay beside it
    notes: tuple[str, ...]  # what was predicted, with which release's rules, or why nothing was
    profile: EngineProfile | None  # the vLLM release whose rules predicted (None: no prediction)
    hub: HubConfig | None = None
    gpu_source: str | None = None  # how the GPU was read from the log (None: given as a flag, or none)


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """kvplan's fit for the log's deployment, and the fits replayed from the log's own figures."""

    predicted: FitResult | None
    replay: Replay
    notes: tuple[str, ...]
    profile: EngineProfile | None = None
    hub: HubConfig | None = None


def explain_log(log_path: Path, *, model: str | None = None, gpu: str | None = None, gpu_memory: str | None = None,
                tp: int | None = None, max_model_len: int | None = None, max_num_batched_tokens: int | None = None,
                max_num_seqs: int | None = None, engine: str | None = None, fetch: bool | None = None,
                revision: str | None = None, weight_dtype: str = "auto") -> ExplainReport:
    """Read the log at ``log_path`` and predict its deployment: ``model`` (default: the one the log names) on
    ``gpu`` or a GPU of ``gpu_memory`` (default: the catalog GPU of the logged total memory), with the rules of
    ``engine`` (``vllm==X.Y.Z``; default: the release the log prints), weights in ``weight_dtype`` (default: the
    checkpoint's, or fp8 where the log quantizes online). The other settings default to the log's."""
    from kvplan.core.capacity.explain import explain_rows
    from kvplan.io.vllm_log import read_vllm_log

    log = read_vllm_log(log_path)
    if max_num_batched_tokens is not None:
        log = dataclasses.replace(log, max_num_batched_tokens=max_num_batched_tokens)
    if max_model_len is not None:
        log = dataclasses.replace(log, max_seq_len=max_model_len)
    gpu_spec, gpu_source = _gpu_for(log, gpu, gpu_memory)
    p = _predict(log, model, gpu_spec, tp=tp, engine=engine, max_num_seqs=max_num_seqs or log.max_num_seqs,
                 fetch=fetch, revision=revision, weight_dtype=weight_dtype)
    notes = p.notes if gpu_source is None or p.predicted is None else (gpu_source, *p.notes)
    if log.binding_kv_cache_bytes is not None and log.kv_cache_memory_bytes is not None:
        notes = (*notes, f"the ranks' pools are sized by the rank with the most non-KV memory: "
                         f"{log.binding_kv_cache_bytes / GiB:.2f} GiB of KV memory (requested less its non-KV memory); "
                         f"the log's 'Available KV cache memory' ({log.kv_cache_memory_bytes / GiB:.2f} GiB) is rank "
                         "0's; the replay uses the binding rank's")
    return ExplainReport(log=log, gpu=gpu_spec, rows=tuple(explain_rows(log.figures(), p.predicted, p.replay)),
                         notes=notes, profile=p.profile, hub=p.hub, gpu_source=gpu_source)


def _gpu_for(log: VLLMLog, gpu: str | None, gpu_memory: str | None) -> tuple[GPUSpec | None, str | None]:
    """The GPU given, else the catalog GPU whose memory is the logged total (the nearest, within 2%: drivers
    report a card's total a little differently, e.g. 44.42 GiB for an L40S the catalog has at 44.52), else one of
    that size; and a note saying where the figure came from when the log gave it."""
    from kvplan.core.gpus import GPUSpec
    from kvplan.io.gpus import closest_gpu_by_memory, get_gpu, gpu_catalog

    if gpu or gpu_memory:
        return get_gpu(gpu, memory=gpu_memory), None
    total = log.total_gpu_memory_bytes
    if not total:
        return None, None
    line = f" ('{log.total_gpu_memory_from}')" if log.total_gpu_memory_from else ""
    said = f"the {total / GiB:.2f} GiB of GPU memory the log states{line}"
    match = closest_gpu_by_memory(total)
    if match is not None:
        # cards of one size class report within a few tenths of a GiB of each other (H100 SXM 79.19, H100 PCIe 79.11,
        # A100 80GB 79.26 GiB): name the others a driver's drift could make it, which differ in engine defaults
        near = [g.name for g in gpu_catalog() if g is not match and abs(g.memory_bytes - total) <= 0.005 * total]
        alike = f"; {', '.join(near)} report nearly the same" if near else ""
        return match, (f"GPU {match.name} ({match.memory_bytes / GiB:.2f} GiB), the catalog GPU nearest {said}"
                       f"{alike}; pass --gpu to name another")
    return (GPUSpec(name=f"{total / GiB:.2f} GiB as logged", memory_bytes=total, source="log"),
            f"GPU of {said}: no catalog GPU within 2% of it; pass --gpu to name one")


_HF_CACHE_DIR = re.compile(r"(?:^|/)models--([A-Za-z0-9][A-Za-z0-9_.-]*)--([A-Za-z0-9][A-Za-z0-9_.-]*)"
                           r"(?:/snapshots/[A-Za-z0-9_.-]+)?/?$")


def _hub_id(model: str | None) -> str | None:
    """A model the log names by a Hugging Face cache folder this machine does not have (``.../hub/models--ORG--NAME``
    or its ``/snapshots/REV``, as a server started from a downloaded snapshot prints it) as the hub id ORG/NAME; a
    folder that exists here, and any other name, as it is."""
    if model is None or Path(model).exists():
        return model
    found = _HF_CACHE_DIR.search(model)
    return f"{found.group(1)}/{found.group(2)}" if found else model


def _predict(log: VLLMLog, model: str | None, gpu: GPUSpec | None, *, tp: int | None, engine: str | None,
             max_num_seqs: int | None, fetch: bool | None, revision: str | None, weight_dtype: str) -> Prediction:
    from kvplan.core.capacity.explain import Replay
    from kvplan.core.capacity.fit import fit
    from kvplan.io.models import resolve_model

    ref = model or _hub_id(log.model)
    if ref is None or gpu is None:
        why = ("the log names no model (no 'Initializing ... LLM engine' line); pass --model NAME" if ref is None
               else "the log gives no GPU memory (pass --gpu or --gpu-memory)")
        return Prediction(predicted=None, replay=Replay(), notes=(f"no prediction: {why}",))
    try:
        resolved = resolve_model(ref, fetch=fetch, revision=revision)
    except HubError:
        raise  # a fetch that was asked for and failed is an error, not a missing prediction
    except KvplanError as exc:
        return Prediction(predicted=None, replay=Replay(), notes=(
            f"no prediction for {ref}: {exc} (pass --model with a bundled name or config.json)",))
    spec, dtype_note = _as_run(resolved.spec, log)
    profile, profile_note = _profile(log, engine)
    weights, weights_note = _weights_as_run(spec, log, weight_dtype, ref)
    drafter, left_out = _log_drafter(spec, profile, log)
    req = _request(spec, gpu, log, profile, tp=tp, max_num_seqs=max_num_seqs, weight_dtype=weights or "auto",
                   drafter=drafter)
    if weights is None:  # the checkpoint's format is not known: no prediction, the replay still holds
        return Prediction(predicted=None, replay=_replay(req, log), notes=(*spec.notes, weights_note), profile=profile,
                          hub=resolved.hub)
    predicted = fit(req)
    notes = [*spec.notes, *(n for n in (dtype_note, profile_note, weights_note) if n)]
    parallel = "".join(f", {name} {n}" for name, n in (("dp", req.dp), ("dcp", req.dcp)) if n > 1) + (
        " with expert parallel" if req.expert_parallel else "")
    notes.append(f"predicted for {spec.name} on {gpu.name}, tp {req.tp}{parallel}, max_model_len "
                 f"{predicted.max_model_len}, with the rules of {profile.display} {profile.version}")
    if req.drafter is not None:
        notes.append(req.drafter.note)
    elif left_out:
        notes.append(f"the log's speculative_config {log.speculative_config}: its drafter's KV layers and weights "
                     f"are left out of the prediction (it is high): {left_out}")
    notes += [n for n in predicted.notes if n.startswith("vLLM warns")]  # the warnings the log should show too
    return Prediction(predicted=predicted, replay=_replay(req, log), notes=tuple(notes), profile=profile,
                      hub=resolved.hub)


def _as_run(spec: ModelSpec, log: VLLMLog) -> tuple[ModelSpec, str | None]:
    """The spec in the dtype the log's engine ran it in: that dtype sets both the weights and the KV cache
    (e.g. opt-125m's float16 upcast to float32 on a GPU without fp16 support)."""
    from kvplan.core.dtypes import get_dtype

    if log.dtype in ("float32", "float16", "bfloat16") and get_dtype(log.dtype).name != _dtype_name(spec.dtype):
        return (dataclasses.replace(spec, dtype=log.dtype),
                f"the log runs {spec.name} in {log.dtype} (the config says {spec.dtype})")
    return spec, None


def _weights_as_run(spec: ModelSpec, log: VLLMLog, weight_dtype: str, ref: str) -> tuple[str | None, str | None]:
    """The weight format to predict with, and a note: the one asked; fp8 where the log quantizes a checkpoint without
    a quantization_config online (vLLM's --quantization fp8, vllm/model_executor/layers/quantization/fp8.py); None
    where the log loads a quantized checkpoint whose quantization_config kvplan does not have (a bundled base model
    matched by name, say): its weights cannot be known."""
    if weight_dtype != "auto":
        return weight_dtype, None
    raw = spec.raw_config
    if log.quantization is None or raw.get("quantization_config") or (raw.get("text_config") or {}).get(
            "quantization_config"):
        return "auto", None
    if log.quantization == "fp8":
        return "fp8", f"the log quantizes {spec.name}'s weights to fp8 as it loads them (quantization=fp8)"
    return None, (f"no prediction: the log loads a {log.quantization}-quantized checkpoint and kvplan has no "
                  f"quantization_config for {ref} (sized as {spec.name}); pass --model with its config.json, or "
                  "--weight-dtype (bf16, fp8, int8, int4-g128, mxfp4)")


def _dtype_name(name: str) -> str:
    """kvplan's name of a dtype spelled the torch or the kvplan way ("bfloat16" and "bf16" are one dtype)."""
    from kvplan.core.dtypes import get_dtype

    try:
        return get_dtype(name).name
    except KvplanError:
        return name


def _profile(log: VLLMLog, engine: str | None) -> tuple[EngineProfile, str | None]:
    """The release's rules: ``engine``'s (checked against the log's V0/V1 format), else the log's version's."""
    from kvplan.core.engines.vllm.profiles import for_log, v0_variant

    if not engine:
        return for_log(log.version, log.generation)
    from kvplan.core.profiles import Version, parse_engine

    choice = parse_engine(engine, allowed=("vllm",))
    assert choice.profile is not None  # vLLM has releases: parse_engine names one
    asked = choice.profile.since if not choice.asked else Version.parse(choice.asked)
    if log.generation == "V0" and not asked < Version.parse("0.11.0"):
        raise InputError(f"--engine {engine}: the log is from vLLM's V0 engine, which 0.11 removed; name the "
                         "release that wrote it (0.6 to 0.10)")
    if log.generation == "V1" and asked < Version.parse("0.7.0"):
        raise InputError(f"--engine {engine}: the log is from vLLM's V1 engine, which begins in 0.7; name the "
                         "release that wrote it")
    note = choice.note if choice.note and choice.asked else None
    return (v0_variant(choice.profile) if log.generation == "V0" else choice.profile), note


def _moe_backend(log: VLLMLog) -> str:
    """The log's --moe-backend where kvplan counts what it allocates (DeepGEMM MegaMoE), else auto."""
    from kvplan.core.engines.vllm.deepseek_v4 import MOE_BACKENDS

    return log.moe_backend if log.moe_backend in MOE_BACKENDS else "auto"


def _request(spec: ModelSpec, gpu: GPUSpec, log: VLLMLog, profile: EngineProfile, *, tp: int | None,
             max_num_seqs: int | None, weight_dtype: str = "auto", drafter=None) -> FitRequest:  # type: ignore[no-untyped-def]
    """The deployment the log started, as a fit question (what the log leaves out: the release's defaults)."""
    from kvplan.core.capacity.common import FitRequest
    from kvplan.core.spec import CompressedLayer

    kv_dtype = log.kv_cache_dtype if log.kv_cache_dtype and log.kv_cache_dtype != "auto" else "auto"
    return FitRequest(spec=spec, gpu=gpu, engine="vllm", tp=tp or log.tensor_parallel_size or 1,
                      pp=log.pipeline_parallel_size or 1, dp=log.data_parallel_size or 1,
                      expert_parallel=bool(log.enable_expert_parallel), dcp=log.decode_context_parallel_size or 1,
                      moe_backend=_moe_backend(log) if spec.has_layer(CompressedLayer) else "auto", kv_dtype=kv_dtype, weight_dtype=weight_dtype,
                      gpu_memory_utilization=log.gpu_memory_utilization,
                      max_model_len=log.max_seq_len or log.concurrency_tokens, block_size=log.block_size,
                      enforce_eager=bool(log.enforce_eager), max_num_batched_tokens=log.max_num_batched_tokens,
                      max_num_seqs=max_num_seqs, profile=profile, drafter=drafter,
                      num_speculative_tokens=drafter.num_speculative_tokens if drafter is not None else 0,
                      mamba_cache_mode=_mamba_cache_mode(log, profile),
                      # the log's max_model_len is the one vLLM started with: past the model's, the variable was set
                      allow_long_max_model_len=True)


def _log_drafter(spec: ModelSpec, profile: EngineProfile, log: VLLMLog):  # type: ignore[no-untyped-def]
    """The drafter the log's speculative_config builds, and why none where kvplan cannot count it (a method it does
    not model, a head's config it cannot read here): the prediction then leaves it out and says so."""
    from kvplan.app.fit import make_drafter
    from kvplan.io.speculative import parse_speculative_config

    try:
        return make_drafter(spec, profile, parse_speculative_config(log.speculative_config),
                            pp=log.pipeline_parallel_size or 1), ""
    except KvplanError as exc:
        return None, str(exc)


def _mamba_cache_mode(log: VLLMLog, profile: EngineProfile) -> str:
    """The log's Mamba cache mode: as it says, else align where the args turn prefix caching on in a release with the
    modes (vLLM sets align for a hybrid model then: 0.33.0 model_executor/models/config.py::MambaModelConfig)."""
    if log.mamba_cache_mode in ("none", "align"):
        return log.mamba_cache_mode
    return "align" if log.enable_prefix_caching and profile.rules.mamba_cache_modes else "none"


def _replay(req: FitRequest, log: VLLMLog) -> Replay:
    """kvplan's arithmetic fed the log's own figures (kvplan/core/capacity/explain.py says which)."""
    from kvplan.core.capacity.explain import LOGGED_GIB_HALF_UNIT, Replay
    from kvplan.core.capacity.fit import fit
    from kvplan.core.gpus import GPUSpec
    from kvplan.core.units import GiB

    measured = dataclasses.replace(req, weights_memory=log.weights_bytes, activation_memory=log.activation_bytes,
                                   non_torch_memory=log.non_torch_bytes,
                                   cuda_graph_memory=log.cuda_graph_estimate_bytes or log.cuda_graph_bytes)
    budget = None
    subtracts = req.engine_profile().rules.cuda_graphs.subtracted
    if (log.total_gpu_memory_bytes and log.gpu_memory_utilization and None not in (
            log.weights_bytes, log.activation_bytes, log.non_torch_bytes)
            and (log.cuda_graph_estimate_bytes is not None or not subtracts)):
        gpu = GPUSpec(name="as logged", memory_bytes=log.total_gpu_memory_bytes, source="log")
        budget = fit(dataclasses.replace(measured, gpu=gpu, gpu_memory_utilization=log.gpu_memory_utilization))
    if log.kv_cache_memory_bytes is None:
        return Replay(budget=budget)
    kv = log.binding_kv_cache_bytes or log.kv_cache_memory_bytes  # the rank that sizes every pool
    half = int(LOGGED_GIB_HALF_UNIT * GiB)

    def at(kv_bytes: int) -> FitResult:
        return fit(dataclasses.replace(measured, kv_cache_memory_bytes=kv_bytes))

    return Replay(budget=budget, kv=at(kv), kv_low=at(kv - half), kv_high=at(kv + half))
