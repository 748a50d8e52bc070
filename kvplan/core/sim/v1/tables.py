"""Requests and their records as columns, for runs of a million requests: a tuple of V1Request takes about 350
bytes a request and one of RequestRecord about 200, where these columns take about 50 and 88
(benchmarks/bench_default_path.py measures the whole run's peak).

- ``RequestTable``: the requests a workload generates (kvplan.app.requests), a Sequence of V1Request whose id is
  the row number, with every request's arrival time;
- ``Columns``: what the simulator reads of all requests before the run (lengths, arrivals), from a table or any
  sequence of V1Request;
- ``RequestRecords``: what the simulator records of each request as it finishes (kvplan.core.sim.v1.result), a
  Sequence of RequestRecord in request order.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Generic, TypeVar, overload

from kvplan.core.sim.v1.inputs import Segment, V1Request
from kvplan.core.sim.v1.result import RequestRecord


T = TypeVar("T")


class _Rows(Sequence[T], Generic[T]):
    """Rows read back one value each (``_row``): indices and slices as a tuple takes them, and equality with any
    sequence of the same values (``_same``: with one of its own kind, compared column by column)."""

    __slots__ = ()

    def _row(self, i: int) -> T:
        raise NotImplementedError

    def _same(self, other: _Rows) -> bool:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> list[T]: ...
    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        if isinstance(i, slice):
            return [self._row(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        return self._row(i)

    def __iter__(self) -> Iterator[T]:
        return (self._row(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if type(other) is type(self):
            return self._same(other)  # type: ignore[arg-type]
        if isinstance(other, Sequence):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class RequestTable(_Rows[V1Request]):
    """Requests appended in order (``append``), read back as V1Request values."""

    __slots__ = ("_arrival", "_len", "_out_len", "_out_seg", "_seg", "_start")

    def __init__(self) -> None:
        self._start = array("q", [0])  # row i's prompt segments: _seg/_len[_start[i]:_start[i + 1]]
        self._seg, self._len = array("q"), array("q")
        self._out_seg, self._out_len = array("q"), array("q")
        self._arrival = array("q")  # picoseconds

    def append(self, prompt: Sequence[Segment], output: Segment, arrival_ps: int) -> int:
        """Add a request; its row number (and id)."""
        for seg, n in prompt:
            self._seg.append(seg)
            self._len.append(n)
        self._start.append(len(self._seg))
        self._out_seg.append(output[0])
        self._out_len.append(output[1])
        self._arrival.append(arrival_ps)
        return len(self._arrival) - 1

    def extend_own(self, first_seg: int, prompts: Sequence[int], outputs: Sequence[int],
                   arrival_ps: Sequence[int]) -> None:
        """``append`` for each request whose prompt is one segment of its own, in one pass per column: request i's
        prompt is segment first_seg + 2i, its output first_seg + 2i + 1 (the ids ``append`` row by row gives)."""
        n, rows = len(prompts), len(self._seg)
        self._seg.extend(range(first_seg, first_seg + 2 * n, 2))
        self._len.extend(prompts)
        self._start.extend(range(rows + 1, rows + n + 1))
        self._out_seg.extend(range(first_seg + 1, first_seg + 2 * n, 2))
        self._out_len.extend(outputs)
        self._arrival.extend(arrival_ps)

    def __len__(self) -> int:
        return len(self._arrival)

    def _row(self, i: int) -> V1Request:
        a, b = self._start[i], self._start[i + 1]
        prompt = tuple(zip(self._seg[a:b], self._len[a:b]))
        return V1Request(id=str(i), prompt=prompt, output=(self._out_seg[i], self._out_len[i]),
                         arrival_ps=self._arrival[i])

    def _same(self, other: RequestTable) -> bool:  # type: ignore[override]
        return all(getattr(self, f) == getattr(other, f) for f in self.__slots__)

    def columns(self) -> Columns:
        starts = self._start
        lens = self._len
        prompt = array("q", (sum(lens[starts[i]:starts[i + 1]]) for i in range(len(self))))
        n = len(self)
        if all(a < b for a, b in zip(starts, islice(starts, 1, None))) and 0 not in map(lens.__getitem__,
                                                                                        islice(starts, n)):
            firsts = array("q", map(self._seg.__getitem__, islice(starts, n)))
        else:  # a prompt led by an empty segment, or without any (refused by the simulator: checked_columns)
            firsts = array("q", (_first(self._row(i)) for i in range(n)))
        return Columns(prompt=prompt, output=self._out_len, arrival_ps=self._arrival, arrival_step=None,
                       first=firsts)


def _first(r: V1Request) -> int:
    """The id of the first segment with tokens (BlockHasher skips empty ones): the output's for an empty prompt."""
    return next((seg for seg, n in r.prompt if n > 0), r.output[0])


class Columns:
    """Every request's prompt and output lengths, arrival (picoseconds, or steps where none has a time), and the
    id of the segment its tokens start with (``first``: kvplan.core.sim.v1.hashing.shared_firsts)."""

    __slots__ = ("arrival_ps", "arrival_step", "first", "output", "prompt")

    def __init__(self, *, prompt: Sequence[int], output: Sequence[int], arrival_ps: Sequence[int] | None,
                 arrival_step: Sequence[int] | None, first: Sequence[int]) -> None:
        self.prompt, self.output, self.arrival_ps, self.arrival_step = prompt, output, arrival_ps, arrival_step
        self.first = first

    @staticmethod
    def of(requests: Sequence[V1Request]) -> Columns:
        """From a table's own columns, or by reading each request; ``arrival_ps`` None unless every request has a
        time (a mix is refused by the simulator)."""
        if isinstance(requests, RequestTable):
            return requests.columns()
        times = [r.arrival_ps for r in requests]
        timed = bool(times) and all(t is not None for t in times)
        return Columns(prompt=[r.prompt_len for r in requests], output=[r.output[1] for r in requests],
                       arrival_ps=times if timed else None, arrival_step=[r.arrival_step for r in requests],
                       first=[_first(r) for r in requests])

    def mixed_times(self, requests: Sequence[V1Request]) -> bool:
        """Whether some requests have an arrival time and others not."""
        if self.arrival_ps is not None or isinstance(requests, RequestTable):
            return False
        return any(r.arrival_ps is not None for r in requests)

    def arrival_order(self) -> Sequence[int]:
        """Row numbers by arrival, ties in row order (the table's rows are appended in arrival order when
        generated: then no sort and no copy)."""
        key = self.arrival_ps if self.arrival_ps is not None else self.arrival_step
        assert key is not None
        n = len(key)
        if all(key[i] <= key[i + 1] for i in range(n - 1)):
            return range(n)
        return array("q", sorted(range(n), key=key.__getitem__))  # sorted() is stable: ties in row order


class Pending:
    """The requests in arrival order (``order``: row numbers), each made a state (``make``) when first read; the
    loop reads them in order, the next arrival more than once."""

    __slots__ = ("_i", "_make", "_order", "_state")

    def __init__(self, order: Sequence[int], make) -> None:  # type: ignore[no-untyped-def]
        self._order, self._make = order, make
        self._i, self._state = -1, None

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        if i != self._i:
            self._i, self._state = i, self._make(self._order[i])
        return self._state


FIELDS = ("arrival_step", "first_scheduled_step", "first_token_step", "finish_step", "num_preemptions",
          "cached_tokens", "cpu_tokens", "arrival_ps", "first_scheduled_ps", "first_token_ps", "finish_ps")


class RequestRecords(_Rows[RequestRecord]):
    """Each request's record (RequestRecord) as it finished, in request order; ``write`` takes a finished
    ReqState (kvplan.core.sim.v1.state), ``column`` one figure of every request."""

    __slots__ = ("_cols", "_ids", "_timed", "log", "written")

    def __init__(self, requests: Sequence[V1Request], timed: bool) -> None:
        n = len(requests)
        self._ids = None if isinstance(requests, RequestTable) else [r.id for r in requests]  # a table's: row numbers
        self._timed = timed
        self._cols = {f: array("q", bytes(8 * n)) for f in FIELDS}
        self.written = 0
        self.log: list[int] | None = None  # the rows in the order they finished, where asked (a data-parallel rank)

    def write(self, r) -> None:  # type: ignore[no-untyped-def]
        i, c = r.index, self._cols  # (FIELDS, one statement each: once a request)
        c["arrival_step"][i], c["first_scheduled_step"][i] = r.arrival_step, r.first_scheduled_step
        c["first_token_step"][i], c["finish_step"][i] = r.first_token_step, r.finish_step
        c["num_preemptions"][i], c["cached_tokens"][i], c["cpu_tokens"][i] = r.num_preemptions, r.cached_tokens, \
            r.cpu_tokens
        c["arrival_ps"][i], c["first_scheduled_ps"][i] = r.arrival_ps, r.first_scheduled_ps
        c["first_token_ps"][i], c["finish_ps"][i] = r.first_token_ps, r.finish_ps
        self.written += 1
        if self.log is not None:
            self.log.append(i)

    def column(self, name: str) -> array:
        return self._cols[name]

    def place(self, other: RequestRecords, rows: Sequence[int]) -> None:
        """Write ``other``'s records (a run over some of these requests: kvplan.core.sim.v1.dp) at ``rows``."""
        for f, col in self._cols.items():
            for i, v in zip(rows, other.column(f)):
                col[i] = v
        self.written += len(rows)

    @property
    def timed(self) -> bool:
        """Whether the records have seconds (a step-time model ran)."""
        return self._timed

    def __len__(self) -> int:
        return len(self._cols["finish_step"])

    def _row(self, i: int) -> RequestRecord:
        c = self._cols
        arrival, timed = c["arrival_ps"][i], self._timed
        return RequestRecord(
            id=self._ids[i] if self._ids is not None else str(i), arrival_step=c["arrival_step"][i],
            first_scheduled_step=c["first_scheduled_step"][i], first_token_step=c["first_token_step"][i],
            finish_step=c["finish_step"][i], num_preemptions=c["num_preemptions"][i],
            num_cached_tokens=c["cached_tokens"][i], num_cpu_tokens=c["cpu_tokens"][i],
            queue_s=(c["first_scheduled_ps"][i] - arrival) / 1e12 if timed else None,
            ttft_s=(c["first_token_ps"][i] - arrival) / 1e12 if timed else None,
            e2e_s=(c["finish_ps"][i] - arrival) / 1e12 if timed else None)

    def _same(self, other: RequestRecords) -> bool:  # type: ignore[override]
        return self._timed == other._timed and self._cols == other._cols and list(self._id_list()) == list(
            other._id_list())

    def _id_list(self) -> Sequence[str]:
        return self._ids if self._ids is not None else [str(i) for i in range(len(self))]

    def __repr__(self) -> str:
        return f"RequestRecords({len(self)} requests)"
