"""The event-driven simulator: cost grows with allocation events, not with token steps.

Between events (arrivals, admissions, completions, preemptions, a sequence entering its last block)
every running sequence just gains a token per step, so the state is kept in aggregates and whole
runs of steps are accounted in closed form:

- a running group's tokens are ``t(s) = tb + s`` (``tb`` fixed while it runs), so the weighted token
  sum is ``TBW + N * s``;
- for paged pools the unused slots of each sequence's last block depend only on ``(tb + s) mod B``,
  so the total slack is kept for each of the ``B`` residues of the step (O(B) to update when a
  sequence starts or stops, O(1) to read), which gives the block count (and the step the pool runs
  out, by bisection) and, summed over a run of steps, the allocated memory;
- step durations are linear in the tokens held, so the clock over a run of steps is a closed form
  and the step an arrival lands on is found by bisection.
The reference in tests/core/sim/reference.py runs every step and every sequence; both give the same
results (a hypothesis test).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from kvplan.core.sim.model import (AllocatorSpec, SimConfig, SimRequest, SimResult, fits_budget, no_progress_reason,
                                   prefill_cost, rejection)
from kvplan.core.sim.placement import make_placement


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(eq=False)
class _Group:
    req: SimRequest
    t: int  # tokens per sequence when not running (waiting/preempted)
    tb: int = 0  # t - s while running
    order: int = 0
    epoch: int = 0
    started: bool = False
    offsets: tuple[int, ...] = ()
    region: int = 0
    s_adm: int = 0  # step of admission
    s_enter: int = 0  # first step its unused slots are waste (paged: tokens in its last block)
    waste: int = 0  # slots it holds that it will never use, from s_enter on
    g_shared: int = 0  # blocks shared within the group (or the global prefix for n == 1)


@dataclass
class _Sums:
    token: int = 0
    allocated: int = 0
    internal: int = 0  # added when a group stops running: its waste times the steps it was wasted
    external: int = 0
    free: int = 0
    batch: int = 0
    timeline: list = field(default_factory=list)


def simulate(requests: list[SimRequest], cfg: SimConfig, alloc: AllocatorSpec, *,
             progress: Callable[[int], None] | None = None, timeline_points: int = 0,
             check_invariants: bool = False) -> SimResult:
    """Run one allocator over the requests. ``check_invariants`` verifies the books at every event."""
    sim = _Sim(requests, cfg, alloc, progress, timeline_points)
    sim.check = check_invariants
    return sim.run()


class _Sim:
    def __init__(self, requests: list[SimRequest], cfg: SimConfig, alloc: AllocatorSpec,
                 progress: Callable[[int], None] | None, timeline_points: int) -> None:
        self.cfg, self.alloc, self.progress = cfg, alloc, progress
        self.B = alloc.block_size
        self.paged = alloc.paged
        self.pool_blocks = cfg.pool_slots // self.B
        self.Pb = cfg.shared_prefix // self.B if (self.paged and cfg.prefix_caching and cfg.shared_prefix > 0) else 0
        self.place = None if self.paged else make_placement(alloc.placement, cfg.pool_slots)
        self.reasons: dict[str, int] = {}
        pending = []
        for r in sorted(requests, key=lambda r: (r.arrival_ps, r.id)):
            why = rejection(r, cfg, alloc)
            if why:
                self.reasons[why] = self.reasons.get(why, 0) + 1
            else:
                pending.append(r)
        self.pending = pending
        self.next_arrival = 0
        self.waiting: deque[_Group] = deque()
        self.running: dict[int, _Group] = {}  # admission order -> group (insertion ordered)
        self.order = 0
        # aggregates over running groups
        self.N = 0  # sequences
        self.TBW = 0  # sum of n * tb
        self.CB = 0  # paged: sum of (G - Pb) - n * G
        # paged: slack of all last blocks, by step mod B (sequences' phases tb mod B are fixed while they run)
        self.slack_by_r = [0] * self.B
        self.slack_rows = [[(-q - r) % self.B for r in range(self.B)] for q in range(self.B)]
        self.allocated_contig = 0
        self.free_blocks = self.pool_blocks
        self.events: list[tuple[int, int, int, _Group]] = []  # completions: (step, order, epoch, group)
        self.ext_now = 0
        self.s = 0
        self.now = 0
        self.sums = _Sums()
        self.steps = 0
        self.completed = 0
        self.generated = 0
        self.preemptions = 0
        self.peak_batch = 0
        self.peak_waiting = 0
        self.queue_ps = 0
        self.busy_ps = 0  # clock over steps with something running
        self.last_arrival = pending[-1].arrival_ps if pending else 0  # the drain starts here
        self.timeline_every = 0
        self.timeline_points = timeline_points
        self.check = False
        self.total_requests = len(requests)

    def _check_invariants(self, s: int) -> None:
        """Every request accounted for; memory adds up; nothing held twice (placement regions disjoint)."""
        accounted = (self.completed + sum(self.reasons.values()) + len(self.running) + len(self.waiting)
                     + len(self.pending) - self.next_arrival)
        assert accounted == self.total_requests, "a request was lost"
        used = self._used(s) if self.running else 0
        allocated = self._allocated(s)
        assert 0 <= used <= allocated <= self.cfg.pool_slots, (used, allocated)
        assert 0 <= self._internal_now(s) <= allocated - used
        if self.paged:
            assert self._blocks(s) <= self.pool_blocks if self.running else True
            truth = sum(g.req.n * (g.tb + s) for g in self.running.values())
            assert truth == self.TBW + self.N * s
        else:
            regions = sorted((off, g.region) for g in self.running.values() for off in g.offsets)
            for (a, size), (b, _) in zip(regions, regions[1:]):
                assert a + size <= b, "two reservations overlap"
            assert sum(size for _, size in regions) == self.allocated_contig
            assert self.place.free_slots() == self.cfg.pool_slots - self.allocated_contig  # type: ignore[union-attr]

    # -- aggregates ---------------------------------------------------------------------------
    def _used(self, s: int) -> int:
        w = self.TBW + self.N * s
        if self.paged:
            return self.B * (self.CB + (self.Pb if self.running else 0)) + w
        return w

    def _slack(self, s: int) -> int:
        return self.slack_by_r[s % self.B]

    def _phase(self, tb: int, n: int) -> None:
        row = self.slack_rows[tb % self.B]
        self.slack_by_r = [a + n * b for a, b in zip(self.slack_by_r, row)]

    def _slack_sum(self, s0: int, count: int) -> int:
        """Sum of the slack over steps [s0, s0 + count)."""
        b = self.B
        by_r = self.slack_by_r
        full, rem = divmod(count, b)
        total = full * sum(by_r)
        r0 = s0 % b
        if rem:
            end = r0 + rem
            total += sum(by_r[r0:end]) if end <= b else sum(by_r[r0:]) + sum(by_r[: end - b])
        return total

    def _blocks(self, s: int) -> int:
        """Blocks held at step s (paged): every used slot plus the slack of each sequence's last block."""
        return (self._used(s) + self._slack(s)) // self.B

    def _add(self, g: _Group, s: int) -> None:
        n = g.req.n
        g.tb = g.t - s
        self.order += 1
        g.order = self.order
        g.epoch += 1
        self.running[g.order] = g
        self.N += n
        self.TBW += n * g.tb
        f = g.req.final_len
        heapq.heappush(self.events, (f - g.tb, g.order, g.epoch, g))  # completion at the end of that step
        g.s_adm = s
        if self.paged:
            g.g_shared = self._shared_blocks(g)
            self.CB += (g.g_shared - self.Pb) - n * g.g_shared
            self._phase(g.tb, n)
            g.s_enter = self.B * (_cdiv(f, self.B) - 1) + 1 - g.tb  # the step its tokens enter the last block
            g.waste = n * (self.B * _cdiv(f, self.B) - f)
        else:
            self.allocated_contig += n * g.region
            g.s_enter = s
            g.waste = n * (g.region - f)

    def _internal_now(self, s: int) -> int:
        """Internal fragmentation held at step s (a scan: for checks and timeline points only)."""
        return sum(g.waste for g in self.running.values() if s >= g.s_enter)

    def _remove(self, g: _Group, s: int) -> None:
        """Stop running g; ``s`` is the last step it was accounted in."""
        n = g.req.n
        g.t = g.tb + s
        del self.running[g.order]
        self.N -= n
        self.TBW -= n * g.tb
        self.sums.internal += g.waste * max(0, s - max(g.s_enter, g.s_adm) + 1)
        if self.paged:
            self.CB -= (g.g_shared - self.Pb) - n * g.g_shared
            self._phase(g.tb, -n)
        else:
            self.allocated_contig -= n * g.region
            for off in g.offsets:
                self.place.free(off)  # type: ignore[union-attr]
            g.offsets = ()

    def _shared_blocks(self, g: _Group) -> int:
        """Blocks a sequence shares: the group's prompt blocks (n > 1), else the global prefix's."""
        return g.req.prompt // self.B if g.req.n > 1 else self.Pb

    def _group_blocks(self, g: _Group, t: int) -> int:
        shared = self._shared_blocks(g)
        return (shared - self.Pb) + g.req.n * (_cdiv(t, self.B) - shared)

    def _region(self, g: _Group) -> int:
        if not g.region:
            need = self.alloc.reservation_slots(g.req.final_len, self.cfg.max_model_len)
            g.region = self.place.rounded(need)  # type: ignore[union-attr]
        return g.region

    # -- one step in full ----------------------------------------------------------------------
    def _full_step(self) -> bool:
        """Run step self.s with every rule; True when memory was freed (next step may admit)."""
        s = self.s
        pend = self.pending
        while self.next_arrival < len(pend) and pend[self.next_arrival].arrival_ps <= self.now:
            r = pend[self.next_arrival]
            self.waiting.append(_Group(req=r, t=r.prompt))
            self.next_arrival += 1
        self.peak_waiting = max(self.peak_waiting, len(self.waiting))

        preempted = False
        if self.paged and self.running:
            self.free_blocks = self.pool_blocks - self._blocks(s - 1)
            if self._blocks(s) > self.pool_blocks:
                preempted = self._preempt(s)
        events = self.events
        while events and events[0][0] < s:  # stale completions of groups preempted since
            _, order, epoch, g = heapq.heappop(events)
            assert self.running.get(order) is not g or g.epoch != epoch, "a completion was missed"

        prefill = 0
        blocked = None
        if not preempted:
            prefill, blocked = self._admit(s)
        # progress guard (model.py rule 6): admission ran, yet nothing runs, so nothing will ever free
        # memory or budget for the head of the queue
        stuck = not preempted and bool(self.waiting) and not self.running
        self._account_step(s, prefill, blocked)
        if self.check:
            self._check_invariants(s)
        freed = self._complete(s)
        self.s += 1
        if stuck:
            why = no_progress_reason(blocked)
            self.reasons[why] = self.reasons.get(why, 0) + 1
            self.waiting.popleft()
            return True
        # the next step must try to admit when someone waits and memory was freed, or the budget refills
        # for a head held back only by this step's prefill
        return bool(self.waiting) and (freed or preempted or (blocked == "budget" and prefill > 0))

    def _preempt(self, s: int) -> bool:
        """Growth at step s does not fit: preempt the youngest groups until it does (model.py rule 2).

        Equivalent to the reference's oldest-first growth loop: the oldest k groups survive for the
        largest k whose growth fits in the free blocks plus what the younger groups release. Walking
        from the youngest costs O(victims), not O(running).
        """
        need = self._blocks(s) - self._blocks(s - 1)  # growth of every running group at step s
        free = self.free_blocks
        released = 0
        victims = []
        for order in reversed(self.running):
            if need <= free + released:
                break
            g = self.running[order]
            t = g.tb + s - 1
            need -= g.req.n * (_cdiv(t + 1, self.B) - _cdiv(t, self.B))
            released += self._group_blocks(g, t)
            victims.append(g)
        if len(victims) == len(self.running):
            released += self.Pb
        for g in victims:  # youngest first, each to the front of the queue
            self._remove(g, s - 1)  # a victim has not grown this step
            self.waiting.appendleft(g)
            self.preemptions += 1
        return bool(victims)

    def _admit(self, s: int) -> tuple[int, str | None]:
        cfg = self.cfg
        prefill = 0
        blocked = None
        seqs = self.N
        if self.paged:
            self.free_blocks = self.pool_blocks - (self._blocks(s) if self.running else 0)
        while self.waiting:
            g = self.waiting[0]
            n = g.req.n
            if seqs + n > cfg.max_num_seqs:
                blocked = "seqs"
                break
            cost = prefill_cost(g.t, g.started, cfg)
            if not fits_budget(cost, prefill, cfg):
                blocked = "budget"
                break
            if self.paged:
                need = self._group_blocks(g, g.t) + (self.Pb if not self.running else 0)
                if need > self.free_blocks:
                    blocked = "memory"
                    break
                self.free_blocks -= need
            else:
                size = self._region(g)
                got = []
                for _ in range(n):
                    off = self.place.allocate(size)  # type: ignore[union-attr]
                    if off is None:
                        break
                    got.append(off)
                if len(got) < n:
                    for off in got:
                        self.place.free(off)  # type: ignore[union-attr]
                    blocked = "memory"
                    break
                g.offsets, g.region = tuple(got), size
            self.waiting.popleft()
            if not g.started:
                self.queue_ps += self.now - g.req.arrival_ps
                g.started = True
            prefill += cost
            self._add(g, s)
            seqs += n
        self.ext_now = 0
        if blocked == "memory" and not self.paged:
            head = self.waiting[0]
            free = self.cfg.pool_slots - self.allocated_contig
            if free >= head.req.n * self._region(head):
                self.ext_now = free
        return prefill, blocked

    def _allocated(self, s: int) -> int:
        if self.paged:
            return self.B * self._blocks(s) if self.running else 0
        return self.allocated_contig

    def _account_step(self, s: int, prefill: int, blocked: str | None) -> None:
        used = self._used(s) if self.running else 0
        allocated = self._allocated(s)
        ext = self.ext_now if blocked == "memory" else 0
        sums = self.sums
        sums.token += used
        sums.allocated += allocated
        sums.external += ext
        sums.free += self.cfg.pool_slots - allocated - ext
        sums.batch += self.N
        if self.N > self.peak_batch:
            self.peak_batch = self.N
        self.steps += 1
        if self.timeline_every and self.steps % self.timeline_every == 0:
            self._timeline_point(s, self.now, used, allocated, ext)
        duration = self.cfg.step.duration(used, prefill)
        if self.N:
            self.busy_ps += duration
        self.now += duration

    def _timeline_point(self, s: int, now_ps: int, used: int, allocated: int, ext: int) -> None:
        internal = self._internal_now(s)
        self.sums.timeline.append((s, now_ps, used, allocated - used - internal, internal, ext,
                                   self.cfg.pool_slots - allocated - ext))

    def _complete(self, s: int) -> bool:
        freed = False
        while self.events and self.events[0][0] <= s:
            _, order, epoch, g = heapq.heappop(self.events)
            if self.running.get(order) is not g or g.epoch != epoch:
                continue  # stale: preempted since
            self._remove(g, s)
            self.completed += 1
            self.generated += g.req.n * g.req.output
            freed = True
        if self.progress and freed:
            self.progress(self.completed)
        return freed

    # -- runs of quiet steps -------------------------------------------------------------------
    def _clock_after(self, s0: int, count: int) -> int:
        """Clock after ``count`` quiet steps from s0 (no prefill): closed form."""
        step = self.cfg.step
        u0 = self._used(s0) if self.running else 0
        return self.now + count * step.base_ps + step.per_token_ps * (count * u0 + self.N * count * (count - 1) // 2)

    def _quiet_until(self) -> int:
        """The next step at which something happens (exclusive end of the quiet run)."""
        s = self.s
        events = self.events
        while events and (self.running.get(events[0][1]) is not events[0][3] or events[0][3].epoch != events[0][2]):
            heapq.heappop(events)  # stale
        end = events[0][0] if events else 1 << 62
        # An arrival is an event only when nobody waits: behind a blocked head (FCFS) it cannot be
        # admitted, so it just joins the queue (see _quiet_run).
        if self.next_arrival < len(self.pending) and not self.waiting:
            target = self.pending[self.next_arrival].arrival_ps
            if self.now >= target:
                return s
            lo, hi = 1, max(1, end - s)
            if self._clock_after(s, hi) >= target:
                while lo < hi:
                    mid = (lo + hi) // 2
                    if self._clock_after(s, mid) >= target:
                        hi = mid
                    else:
                        lo = mid + 1
                end = min(end, s + lo)
        if self.paged and self.running:
            # the first step whose growth does not fit
            def over(x: int) -> bool:
                return self._blocks(x) > self.pool_blocks

            if end - 1 >= s and over(end - 1):
                lo, hi = s, end - 1
                while lo < hi:
                    mid = (lo + hi) // 2
                    if over(mid):
                        hi = mid
                    else:
                        lo = mid + 1
                end = lo
        return end

    def _quiet_run(self, end: int) -> None:
        """Account steps [self.s, end) in closed form: growth only, nothing admitted or freed."""
        s0, count = self.s, end - self.s
        if count <= 0:
            return
        used0 = self._used(s0)
        used_sum = count * used0 + self.N * count * (count - 1) // 2
        if self.paged:
            allocated_sum = used_sum + self._slack_sum(s0, count)
        else:
            allocated_sum = count * self.allocated_contig
        ext = self.ext_now
        sums = self.sums
        sums.token += used_sum
        sums.allocated += allocated_sum
        sums.external += count * ext
        sums.free += count * self.cfg.pool_slots - allocated_sum - count * ext
        sums.batch += count * self.N
        if self.timeline_every:
            last = end - 1
            self._timeline_point(last, self._clock_after(s0, count - 1), self._used(last), self._allocated(last), ext)
        # arrivals during the run join the queue behind its blocked head (only when someone waits)
        if self.waiting:
            last_start = self._clock_after(s0, count - 1)  # clock at the start of the run's last step
            pend = self.pending
            while self.next_arrival < len(pend) and pend[self.next_arrival].arrival_ps <= last_start:
                r = pend[self.next_arrival]
                self.waiting.append(_Group(req=r, t=r.prompt))
                self.next_arrival += 1
            self.peak_waiting = max(self.peak_waiting, len(self.waiting))
        after = self._clock_after(s0, count)
        if self.N:
            self.busy_ps += after - self.now
        self.now = after
        self.steps += count
        self.s = end

    def run(self) -> SimResult:
        total = len(self.pending)
        if self.timeline_points:
            self.timeline_every = max(1, (sum(r.output for r in self.pending) // max(1, self.cfg.max_num_seqs) + total)
                                      // self.timeline_points)
        first_arrival = self.pending[0].arrival_ps if self.pending else 0
        must_step = True
        while self.next_arrival < total or self.waiting or self.running:
            if not self.waiting and not self.running:
                self.now = max(self.now, self.pending[self.next_arrival].arrival_ps)
                must_step = True
            if must_step:
                must_step = self._full_step()
                continue
            end = self._quiet_until()
            if end > self.s:
                self._quiet_run(end)
            must_step = self._full_step()
        return self._result(first_arrival)

    def _result(self, first_arrival: int) -> SimResult:
        steps = self.steps
        denom = max(1, steps) * self.cfg.pool_slots
        seconds = (self.now - first_arrival) / 1e12 if steps else 0.0
        busy = self.busy_ps / 1e12
        drain = (self.now - self.last_arrival) / 1e12 if steps else 0.0
        s = self.sums
        return SimResult(
            allocator=self.alloc.name,
            token_states_frac=s.token / denom, reserved_frac=(s.allocated - s.token - s.internal) / denom,
            internal_frag_frac=s.internal / denom, external_frag_frac=s.external / denom, free_frac=s.free / denom,
            mean_batch_size=s.batch / max(1, steps), peak_batch_size=self.peak_batch, preemptions=self.preemptions,
            completed=self.completed, rejected=sum(self.reasons.values()), rejected_reasons=dict(self.reasons),
            makespan_steps=steps, makespan_seconds=seconds, generated_tokens=self.generated,
            throughput_tokens_per_s=self.generated / busy if busy else 0.0, busy_seconds=busy,
            drain_seconds=drain, peak_waiting=self.peak_waiting,
            mean_queue_seconds=self.queue_ps / max(1, self.completed) / 1e12, timeline=tuple(s.timeline),
        )
