"""Validation against real torch runs. The only package that imports torch and transformers, lazily."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.errors import InputError

if TYPE_CHECKING:
    from kvplan.core.engines import Engine
    from kvplan.core.profiles import EngineChoice


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


def installed_hf_choice() -> EngineChoice:
    """``--engine hf==<the installed transformers>``: the profile whose rules the real cache here follows."""
    require_torch()
    import transformers

    from kvplan.core.profiles import parse_engine

    return parse_engine(f"hf=={transformers.__version__}")


def installed_hf_engine() -> Engine:
    """The ``hf`` engine under the installed transformers' own profile (what every byte-for-byte check compares)."""
    from kvplan.core.engines import get_engine

    return get_engine("hf", profile=installed_hf_choice().profile)
