"""What a v1 run is set up with: its requests checked as vLLM takes them, and its KV cache manager (vLLM's paged
pool or a contiguous allocator); the errors and books checks the step loop calls (kvplan.core.sim.v1.scheduler)."""

from __future__ import annotations

from collections import deque

from kvplan.core.sim.v1.contiguous import ContiguousManager
from kvplan.core.sim.v1.inputs import V1Inputs
from kvplan.core.sim.v1.manager import KVCacheManager
from kvplan.core.sim.v1.state import ReqState
from kvplan.core.sim.v1.tables import Columns
from kvplan.errors import InputError


def checked_columns(inputs: V1Inputs) -> Columns:
    """The requests' columns, each request checked as vLLM would take it."""
    requests = inputs.requests
    cols = Columns.of(requests)
    if cols.mixed_times(requests):
        raise InputError("give every request an arrival time, or none (arrival steps)")
    if cols.arrival_ps is not None and inputs.step_model is None:
        raise InputError("requests that arrive in time need a step-time model")
    mml = inputs.scheduler.max_model_len
    for i, (p, o) in enumerate(zip(cols.prompt, cols.output)):
        if p < 1 or o < 1:
            raise InputError(f"request {requests[i].id}: needs at least one prompt token and one output token")
        if p >= mml:
            raise InputError(f"request {requests[i].id}: prompt of {p} tokens reaches max_model_len {mml}; vLLM "
                             "rejects it")
    return cols


def manager_for(inputs: V1Inputs) -> KVCacheManager | ContiguousManager:
    """vLLM's paged pool (V1Inputs.allocator None or paged) or a contiguous allocator over the same memory."""
    alloc, layout = inputs.allocator, inputs.layout
    if alloc is None or alloc.paged:
        sizes = {g.block_size for g in layout.groups}
        if alloc is not None and sizes != {alloc.block_size}:
            raise InputError(f"{alloc.name}: the pool's KV cache groups have blocks of {sorted(sizes)} tokens; the "
                             "paged pool simulated is vLLM's own (plan it with that block size, or leave the "
                             "allocator out)")
        return KVCacheManager(layout, inputs.scheduler)
    return ContiguousManager(layout, inputs.scheduler, alloc, offload=inputs.offload is not None)


def outgrows(r: ReqState, num_blocks: int, release: str) -> InputError:
    """A request alone outgrew the whole pool. Without the whole-sequence gate (before 0.19.0) vLLM re-admits it on
    its first chunk and preempts it again at the same point, forever: the loop stops instead, with this."""
    return InputError(f"request {r.req.id} ({r.num_tokens} tokens) outgrows the whole pool ({num_blocks - 1} blocks) "
                      f"even alone: vLLM {release}'s scheduler (no whole-sequence admission gate before 0.19.0) would "
                      "preempt and recompute it forever; give the pool more blocks or shorten the request")


def check_books(mgr: KVCacheManager | ContiguousManager, running: list[ReqState], waiting: deque[ReqState],
                computed: int, books: tuple[int, int, int, int, int] | None) -> None:
    """The pool's books (the manager's ``check``); no request is in two queues; the computed tokens the memory books
    keep are those of the requests holding memory; ``books``: a step's split of the pool (None: nothing scheduled)."""
    mgr.check(running, waiting)
    assert len({r.index for r in running}) == len(running)
    assert not ({r.index for r in running} & {r.index for r in waiting}), "a request is running and waiting"
    assert computed == sum(r.num_computed for r in running), "the computed tokens' books drifted"
    assert books is None or min(books) >= 0, f"a negative share: {books}"
