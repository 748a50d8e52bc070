"""transformers' own cache for any config, measured on the meta device: no weights, nothing downloaded.

A model built under ``torch.device("meta")`` has every tensor's shape and dtype and no data, so a prefill and a
decode step run in moments whatever the model's size, and the cache they leave holds tensors whose storage sizes
are exactly what a real run allocates. This is how ``--engine hf`` sizes an architecture kvplan's readers do not
model: exact by construction, for the (batch, tokens) asked. A model whose forward reads tensor values (``.item()``,
data-dependent shapes) cannot run on the meta device; that is reported, not guessed around.
"""

from __future__ import annotations

import warnings
from typing import Any

from kvplan.errors import ConfigError
from kvplan.validate import require_torch
from kvplan.validate.hf_cache import CacheMeasurement, build_model, measure_decode


def measure_on_meta(config: dict[str, Any], *, batch: int, seq_len: int, dtype: str,
                    origin: str = "config") -> CacheMeasurement:
    """The cache transformers holds for ``batch`` sequences of ``seq_len`` tokens (a prefill of seq_len - 1 tokens
    and one decode step), in ``dtype`` (a torch dtype name), with the cache the model makes itself."""
    require_torch()
    import transformers

    if seq_len < 2:
        raise ConfigError(f"{origin}: measuring on the meta device needs --seq-len 2 or more (a prefill and a "
                          "decode step)")
    try:
        with warnings.catch_warnings():
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
    except Exception as exc:  # transformers' own refusal or a forward that cannot run without data
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(f"{origin}: transformers {transformers.__version__} cannot run this config on the meta "
                          f"device ({type(exc).__name__}: {first[:160]})") from None
