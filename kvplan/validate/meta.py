"""transformers' own cache for any config, measured on the meta device: no weights, nothing downloaded.

A model built under ``torch.device("meta")`` has every tensor's shape and dtype and no data, so a prefill and a
decode step run in moments whatever the model's size, and the cache they leave holds tensors whose storage sizes
are exactly what a real run allocates. This is how ``--engine hf`` sizes an architecture kvplan's readers do not
model: exact by construction, for the (batch, tokens) asked. A model whose forward reads tensor values (``.item()``,
data-dependent shapes) cannot run on the meta device; that is reported, not guessed around.
"""

from __future__ import annotations

import os
import signal
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kvplan.core.dtypes import get_dtype
from kvplan.errors import ConfigError, InputError, UnmodeledError
from kvplan.validate import require_torch
from kvplan.validate.hf_cache import CacheMeasurement, build_model, measure_decode

# A forward with a per-token Python loop (transformers' torch fallbacks of Mamba and other scans) takes minutes on a
# long prompt, meta device or not: it is stopped after a time limit, and said so, rather than hang.
def time_limit_s() -> int:
    """KVPLAN_MEASURE_SECONDS, default 120 (0: no limit)."""
    try:
        return max(0, int(os.environ.get("KVPLAN_MEASURE_SECONDS", "120")))
    except ValueError:
        raise InputError("KVPLAN_MEASURE_SECONDS must be a whole number of seconds") from None



_TORCH_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class _TooSlow(Exception):
    pass


@contextmanager
def _time_limit(seconds: int) -> Iterator[None]:
    """SIGALRM after ``seconds`` (main thread on Unix only; elsewhere no limit)."""
    if seconds <= 0 or not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _alarm(signum: int, frame: Any) -> None:
        raise _TooSlow

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def measure_on_meta(config: dict[str, Any], *, batch: int, seq_len: int, dtype: str,
                    origin: str = "config") -> CacheMeasurement:
    """The cache transformers holds for ``batch`` sequences of ``seq_len`` tokens (a prefill of seq_len - 1 tokens
    and one decode step), in ``dtype`` (a torch dtype name), with the cache the model makes itself."""
    require_torch()
    import transformers

    if seq_len < 2:
        raise ConfigError(f"{origin}: measuring on the meta device needs --seq-len 2 or more (a prefill and a "
                          "decode step)")
    limit = time_limit_s()
    try:
        with warnings.catch_warnings(), _time_limit(limit):
            warnings.simplefilter("ignore")
            verbosity = transformers.logging.get_verbosity()
            transformers.logging.set_verbosity_error()
            try:
                model = build_model(config, dtype=dtype, device="meta")
                return measure_decode(model, batch=batch, prompt_len=seq_len - 1, seq_len=seq_len, device="meta",
                                      model_makes_cache=True)
            finally:
                transformers.logging.set_verbosity(verbosity)
    except ConfigError:
        raise
    except _TooSlow:
        raise ConfigError(f"{origin}: transformers' forward ran past {limit} s on the meta device at "
                          f"{seq_len:,} tokens (a loop over tokens); measure a shorter --seq-len, or raise "
                          "KVPLAN_MEASURE_SECONDS") from None
    except Exception as exc:  # transformers' own refusal or a forward that cannot run without data
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(f"{origin}: transformers {transformers.__version__} cannot run this config on the meta "
                          f"device ({type(exc).__name__}: {first[:160]})") from None


@dataclass(frozen=True, kw_only=True)
class MeasuredSize:
    """transformers' cache for a config kvplan does not model, measured (``kvplan size --engine hf``)."""

    transformers_version: str
    dtype: str  # kvplan's name of the model dtype the cache holds
    batch: int
    seq_len: int
    total_bytes: int
    per_layer_bytes: tuple[int, ...]

    def layer_groups(self) -> list[tuple[int, list[int]]]:
        """(bytes a layer holds, the layers holding that much), in order of first appearance."""
        groups: dict[int, list[int]] = {}
        for i, held in enumerate(self.per_layer_bytes):
            groups.setdefault(held, []).append(i)
        return list(groups.items())


def _model_dtype(config: dict[str, Any]) -> str:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for source in (config, text):
        for key in ("torch_dtype", "dtype"):
            if isinstance(source.get(key), str):
                return get_dtype(source[key]).name
    return "fp32"  # transformers builds a model without a dtype in float32


def max_positions(config: dict[str, Any]) -> int:
    """The config's maximum context (0 when it states none), the text model's for a multimodal config."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for source in (config, text):
        for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "max_seq_len"):
            value = source.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return 0


def measure_unmodeled(error: UnmodeledError, *, batch: int, seq_len: int, origin: str) -> MeasuredSize:
    """Measure transformers' own cache for the config an ``UnmodeledError`` refused: in the model's dtype (what
    DynamicCache holds), for ``batch`` sequences of ``seq_len`` tokens. Refused in turn, with its reason, when this
    transformers cannot run the config on the meta device."""
    require_torch()
    import transformers

    if batch < 1:
        raise InputError(f"--batch must be at least 1 (got {batch})")
    dtype = _model_dtype(error.config)
    if dtype not in _TORCH_NAMES:
        raise ConfigError(f"{origin}: the model dtype {dtype} is not one transformers builds a model in")
    try:
        measured = measure_on_meta(error.config, batch=batch, seq_len=seq_len, dtype=_TORCH_NAMES[dtype],
                                   origin=origin)
    except ConfigError as exc:
        raise ConfigError(f"{exc}; and kvplan's own readers cannot size it: {error.what}") from None
    return MeasuredSize(transformers_version=transformers.__version__, dtype=dtype, batch=batch, seq_len=seq_len,
                        total_bytes=measured.total_bytes, per_layer_bytes=measured.per_layer_bytes)
