"""One quiet stretch of vLLM v1's loop (quiet.py says where one starts), step by step in closed form.

Every running request is in a steady decode: at step j of the stretch it has computed c0 + j tokens, knows nt0 + j
and has generated g0 + j, so a step is touched only where something happens (``Quiet.plan`` files the steps):
- a request's token needs a block or fills one: the manager's own calls (grow, cache_blocks), in running order;
- a request's last output: sync scheduling schedules it and frees its blocks after the step; async skips it at
  the step its last token is in flight (0.11.1 and later) and frees its blocks when that token is processed;
- a request arrives: the waiting queue is admitted as schedule() admits it (find_hit, allocate_slots, with the
  budget the decodes leave); a request admitted with its whole prompt decodes from the next step (async: its first
  token is processed a step later) and joins the stretch with its own events;
- the pool has fewer free blocks than the step's crossings ask: the stretch ends before it (the loop preempts).
Steps between such events have the same figures but for the computed tokens and the clock, which grow by one
rule: they are added at once (StepModel.duration in closed form, the per-step lists extended in C, the float
usage summed in the loop's order). The stretch ends where the loop's rules need the loop: a request left waiting,
a prefill cut into chunks, a step that schedules nothing, the pool short. Same results as the step-by-step loop,
to the block id (tests/core/sim/test_v1_quiet.py).
"""

from __future__ import annotations

from heapq import heappop, heappush
from itertools import accumulate, repeat
from math import sqrt

from kvplan.core.sim.v1.shares import split, thin

MIN_STEPS = 2  # a shorter stretch costs more to set up than the steps it saves
MARGIN = 1  # without stops inside the stretch, the step whose output stops a request runs in the loop


def arrives(k: int, hi: int, arrival: int | None, timed: bool, s: int, lag: int, k0: int, clock0: int, base: int,
            pt: int, kv0: int, n: int) -> int:
    """The first step from k (above k0 when async) before hi whose check sees the next arrival, or hi: the loop
    sees it by the start of the batch in flight (async, ``lag`` 1) or the clock (sync), or by the step number
    (untimed). From step k0 on, step k0 + j starts at clock0 + j * base + pt * (j * kv0 + n * j * (j + 1) // 2):
    the quadratic's root in floats, then the exact step by integers."""
    if arrival is None:
        return hi
    if not timed:
        return min(max(k, arrival - s), hi)
    j = k - lag - k0
    if clock0 + j * base + pt * (j * kv0 + n * j * (j + 1) // 2) >= arrival:
        return min(k, hi)
    lo = j  # the start at step k0 + lo is before the arrival
    a = pt * n / 2
    b = base + pt * kv0 + a
    c = clock0 - arrival
    if a > 0:
        x = (-b + sqrt(b * b - 4 * a * c)) / (2 * a)
    elif b > 0:
        x = -c / b
    else:
        return hi  # the clock stands still
    top = hi - lag - k0
    if x > top + 2:
        return hi
    j = max(lo + 1, -int(-x))  # the root rounded up: most often the step itself
    while clock0 + j * base + pt * (j * kv0 + n * j * (j + 1) // 2) < arrival:
        if j >= top:
            return hi
        j += 1
    while j - 1 > lo and clock0 + (j - 1) * base + pt * ((j - 1) * kv0 + n * (j - 1) * j // 2) >= arrival:
        j -= 1
    return min(j + lag + k0, hi)


class Stretch:
    """What a stretch did: its steps, where the clock and the batch in flight are after it, and the sums the
    loop keeps over counted steps."""

    __slots__ = ("batch", "busy", "clock", "completed", "computed", "entries", "external", "free", "generated",
                 "gpu_hit", "held_c", "internal", "launched", "nxt", "peak", "recomputed", "run_sum", "steps",
                 "peak_usage", "peak_waiting", "tl_every")



def advance(q, running, waiting, pending, nxt: int, batch, s: int, clock: int, launched: int, held_c: int,
            steps: int, tl_every: int) -> Stretch | None:
    """Advance a quiet stretch from step ``s``; None where none starts here (the loop takes the step). Where no
    request can be admitted (``absorb``), arrivals join ``waiting`` and the stretch ends before a request stops.
    One function on purpose: the simulator's hottest loop (benchmarks/bench_default_path.py), its state in locals."""
    absorb = q._admits_none(running, waiting)
    if waiting and not absorb:
        return None
    finishes = q.finishes and not absorb  # a stop frees blocks: a waiting head might then be admitted
    admits = finishes and q.block > 0  # arrivals admitted inside (a paged pool)
    kmax = q._bound(running, batch, finishes)
    if kmax < MIN_STEPS:
        return None
    mgr, pool, books, capacity, check, record = q.mgr, q.pool, q.books, q.capacity, q.check, q.record
    step_model, timed, async_, caching, hb = q.step_model, q.timed, q.async_, q.caching, q.hash_block
    n = len(running)
    c0s = [r.num_computed for r in running]
    nt0s = [r.num_tokens for r in running]
    g0s = [r.generated for r in running]
    kv = sum(c0s)  # the computed tokens of the running requests at a step's start (its batch reads kv + n)
    base, pt = (step_model.base_ps, step_model.per_token_ps) if step_model is not None else (0, 0)
    ppt = q.per_prefill
    # from step k0 on, with n running and kv0 computed tokens at its start, step k0 + j starts at
    # clock0 + j * base + pt * (j * kv0 + n * j * (j + 1) // 2)
    k0, clock0, kv0 = 0, clock, kv
    n_pending = len(pending)
    arrival = None if nxt == n_pending else pending[nxt].due
    # a data-parallel rank (dp.rank_sim): nothing is known past the router's horizon, which ends the stretch
    # where an arrival would be seen (a barrier, not an arrival)
    routed, horizon = q.sim.open, q.sim.horizon
    if arrival is None and routed:
        arrival = horizon
    lag = 1 if async_ else 0  # the loop sees an arrival by the start of the batch in flight (async) or the clock
    kcap = 1 << 62 if finishes else kmax
    k_arr = arrives(1, kcap, arrival, timed, s, lag, k0, clock0, base, pt, kv0, n)
    if not absorb and not admits:
        kcap = k_arr  # the arrival may be admitted: the loop takes that step
    events: dict[int, list[int]] = {}
    stops: dict[int, list[int]] = {}
    heap: list[int] = []
    B = q.block
    wheel: list[list[int]] = [[] for _ in range(B)]  # at step j, wheel[j % B]: the requests whose token needs a block
    phase: dict[int, int] = {}
    for i, r in enumerate(running):
        kcap = q.plan(i, r, c0s[i], nt0s[i], g0s[i], 0, kcap, finishes, events, stops, heap, wheel, phase)
    if kcap < MIN_STEPS:
        return None
    if kcap < 1 << 62:
        heappush(heap, kcap)
    grow = (mgr.grow_one if len(mgr.kinds) == 1 else mgr.grow) if q.block else None
    plain = pool.plain if q.block else None  # with pool.n_cached, BlockPool.num_free's parts
    per, budget0, max_seqs, lpt = q.per_crossing, q.budget, q.max_seqs, q.lpt
    keep = q.ps is not None  # the per-step figures (V1Result.per_step_*), kept where asked
    ps_running, ps_usage, ps_tokens, ps_waiting, ps_start = q.ps if keep else ([], [], [], [], [])
    timeline, points = q.timeline, q.points
    out = Stretch()
    sum_free = sum_entries = sum_c = sum_int = sum_ext = run_sum = generated = completed = busy = 0
    gpu_hit = recomputed = admitted_in = 0
    peak = n
    nw = len(waiting)
    peak_pm = peak_w = 0  # the peaks of the usage (permille) and the waiting queue over the stretch's steps
    gone = False  # a request stopped: the running list is rebuilt at the end
    last_adm: tuple | list = ()  # the batch items of requests admitted at the last step (its batch in flight)
    k = 0
    while k < kcap:
        arriving = k == k_arr
        if arriving and routed and nxt == n_pending:
            break  # the router's horizon: the loop hands back to it from this step
        skip = -1  # a step whose crossings are done here, before the run of steps from it
        stopping = todo = adm = None
        if arriving or (heap and heap[0] == k):
            skip = k
            while heap and heap[0] == k:
                heappop(heap)
            stopping = stops.pop(k, None)
            if stopping is not None and async_:
                if len(stopping) == n:
                    break  # nothing decodes this step: the loop takes it
                for i in stopping:  # their last token is in flight: no block asked for it
                    if i in phase:
                        wheel[phase.pop(i)].remove(i)
            todo = events.pop(k, None)
            crossing = wheel[k % B] if B else None
            if crossing:
                if len(crossing) * per > len(plain) + pool.n_cached:
                    break  # a crossing finds the pool short: the loop preempts
                todo = crossing if todo is None else sorted(crossing + todo)  # in running order
            if arriving:  # the loop's rule: every request seen by now queues
                seen_by = (launched if async_ else clock) if timed else s + k
                while arrival is not None and arrival <= seen_by:
                    st = pending[nxt]
                    st.arrival_step = s + k
                    st.arrival_ps = st.due if timed else clock
                    waiting.append(st)
                    nxt += 1
                    arrival = None if nxt == n_pending else pending[nxt].due
                if arrival is None and routed:
                    arrival = horizon
                nw = len(waiting)
                if absorb:
                    k_arr = arrives(k + 1, kcap, arrival, timed, s, lag, k0, clock0, base, pt, kv0, n)
            if todo is not None:
                done = -1
                for i in todo:
                    if i == done:
                        continue
                    done = i
                    r = running[i]
                    end, nt = c0s[i] + k + 1, nt0s[i] + k  # (its counts are written when the stretch ends)
                    if end > r.cap_tokens:  # paged only: a contiguous stretch ends before its first crossing
                        grow(r, end, nt)  # the pool has the blocks (checked above); its new keys hashed there
                    else:  # a block filled: file it
                        if nt >= (r.hasher.n + 1) * hb:
                            r.hasher.extend(nt)
                        if min(end, nt) >= (r.ncached[0] + 1) * hb:
                            mgr.cache_blocks(r, min(end, nt))
            if stopping is not None and not async_:  # they stop after this step's block
                for i in stopping:
                    if i in phase:
                        wheel[phase.pop(i)].remove(i)
            sched = n
            if stopping is not None and async_:  # their last token is in flight: not scheduled
                sched -= len(stopping)
                for i in stopping:
                    kv -= c0s[i] + k
            ext_now = 0
            if arriving and admits and waiting:  # schedule(): the waiting queue after the decodes
                adm = []
                budget = budget0 - sched
                while budget > 0 and waiting and n + len(adm) < max_seqs:
                    r = waiting[0]
                    hits, hit_len = mgr.find_hit(r) if caching else (None, 0)
                    num = r.num_tokens - hit_len
                    if 0 < lpt < num:
                        num = lpt
                    num = min(num, budget)
                    if not mgr.allocate_slots(r, num, hits, hit_len, 0, admitting=True, has_running=True):
                        ext_now = mgr.ext
                        break
                    waiting.popleft()
                    running.append(r)
                    r.num_computed = end = hit_len + num
                    held_c += hit_len
                    samples = end >= r.num_tokens
                    if async_:
                        r.in_flight += num
                        if samples:
                            r.placeholders += 1
                    gpu_hit += hit_len
                    recomputed += r.num_tokens - hit_len
                    if r.first_scheduled_step < 0:
                        r.first_scheduled_step = s + k
                        r.first_scheduled_ps = clock
                        r.cached_tokens = hit_len
                        r.cpu_tokens = 0
                    adm.append((r, num, samples))
                    admitted_in += 1
                    budget -= num
                nw = len(waiting)
            if stopping is not None or adm is not None:
                nf = len(plain) + pool.n_cached if plain is not None else pool.num_free
                entries, internal = mgr.entries, mgr.internal
                permille = round((1.0 - nf / capacity) * 1000)
                # ---- a step where requests stop, are admitted or see their first token: the loop's own figures ----
                total = sched
                kv_tokens = kv + sched
                prefill = 0
                if adm:
                    for r, num, _ in adm:
                        total += num
                        prefill += num
                        kv_tokens += r.num_computed
                nr = n + (len(adm) if adm else 0)
                held_c += total
                steps += 1
                run_sum += nr
                if nr > peak:
                    peak = nr
                if permille > peak_pm:
                    peak_pm = permille
                if nw > peak_w:
                    peak_w = nw
                sum_free += nf
                sum_entries += entries
                sum_c += held_c
                sum_int += internal
                sum_ext += ext_now
                if tl_every and steps % tl_every == 0:
                    timeline.append((s + k, clock, *split(books, 1, nf, entries, held_c, internal, ext_now)))
                    tl_every = thin(timeline, points, tl_every)
                if keep:
                    ps_running.append(nr)
                    ps_usage.append(permille)
                    ps_tokens.append(total)
                    ps_waiting.append(nw)
                    if step_model is not None:
                        ps_start.append(clock)
                launched = clock
                if step_model is not None:
                    duration = base + pt * kv_tokens + ppt * prefill
                    busy += duration
                    clock += duration
                kv = kv_tokens
                k += 1
                # update_from_output(): the batch of the step before (async) or this one (sync), in running order
                generated += n if async_ else sched
                if stopping is not None:  # their last token; blocks freed in running order
                    if check is not None:  # the invariants at this step, as the loop checks them (tests only)
                        for i, r in enumerate(running):
                            if r.finish_step < 0 and i < len(c0s):
                                r.num_computed, r.num_tokens = c0s[i] + k - (async_ and i in stopping), nt0s[i] + k - 1
                                if r.private:  # its filings are not events (Quiet.plan): the last step's, now
                                    r.hasher.extend(nt0s[i] + k - 1)
                                    mgr.cache_blocks(r, min(c0s[i] + k, nt0s[i] + k - 1))
                        check([r for r in running if r.finish_step < 0], waiting, held_c, budget0 - total,
                              split(books, 1, nf, entries, held_c, internal, ext_now))
                    at, end_clock = (s + k - 2, launched) if async_ else (s + k - 1, clock)
                    for i in stopping:
                        r = running[i]
                        r.num_computed = c0s[i] + k - lag
                        r.num_tokens = nt = nt0s[i] + k
                        r.generated = g0s[i] + k
                        if caching and nt >= (r.hasher.n + 1) * hb:
                            r.hasher.extend(nt)
                        if r.private:  # its filings are not events (Quiet.plan): the last step's, now
                            mgr.cache_blocks(r, min(c0s[i] + k, nt - 1))
                        if async_:
                            r.in_flight = r.placeholders = 0
                            if caching and min(r.num_computed, nt) >= (r.ncached[0] + 1) * hb:
                                mgr.cache_blocks(r, min(r.num_computed, nt))
                        else:
                            kv -= r.num_computed
                        r.finish_step, r.finish_ps = at, end_clock
                        mgr.free(r)
                        r.hasher = None
                        record(r)
                        held_c -= r.num_computed
                        completed += 1
                    n -= len(stopping)
                    gone = True
                last_adm = ()
                if adm is not None:
                    last_adm = []
                    ends = bool(waiting)  # a request left waiting: the loop's rules decide from here
                    for r, num, samples in adm:
                        i = len(c0s)
                        if not samples:
                            ends = True  # a prompt in chunks: the loop schedules the rest
                        elif not async_:  # its first token, now
                            r.num_tokens += 1
                            r.generated += 1
                            generated += 1
                            r.first_token_step, r.first_token_ps = s + k - 1, clock
                            if caching and r.num_tokens >= (r.hasher.n + 1) * hb:
                                r.hasher.extend(r.num_tokens)
                            if r.num_tokens >= q.mml or r.generated >= r.max_tokens:
                                r.finish_step, r.finish_ps = s + k - 1, clock
                                mgr.free(r)
                                r.hasher = None
                                record(r)
                                held_c -= r.num_computed
                                kv -= r.num_computed
                                completed += 1
                                gone = True
                        # its steady state from step k on (where the stretch ends here: as the loop leaves it)
                        c0s.append(r.num_computed - k)
                        nt0s.append(r.num_tokens - k)
                        g0s.append(r.generated - k)
                        if r.finish_step < 0:
                            n += 1
                            if samples:
                                kcap = q.plan(i, r, r.num_computed - k, r.num_tokens - k, r.generated - k, k, kcap,
                                              True, events, stops, heap, wheel, phase)
                                if async_:  # its first token, processed at the next step (undone below if none comes)
                                    r.first_token_step, r.first_token_ps = s + k - 1, clock
                                    r.in_flight = 1
                        last_adm.append((r, num, samples))
                    if ends:
                        break
                if not n:
                    break
                # the clock's rule from here on, and when the next arrival is seen
                k0, clock0, kv0 = k, clock, kv
                if not absorb:
                    if arrival is None:
                        k_arr = kcap
                    elif ((launched if async_ else clock) if timed else s + k) >= arrival:
                        k_arr = k
                    else:
                        k_arr = arrives(k + 1, kcap, arrival, timed, s, lag, k0, clock0, base, pt, kv0, n)
                    if not admits and k_arr < kcap:
                        kcap = k_arr
                continue
        # ---- steps k .. stop - 1: nothing stops, is admitted, filed apart or arrives; the wheel's crossings ----
        stop = heap[0] if heap else kcap
        if k_arr < stop:
            stop = k_arr
        if stop > kcap:
            stop = kcap
        nf = len(plain) + pool.n_cached if plain is not None else pool.num_free
        entries, internal = mgr.entries, mgr.internal
        permille = round((1.0 - nf / capacity) * 1000) if keep else 0  # (else only the run's last: its peak)
        jp, short = k, False  # where the run of the pool's present figures started; whether the pool ran short
        chg = [(k, nf, entries, internal)] if tl_every else None
        for j in range(k, stop) if B else ():
            crossing = wheel[j % B]
            if not crossing or j == skip:
                continue
            if len(crossing) * per > nf:
                stop, short = j, True  # a crossing finds the pool short: the loop preempts
                break
            g = j - jp
            if g:
                sum_free += g * nf
                sum_entries += g * entries
                sum_int += g * internal
                if keep:
                    ps_usage += [permille] * g
                jp = j
            for i in crossing:
                grow(running[i], c0s[i] + j + 1, nt0s[i] + j)
            nf = len(plain) + pool.n_cached
            entries, internal = mgr.entries, mgr.internal
            if keep:
                permille = round((1.0 - nf / capacity) * 1000)
            if chg is not None:
                chg.append((j, nf, entries, internal))
        g = stop - jp
        sum_free += g * nf
        sum_entries += g * entries
        sum_int += g * internal
        g = stop - k
        if not g:
            break
        if not keep:  # usage only rises over the run (crossings take blocks): its last is its peak
            permille = round((1.0 - nf / capacity) * 1000)
        if permille > peak_pm:
            peak_pm = permille
        if nw > peak_w:
            peak_w = nw
        if keep:
            ps_usage += [permille] * (stop - jp)
            ps_running += [n] * g
            ps_tokens += [n] * g
            ps_waiting += [nw] * g
        h0 = held_c
        held_c += n * g
        before = steps
        steps += g
        run_sum += n * g
        generated += n * g
        sum_c += g * h0 + n * g * (g + 1) // 2
        # step k + j starts at clock + j * base + pt * (j * kv + n * j * (j + 1) // 2)
        if tl_every:
            at = (before // tl_every + 1) * tl_every
            c = 0
            while at <= steps:
                j = at - before - 1
                while c + 1 < len(chg) and chg[c + 1][0] <= k + j:
                    c += 1
                _, tf, te, ti = chg[c]
                timeline.append((s + k + j, clock + j * base + pt * (j * kv + n * j * (j + 1) // 2),
                                 *split(books, 1, tf, te, h0 + n * (j + 1), ti, 0)))
                tl_every = thin(timeline, points, tl_every)
                at = (at // tl_every + 1) * tl_every
        if step_model is not None:  # step j lasts d0 + j * pt * n: the starts are their running sums, from clock
            d0, dd = base + pt * (kv + n), pt * n
            if keep:
                ps_start += (accumulate(range(d0, d0 + dd * (g - 1), dd), initial=clock) if dd else
                             accumulate(repeat(d0, g - 1), initial=clock))
            launched = clock + (g - 1) * d0 + dd * ((g - 1) * (g - 2) // 2)
            duration = g * d0 + dd * (g * (g - 1) // 2)
            busy += duration
            clock += duration
        else:
            launched = clock
        kv += n * g
        last_adm = ()
        k = stop
        if short:
            break
    if not k:
        return None  # it broke off before its first step, which changed nothing
    out.free, out.entries, out.computed, out.internal, out.external = sum_free, sum_entries, sum_c, sum_int, sum_ext
    out.busy, out.run_sum, out.peak, out.completed, out.generated = busy, run_sum, peak, completed, generated
    out.gpu_hit, out.recomputed = gpu_hit, recomputed
    if gone:
        alive = [i for i, r in enumerate(running) if r.finish_step < 0]
        running[:] = [running[i] for i in alive]
        c0s = [c0s[i] for i in alive]
        nt0s = [nt0s[i] for i in alive]
        g0s = [g0s[i] for i in alive]
    for i, r in enumerate(running):
        r.num_computed, r.num_tokens, r.generated = c0s[i] + k, nt0s[i] + k, g0s[i] + k
        if caching and r.num_tokens >= (r.hasher.n + 1) * hb:
            r.hasher.extend(r.num_tokens)
        if r.private:  # its filings are not events (Quiet.plan): the last step's (min(computed, known)), now
            mgr.cache_blocks(r, min(c0s[i] + k, nt0s[i] + k - 1))
    out.steps, out.clock, out.launched, out.held_c, out.tl_every = k, clock, launched, held_c, tl_every
    out.nxt = nxt
    out.peak_usage, out.peak_waiting = peak_pm, peak_w
    q.count += 1
    q.steps += k
    q.stopped += completed
    q.admitted += admitted_in
    if async_:
        for r, num, samples in last_adm:  # admitted at the last step: their first token is still in flight
            if samples and r.finish_step < 0:
                r.first_token_step, r.first_token_ps, r.in_flight = -1, 0, num
        joined = {id(it[0]) for it in last_adm}
        out.batch = ([*((r, 1, True) for r in running if id(r) not in joined), *last_adm], s + k - 1, clock)
    else:
        out.batch = None
    return out
