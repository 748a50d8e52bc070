"""Which of kvplan's input files a document is, told by its top-level keys.

A file given to the wrong command (a workload to ``kvplan check``) would otherwise fail validation
with one "unknown key" per top-level key and a "Field required" for what is missing; an empty file
with pydantic's "Input should be a valid dictionary ... (got None)". ``expect_kind`` says instead
what the file is and which command reads it, or that it is empty and what it should hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvplan.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class FileKind:
    name: str  # "a workload file"
    command: str  # the command that reads it, with FILE where the path goes
    marks: frozenset[str]  # top-level keys that only this kind of file has (two of them tell it, or its only one)
    holds: str  # what such a file holds, for the message about an empty one


KINDS = {
    "budgets": FileKind(
        name="a budgets file", command="kvplan check FILE", marks=frozenset({"budgets"}),
        holds="`budgets:`, a list of budgets, each with a `name`, what it plans for (`model` and `gpu`, or a "
              "`workload`) and its `require:` limits (`kvplan examples example` prints one)"),
    "workload": FileKind(
        name="a workload file", command="kvplan simulate FILE",
        marks=frozenset({"serving", "requests", "sharing", "scheduler", "allocators", "placement", "step_time"}),
        holds="`serving:` (a model and GPU, or kv_pool_bytes) and `requests:` (a trace, or count, arrival, "
              "prompt_tokens and output_tokens) (`kvplan examples vllm-paper-sharegpt` prints one)"),
    "matrix": FileKind(
        name="a validation matrix", command="kvplan validate --matrix FILE", marks=frozenset({"cases"}),
        holds="`cases:`, a list of cases, each with a `model` (configs/validation/matrix-cpu.yaml is one)"),
    "bundled model": FileKind(
        name="a model file like those in configs/models/", command="kvplan size FILE",
        marks=frozenset({"config", "aliases", "source"}), holds="`name`, `source` and the model's `config`"),
    "config.json": FileKind(
        name="a model's config.json", command="kvplan size FILE",
        marks=frozenset({"model_type", "architectures", "num_hidden_layers", "hidden_size"}),
        holds="the model's hyperparameters"),
    "prices": FileKind(
        name="a prices file", command="kvplan plan MODEL --prices FILE", marks=frozenset({"prices"}),
        holds="`prices:`, GPU names (`kvplan gpus`) to a price an hour (configs/prices/example-2026-05.yaml)"),
    "check output": FileKind(
        name="the output of `kvplan check --json`", command="kvplan check BUDGETS --baseline FILE",
        marks=frozenset({"passed", "results"}), holds="`passed` and `results`"),
}


def expect_kind(path: Path, data: Any, kind: str) -> None:
    """Refuse ``data`` (the file ``path`` as loaded) when it is empty, not a mapping, or plainly another
    kind of kvplan file than ``kind``; otherwise leave it to the file's pydantic model."""
    want = KINDS[kind]
    if data is None or data == {}:
        raise ConfigError(f"{path}: the file is empty (or only comments); {want.name} holds {want.holds}")
    if not isinstance(data, dict):
        got = {list: "a list", str: "a single string"}.get(type(data), f"a single {type(data).__name__}")
        raise ConfigError(f"{path}: holds {got} at the top level, not keys; {want.name} holds {want.holds}")
    if want.marks & data.keys():
        return
    for other in KINDS.values():
        found = sorted(other.marks & data.keys(), key=str)
        if other is not want and found and len(found) >= min(2, len(other.marks)):
            command = other.command.replace("FILE", str(path))
            raise ConfigError(f"{path}: this is {other.name} (it has {', '.join(map(str, found))}), not "
                              f"{want.name}: use `{command}`")
