"""The event-driven simulator: cost grows with allocation events, not with token steps.

Between events (arrivals, admissions, completions, preemptions, a sequence entering its last block)
every running sequence just gains a token per step, so the state is kept in aggregates and whole
runs of steps are accounted in closed form:

- a running group's tokens are ``t(s) = tb + s`` (``tb`` fixed while it runs), so the pool's used
  slots are ``U + N * s`` (``U`` the sum of ``n * tb`` plus the prefix-sharing correction, ``N`` the
  running sequences);
- for paged pools the unused slots of each sequence's last block depend only on ``(tb + s) mod B``,
  so the total slack is kept for each of the ``B`` residues of the step, with its running sum over
  the residues, as the fields of one integer (a sequence starting or stopping adds or subtracts its
  own fields: one addition; a field is read with a shift and a mask), which gives the block count
  and, summed over a run of steps (a difference of two running sums), the allocated memory. The step
  the pool runs out is bracketed to ``B`` candidates by the slack's bounds (0 and ``N * (B - 1)``),
  then bisected;
- step durations are linear in the tokens held, so the clock over a run of steps is a quadratic in
  the number of steps and the step an arrival lands on is its integer root (``math.isqrt``).

The waiting queue is the preempted requests (a deque, at its head) followed by a range of arrived,
never-admitted requests, which FCFS admits in arrival order: a backlog of a million requests costs
two integers, not a million objects. Requests are read from flat arrays (``RequestArrays``).

The reference in tests/core/sim/reference.py runs every step and every sequence; both give the same
results, latencies included (a hypothesis test).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Iterable
from bisect import bisect_right
from heapq import heappop, heappush
from math import isqrt

from kvplan.core.sim.model import (AllocatorSpec, Preemption, RequestArrays, SimConfig, SimRequest, SimResult,
                                   latency_of, no_progress_reason, rejection, screen)
from kvplan.core.sim.invariants import check_invariants, packed_row
from kvplan.core.sim.placement import make_placement

_SHIFT = 40  # completion heap keys: step << _SHIFT | admission order (an int compares faster than a tuple)
_MASK = (1 << _SHIFT) - 1
_FAR = 1 << 62  # "no event": past any step a run can reach

# a running group's record (a list, indexed by these positions)
# _WFROM: the first step its unused slots are waste (contiguous: admission; paged: its tokens reach the
# last block, or admission if later); _WASTE: those slots
_I, _TB, _N, _WFROM, _WASTE, _GSH, _OFFS, _REGION, _ADMIT, _TTFT = range(10)


def simulate(requests: Iterable[SimRequest] | RequestArrays, cfg: SimConfig, alloc: AllocatorSpec, *,
             progress: Callable[[int], None] | None = None, timeline_points: int = 0,
             check_invariants: bool = False) -> SimResult:
    """Run one allocator over the requests.

    ``progress(done)`` is called as requests finish (completed or rejected; about 256 times in a
    run, and once at the end with all of them). ``check_invariants`` verifies the books at every
    event (slow: tests only).
    """
    reqs = RequestArrays.of(requests)
    if not reqs.is_sorted():
        order = sorted(range(len(reqs)), key=reqs.arrival_ps.__getitem__)  # stable: (arrival, id)
        reqs = _take(reqs, order)
    n_total = len(reqs)
    keep, reasons = screen(reqs, cfg, alloc, rejection)
    if keep is not None:
        reqs = _take(reqs, keep)
    return _run(reqs, cfg, alloc, reasons, n_total, progress, timeline_points, check_invariants)


def _take(reqs: RequestArrays, idx: list[int]) -> RequestArrays:
    cols = (reqs.arrival_ps, reqs.prompt, reqs.output, reqs.n)
    return RequestArrays(*(array("q", [c[i] for i in idx]) for c in cols))


def _first_reaching(gap: int, a1: int, a2: int) -> int:
    """The least c >= 1 with ``f(c) = a1 * c + a2 * c * (c - 1) / 2 >= gap`` (the clock after c quiet
    steps minus the clock now, for a gap > 0 that some c reaches): the root of the quadratic, then
    corrected by one where the integer square root rounded."""
    if not a2:
        return max(1, -(-gap // a1))
    b = 2 * a1 - a2  # 2 f(c) = a2 c^2 + b c
    # the integer square root rounds down, so c is at most the real root and f(c - 1) < gap: count up
    c = max(1, (isqrt(b * b + 8 * a2 * gap) - b) // (2 * a2))
    while a1 * c + a2 * c * (c - 1) // 2 < gap:
        c += 1
    return c


def _run(reqs: RequestArrays, cfg: SimConfig, alloc: AllocatorSpec, reasons: dict[str, int], n_total: int,
         progress: Callable[[int], None] | None, timeline_points: int, check: bool) -> SimResult:
    # One function on purpose: the loop keeps its state in local variables (an attribute read costs a dictionary
    # lookup, a call one more frame, and this loop runs a few million times for a million requests: the speed
    # targets of benchmarks/bench_simulate.py are met this way). The invariants it keeps are checked from outside
    # (kvplan.core.sim.invariants, tests only).
    arr, prm, out, nsq = reqs.arrival_ps, reqs.prompt, reqs.output, reqs.n
    total = len(arr)
    paged = alloc.paged
    B = alloc.block_size
    pool = cfg.pool_slots
    P = pool // B  # pool blocks
    Pb = cfg.shared_prefix // B if (paged and cfg.prefix_caching and cfg.shared_prefix > 0) else 0
    place = None if paged else make_placement(alloc.placement, pool)
    if place is not None:
        allocate, release = place.allocate, place.free
    # contiguous reservations (AllocatorSpec.reservation_slots, then the placement's rounding), inlined
    r_max, r_pow2, buddy = alloc.reservation == "max", alloc.reservation == "pow2", alloc.placement == "buddy"
    mml = cfg.max_model_len
    base, tok, pre = cfg.step.base_ps, cfg.step.per_token_ps, cfg.step.per_prefill_token_ps
    max_seqs, mnbt = cfg.max_num_seqs, cfg.max_num_batched_tokens
    recompute = cfg.preemption is Preemption.RECOMPUTE
    # paged: the slack of all last blocks for each residue r of the step mod B, and its running sum over
    # the residues before r, packed as fields of one integer (_packed_row): a sequence starts or stops
    # with one addition, not B
    slack = 0
    w = (max(1, max_seqs) * B * B).bit_length() + 1  # a field's bits: N (B - 1) B bounds the sums
    m = (1 << w) - 1
    wB = w * B  # where the running sums start
    sum_all = B * (B - 1) // 2  # one sequence's slack summed over all B residues
    rows: list[int | None] = [None] * B  # rows[q]: one sequence's fields when tb = q mod B (built when first used)

    s = now = 0
    nxt = lo = 0  # arrived: [0, nxt); waiting fresh (never admitted): [lo, nxt)
    front: deque[int] = deque()  # preempted requests, waiting at the head of the queue
    nfront = 0  # len(front)
    held: dict[int, tuple[int, int, int]] = {}  # preempted request -> (tokens, admission clock, first-token clock)
    running: dict[int, list] = {}  # admission order -> record (insertion ordered: oldest first)
    heap: list[int] = []  # completions: step << _SHIFT | admission order (stale once preempted)
    order = 0
    N = 0  # running sequences
    U = B * Pb  # used slots at step s are U + N * s (while something runs)
    alloc_contig = 0
    ext_now = 0
    sum_token = sum_alloc = sum_int = sum_ext = sum_batch = 0
    steps = completed = generated = preemptions = peak_batch = peak_waiting = 0
    queue_ps = busy = 0
    lat_queue, lat_ttft, lat_e2e = array("q"), array("q"), array("q")
    add_queue, add_ttft, add_e2e = lat_queue.append, lat_ttft.append, lat_e2e.append
    first_arrival = arr[0] if total else 0
    last_arrival = arr[-1] if total else 0  # the drain starts here
    timeline: list[tuple[int, int, int, int, int, int, int]] = []
    tl_every = (max(1, (sum(out) // max(1, max_seqs) + total) // timeline_points) if timeline_points else 0)
    rejected = n_total - total
    stride = max(1, n_total // 256)
    next_report = rejected + stride
    if progress is not None and rejected:
        progress(rejected)

    # `settled`: the last admission attempt was blocked by memory or max_num_seqs and nothing has been
    # freed since (steps without an event only grow), so another attempt would end the same way: skip it
    settled = False
    blocked = None
    size_of = head_size = -1  # contiguous: the last request whose region was sized, and the size
    need_of = head_need = -1  # paged: the last request whose blocks were counted, and the count
    while nxt < total or nfront or lo < nxt or running:
        if not running and not nfront and lo == nxt and arr[nxt] > now:
            now = arr[nxt]  # idle until the next arrival

        # -- step s in full: arrivals (rule 1), growth and preemption (2), admission (3) ---------------
        while nxt < total and arr[nxt] <= now:
            nxt += 1
        if nfront + nxt - lo > peak_waiting:  # noqa: PLR1730 (a comparison is cheaper than a call here)
            peak_waiting = nfront + nxt - lo
        preempted = False
        b_now = 0  # paged: blocks held at step s
        if paged and running:
            b_now = (U + N * s + (slack >> w * (s % B) & m)) // B
            if b_now > P:
                # growth at step s does not fit: the oldest k groups survive for the largest k whose
                # growth fits in the free blocks plus what the younger ones release (rule 2)
                b_prev = (U + N * (s - 1) + (slack >> w * ((s - 1) % B) & m)) // B
                need, free, released = b_now - b_prev, P - b_prev, 0
                victims = []
                for o_ in reversed(running):
                    if need <= free + released:
                        break
                    r = running[o_]
                    n, gsh = r[_N], r[_GSH]
                    t = r[_TB] + s - 1
                    need -= n * ((t + B) // B - (t + B - 1) // B)
                    released += (gsh - Pb) + n * (-(-t // B) - gsh)
                    victims.append(o_)
                for o_ in victims:  # youngest first, each to the front of the queue
                    i, tb, n, wfrom, waste, gsh, _, _, admit_ps, ttft_ps = running.pop(o_)
                    N -= n
                    U -= B * ((gsh - Pb) - n * gsh) + n * tb
                    slack -= rows[tb % B] * n
                    if s > wfrom:  # its waste counts up to step s - 1: it has not grown this step
                        sum_int += waste * (s - wfrom)
                    held[i] = (tb + s - 1, admit_ps, ttft_ps)
                    front.appendleft(i)
                    nfront += 1
                    preemptions += 1
                preempted = bool(victims)
                need_of = -1  # a victim's tokens changed while it ran
        if paged:
            while heap and (heap[0] & _MASK) not in running:
                heappop(heap)  # stale: preempted since
            if check:
                assert not heap or heap[0] >> _SHIFT >= s, "a completion was missed"

        prefill = 0
        fresh = []  # admitted for the first time at this step
        if preempted:
            blocked = None
            settled = False
            if running:
                # Step s admits nothing (rule 3). Would step s + 1 admit the head, the oldest victim? If
                # not, the steps from s + 1 on are settled and the run goes on to the next event.
                i = front[0]
                n = nsq[i]
                if N + n > max_seqs:
                    blocked = "seqs"
                else:
                    gsh = prm[i] // B if n > 1 else Pb
                    need_of, head_need = i, (gsh - Pb) + n * (-(-held[i][0] // B) - gsh)  # kept while it waits
                    if head_need > P - (U + N * (s + 1) + (slack >> w * ((s + 1) % B) & m)) // B:
                        blocked = "memory"
                settled = blocked is not None
        elif not settled:
            blocked = None
            ext_now = 0
            seqs = N
            free_blocks = P - b_now  # paged
            while nfront or lo < nxt:
                if nfront:
                    i = front[0]
                    t, admit_ps, ttft_ps = held[i]
                    started = True
                    p_i = prm[i]
                else:
                    i = lo
                    t = p_i = prm[i]
                    started = False
                n = nsq[i]
                if seqs + n > max_seqs:
                    blocked = "seqs"
                    break
                cost = t if (recompute or not started) else 0
                if cost > mnbt - prefill and prefill:  # model.fits_budget
                    blocked = "budget"
                    break
                if paged:
                    gsh = p_i // B if n > 1 else Pb
                    if i != need_of:  # the head blocked at the last attempt is asked again: its need is kept
                        need = (gsh - Pb) + n * (-(-t // B) - gsh)
                        need_of, head_need = i, need
                    else:
                        need = head_need
                    if not running:
                        need += Pb  # the shared prefix's blocks come back with the first request
                    if need > free_blocks:
                        blocked = "memory"
                        break
                    free_blocks -= need
                    offs, size = (), 0
                else:
                    gsh = 0
                    if i != size_of:  # the head blocked at the last attempt is asked again: its size is kept
                        o_i = out[i]
                        size = mml if r_max else (min(p_i + (1 << (o_i - 1).bit_length()), mml) if r_pow2 else
                                                  p_i + o_i)
                        if buddy:
                            size = 1 << (size - 1).bit_length()
                        size_of, head_size = i, size
                    else:
                        size = head_size
                    if pool - alloc_contig < n * size:
                        blocked = "memory"
                        break
                    if n == 1:
                        off = allocate(size)
                        if off is None:
                            blocked = "memory"
                            ext_now = pool - alloc_contig  # room enough in total, none in one piece
                            break
                        offs = (off,)
                    else:
                        got = []
                        for _ in range(n):
                            off = allocate(size)
                            if off is None:
                                break
                            got.append(off)
                        if len(got) < n:
                            for off in got:
                                release(off)
                            blocked = "memory"
                            ext_now = pool - alloc_contig
                            break
                        offs = tuple(got)
                f = p_i + out[i]
                if started:
                    front.popleft()
                    nfront -= 1
                    del held[i]
                else:
                    lo += 1
                    queue_ps += now - arr[i]
                    admit_ps, ttft_ps = now, -1  # -1: the end of this step, set below
                prefill += cost
                order += 1
                tb = t - s
                if paged:
                    blocks_f = -(-f // B)
                    wfrom = B * (blocks_f - 1) + 1 - tb  # the step its tokens enter the last block
                    r = [i, tb, n, wfrom if wfrom > s else s, n * (B * blocks_f - f), gsh, offs, size, admit_ps,
                         ttft_ps]
                    U += B * ((gsh - Pb) - n * gsh) + n * tb
                    row = rows[tb % B]
                    if row is None:
                        row = rows[tb % B] = packed_row(tb % B, B, w)
                    slack += row * n
                else:
                    r = [i, tb, n, s, n * (size - f), gsh, offs, size, admit_ps, ttft_ps]
                    U += n * tb
                    alloc_contig += n * size
                running[order] = r
                if ttft_ps < 0:
                    fresh.append(r)
                N += n
                heappush(heap, (f - tb) << _SHIFT | order)  # completes at the end of that step
                seqs += n
            settled = blocked == "memory" or blocked == "seqs"
        waiting = nfront or lo < nxt
        # progress guard (rule 6): admission ran, yet nothing runs, so nothing will ever free memory or
        # budget for the head of the queue
        stuck = not preempted and not running and bool(waiting)
        u0 = U + N * s if running else 0  # used slots at step s
        if check:
            used, allocated = u0, (u0 + (slack >> w * (s % B) & m) if paged else alloc_contig) if running else 0
            check_invariants(locals())

        # -- steps [s, end) in closed form: from here on until the next event, every running sequence
        # just gains a token per step and nothing can be admitted (the attempt at s decided it)
        pre_ps = pre * prefill  # step s's prefill compute
        if not running or (preempted and not settled) or stuck or (blocked == "budget" and prefill):
            end = s + 1  # the next step must try again (or nothing runs)
        else:
            c = heap[0] >> _SHIFT  # the next completion, at the end of step c
            # step c can be in the run when it admits nothing: the queue is settled, or empty and no
            # arrival comes by its start (checked below); then its completions end the run
            end = c + 1 if (c == s or settled or not waiting) else c
            if nxt < total and not waiting:
                # an arrival is an event only when nobody waits (behind a blocked head, FCFS, it just
                # joins the queue): the first step starting at or after it is the quadratic's root
                gap = arr[nxt] - now - pre_ps
                if gap <= 0:
                    end = s + 1
                else:
                    hi = end - s
                    a1, a2 = base + tok * u0, tok * N
                    if a1 * hi + a2 * hi * (hi - 1) // 2 >= gap:
                        arrival_at = s + _first_reaching(gap, a1, a2)
                        if arrival_at < end:
                            end = arrival_at
            if paged and end - 1 > s:
                x = end - 1
                if U + N * x + (slack >> w * (x % B) & m) > B * P:  # the pool runs out at a step before `end`: which
                    limit = B * (P + 1)  # out at x  <=>  U + N x + slack(x) >= limit; 0 <= slack <= N (B - 1)
                    lo_x = max(s + 1, -(-(limit - U - N * (B - 1)) // N))
                    hi_x = min(x, -(-(limit - U) // N))
                    while lo_x < hi_x:
                        mid = (lo_x + hi_x) // 2
                        if U + N * mid + (slack >> w * (mid % B) & m) >= limit:
                            hi_x = mid
                        else:
                            lo_x = mid + 1
                    end = lo_x
        count = end - s
        used_sum = count * u0 + N * count * (count - 1) // 2
        if paged:
            full, rem = divmod(count, B)
            alloc_sum = used_sum + full * N * sum_all  # a sequence's slack over B steps: 0 + ... + B - 1
            if rem:
                r0 = s % B  # the slack over residues r0 .. r0 + rem - 1 (mod B): a difference of running sums
                r1 = r0 + rem
                alloc_sum -= slack >> (wB + w * r0) & m
                alloc_sum += (slack >> (wB + w * r1) & m) if r1 < B else N * sum_all + (
                    slack >> (wB + w * (r1 - B)) & m if r1 > B else 0)
        else:
            alloc_sum = count * alloc_contig
        sum_token += used_sum
        sum_alloc += alloc_sum
        sum_ext += count * ext_now
        sum_batch += count * N
        if N > peak_batch:  # noqa: PLR1730
            peak_batch = N
        after = now + pre_ps + count * base + tok * used_sum  # the clock at the end of step end - 1
        if N:
            busy += after - now
        if fresh:  # the first token comes out of the step that prefilled the prompt
            first_token = now + pre_ps + base + tok * u0
            for r in fresh:
                r[_TTFT] = first_token
        if count > 1 or tl_every:
            last_used = u0 + N * (count - 1)
            last_start = after - base - tok * last_used - (pre_ps if count == 1 else 0)
            if tl_every and (steps + count) // tl_every != steps // tl_every:
                x = end - 1
                _point(timeline, running, pool, x, last_start, last_used,
                       (last_used + (slack >> w * (x % B) & m) if paged else alloc_contig) if running else 0, ext_now)
                if len(timeline) >= 2 * timeline_points:  # the run is longer than guessed: every other point
                    del timeline[1::2]
                    tl_every *= 2
            if waiting and count > 1:  # arrivals during the run join the queue behind its blocked head
                nxt = bisect_right(arr, last_start, nxt)
                if nfront + nxt - lo > peak_waiting:  # noqa: PLR1730
                    peak_waiting = nfront + nxt - lo
        now = after
        steps += count
        s = end - 1

        # -- completions at the end of step s (rule 5) ------------------------------------------------
        freed = False
        while heap and heap[0] >> _SHIFT == s:
            r = running.pop(heappop(heap) & _MASK, None)
            if r is None:
                continue  # stale: preempted since
            i, tb, n, wfrom, waste, gsh, offs, size, admit_ps, ttft_ps = r
            N -= n
            if s >= wfrom:
                sum_int += waste * (s - wfrom + 1)
            if paged:
                U -= B * ((gsh - Pb) - n * gsh) + n * tb
                slack -= rows[tb % B] * n
            else:
                U -= n * tb
                alloc_contig -= n * size
                for off in offs:
                    release(off)
            completed += 1
            generated += n * out[i]
            a = arr[i]
            add_queue(admit_ps - a)
            add_ttft(ttft_ps - a)
            add_e2e(now - a)
            freed = True
        if freed:
            settled = False
        s += 1
        if stuck:
            why = no_progress_reason(blocked)
            reasons[why] = reasons.get(why, 0) + 1
            rejected += 1
            settled = False
            if nfront:
                del held[front.popleft()]
                nfront -= 1
            else:
                lo += 1
        if progress is not None and completed + rejected >= next_report:
            progress(completed + rejected)
            next_report = completed + rejected + stride

    if progress is not None:
        progress(n_total)
    denom = max(1, steps) * pool
    busy_s = busy / 1e12
    return SimResult(
        allocator=alloc.name,
        token_states_frac=sum_token / denom, reserved_frac=(sum_alloc - sum_token - sum_int) / denom,
        internal_frag_frac=sum_int / denom, external_frag_frac=sum_ext / denom,
        free_frac=(steps * pool - sum_alloc - sum_ext) / denom,
        mean_batch_size=sum_batch / max(1, steps), peak_batch_size=peak_batch, preemptions=preemptions,
        completed=completed, rejected=sum(reasons.values()), rejected_reasons=dict(reasons),
        makespan_steps=steps, makespan_seconds=(now - first_arrival) / 1e12 if steps else 0.0,
        generated_tokens=generated, throughput_tokens_per_s=generated / busy_s if busy else 0.0,
        busy_seconds=busy_s, drain_seconds=(now - last_arrival) / 1e12 if steps else 0.0,
        peak_waiting=peak_waiting, mean_queue_seconds=queue_ps / max(1, completed) / 1e12,
        timeline=tuple(timeline), latency=latency_of(lat_queue, lat_ttft, lat_e2e) if completed else None,
    )


def _point(timeline: list, running: dict, pool: int, x: int, clock: int, used: int, allocated: int,
           ext: int) -> None:
    """A timeline point: (step, clock ps at its start, token, reserved, internal, external, free slots)."""
    internal = sum(r[_WASTE] for r in running.values() if x >= r[_WFROM])
    timeline.append((x, clock, used, allocated - used - internal, internal, ext, pool - allocated - ext))
