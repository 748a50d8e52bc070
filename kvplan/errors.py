"""kvplan's exceptions: one root, caught only by the CLI.

    KvplanError
    ├── ConfigError      a model, GPU or workload description is wrong or incomplete (exit 2)
    │   ├── HubError     a hub id's config.json could not be had from the Hugging Face Hub (exit 2)
    │   └── UnmodeledError  an architecture kvplan's readers do not model (exit 2; ``--engine hf`` measures it)
    └── InputError       a flag or value given by the user is out of range or unknown (exit 2)

Core code raises these; only ``kvplan.cli`` catches them and maps them to exit codes. "Does not fit"
and "over budget" are results, not errors: the commands return them and exit 1 themselves.
Messages say what to change, with numbers.
"""

from __future__ import annotations


class KvplanError(Exception):
    """Root of every error kvplan raises on purpose."""

    exit_code = 2


class ConfigError(KvplanError):
    """A model/GPU/workload description is malformed or missing something."""


class InputError(KvplanError):
    """A user-supplied value is invalid (unknown name, out of range)."""


class UnmodeledError(ConfigError):
    """A config whose model_type or layer kinds kvplan does not model: refused rather than sized wrong. It carries
    the config, so that ``--engine hf`` can measure transformers' own cache for it instead (kvplan.validate.meta)."""

    def __init__(self, message: str, *, config: dict | None = None, model_type: str = "", what: str = "") -> None:
        super().__init__(message)
        self.config = config or {}
        self.model_type = model_type
        self.what = what or message  # what is not modelled, without the file's name or the hint


class HubError(ConfigError):
    """A hub id's config.json could not be fetched (offline, unreachable, gated, missing) or found cached."""
