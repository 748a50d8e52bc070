"""Options shared by the commands, declared once.

An option that reads the same on every command is an ``Annotated`` alias named ``...Option`` here
(``as_json: JsonOption = False``); a command's own options are ``...Opt`` aliases in its module. An option whose
flags are shared but whose default, and so its help, differs by command (``--engine`` is ``ideal`` for ``size``,
``vllm`` for ``fit``, the log's release for ``explain``) is made by a function that takes the help
(``EngineOpt = Annotated[str, engine_option(HELP)]``): its flag names are still written here only.

Every length in tokens (``--seq-len``, ``--max-model-len``, ``--max-num-batched-tokens``, ``--prompt-len``) is
read by ``kvplan.io.units.parse_length``, so ``8k`` and ``32K`` (x1024) work wherever a length does, and a
fraction or a negative is one line naming the flag; a memory size (``24GiB``) by ``parse_size``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer

from kvplan.io.units import parse_length, parse_size

LENGTH_HINT = "8192 or 8k (x1024)"


def tokens(flag: str, *, auto: bool = False) -> Callable[[Any], int]:
    """The ``parser=`` of a length option named ``flag``; ``auto`` lets -1 through (the longest that fits)."""

    def parse(value: Any) -> int:
        return parse_length(value, what=flag, auto=auto)  # an InputError: one line on stderr, exit 2

    return parse


def byte_size(flag: str) -> Callable[[Any], int]:
    """The ``parser=`` of a memory option named ``flag``: ``24GiB``, ``14.99GiB``, ``40000000000`` -> bytes."""

    def parse(value: Any) -> int:
        return parse_size(value, what=flag)

    return parse


FETCH_HELP = ("Download a hub id's config.json (that file only) from the Hugging Face Hub into its cache when "
              "kvplan does not bundle the model (HF_ENDPOINT, HF_HOME, HF_TOKEN apply); default: off, on with "
              "KVPLAN_FETCH=1; without it a hub id is read from the local cache only.")
REVISION_HELP = ("Branch, tag or commit of a hub id's config.json (default: main); reads the Hub's config, cached "
                 "or fetched, even for a model kvplan bundles.")
DTYPE_HELP = ("KV cache dtype: auto (default: the model's torch_dtype), fp32, bf16, fp16, fp8 (= fp8_e4m3), "
              "fp8_e5m2, fp8_per_token_head, int8_per_token_head, fp8_ds_mla (vLLM), int8, int4, nvfp4; an engine "
              "refuses formats it has no option for.")
BLOCK_HELP = ("Tokens per KV block (default: the engine's: vllm 16, 64 for MLA models; trtllm 32; sglang 1). "
              "Paged engines only.")

# --- the same on every command that takes them
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables; default: "
                                                          "tables.")]
FetchOption = Annotated[Optional[bool], typer.Option("--fetch/--no-fetch", help=FETCH_HELP)]
RevisionOption = Annotated[Optional[str], typer.Option("--revision", help=REVISION_HELP)]
ModelArg = Annotated[str, typer.Argument(help="Bundled name (`kvplan models`), hub id, or path to a config.json "
                                              "(or its folder).")]
KvCacheDtypeOption = Annotated[str, typer.Option("--kv-cache-dtype", help=DTYPE_HELP)]
BlockSizeOption = Annotated[Optional[int], typer.Option("--block-size", help=BLOCK_HELP)]
TensorParallelOption = Annotated[int, typer.Option("--tensor-parallel-size", "-tp", help=(
    "Tensor parallel size: GPUs that split each layer, KV heads over them (default 1)."))]
PipelineParallelOption = Annotated[int, typer.Option("--pipeline-parallel-size", "-pp", help=(
    "Pipeline parallel size: stages that split the layers (default 1)."))]
BatchOption = Annotated[int, typer.Option("--batch", "-b", help="Sequences held at once (default 1).")]
DataParallelOption = Annotated[int, typer.Option("--data-parallel-size", "-dp", help=(
    "Engines of tp x pp GPUs side by side, each with its own KV pool and scheduler, the requests shared between "
    "them (fit, vLLM: the routed experts spread over dp x tp GPUs; SGLang --dp-size: replicas, or with "
    "--enable-dp-attention attention groups inside the tp GPUs) (default 1)."))]
DecodeContextParallelOption = Annotated[int, typer.Option("--decode-context-parallel-size", "-dcp", help=(
    "vLLM: each sequence's KV sharded over this many of the tp ranks (token i on rank i % dcp), from 0.10.2; MLA, "
    "and GQA from 0.11.1 (default 1)."))]


# --- the same flags, a default (so a help) of each command's own
def engine_option(help: str) -> Any:
    return typer.Option("--engine", "-e", help=help)


def gpu_option(help: str) -> Any:
    return typer.Option("--gpu", "-g", help=help)


def gpu_memory_option(help: str) -> Any:
    return typer.Option("--gpu-memory", help=help)


def max_model_len_option(help: str, *, auto: bool = False) -> Any:
    return typer.Option("--max-model-len", parser=tokens("--max-model-len", auto=auto), help=help)


def max_num_batched_tokens_option(help: str) -> Any:
    return typer.Option("--max-num-batched-tokens", parser=tokens("--max-num-batched-tokens"), help=help)


def max_num_seqs_option(help: str) -> Any:
    return typer.Option("--max-num-seqs", help=help)
