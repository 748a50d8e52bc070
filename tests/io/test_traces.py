"""Trace readers: rows streamed and stopped at the limit, absurd values refused with their line."""

from __future__ import annotations

import pytest

from kvplan.errors import ConfigError
from kvplan.io import traces as workload
from kvplan.io.traces import read_trace

HEADER = "arrival,prompt_tokens,output_tokens\n"


def test_limit_stops_reading(tmp_path, monkeypatch):
    path = tmp_path / "t.csv"
    # rows past the limit are garbage: a reader that parsed the whole file would fail on them
    path.write_text(HEADER + "0,10,5\n1,20,6\n" + "\xff-not-a-row\n" * 1000)
    read = []
    real = workload.iter_lines

    def counting(p, **kw):
        for item in real(p, **kw):
            read.append(item[0])
            yield item

    monkeypatch.setattr(workload, "iter_lines", counting)
    assert read_trace(path, limit=2) == [(0.0, 10, 5), (1.0, 20, 6)]
    assert max(read) <= 4  # the header, two rows and at most one look-ahead line


def test_ten_million_row_trace_with_limit(tmp_path):
    # 10M rows written sparsely is too slow for a test; a file past the stream size cap shows the
    # reader never reads it whole: 1000 rows come back at once.
    path = tmp_path / "big.csv"
    with path.open("w") as fh:
        fh.write(HEADER)
        fh.write("0.5,100,10\n" * 2000)
        fh.seek(3 * (1 << 30))  # a 3 GiB sparse tail of NULs
        fh.write("\n")
    rows = read_trace(path, limit=1000)
    assert len(rows) == 1000


@pytest.mark.parametrize("row, what", [
    ("nan,10,5", "cannot read arrival 'nan'"),
    ("inf,10,5", "cannot read arrival 'inf'"),
    ("1e300,10,5", "cannot read arrival '1e300'"),
    ("0,nan,5", "cannot read token counts"),
    ("0,1e9,5", "cannot read token counts"),
    ("0,99999999999999999999,5", "cannot read token counts"),
    ("0,10,-1", "token counts must be in 0..2147483647"),
    ("0,3000000000,5", "token counts must be in 0..2147483647"),
    ("2023-11-16 18:17:03.x,10,5", "cannot read arrival"),
])
def test_bad_values_name_the_line(tmp_path, row, what):
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "0,1,1\n" + row + "\n")
    with pytest.raises(ConfigError, match="line 3: " + what.replace("(", r"\(").replace(".", r"\.")):
        read_trace(path)


@pytest.mark.parametrize("line, what", [
    ("[1, 2, 3]", "expected a JSON object per line"),
    ("{\"arrival\": NaN, \"prompt_tokens\": 1, \"output_tokens\": 1}", "cannot read arrival"),
    ("[" * 50_000 + "]" * 50_000, "nested too deeply"),
    ("{\"arrival\": 0, \"prompt_tokens\": 1.5, \"output_tokens\": 1}", "cannot read token counts"),
])
def test_bad_jsonl_rows(tmp_path, line, what):
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival": 0, "prompt_tokens": 1, "output_tokens": 1}\n' + line + "\n")
    with pytest.raises(ConfigError, match="line 2: " + what):
        read_trace(path)


def test_azure_timestamps_still_read(tmp_path):
    path = tmp_path / "az.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n"
                    "2023-11-16 18:17:04.0319600,3180,8\n")
    (t0, p0, o0), (t1, p1, o1) = read_trace(path)
    assert t0 == 0.0 and abs(t1 - 0.052) < 1e-6 and (p0, o1) == (4808, 8)
