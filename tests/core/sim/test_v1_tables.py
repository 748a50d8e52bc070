"""Requests and records as columns (kvplan/core/sim/v1/tables.py): the same values as the tuples they replace, and
the same simulation."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.core.engines.vllm.scheduler_rules import newest
from kvplan.core.sim.model import StepModel
from kvplan.core.sim.v1 import FULL, CacheGroup, CacheLayout, SchedulerConfig, V1Inputs, V1Request, simulate_v1
from kvplan.core.sim.v1.tables import Columns, RequestRecords, RequestTable

STEP = StepModel(base_ps=5_000_000, per_token_ps=20_000, per_prefill_token_ps=90_000)

rows = st.lists(st.tuples(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 40)), min_size=1, max_size=3),
                          st.integers(1, 50), st.integers(0, 10**9)), min_size=1, max_size=30)


def table_and_tuple(data: list) -> tuple[RequestTable, tuple[V1Request, ...]]:
    table = RequestTable()
    plain = []
    for i, (prompt, out, at) in enumerate(data):
        assert table.append(prompt, (100 + i, out), at) == i
        plain.append(V1Request(id=str(i), prompt=tuple(prompt), output=(100 + i, out), arrival_ps=at))
    return table, tuple(plain)


@given(rows)
def test_a_table_reads_back_the_requests_appended(data):
    table, plain = table_and_tuple(data)
    assert len(table) == len(plain) and list(table) == list(plain) and table == plain
    assert table[-1] == plain[-1] and table[1:3] == list(plain[1:3])
    cols = Columns.of(table)
    assert list(cols.prompt) == [r.prompt_len for r in plain] and list(cols.output) == [r.output[1] for r in plain]
    assert list(cols.arrival_ps) == [r.arrival_ps for r in plain]
    order = list(cols.arrival_order())
    assert order == sorted(range(len(plain)), key=lambda i: (plain[i].arrival_ps, i))
    assert order == list(Columns.of(plain).arrival_order())


@settings(max_examples=40, deadline=None)
@given(rows, st.booleans(), st.booleans())
def test_a_table_simulates_as_the_tuple_and_records_as_the_requests_finish(data, caching, async_):
    table, plain = table_and_tuple([(p, o, at // 1000) for p, o, at in data])
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256,
                            enable_prefix_caching=caching, async_scheduling=async_, rules=newest())
    layout = CacheLayout(num_blocks=40, groups=(CacheGroup(kind=FULL, block_size=16),))
    a = simulate_v1(V1Inputs(requests=table, scheduler=sched, layout=layout, step_model=STEP), check_invariants=True)
    b = simulate_v1(V1Inputs(requests=plain, scheduler=sched, layout=layout, step_model=STEP))
    assert a == b
    assert isinstance(a.per_request, RequestRecords) and len(a.per_request) == len(plain)
    for i, rec in enumerate(a.per_request):
        assert rec.id == str(i) and rec.arrival_step <= rec.first_scheduled_step <= rec.first_token_step
        assert rec.first_token_step <= rec.finish_step and rec.queue_s is not None and rec.queue_s >= 0
    assert a.per_request == tuple(a.per_request)  # the columns equal the records they give
    assert a.per_request != tuple(dataclasses.replace(r, num_preemptions=r.num_preemptions + 1)
                                  for r in a.per_request)


def test_records_refuse_a_row_past_either_end():
    import pytest

    table, plain = table_and_tuple([([(1, 5)], 3, 0), ([(2, 4)], 2, 10)])
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256, rules=newest())
    layout = CacheLayout(num_blocks=40, groups=(CacheGroup(kind=FULL, block_size=16),))
    recs = simulate_v1(V1Inputs(requests=table, scheduler=sched, layout=layout, step_model=STEP)).per_request
    assert recs[-2] == recs[0] and recs[0:2] == [recs[0], recs[1]]
    for i in (2, -3):
        with pytest.raises(IndexError):
            recs[i]
        with pytest.raises(IndexError):
            table[i]


@given(st.lists(st.tuples(st.integers(1, 4000), st.integers(1, 4000), st.integers(0, 10**15)), max_size=30),
       st.integers(1, 10**6))
def test_rows_of_their_own_extend_a_table_as_appended_rows(data, first):
    # kvplan.app.requests.V1Requests.plain: prompt i is segment first + 2i, its output first + 2i + 1
    one, bulk = RequestTable(), RequestTable()
    for i, (p, o, at) in enumerate(data):
        one.append([(first + 2 * i, p)], (first + 2 * i + 1, o), at)
    bulk.extend_own(first, [p for p, _, _ in data], [o for _, o, _ in data], [at for _, _, at in data])
    assert bulk == one and list(bulk) == list(one)
    assert list(Columns.of(bulk).first) == [first + 2 * i for i in range(len(data))]


def test_a_prompt_led_by_an_empty_segment_starts_with_its_next_one():
    table = RequestTable()
    table.append([(7, 0), (8, 5)], (9, 3), 0)
    table.append([(7, 4)], (10, 3), 1)
    assert list(Columns.of(table).first) == [8, 7] == [Columns.of(list(table)).first[i] for i in range(2)]


def test_a_record_writes_every_field():
    from types import SimpleNamespace

    from kvplan.core.sim.v1.tables import FIELDS

    records = RequestRecords([V1Request(id="a", prompt=((1, 2),), output=(3, 4))] * 2, timed=True)
    state = SimpleNamespace(index=1, **{f: 10 + k for k, f in enumerate(FIELDS)})
    records.write(state)
    assert [records.column(f)[1] for f in FIELDS] == [10 + k for k in range(len(FIELDS))]
    assert [records.column(f)[0] for f in FIELDS] == [0] * len(FIELDS) and records.written == 1


def test_a_row_without_prompt_segments_is_refused_not_a_crash():
    # (a review's counterexample) the table's columns read each row's first segment before the rows are checked
    from kvplan.errors import InputError

    table = RequestTable()
    table.append([(1, 5)], (2, 3), 0)
    table.append([], (4, 3), 1)
    assert list(Columns.of(table).first) == [1, 4]
    sched = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256, rules=newest())
    layout = CacheLayout(num_blocks=40, groups=(CacheGroup(kind=FULL, block_size=16),))
    with pytest.raises(InputError, match="at least one prompt token"):
        simulate_v1(V1Inputs(requests=table, scheduler=sched, layout=layout, step_model=STEP))
