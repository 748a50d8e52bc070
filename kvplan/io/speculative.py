"""vLLM's ``--speculative-config`` as a user writes it (the CLI edge, and the non-default args of a startup log):
plain data for the fit request."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kvplan.errors import InputError

# SpeculativeConfig's fields that leave the memory kvplan counts as it is (vLLM 0.33.0 config/speculative.py):
# accepted and not read
_NO_MEMORY_KEYS = frozenset({
    "enforce_eager", "revision", "code_revision", "disable_padded_drafter_batch", "disable_eagle_block_drop",
    "disable_lookahead_block_hashes", "use_local_argmax_reduction", "prompt_lookup_max", "prompt_lookup_min",
    "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob", "rejection_sample_method", "synthetic_acceptance_rates",
    "synthetic_acceptance_length", "enable_adaptive_verification", "draft_sample_method", "moe_backend",
    "attention_backend", "index_share_for_mtp_iteration", "max_model_len",
})
# fields that would change the memory in ways kvplan does not count: refused unless they say what the target has
_NOT_MODELLED = ("draft_tensor_parallel_size", "tensor_parallel_size", "kv_cache_dtype", "parallel_drafting",
                 "quantization",
                 "draft_lm_head_quantization", "num_speculative_tokens_per_batch_size", "use_heterogeneous_vocab")


@dataclass(frozen=True, kw_only=True)
class SpeculativeSettings:
    method: str
    num_speculative_tokens: int
    model: str | None = None  # the draft checkpoint (vLLM's "model" key)


def parse_speculative_config(value: str | dict[str, Any] | None) -> SpeculativeSettings | None:
    """vLLM's --speculative-config: a JSON object with ``method`` and ``num_speculative_tokens``."""
    if value is None:
        return None
    raw: Any = value
    if isinstance(value, str):
        try:
            raw = json.loads(value)
        except ValueError:
            raw = None
    if not isinstance(raw, dict):
        raise InputError("--speculative-config takes a JSON object, as vLLM does, e.g. "
                         f"'{{\"method\": \"mtp\", \"num_speculative_tokens\": 1}}' (got {value!r})")
    unknown = sorted(set(raw) - _NO_MEMORY_KEYS - set(_NOT_MODELLED) - {"method", "model", "num_speculative_tokens"})
    if unknown:
        raise InputError(f"--speculative-config: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not "
                         "vLLM's (SpeculativeConfig, 0.33.0)")
    given = [k for k in _NOT_MODELLED if raw.get(k) not in (None, False)]
    if given:
        raise InputError(f"--speculative-config: {', '.join(given)} changes the drafter's memory in a way kvplan does "
                         "not count yet; plan without it")
    k = raw.get("num_speculative_tokens")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InputError(f"--speculative-config needs num_speculative_tokens, a whole number of 1 or more (got {k!r})")
    method = raw.get("method")
    if not isinstance(method, str) or not method:
        raise InputError("--speculative-config needs a method (mtp, eagle, eagle3, draft_model, ngram, suffix, ...): "
                         "kvplan does not guess it from the draft model's name as vLLM does")
    model = raw.get("model")
    return SpeculativeSettings(method=method, num_speculative_tokens=k, model=model if isinstance(model, str) else None)
