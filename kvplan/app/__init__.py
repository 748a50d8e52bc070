"""kvplan's use cases: one function per command (size, fit, explain, validate, simulate, check, ...), combining
the input edges (kvplan.io: models, GPUs, logs, workloads) with the pure core (kvplan.core: the arithmetic).

Each takes plain values (the parsed flags: a model reference, lengths in tokens, sizes in bytes) and returns a
frozen dataclass holding everything the command shows: the core results, the notes, the choices resolved on the
way. Nothing here prints, parses a command line or knows Typer or Rich; a command in ``kvplan.cli`` parses its
flags, calls one of these, and renders the result as text or JSON. Errors are ``KvplanError``s, left to the
command line to turn into an exit code.

Heavy or rarely needed parts (the profile registry, the capacity core, transformers on the meta device, torch)
are imported inside the functions that need them, so importing a module here stays cheap: ``kvplan size``
starts without torch, transformers, matplotlib or huggingface_hub.
"""
