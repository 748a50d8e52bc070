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
from dataclasses import dataclass
from typing import Any

from kvplan.core.units import GiB
from kvplan.core.capacity.estimates import ACTIVATION_BYTES_PER_HIDDEN_PER_TOKEN
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


@dataclass(frozen=True, kw_only=True)
class ComponentResult:
    model: str
    batch: int
    seq_len: int
    dtype: str
    component: str  # kv_cache, weights, peak
    predicted_bytes: int
    measured_bytes: int
    scaled: bool
    layers: int
    device: str
    note: str = ""

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


def hf_activation_estimate(spec: ModelSpec, *, batch: int, prompt_len: int, act_bytes: int) -> int:
    """Transient memory of a transformers prefill: the forward activations (kvplan's calibrated
    estimate) plus the logits of every prompt position (``logits_to_keep=0``) and their fp32 copy."""
    vocab = spec.arch.vocab_size if spec.arch else 0
    tokens = batch * prompt_len
    fp32 = get_dtype("fp32").vector_bytes(1)
    return tokens * spec.hidden_size * ACTIVATION_BYTES_PER_HIDDEN_PER_TOKEN * act_bytes // 2 + tokens * vocab * (act_bytes + fp32)


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


def _build(spec: ModelSpec, raw: dict[str, Any], torch_dtype: str) -> Any:
    """The model of ``raw`` in ``torch_dtype``, built without random init; what it cannot import is an InputError."""
    from kvplan.validate.hf_cache import build_model

    cfg = dict(raw)
    cfg["torch_dtype"] = torch_dtype
    try:
        with _no_random_init():
            return _tied_and_zeroed(build_model(cfg, dtype=torch_dtype))
    except ImportError as exc:  # e.g. Gemma 3n's vision tower needs timm
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), exc.__class__.__name__)
        first = first.split(". ")[0].rstrip(".")
        raise InputError(f"transformers cannot build {spec.name} here: {first}; install what it names, or validate "
                         "the text_config alone saved as a config.json") from None


@dataclass(frozen=True, kw_only=True)
class _Measured:
    weights: int  # bytes of the parameters' distinct storages
    kv_cache: int  # bytes of the cache's distinct storages after prefill and decode
    peak: int | None = None  # CUDA: the allocator's peak over load, prefill and decode (None on CPU)
    on_device: int = 0  # CUDA: what the loaded model holds on the device


def _measure(case: Case, spec: ModelSpec, raw: dict[str, Any], run: _RunSettings) -> _Measured:
    """Build the model, run the case, and measure; on CUDA the allocator around each phase."""
    import torch

    from kvplan.validate.hf_cache import measure_decode

    cuda = run.device == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    model = _build(spec, raw, TORCH_DTYPES[run.dtype.name])
    if cuda:
        model = model.to("cuda")
        torch.cuda.synchronize()
        after_load = torch.cuda.memory_allocated()
    weights = _weights_bytes(model)
    kv_cache = measure_decode(model, batch=case.batch, prompt_len=run.prompt_len, seq_len=case.seq_len,
                              device=run.device).total_bytes
    if not cuda:
        return _Measured(weights=weights, kv_cache=kv_cache)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del model
    torch.cuda.empty_cache()
    return _Measured(weights=weights, kv_cache=kv_cache, peak=peak, on_device=after_load - base)


def run_case(case: Case, spec: ModelSpec) -> list[ComponentResult]:
    require_torch()
    run = _run_settings(case, spec)
    check_memory(case, spec, device=run.device, dtype=run.dtype.name, prompt_len=run.prompt_len,
                 available=available_bytes(run.device))
    raw = reduced_config(spec.raw_config, case.layers)
    sub = spec_from_hf_config(raw, name=spec.name, origin=spec.source or spec.name)
    measured = _measure(case, spec, raw, run)

    wfmt = run.dtype.vector_bytes(1)
    predicted_kv = size_kv(sub, get_engine("hf"), batch=case.batch, seq_len=case.seq_len,
                           kv_dtype=run.dtype.name).total_bytes
    predicted_weights = count_params(sub, sub.arch).total * wfmt if sub.arch else 0
    common = dict(model=spec.name, batch=case.batch, seq_len=case.seq_len, dtype=run.dtype.name, layers=sub.num_layers,
                  device=run.device)
    results = [
        ComponentResult(component="kv_cache", predicted_bytes=predicted_kv, measured_bytes=measured.kv_cache,
                        scaled=False, **common),
        ComponentResult(component="weights", predicted_bytes=predicted_weights, measured_bytes=measured.weights,
                        scaled=False, **common),
    ]
    if measured.peak is not None:
        predicted_peak = (predicted_weights + predicted_kv
                          + hf_activation_estimate(sub, batch=case.batch, prompt_len=run.prompt_len, act_bytes=wfmt))
        results.append(ComponentResult(component="peak", predicted_bytes=predicted_peak, measured_bytes=measured.peak,
                                       scaled=False, note=f"weights on device {measured.on_device:,} B", **common))
    if sub.num_layers < spec.num_layers:  # whole-model figures, scaled by the predicted whole/part ratio
        results += _scaled_results(case, spec, run, measured, predicted_kv=predicted_kv,
                                   predicted_weights=predicted_weights, common=common)
    return results


def _scaled_results(case: Case, spec: ModelSpec, run: _RunSettings, measured: _Measured, *, predicted_kv: int,
                    predicted_weights: int, common: dict[str, Any]) -> list[ComponentResult]:
    """The whole model's figures from a run of its first layers: measured x predicted whole / predicted part."""
    full_kv = size_kv(spec, get_engine("hf"), batch=case.batch, seq_len=case.seq_len,
                      kv_dtype=run.dtype.name).total_bytes
    full_w = count_params(spec, spec.arch).total * run.dtype.vector_bytes(1) if spec.arch else 0
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
