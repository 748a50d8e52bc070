"""Output for people and for machines.

People: byte figures in binary units, labelled; tables that never lose a digit. A table prints as
it is when its narrowest layout fits the console (80 columns in a CI log or a pipe), then without
borders, then as one record per row (``label`` then ``column: value`` pairs), so a cell is never cut
with an ellipsis and a number never wraps over two lines (numeric columns are ``no_wrap``).

Machines: JSON is strict (``NaN`` and infinities are a bug, not output) and keeps integer bytes.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
RECORD_INDENT = "  "
# Spaces before a line's end, also when colour codes (SGR) follow them: Rich pads table cells and titles
# to the table's width and leaves the space where it wraps a line. Only spaces before a newline go: a
# print with end="" keeps its own.
_TRAILING_SPACES = re.compile(r" +((?:\x1b\[[0-9;]*m)*)(?=\r?\n)")


def format_bytes(num_bytes: int | float) -> str:
    """``2147483648`` -> ``2.00 GiB``; below 1 KiB plain bytes."""
    value = float(num_bytes)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value):,} B" if unit == "B" else f"{value:,.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def bytes_cell(num_bytes: int) -> str:
    """Exact bytes and the binary-unit figure: ``524,288 B (512.00 KiB)``."""
    if num_bytes < 1024:
        return f"{num_bytes:,} B"
    return f"{num_bytes:,} B ({format_bytes(num_bytes)})"


def format_indices(indices: tuple[int, ...] | list[int]) -> str:
    """[0,1,2,3,5,7] -> '0-3,5,7'; an arithmetic stride over more than 3 items -> '1,3,...,31'."""
    idx = list(indices)
    if len(idx) > 3:
        step = idx[1] - idx[0]
        if step > 1 and all(b - a == step for a, b in zip(idx, idx[1:])):
            return f"{idx[0]},{idx[1]},...,{idx[-1]}"
    parts: list[str] = []
    start = idx[0]
    for i, a in enumerate(idx):
        if i + 1 == len(idx) or idx[i + 1] != a + 1:  # a run ends at a
            parts.append(f"{start}" if start == a else f"{start}-{a}")
            start = idx[i + 1] if i + 1 < len(idx) else a
    text = ",".join(parts)
    return text if len(text) <= 20 else f"{idx[0]}..{idx[-1]}, mixed"


def layers_cell(indices: tuple[int, ...] | list[int]) -> str:
    """A layer group's first cell: ``32 x [0-31]``."""
    return f"{len(indices)} x [{format_indices(indices)}]"


def flag_value(value: int | float) -> str:
    """A number as it would be typed back as a flag: ``72944``, never ``72,944``."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def print_json(obj: Any) -> None:
    """One JSON document on stdout. Non-finite floats raise ValueError: strict JSON has none."""
    sys.stdout.write(json.dumps(obj, indent=2, allow_nan=False) + "\n")


def strip_trailing_spaces(text: str) -> str:
    """Every line of ``text`` without the spaces before its end (colour codes after them kept)."""
    while True:
        stripped = _TRAILING_SPACES.sub(r"\1", text)
        if stripped == text:
            return text
        text = stripped  # spaces between two colour codes: the next pass takes them


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """Rich exits 1 here, the "does not fit" code; a closed pipe is not a verdict (141, as SIGPIPE)."""
        self.quiet = True
        raise BrokenPipeError

    def _render_buffer(self, buffer: Any) -> str:
        """What Rich writes, without trailing spaces: a CI log or a file diffs clean. Rich has no option for
        it; this is the one place every print passes (tests/cli/test_output_width.py fails if it stops)."""
        return strip_trailing_spaces(super()._render_buffer(buffer))


def make_console(*, stderr: bool = False, **options: Any) -> Console:
    """A console without automatic highlighting (it split names like paged-16 into colours); ``options`` go to
    Rich's Console (a test's file, force_terminal, width)."""
    return _Console(stderr=stderr, highlight=False, emoji=False, **options)  # emoji=True loads a 19 ms table


def new_table(*columns: str, numeric: tuple[str, ...] | str = (), title: str | None = None,
              show_header: bool = True, no_wrap: tuple[str, ...] = ()) -> Table:
    """A table whose ``numeric`` columns are right-aligned and never wrap (``numeric="*"``: all but the
    first). ``no_wrap`` keeps other columns (names) on one line too."""
    table = Table(title=title, title_justify="left", show_header=show_header)
    for i, name in enumerate(columns):
        is_num = (numeric == "*" and i > 0) or name in numeric
        # text that cannot wrap at a space folds onto the next line: nothing is cut with an ellipsis
        table.add_column(name, justify="right" if is_num else "left", no_wrap=is_num or name in no_wrap,
                         overflow="fold")
    return table


def summary_table() -> Table:
    """Label / value pairs without borders: bold labels on the left, values right-aligned, unwrapped."""
    table = Table(show_header=False, box=None)
    table.add_column(style="bold", overflow="fold")
    table.add_column(justify="right", no_wrap=True)
    return table


def _plain(cell: Any) -> str:
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        return Text.from_markup(cell, emoji=False).plain
    return str(cell)


def _min_width(table: Table) -> int:
    """The narrowest this table renders without cutting a cell: a ``no_wrap`` column is as wide as its
    widest cell, another as its longest word (Rich's own measure treats every column as wrappable)."""
    from rich.cells import cell_len

    total = 0
    for column in table.columns:
        texts = [_plain(column.header), *(_plain(cell) for cell in column.cells)]
        if column.no_wrap:
            need = max((cell_len(line) for t in texts for line in t.splitlines() or [""]), default=0)
        else:
            need = max((cell_len(word) for t in texts for word in t.split()), default=0)
        total += need
    _, right, _, left = table.padding
    total += (left + right) * len(table.columns)
    if table.box is not None:
        total += len(table.columns) + (1 if table.show_edge else -1)
    return total


def _fits(console: Console, table: Table) -> bool:
    return _min_width(table) <= console.width


def print_table(console: Console, table: Table) -> None:
    """Print ``table`` in the first layout that fits the console without cutting a cell."""
    if _fits(console, table):
        console.print(table)
        return
    compact = copy.copy(table)
    compact.box = box.SIMPLE_HEAD
    compact.padding = (0, 1)
    compact.show_edge = False
    if _fits(console, compact):
        console.print(compact)
        return
    print_records(console, table)


def print_records(console: Console, table: Table) -> None:
    """One block per row: the first cell, then ``header: value`` pairs packed into lines that fit."""
    if table.title:
        console.print(table.title)
    columns = table.columns
    headers = [_plain(c.header) for c in columns]
    cells = [[_plain(cell) for cell in c.cells] for c in columns]
    width = max(console.width, 40)
    for row in range(len(table.rows)):
        label = cells[0][row].replace("\n", " ")
        console.print(Text(label, style="bold"))  # long text wraps at spaces: no number is split
        line = RECORD_INDENT
        for header, column in zip(headers[1:], cells[1:]):
            value = column[row].replace("\n", " ").strip()
            if not value:
                continue
            pair = f"{header}: {value}" if header else value
            sep = "" if line == RECORD_INDENT else "; "
            if line != RECORD_INDENT and len(line) + len(sep) + len(pair) > width:
                console.print(Text(line))
                line, sep = RECORD_INDENT, ""
            line += sep + pair
        if line != RECORD_INDENT:
            console.print(Text(line))
