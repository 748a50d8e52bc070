"""``kvplan validate``: build a real model with transformers, run it, and set kvplan's predictions
beside what torch actually holds.

On CPU the KV cache is measured exactly (the bytes of the cache's distinct tensor storages, what the
``hf`` engine predicts) and the weights as the bytes of the parameters. On CUDA the caching
allocator is measured around each phase (load, prefill, decode): ``memory_allocated`` deltas and
``max_memory_allocated`` for the peak. With ``--layers N`` a model too large for the device is built
with its first N layers: those figures are measured, and the whole-model figures are scaled by the
predicted whole/part ratio and marked ``scaled``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from kvplan.core.units import GiB
from kvplan.core.capacity.estimates import (ACTIVATION_BYTES_PER_HIDDEN_PER_TOKEN, ACTIVATION_ERROR_FRAC,
                                            CUDA_GRAPH_ERROR_FRAC, cuda_graph_bytes)
from kvplan.core.dtypes import KVDtype, get_dtype
from kvplan.core.engines import get_engine
from kvplan.core.sizing import size_kv
from kvplan.core.spec import ModelSpec
from kvplan.core.weights import count_params
from kvplan.errors import InputError
from kvplan.io.hf_config import spec_from_hf_config
from kvplan.validate import require_torch

TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# Share of the device's available memory a run may plan to use: the interpreter, torch's own
# buffers and allocator rounding need the rest.
USABLE_SHARE = 0.9


@dataclass(frozen=True, kw_only=True)
class Case:
    model: str
    batch: int = 1
    seq_len: int = 64
    prompt_len: int | None = None  # default: seq_len - 8 (decoding the rest)
    dtype: str = "auto"
    layers: int | None = None
    device: str = "auto"
    # CUDA only: the prompt lengths (batch 1) whose prefill peak is measured; the decode step's graph pool is
    # captured at the case's batch
    prefill_tokens: tuple[int, ...] = (512, 2048)


@dataclass(frozen=True, kw_only=True)
class ComponentResult:
    model: str
    batch: int
    seq_len: int
    dtype: str
    component: str  # kv_cache, weights, peak; on CUDA also prefill_peak (one per token count) and graph_pool
    predicted_bytes: int
    measured_bytes: int
    scaled: bool
    layers: int
    device: str
    note: str = ""
    band_bytes: int = 0  # an estimate's stated error band (0: a figure kvplan claims, held to the tolerance)
    tokens: int | None = None  # prefill_peak: the prompt tokens of that forward
    missing: str = ""  # why this part could not be measured (then no measured figure: the bytes are 0)

    def passes(self, tolerance: float) -> bool:
        """Within the tolerance (a figure kvplan claims) or within its band (an estimate); a part that could not be
        measured is reported, not failed."""
        if self.missing:
            return True
        if self.band_bytes:
            return abs(self.error_bytes) <= self.band_bytes
        return abs(self.error_frac) <= tolerance

    @property
    def error_bytes(self) -> int:
        return self.predicted_bytes - self.measured_bytes

    @property
    def error_frac(self) -> float:
        return self.error_bytes / self.measured_bytes if self.measured_bytes else 0.0


def reduced_config(raw: dict[str, Any], layers: int | None) -> dict[str, Any]:
    """The config with only the first ``layers`` decoder layers (text_config too)."""
    cfg = copy.deepcopy(raw)
    if layers is None:
        return cfg
    target = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) and "num_hidden_layers" not in cfg else cfg
    total = next((target[k] for k in ("num_hidden_layers", "n_layer", "num_layers") if isinstance(target.get(k), int)),
                 None)
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if key in target:
            if layers > target[key]:
                raise InputError(f"--layers {layers} exceeds the model's {target[key]} layers")
            target[key] = layers
    # per-layer lists (Gemma 3n's intermediate_size and activation_sparsity_pattern, Hunyuan's MoE lists)
    for key in ("layer_types", "no_rope_layers", "intermediate_size", "activation_sparsity_pattern", "moe_topk",
                "moe_intermediate_size", "num_shared_expert"):
        if isinstance(target.get(key), list) and (key in ("layer_types", "no_rope_layers") or len(target[key]) == total):
            target[key] = target[key][:layers]
    if isinstance(target.get("num_kv_shared_layers"), int) and isinstance(total, int):
        # KV sharing covers the model's last layers: of the first `layers`, those from total - shared on
        target["num_kv_shared_layers"] = max(0, layers - (total - target["num_kv_shared_layers"]))
    return cfg


def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is visible to torch; use --device cpu")
    if name not in ("cpu", "cuda"):
        raise InputError(f"--device must be auto, cpu or cuda (got {name!r})")
    return name


def available_bytes(device: str) -> int:
    """Memory a run can use now: CUDA's free bytes (``torch.cuda.mem_get_info``); on CPU the kernel's
    MemAvailable (/proc/meminfo), else physical pages x page size."""
    if device == "cuda":
        import torch

        return int(torch.cuda.mem_get_info()[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return 0  # unknown: do not refuse


@dataclass(frozen=True, kw_only=True)
class RunNeed:
    weights: int
    kv_cache: int
    activation: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activation


def run_need(spec: ModelSpec, layers: int | None, *, batch: int, seq_len: int, prompt_len: int, dtype: str) -> RunNeed:
    """What building ``layers`` layers of the model and running the case holds at its peak (kvplan's own
    predictions: parameter count x dtype, the hf engine's KV cache, the prefill activation estimate)."""
    sub = spec_from_hf_config(reduced_config(spec.raw_config, layers), name=spec.name, origin=spec.source or spec.name)
    width = get_dtype(dtype).vector_bytes(1)
    return RunNeed(weights=count_params(sub, sub.arch).total * width if sub.arch else 0,
                   kv_cache=size_kv(sub, get_engine("hf"), batch=batch, seq_len=seq_len, kv_dtype=dtype).total_bytes,
                   activation=hf_activation_estimate(sub, batch=batch, prompt_len=prompt_len, act_bytes=width))


def check_memory(case: Case, spec: ModelSpec, *, device: str, dtype: str, prompt_len: int, available: int) -> None:
    """Refuse, before building anything, a run that would not fit the device; name a --layers that does."""
    if available <= 0:
        return
    usable = int(available * USABLE_SHARE)

    def need(layers: int | None) -> RunNeed:
        return run_need(spec, layers, batch=case.batch, seq_len=case.seq_len, prompt_len=prompt_len, dtype=dtype)

    whole = need(case.layers)
    if whole.total <= usable:
        return
    built = case.layers or spec.num_layers
    lo, hi = 0, built - 1  # the most layers that fit: need() grows with layers
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if need(mid).total <= usable else (lo, mid - 1)
    what = (f"{spec.name} with {built} layers on {device} needs about {whole.total / GiB:.2f} GiB (weights "
            f"{whole.weights / GiB:.2f} GiB + KV cache {whole.kv_cache / GiB:.2f} GiB + activations "
            f"{whole.activation / GiB:.2f} GiB), {usable / GiB:.2f} GiB usable ({USABLE_SHARE:.0%} of "
            f"{available / GiB:.2f} GiB available)")
    if lo == 0:
        raise InputError(f"{what}; even one layer does not fit: lower --batch or --seq-len, or --dtype bf16")
    raise InputError(f"{what}; run with --layers {lo} (the whole-model figures are then scaled)")


# Random weight initialisation is not measurement: the parameters' storages are allocated as the modules are
# built (what "weights" measures), and the cache holds what the forward passes put in it, whatever the
# weights' values (what "kv_cache" measures). On 2 CPUs it was 20 s of the 24 s of `kvplan validate
# llama3.1-8b --device cpu --layers 2` (torch's reset_parameters and transformers' init_weights, half each,
# mostly the 128,256 x 4,096 embedding and LM head: benchmarks/bench_validate.py).
@contextmanager
def _no_random_init() -> Iterator[None]:
    """While the model is built, transformers' own ``no_init_weights``: no torch.nn.init call, no init_weights."""
    try:
        from transformers.initialization import no_init_weights  # transformers 5
    except ImportError:
        try:
            from transformers.modeling_utils import no_init_weights  # type: ignore[no-redef]  # transformers 4
        except ImportError:  # neither: built as from_config builds it, only slower
            no_init_weights = nullcontext  # type: ignore[assignment]
    with no_init_weights():
        yield


def _tied_and_zeroed(model: Any) -> Any:
    """What init_weights would have left that the measurement needs: tied weights (transformers ties them
    there; a tied LM head is one storage, not two); then every parameter zeroed, so no value comes from
    whatever memory the allocator recycled (a NaN there could reach a router's top-k)."""
    import torch

    model.tie_weights()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model


def _weights_bytes(model: Any) -> int:
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        storage = p.untyped_storage()
        if storage.data_ptr() not in seen:  # tied weights share a storage
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


# transformers' configs whose final_logit_softcapping defaults to a value when config.json omits it (transformers
# 5.24 models/gemma2/configuration_gemma2.py: 30.0; Gemma 3's default is None).
_SOFTCAP_BY_DEFAULT = frozenset({"gemma2"})


def _logit_copies(spec: ModelSpec) -> int:
    """Logits tensors alive at once after the LM head: two where the model caps them (Gemma 2's forward divides,
    takes tanh and multiplies, each a new tensor made while the last is held: modeling_gemma2.py), else one."""
    raw = spec.raw_config
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    cap = text.get("final_logit_softcapping", 30.0 if text.get("model_type", raw.get("model_type")) in
                   _SOFTCAP_BY_DEFAULT else None)
    return 2 if cap else 1


def hf_activation_estimate(spec: ModelSpec, *, batch: int, prompt_len: int, act_bytes: int,
                           every_position: bool = False) -> int:
    """Transient memory of a transformers prefill beside its weights and cache. ``generate()`` asks for the last
    position's logits alone (``logits_to_keep=1``: transformers 5.24 generation/utils.py, where the model's forward
    takes it) and copies them to float32 to pick the next token: kvplan's calibrated forward activations plus those.
    A plain forward (``every_position``) returns every position's logits in the model's dtype (modeling_llama.py's
    ``LlamaForCausalLM.forward``: no float32 copy without labels), made after the last layer has freed its
    activations: its peak is the larger of the forward's and the logits' with the final hidden states."""
    vocab = spec.arch.vocab_size if spec.arch else 0
    tokens = batch * prompt_len
    forward = tokens * spec.hidden_size * ACTIVATION_BYTES_PER_HIDDEN_PER_TOKEN * act_bytes // 2
    if every_position:
        return max(forward, tokens * (vocab * _logit_copies(spec) + spec.hidden_size) * act_bytes)
    return forward + batch * vocab * (act_bytes + get_dtype("fp32").vector_bytes(1))


@dataclass(frozen=True, kw_only=True)
class _RunSettings:
    """A case's device, model dtype and prompt length, checked."""

    device: str
    dtype: KVDtype
    prompt_len: int


def _run_settings(case: Case, spec: ModelSpec) -> _RunSettings:
    device = _device(case.device)
    dtype = get_dtype(spec.dtype if case.dtype == "auto" else case.dtype)
    if dtype.name not in TORCH_DTYPES:
        raise InputError(f"validate runs fp32, bf16 or fp16 models (got {dtype.name})")
    prompt_len = case.prompt_len or max(1, case.seq_len - 8)
    if not 0 < prompt_len < case.seq_len:
        raise InputError(f"--prompt-len must be between 1 and seq_len - 1 ({case.seq_len - 1})")
    return _RunSettings(device=device, dtype=dtype, prompt_len=prompt_len)


def _build(spec: ModelSpec, raw: dict[str, Any], torch_dtype: str, device: str = "cpu") -> Any:
    """The model of ``raw`` in ``torch_dtype`` on ``device``, built without random init; what it cannot import is an
    InputError."""
    from kvplan.validate.hf_cache import build_model

    cfg = dict(raw)
    cfg["torch_dtype"] = torch_dtype
    try:
        with _no_random_init():
            return _tied_and_zeroed(build_model(cfg, dtype=torch_dtype, device=device))
    except ImportError as exc:  # e.g. Gemma 3n's vision tower needs timm
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), exc.__class__.__name__)
        first = first.split(". ")[0].rstrip(".")
        raise InputError(f"transformers cannot build {spec.name} here: {first}; install what it names, or validate "
                         "the text_config alone saved as a config.json") from None


@dataclass(frozen=True, kw_only=True)
class _Measured:
    weights: int  # bytes of the parameters' distinct storages (CUDA: what loading the model allocated)
    kv_cache: int  # CPU: the cache's distinct storages after prefill and decode; CUDA: what generate()'s cache holds
    peak: int | None = None  # CUDA: the allocator's peak over load and generate (None on CPU)
    notes: dict[str, str] = field(default_factory=dict)  # CUDA: the other measure of the same bytes, per component
    prefill_peaks: tuple[tuple[int, int], ...] = ()  # CUDA: (prompt tokens, peak bytes) of a batch-1 prefill
    graph_pool: int | None = None  # CUDA: the private pool of a captured decode step (None: not captured)
    failures: tuple[str, ...] = ()  # CUDA: what could not be measured, and why
    towers: bool = True  # whether transformers built the vision tower (a text-only class leaves it out)


def _built_towers(model: Any) -> bool:
    """Whether the built model holds a multimodal config's encoder: AutoModelForCausalLM builds some multimodal
    models text-only (transformers 5.24: Qwen 3.5 and Llama 4 as *ForCausalLM with the text config alone), others
    whole (Gemma 3, Mistral 3: *ForConditionalGeneration, whose config keeps vision_config)."""
    return any(hasattr(model.config, key) for key in ("vision_config", "audio_config"))


def _measure(case: Case, spec: ModelSpec, raw: dict[str, Any], run: _RunSettings) -> _Measured:
    """Build the model, run the case, and measure; on CUDA the allocator around transformers' own calls."""
    from kvplan.validate.hf_cache import measure_decode

    if run.device == "cuda":
        return _measure_cuda(case, spec, raw, run)
    model = _build(spec, raw, TORCH_DTYPES[run.dtype.name])
    kv_cache = measure_decode(model, batch=case.batch, prompt_len=run.prompt_len, seq_len=case.seq_len,
                              device=run.device).total_bytes
    return _Measured(weights=_weights_bytes(model), kv_cache=kv_cache, towers=_built_towers(model))


def _measure_cuda(case: Case, spec: ModelSpec, raw: dict[str, Any], run: _RunSettings) -> _Measured:
    """Build on the GPU, ``generate()`` to the case's length, then a prefill per token count and a captured decode
    step, each read from the caching allocator (kvplan.validate.cuda). A prefill or capture that fails (out of
    memory, a model whose forward cannot be captured) is recorded as such; the rest is still measured."""
    import torch

    from kvplan.validate import cuda

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base, asked = torch.cuda.memory_allocated(), cuda.requested_bytes()
    model = _build(spec, raw, TORCH_DTYPES[run.dtype.name], device="cuda")
    torch.cuda.synchronize()
    weights, blocks = cuda.requested_bytes() - asked, torch.cuda.memory_allocated() - base
    storages, towers = _weights_bytes(model), _built_towers(model)
    try:
        kv = cuda.generate_kv(model, batch=case.batch, prompt_len=run.prompt_len, seq_len=case.seq_len)
    except torch.cuda.OutOfMemoryError:
        raise InputError(f"{spec.name} ran out of GPU memory in generate() at batch {case.batch} x {case.seq_len} "
                         f"tokens (the prefill's activations are transformers', not an engine's: eager attention "
                         f"holds batch x heads x prompt^2 scores); lower --batch or --seq-len, or --layers") from None
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    torch.cuda.empty_cache()
    notes = {"weights": f"parameter storages {storages:,} B (the rest: buffers); allocator blocks {blocks:,} B",
             "kv_cache": f"generate() to {kv.cached_tokens} cached tokens; cache storages {kv.storage_bytes:,} B; "
                         f"allocator blocks {kv.allocator_bytes:,} B"}
    failures = []
    if kv.cached_tokens != case.seq_len:
        failures.append(f"kv_cache: generate() left {kv.cached_tokens} tokens in the cache, not {case.seq_len}")
    peaks = []
    for tokens in case.prefill_tokens:
        try:
            peaks.append((tokens, cuda.prefill_peak(model, batch=1, tokens=tokens)))
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            failures.append(f"prefill_peak: {tokens} tokens ran out of memory")
    try:
        pool: int | None = cuda.decode_graph_pool(model, batch=case.batch, prompt_len=run.prompt_len)
    except Exception as exc:  # noqa: BLE001 - what torch or transformers raise under capture varies by model
        torch.cuda.empty_cache()
        pool = None
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        failures.append(f"graph_pool: the decode step was not captured ({type(exc).__name__}: {first})")
    del model
    torch.cuda.empty_cache()
    return _Measured(weights=weights, kv_cache=kv.requested_bytes, peak=peak, notes=notes,
                     prefill_peaks=tuple(peaks), graph_pool=pool, failures=tuple(failures), towers=towers)


def _param_count(spec: ModelSpec, towers: bool) -> int:
    """kvplan's parameter count of what transformers built: the vision tower only where it was built."""
    if not spec.arch:
        return 0
    counts = count_params(spec, spec.arch)
    return counts.total if towers else counts.language_model


def run_case(case: Case, spec: ModelSpec) -> list[ComponentResult]:
    require_torch()
    run = _run_settings(case, spec)
    check_memory(case, spec, device=run.device, dtype=run.dtype.name, prompt_len=run.prompt_len,
                 available=available_bytes(run.device))
    raw = reduced_config(spec.raw_config, case.layers)
    sub = spec_from_hf_config(raw, name=spec.name, origin=spec.source or spec.name)
    measured = _measure(case, spec, raw, run)

    wfmt = run.dtype.vector_bytes(1)
    hf = get_engine("hf")
    predicted_kv = size_kv(sub, hf, batch=case.batch, seq_len=case.seq_len, kv_dtype=run.dtype.name).total_bytes
    predicted_weights = _param_count(sub, measured.towers) * wfmt
    common = dict(model=spec.name, batch=case.batch, seq_len=case.seq_len, dtype=run.dtype.name, layers=sub.num_layers,
                  device=run.device)
    results = [
        ComponentResult(component="kv_cache", predicted_bytes=predicted_kv, measured_bytes=measured.kv_cache,
                        scaled=False, note=measured.notes.get("kv_cache", ""), **common),
        ComponentResult(component="weights", predicted_bytes=predicted_weights, measured_bytes=measured.weights,
                        scaled=False, note=measured.notes.get("weights", ""), **common),
    ]
    if measured.peak is not None:
        activation = hf_activation_estimate(sub, batch=case.batch, prompt_len=run.prompt_len, act_bytes=wfmt)
        results.append(ComponentResult(
            component="peak", predicted_bytes=predicted_weights + predicted_kv + activation,
            measured_bytes=measured.peak, scaled=False, band_bytes=int(activation * ACTIVATION_ERROR_FRAC),
            note=f"load and generate(): weights + KV + activation estimate {activation:,} B", **common))
    for tokens, peak in measured.prefill_peaks:
        activation = hf_activation_estimate(sub, batch=1, prompt_len=tokens, act_bytes=wfmt, every_position=True)
        kv = size_kv(sub, hf, batch=1, seq_len=tokens, kv_dtype=run.dtype.name).total_bytes
        results.append(ComponentResult(
            component="prefill_peak", predicted_bytes=kv + activation, measured_bytes=peak, scaled=False,
            tokens=tokens, band_bytes=int(activation * ACTIVATION_ERROR_FRAC),
            note=f"batch 1 x {tokens} tokens: KV {kv:,} B + activation estimate {activation:,} B", **common))
    if measured.graph_pool is not None:
        per_size = cuda_graph_bytes(sub, num_graphs=1, tp=1, pp=1, era="v1_profiled")
        results.append(ComponentResult(
            component="graph_pool", predicted_bytes=per_size, measured_bytes=measured.graph_pool, scaled=False,
            band_bytes=int(per_size * CUDA_GRAPH_ERROR_FRAC),
            note=f"one decode step at batch {case.batch}, captured whole; kvplan's vLLM 0.18+ per-size estimate",
            **common))
    results += [ComponentResult(component=part, predicted_bytes=0, measured_bytes=0, scaled=False, missing=why,
                                **common) for part, why in (f.split(": ", 1) for f in measured.failures)]
    if sub.num_layers < spec.num_layers:  # whole-model figures, scaled by the predicted whole/part ratio
        results += _scaled_results(case, spec, run, measured, predicted_kv=predicted_kv,
                                   predicted_weights=predicted_weights, common=common)
    return results


def _scaled_results(case: Case, spec: ModelSpec, run: _RunSettings, measured: _Measured, *, predicted_kv: int,
                    predicted_weights: int, common: dict[str, Any]) -> list[ComponentResult]:
    """The whole model's figures from a run of its first layers: measured x predicted whole / predicted part."""
    full_kv = size_kv(spec, get_engine("hf"), batch=case.batch, seq_len=case.seq_len,
                      kv_dtype=run.dtype.name).total_bytes
    full_w = _param_count(spec, measured.towers) * run.dtype.vector_bytes(1)
    whole = dict(common, layers=spec.num_layers)
    return [
        ComponentResult(component="kv_cache", predicted_bytes=full_kv, scaled=True,
                        measured_bytes=measured.kv_cache * full_kv // max(predicted_kv, 1), **whole),
        ComponentResult(component="weights", predicted_bytes=full_w, scaled=True,
                        measured_bytes=measured.weights * full_w // max(predicted_weights, 1), **whole),
    ]


def device_description() -> dict[str, Any]:
    require_torch()
    import torch
    import transformers

    info: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(name=props.name, memory_bytes=props.total_memory, cuda=torch.version.cuda)
        try:
            import subprocess

            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            info["driver"] = "unknown"
    else:
        info["name"] = "cpu"
    return info
