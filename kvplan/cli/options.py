"""Option parsers shared by the commands: every length in tokens (``--seq-len``, ``--max-model-len``,
``--max-num-batched-tokens``, ``--prompt-len``) is read by ``kvplan.io.units.parse_length``, so ``8k``
and ``32K`` (x1024) work wherever a length does, and a fraction or a negative is one line naming the flag."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from kvplan.io.units import parse_length

LENGTH_HINT = "8192 or 8k (x1024)"


def tokens(flag: str, *, auto: bool = False) -> Callable[[Any], int]:
    """The ``parser=`` of a length option named ``flag``; ``auto`` lets -1 through (the longest that fits)."""

    def parse(value: Any) -> int:
        return parse_length(value, what=flag, auto=auto)  # an InputError: one line on stderr, exit 2

    return parse


# -- Annotated option aliases shared by the commands (fastapi-cli style: one declaration, reused) --------------
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables; default: "
                                                          "tables.")]
