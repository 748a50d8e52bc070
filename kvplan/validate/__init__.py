"""Validation against real torch runs. The only package that imports torch and transformers, lazily."""

from __future__ import annotations

from kvplan.errors import InputError


# The README's command for torch on an ordinary machine: PyPI's default torch wheel for Linux is a CUDA build
# of several GB, which `pip install -e '.[validate]'` alone would pull.
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def require_torch() -> None:
    """Fail with one line saying what to install when torch/transformers are missing."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        first = (f"{CPU_TORCH} (a CPU build; for a GPU, the command pytorch.org gives for your CUDA), then "
                 if exc.name == "torch" else "")
        raise InputError(
            f"validation needs torch and transformers ({exc.name} is missing): {first}pip install -e '.[validate]'"
        ) from None
