"""Validation against real torch runs. The only package that imports torch and transformers, lazily."""

from __future__ import annotations

from kvplan.errors import InputError


def require_torch() -> None:
    """Fail with one line saying what to install when torch/transformers are missing."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        raise InputError(
            f"validation needs torch and transformers ({exc.name} is missing): pip install -e '.[validate]'"
        ) from None
