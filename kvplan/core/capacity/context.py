"""A max_model_len longer than the model's: what each engine does at startup.

Each engine derives the longest context from the model's config by its own rule (the engine's budget,
``EngineBudget.context_limit``) and, given a longer one, either refuses to start unless an environment
variable is set where it runs (vLLM, SGLang) or starts with its own limit instead (TensorRT-LLM). The rules
and their sources: the engines' modules and docs/engines.md ("A context longer than the model's").

kvplan plans with what the engine does: a refusal is a reason (the deployment does not fit, exit 1), a
lowered limit is the max_model_len planned, and ``--allow-long-max-model-len`` (the variable will be set)
plans with the length asked for. Where the engine's limit cannot be derived from the config (a RoPE factor
whose treatment differs between releases), only a note says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class ContextLimit:
    """The longest max_model_len an engine starts with for a model unless its override is set."""

    engine: str  # the engine's name as users know it: "vLLM"
    max_model_len: int  # 0: the engine's rule cannot be applied to this config (``source`` says why)
    source: str  # how the engine derives it: "max_position_embeddings", "max_position_embeddings x RoPE factor 4"
    override: str  # what lifts it where the engine runs: "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
    clamps: bool = False  # past it the engine starts with this limit (TensorRT-LLM); else it refuses to start

    def as_dict(self, *, exceeded: bool, allowed: bool) -> dict[str, Any]:
        """The JSON object ``context_limit`` of `kvplan fit --json`."""
        return {"engine": self.engine, "max_model_len": self.max_model_len or None, "source": self.source,
                "override": self.override, "when_exceeded": "clamps" if self.clamps else "refuses to start",
                "exceeded": exceeded, "override_set": allowed}


@dataclass(frozen=True, kw_only=True)
class Decision:
    """What the engine does with the max_model_len asked for."""

    max_model_len: int  # what the engine runs with (the limit when it clamps)
    reason: str = ""  # the engine does not start (a fit reason)
    note: str = ""
    exceeded: bool = False


def config_length(context: dict[str, Any], key: str) -> int | None:
    """A length key of the config as an engine reads it: a positive integer, else absent."""
    value = context.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def rope_factor(scaling: Any) -> float | None:
    """``rope_scaling``'s factor as a number (None: absent or not a number)."""
    if not isinstance(scaling, dict):
        return None
    factor = scaling.get("factor")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
        return None
    return float(factor)


def rope_type(scaling: dict[str, Any]) -> str:
    """The RoPE type as transformers normalizes it (``rope_type``, or the older ``type``)."""
    return str(scaling.get("rope_type", scaling.get("type", "default")))


def decide(limit: ContextLimit | None, *, asked: int | None, default: int, allow: bool,
           model_positions: int) -> Decision:
    """The max_model_len the engine runs with, and why it would not start.

    ``asked``: --max-model-len (None: the default, ``default``, the model's positions as kvplan reads them);
    ``allow``: the engine's override variable will be set where it runs (--allow-long-max-model-len)."""
    flag = "--allow-long-max-model-len"
    if asked is None:
        if limit and 0 < limit.max_model_len < default:
            return Decision(max_model_len=limit.max_model_len, note=(
                f"{limit.engine} derives max_model_len {limit.max_model_len} from the config ({limit.source}), "
                f"not the {default:,} kvplan reads first: planned at {limit.max_model_len}"))
        return Decision(max_model_len=default)
    if limit is None or limit.max_model_len == 0:
        if not 0 < model_positions < asked:
            return Decision(max_model_len=asked)
        why = f" ({limit.source})" if limit else ""
        engine = limit.engine if limit else "the engine"
        if limit is None:
            told = "it may refuse it unless told otherwise"
        elif allow:
            told = f"{limit.override} is set where it runs ({flag})"
        else:
            told = (f"it may {'start with its own instead' if limit.clamps else 'refuse to start'} unless "
                    f"{limit.override} is set where it runs")
        return Decision(max_model_len=asked, exceeded=True, note=(
            f"max_model_len {asked} exceeds the model's {model_positions:,} positions and kvplan cannot derive "
            f"{engine}'s own limit from this config{why}: {told}; outputs past the model's positions are not "
            "assured"))
    top = limit.max_model_len
    if asked <= top:
        return Decision(max_model_len=asked)
    derived = f"the model's {top:,} ({limit.source}, as {limit.engine} derives it)"
    if allow:
        return Decision(max_model_len=asked, exceeded=True, note=(
            f"max_model_len {asked} exceeds {derived}; {limit.override} is set where it runs ({flag}), so it "
            "starts; outputs past the model's positions are not assured"
            + (f"; a release that does not read {limit.override.split('=')[0]} starts with {top} instead"
               if limit.clamps else "")))
    if limit.clamps:
        return Decision(max_model_len=top, exceeded=True, note=(
            f"{limit.engine} starts with max_seq_len {top}, not {asked}: it lowers a longer one to {derived} "
            f"with a warning; planned at {top} (to keep {asked}: {limit.override} where it runs, in releases "
            f"that read it, and {flag})"))
    return Decision(max_model_len=asked, exceeded=True, reason=(
        f"{limit.engine} does not start: max_model_len {asked} exceeds {derived}, and {limit.engine} refuses a "
        f"longer one unless {limit.override} is set where it runs; pass --max-model-len {top}, or set that "
        f"variable and pass {flag}"))
