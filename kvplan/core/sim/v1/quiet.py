"""Quiet stretches of vLLM v1's loop: where one starts, and the steps each request's events fall on.

A stretch starts at a step where every running request decodes (its first token sampled; under async scheduling
one token in flight, none stale) and nothing waits, or nothing waiting could be admitted (max_num_seqs run, or
the head of the queue is short of blocks without prefix caching). From there each schedule() gives every running
request one token in running order and update_from_output() returns one to each, so a request's counts at any
step follow from the stretch's start, and it touches the pool only when a token needs a block or fills one
(every block_size steps), when it stops, or when it is admitted. stretch.py advances the stretch from event to
event through the manager's own calls in the loop's order, so the pool hands out the same blocks and files the
same hashes; arrivals are admitted inside it and requests stop inside it (where nothing could be admitted, it
ends before the first stop instead, as arrivals only queue).

Where: every KV cache group full attention with one block size (no window frees, no per-sequence state), or a
contiguous allocator (no admissions inside; a crossing ends the stretch); no CPU tier. Same results as the
step-by-step loop, to the block id: the tests run both (``simulate_v1(..., fast_path=False)``) over random
workloads, sync and async, with prefix caching.
"""

from __future__ import annotations

from heapq import heappush

from kvplan.core.sim.v1.contiguous import ContiguousManager
from kvplan.core.sim.v1.inputs import FULL
from kvplan.core.sim.v1.state import ReqState
from kvplan.core.sim.v1.stretch import MARGIN, MIN_STEPS, Stretch, advance



class Quiet:
    """One simulation's quiet-stretch stepper; ``usable`` is False where the pool does not allow it."""

    def __init__(self, sim, ps: tuple[list[int], ...] | None, timeline: list, points: int) -> None:
        mgr, cfg = sim.mgr, sim.cfg
        self.sim = sim  # a data-parallel rank's router horizon (sim.open, sim.horizon)
        self.mgr, self.pool, self.books = mgr, mgr.pool, mgr.books
        self.capacity = mgr.books.capacity
        self.async_ = cfg.async_scheduling
        self.mml = cfg.max_model_len
        self.caching = cfg.enable_prefix_caching
        self.hash_block = mgr.hash_block
        self.step_model = sim.inputs.step_model
        self.timed = sim.timed
        self.ps, self.timeline, self.points = ps, timeline, points
        if isinstance(mgr, ContiguousManager):
            self.usable, self.block, self.per_crossing = True, 0, 0
        else:
            sizes = set(mgr.sizes)
            self.usable = all(k == FULL for k in mgr.kinds) and len(sizes) == 1
            self.block = sizes.pop() if len(sizes) == 1 else 0
            self.per_crossing = len(mgr.kinds)  # a block in each group when a token needs a new one
        self.usable = self.usable and sim.fast and sim.cpu is None
        # a request may stop inside a stretch where its last step is the loop's plain one: sync scheduling, or async
        # that skips a request whose last token is in flight (0.11.0 computes one token more: the loop takes it)
        self.finishes = not self.async_ or cfg.rules.async_skip_last_in_flight
        self.last = 0 if self.async_ else 1  # a stopping request's last scheduled step: the one before (async)
        self.max_seqs, self.budget = cfg.max_num_seqs, cfg.max_num_batched_tokens
        self.lpt = cfg.long_prefill_token_threshold
        self.per_prefill = sim.inputs.step_model.per_prefill_token_ps if sim.inputs.step_model is not None else 0
        # stretches taken, the steps they advanced, the requests admitted and stopped inside (the tests check them)
        self.count = self.steps = self.admitted = self.stopped = 0
        self.check = sim._check if sim.check else None
        self.record = sim.records.write  # a finished request's record (kvplan.core.sim.v1.tables.RequestRecords)

    def _admits_none(self, running: list[ReqState], waiting) -> bool:
        """Whether no waiting request can be admitted at any step of a stretch starting here: max_num_seqs run,
        or (prefix caching off, or a private head: KVCacheManager.admission_short) the head of the queue is short of
        blocks now, and blocks only get fewer while nothing finishes. A request that arrives then queues behind the
        head: it cannot be admitted either."""
        n = len(running)
        if n >= self.max_seqs:
            return True
        if not waiting:
            return False
        head = waiting[0]
        if self.caching and not head.private:  # a hit may make room
            return False
        num = head.num_tokens  # a waiting request has computed nothing; others wait or run: the threshold applies
        if 0 < self.lpt < num:
            num = self.lpt
        return self.mgr.admission_short(head, min(num, self.budget - n), self.pool.num_free)

    def _bound(self, running: list[ReqState], batch, finishes: bool) -> int:
        """Steps before a running request stops (``finishes``: before the last one has stopped), or 0 where a
        request is not in a steady decode."""
        mml, async_ = self.mml, self.async_
        kmin, kmax = 1 << 62, 0
        lag = 0 if async_ else 1  # computed tokens behind the known ones: async counts the token in flight
        for r in reversed(running):  # the newest, at the end, are the likeliest still in prefill
            if r.num_tokens - r.num_computed != lag or r.first_token_step < 0:
                return 0
            left = min(r.max_tokens - r.generated, mml - r.num_tokens)  # its output at step left - 1 stops it
            if left < kmin:
                if left < MIN_STEPS + MARGIN * (not finishes):
                    return 0
                kmin = left
            if left > kmax:
                kmax = left
        if async_:  # the batch in flight: one token for each running request, in running order (and the
            # requests it finished, whose outputs update_from_output skips)
            if batch is None:
                return 0
            items = [it for it in batch[0] if it[0].finish_step < 0]
            if len(items) != len(running):
                return 0
            for (q, num, samples), r in zip(items, running):
                if q is not r or num != 1 or not samples or r.placeholders != 1 or r.stale or r.in_flight != 1:
                    return 0
        return kmax if finishes else kmin - MARGIN

    def plan(self, i: int, r: ReqState, c0: int, nt0: int, g0: int, start: int, kcap: int, finishes: bool,
             events: dict[int, list[int]], stops: dict[int, list[int]], heap: list[int], wheel: list[list[int]],
             phase: dict[int, int]) -> int:
        """File request i's steps with events from step ``start`` on, where at step j's start it has computed
        c0 + j tokens, knows nt0 + j and has generated g0 + j: the steps its token needs a block, every block_size
        steps from the first (``wheel``: i joins the list of the steps at that phase, ``phase`` notes which), a
        block filled apart from a crossing (``events``, in running order), and (``finishes``) the step whose output
        stops it (``stops``); each filing and stop pushed on ``heap``. Returns ``kcap``, or the step a contiguous
        region's end stops the stretch at."""
        B, hb = self.block, self.hash_block
        lim = kcap
        if finishes:
            k = min(r.max_tokens - g0, self.mml - nt0) - 1
            if k in stops:
                stops[k].append(i)
            else:
                stops[k] = [i]
            heappush(heap, k)
            lim = min(kcap, k + self.last)
        ja = r.cap_tokens - c0  # the step whose token is past the blocks held
        if not B:  # a contiguous region holds every token: a crossing ends the stretch there
            return max(ja, 0) if ja < lim else kcap
        if ja < lim:
            if not start <= ja < start + B:  # a table more than a block ahead (allocate_slots never leaves one)
                return min(kcap, start)
            wheel[ja % B].append(i)  # i is the newest: the list stays in running order
            phase[i] = ja % B
        if self.caching and not r.private:  # (a private request's: caught up where they are read, stretch.py)
            jc = max(start, (r.ncached[0] + 1) * hb - nt0)
            if jc < lim:  # a crossing files the blocks too (grow): a step that is both is filed once
                jf = ((nt0 + jc) // hb + 1) * hb - nt0
                if (jf - ja) % B == 0 and ja < lim:  # (B = hb) from ja on every filing is a crossing's
                    lim = ja
                for j in (jc, *range(jf, lim, hb)):
                    if j >= ja and (j - ja) % B == 0:
                        continue
                    if j in events:
                        events[j].append(i)
                    else:
                        events[j] = [i]
                        heappush(heap, j)
        return kcap

    def run(self, running: list[ReqState], waiting, pending: list[ReqState], nxt: int, batch, s: int, clock: int,
            launched: int, held_c: int, steps: int, tl_every: int) -> Stretch | None:
        """Advance a quiet stretch from step ``s`` (kvplan.core.sim.v1.stretch); None where none starts here."""
        return advance(self, running, waiting, pending, nxt, batch, s, clock, launched, held_c, steps, tl_every)
