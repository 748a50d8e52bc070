"""Quiet stretches of vLLM v1's loop, advanced without walking every running request at every step.

A stretch starts at a step where nothing waits, every running request decodes (its first token sampled; under
async scheduling one token in flight, none stale) and none is within three tokens of its stop. While no request
arrives, each schedule() gives every running request one token in running order and update_from_output() returns
one token to each, so a step's figures follow from the stretch's start: n requests running, n tokens scheduled,
n more computed tokens, the step time of the computed tokens. A request touches the pool only when its next
token needs a block or fills one (every block_size steps): those events run through the manager's own calls
(allocate_slots, cache_blocks) in the loop's order, step by step and in running order within a step, so the
pool hands out the same blocks and files the same hashes. The stretch ends before the step that would see an
arrival, finish a request or find the pool short; the loop goes on from there step by step.

Where: every KV cache group full attention with one block size (no window frees, no per-sequence state), or a
contiguous allocator; no CPU tier. Same results as the step-by-step loop, to the block id: the tests run both
(``simulate_v1(..., fast_path=False)``) over random workloads, sync and async, with prefix caching.
"""

from __future__ import annotations

from functools import reduce
from itertools import repeat
from operator import add

from kvplan.core.sim.v1.contiguous import ContiguousManager
from kvplan.core.sim.v1.inputs import FULL
from kvplan.core.sim.v1.shares import split, thin
from kvplan.core.sim.v1.state import ReqState

MIN_STEPS = 2  # a shorter stretch costs more to set up than the steps it saves
MARGIN = 1  # the step whose output stops a request runs in the loop


def arrives(k: int, hi: int, arrival: int | None, timed: bool, s: int, lag: int, k0: int, clock0: int, base: int,
            pt: int, kv0: int, n: int) -> int:
    """The first step from k (above k0 when async) before hi whose check sees the next arrival, or hi: the loop
    sees it by the start of the batch in flight (async, ``lag`` 1) or the clock (sync), or by the step number
    (untimed). From step k0 on, step k0 + j starts at clock0 + j * base + pt * (j * kv0 + n * j * (j + 1) // 2)."""
    if arrival is None:
        return hi
    if not timed:
        return min(max(k, arrival - s), hi)
    while k < hi:
        mid = (k + hi) // 2
        j = mid - lag - k0
        if clock0 + j * base + pt * (j * kv0 + n * j * (j + 1) // 2) >= arrival:
            hi = mid
        else:
            k = mid + 1
    return min(k, hi)


class Stretch:
    """What a stretch did: its steps, where the clock and the batch in flight are after it, and the sums the
    loop keeps over counted steps."""

    __slots__ = ("batch", "busy", "clock", "completed", "computed", "entries", "free", "held_c", "internal",
                 "launched", "nxt", "peak", "run_sum", "steps", "tl_every", "usage")


class Quiet:
    """One simulation's quiet-stretch stepper; ``usable`` is False where the pool does not allow it."""

    def __init__(self, sim, ps: tuple[list[int], ...], timeline: list, points: int) -> None:
        mgr, cfg = sim.mgr, sim.cfg
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
        self.max_seqs, self.budget = cfg.max_num_seqs, cfg.max_num_batched_tokens
        self.lpt = cfg.long_prefill_token_threshold
        self.count = 0  # stretches taken (the tests check some are)
        self.check = sim._check if sim.check else None

    def _admits_none(self, running: list[ReqState], waiting) -> bool:
        """Whether no waiting request can be admitted at any step of a stretch starting here: max_num_seqs run,
        or (prefix caching off) the head of the queue is short of blocks now, and blocks only get fewer while
        nothing finishes. A request that arrives then queues behind the head: it cannot be admitted either."""
        n = len(running)
        if n >= self.max_seqs:
            return True
        if not waiting or self.caching:
            return False
        head = waiting[0]
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

    def _events(self, running: list[ReqState], kmax: int,
                finishes: bool) -> tuple[dict[int, list[int]], dict[int, list[int]], int]:
        """Per step with any, the running requests (by index) whose token needs a block or fills one, in running
        order, and (``finishes``) those whose output that step stops them; the steps the pool's free blocks last
        (no step at or past it is taken; the blocks stopped requests free are not counted)."""
        B, hb, caching, mml = self.block, self.hash_block, self.caching, self.mml
        last = 0 if self.async_ else 1  # async skips a request at the step its last token is in flight
        events: dict[int, list[int]] = {}
        needs: dict[int, int] = {}
        stops: dict[int, list[int]] = {}
        for i, r in enumerate(running):
            c0, nt0 = r.num_computed, r.num_tokens
            lim = kmax
            if finishes:
                k = min(r.max_tokens - r.generated, mml - nt0) - 1
                if k in stops:
                    stops[k].append(i)
                else:
                    stops[k] = [i]
                lim = min(kmax, k + last)
            ja = r.cap_tokens - c0  # the step whose token is past the blocks held
            if not B:  # a contiguous region holds every token: a crossing ends the stretch there
                if ja < lim:
                    kmax = max(ja, 0)
                continue
            for j in range(ja, lim, B):
                needs[j] = needs.get(j, 0) + 1
                if j in events:
                    events[j].append(i)
                else:
                    events[j] = [i]
            if caching:
                jc = max(0, (r.ncached[0] + 1) * hb - nt0)
                if jc < lim:  # a step that is also a crossing lists the request twice: run() takes it once
                    for j in (jc, *range(((nt0 + jc) // hb + 1) * hb - nt0, lim, hb)):
                        if j in events:
                            events[j].append(i)
                        else:
                            events[j] = [i]
        free, per = self.pool.num_free, self.per_crossing
        used = 0
        for j in sorted(needs):
            if j >= kmax:
                break
            used += needs[j] * per
            if used > free:
                return events, stops, j
        return events, stops, kmax

    def run(self, running: list[ReqState], waiting, pending: list[ReqState], nxt: int, batch, s: int, clock: int,
            launched: int, held_c: int, steps: int, tl_every: int, usage_sum: float) -> Stretch | None:
        """Advance a quiet stretch from step ``s``; None where none starts here (the loop takes the step).
        Requests that arrive in it join ``waiting`` where none can be admitted; otherwise the first ends it.
        Between steps with events (a block crossed or filed, an arrival, a request stopped) every step's figures
        are the same but for the computed tokens and the clock, which grow by the same rule: such runs of steps are
        added at once, their per-step figures extended in C, the clock in closed form. One function on purpose:
        the simulator's hottest (benchmarks/bench_default_path.py)."""
        absorb = self._admits_none(running, waiting)
        if waiting and not absorb:
            return None
        finishes = self.finishes and not absorb  # a stop frees blocks: a waiting head might be admitted
        kmax = self._bound(running, batch, finishes)
        if kmax < MIN_STEPS:
            return None
        n = len(running)
        c0s = [r.num_computed for r in running]
        kv = sum(c0s)  # the computed tokens of the running requests at a step's start (its batch reads kv + n)
        step_model, timed, async_ = self.step_model, self.timed, self.async_
        base, pt = (step_model.base_ps, step_model.per_token_ps) if step_model is not None else (0, 0)
        # from step k0 on, with n running and kv0 computed tokens at its start, step k0 + j starts at
        # clock0 + j * base + pt * (j * kv0 + n * j * (j + 1) // 2) (StepModel.duration, no prefill in a stretch)
        k0, clock0, kv0 = 0, clock, kv
        n_pending = len(pending)
        arrival = (None if nxt == n_pending else
                   pending[nxt].req.arrival_ps if timed else pending[nxt].req.arrival_step)
        lag = 1 if async_ else 0  # the loop sees an arrival by the start of the batch in flight (async) or the clock
        k_arr = arrives(1, kmax, arrival, timed, s, lag, k0, clock0, base, pt, kv0, n)
        if not absorb:
            kmax = k_arr  # the arrival may be admitted: the loop takes that step (a stop only delays it)
        events, stops, kcap = self._events(running, kmax, finishes)
        kmax = min(kmax, kcap)
        if kmax < MIN_STEPS:
            return None
        mgr, pool, books, capacity, check = self.mgr, self.pool, self.books, self.capacity, self.check
        grow = (mgr.grow_one if len(mgr.kinds) == 1 else mgr.grow) if self.block else None
        caching, hb = self.caching, self.hash_block
        ps_running, ps_usage, ps_tokens, ps_waiting, ps_start = self.ps
        timeline, points = self.timeline, self.points
        nt0s = [r.num_tokens for r in running]
        out = Stretch()
        sum_free = sum_entries = sum_c = sum_int = run_sum = completed = busy = 0
        peak = n
        ev = sorted({j for j in events if j < kcap} | {j for j in stops if j < kcap})
        ev.append(kcap)
        ei = 0
        nw = len(waiting)
        gone = False  # a request stopped: the running list is rebuilt at the end
        nf = -1  # the pool's books, read again after a step with events
        k = 0
        while k < kmax:
            if k == k_arr:  # requests arriving now queue behind a head that cannot be admitted
                seen_by = (launched if async_ else clock) if timed else s + k  # the loop's rule
                while arrival is not None and arrival <= seen_by:
                    st = pending[nxt]
                    st.arrival_step = s + k
                    st.arrival_ps = st.req.arrival_ps if timed else clock
                    waiting.append(st)
                    nxt += 1
                    arrival = (None if nxt == n_pending else
                               pending[nxt].req.arrival_ps if timed else pending[nxt].req.arrival_step)
                nw = len(waiting)
                k_arr = arrives(k + 1, kcap, arrival, timed, s, lag, k0, clock0, base, pt, kv0, n)
            stopping = None
            if ev[ei] == k:
                ei += 1
                stopping = stops.get(k)
                if stopping is not None and async_ and len(stopping) == n:
                    break  # nothing is scheduled: the step is not counted (the loop takes it)
                todo = events.get(k)
                if todo is not None:
                    done = -1
                    for i in todo:
                        if i == done:
                            continue
                        done = i
                        r = running[i]
                        end, nt = c0s[i] + k + 1, nt0s[i] + k
                        r.num_computed, r.num_tokens = end - 1, nt
                        if caching and nt >= (len(r.hasher.keys) + 1) * hb:
                            r.hasher.extend(nt)
                        if end > r.cap_tokens:  # paged only: a contiguous stretch ends before its first crossing
                            grow(r, end, nt)  # the pool's free blocks were counted (_events)
                        elif caching and min(end, nt) >= (r.ncached[0] + 1) * hb:
                            mgr.cache_blocks(r, min(end, nt))
                    nf = -1
            if nf < 0:
                nf, entries, internal = pool.num_free, mgr.entries, mgr.internal
                u = 1.0 - nf / capacity
                permille = round(u * 1000)
            stop = ev[ei] if ev[ei] < k_arr else k_arr  # steps k .. stop - 1 have the same figures
            if stop == k + 1 or stopping is not None:  # most often (a crossing every few steps): the loop's own step
                stop = k + 1
                sched = n
                if stopping is not None and async_:  # their last token is in flight: not scheduled
                    sched -= len(stopping)
                    for i in stopping:
                        kv -= c0s[i] + k
                held_c += sched
                steps += 1
                run_sum += n
                usage_sum += u
                sum_free += nf
                sum_entries += entries
                sum_c += held_c
                sum_int += internal
                if tl_every and steps % tl_every == 0:
                    timeline.append((s + k, clock, *split(books, 1, nf, entries, held_c, internal, 0)))
                    tl_every = thin(timeline, points, tl_every)
                ps_running.append(n)
                ps_usage.append(permille)
                ps_tokens.append(sched)
                ps_waiting.append(nw)
                launched = clock
                kv += sched
                if step_model is not None:
                    ps_start.append(clock)
                    duration = base + pt * kv
                    busy += duration
                    clock += duration
                k = stop
                if stopping is not None:  # update_from_output: their last token; blocks freed in running order
                    if check is not None:  # the invariants at this step, as the loop checks them (tests only)
                        for i, r in enumerate(running):
                            if r.finish_step < 0:
                                r.num_computed, r.num_tokens = c0s[i] + k - (async_ and i in stopping), nt0s[i] + k - 1
                        check([r for r in running if r.finish_step < 0], waiting, held_c, self.budget - sched,
                              split(books, 1, nf, entries, held_c, internal, 0))
                    at, end_clock = (s + k - 2, launched) if async_ else (s + k - 1, clock)
                    for i in stopping:
                        r = running[i]
                        r.num_computed = c0s[i] + k - lag
                        r.num_tokens = nt = nt0s[i] + k
                        r.generated += k
                        if caching and nt >= (len(r.hasher.keys) + 1) * hb:
                            r.hasher.extend(nt)
                        if async_:
                            r.in_flight = r.placeholders = 0
                            if caching and min(r.num_computed, nt) >= (r.ncached[0] + 1) * hb:
                                mgr.cache_blocks(r, min(r.num_computed, nt))
                        if not async_:
                            kv -= r.num_computed
                        r.finish_step, r.finish_ps = at, end_clock
                        mgr.free(r)
                        r.hasher = None
                        held_c -= r.num_computed
                        completed += 1
                    n -= len(stopping)
                    gone = True
                    nf = -1
                    if not n:
                        break
                    k0, clock0, kv0 = k, clock, kv  # the clock's rule from here on
                    if arrival is not None:  # (no stop in a stretch that lets arrivals queue)
                        if ((launched if async_ else clock) if timed else s + k) >= arrival:
                            break  # the next step sees it: the loop takes that step
                        kmax = k_arr = arrives(k + 1, kcap, arrival, timed, s, lag, k0, clock0, base, pt, kv0, n)
                continue
            g = stop - k
            h0 = held_c
            held_c += n * g
            before = steps
            steps += g
            run_sum += n * g
            usage_sum = reduce(add, repeat(u, g), usage_sum)  # in the loop's order: the same float sum
            sum_free += g * nf
            sum_entries += g * entries
            sum_c += g * h0 + n * g * (g + 1) // 2
            sum_int += g * internal
            # step k + j starts at clock + j * base + pt * (j * kv + n * j * (j + 1) // 2)
            if tl_every:
                at = (before // tl_every + 1) * tl_every
                while at <= steps:
                    j = at - before - 1
                    timeline.append((s + k + j, clock + j * base + pt * (j * kv + n * j * (j + 1) // 2),
                                     *split(books, 1, nf, entries, h0 + n * (j + 1), internal, 0)))
                    tl_every = thin(timeline, points, tl_every)
                    at = (at // tl_every + 1) * tl_every
            ps_running += [n] * g
            ps_usage += [permille] * g
            ps_tokens += [n] * g
            ps_waiting += [nw] * g
            if step_model is not None:
                ps_start += [clock + j * base + pt * (j * kv + n * j * (j + 1) // 2) for j in range(g)]
                j = g - 1
                launched = clock + j * base + pt * (j * kv + n * j * (j + 1) // 2)
                duration = g * base + pt * (g * kv + n * g * (g + 1) // 2)
                busy += duration
                clock += duration
            else:
                launched = clock
            kv += n * g
            k = stop
        out.free, out.entries, out.computed, out.internal, out.busy = sum_free, sum_entries, sum_c, sum_int, busy
        out.run_sum, out.peak, out.completed = run_sum, peak, completed
        if gone:
            keep = [i for i, r in enumerate(running) if r.finish_step < 0]
            running[:] = [running[i] for i in keep]
            c0s = [c0s[i] for i in keep]
            nt0s = [nt0s[i] for i in keep]
        for i, r in enumerate(running):
            r.num_computed, r.num_tokens = c0s[i] + k, nt0s[i] + k
            r.generated += k
            if caching and r.num_tokens >= (len(r.hasher.keys) + 1) * hb:
                r.hasher.extend(r.num_tokens)
        out.steps, out.clock, out.launched, out.held_c, out.tl_every = k, clock, launched, held_c, tl_every
        out.nxt = nxt
        out.usage = usage_sum
        self.count += 1
        out.batch = ([(r, 1, True) for r in running], s + k - 1, clock) if async_ else None
        return out
