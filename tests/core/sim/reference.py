"""A slow, obviously correct step-by-step simulator: every step, every sequence, no shortcuts.

It follows the semantics in kvplan/core/sim/model.py literally, so the event-driven engine can be
checked against it on random small workloads.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kvplan.core.sim.model import (AllocatorSpec, SimConfig, SimRequest, SimResult, fits_budget, latency_of,
                                   no_progress_reason, prefill_cost, rejection)
from kvplan.core.sim.placement import make_placement


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Group:
    req: SimRequest
    t: int = 0  # tokens per sequence in the cache
    order: int = 0
    offsets: tuple[int, ...] = ()
    region: int = 0  # contiguous: slots per region after placement rounding
    started: bool = False
    queued_at: int = 0
    admitted_at: int = 0  # clock when first admitted
    first_token_at: int = 0  # clock at the end of the step that first prefilled it


def simulate_reference(requests: list[SimRequest], cfg: SimConfig, alloc: AllocatorSpec) -> SimResult:
    B = alloc.block_size
    pool_blocks = cfg.pool_slots // B
    Pb = cfg.shared_prefix // B if (alloc.paged and cfg.prefix_caching and cfg.shared_prefix > 0) else 0
    place = None if alloc.paged else make_placement(alloc.placement, cfg.pool_slots)

    reasons: dict[str, int] = {}
    pending = []
    for r in sorted(requests, key=lambda r: (r.arrival_ps, r.id)):
        why = rejection(r, cfg, alloc)
        if why:
            reasons[why] = reasons.get(why, 0) + 1
        else:
            pending.append(r)
    pending_q = deque(pending)
    waiting: deque[Group] = deque()
    running: list[Group] = []
    free_blocks = pool_blocks
    order = 0
    now = 0
    steps = 0
    completed = 0
    generated = 0
    preemptions = 0
    sums = dict(token=0, reserved=0, internal=0, external=0, free=0, batch=0)
    peak_batch = peak_waiting = 0
    queue_ps = 0
    busy_ps = 0
    first_arrival = pending[0].arrival_ps if pending else 0
    last_arrival = pending[-1].arrival_ps if pending else 0

    def G(g: Group) -> int:
        return g.req.prompt // B if g.req.n > 1 else Pb

    def group_blocks(g: Group, t: int) -> int:
        return (G(g) - Pb) + g.req.n * (cdiv(t, B) - G(g))

    lat_queue: list[int] = []
    lat_ttft: list[int] = []
    lat_e2e: list[int] = []

    def region_size(g: Group) -> int:
        need = alloc.reservation_slots(g.req.prompt, g.req.output, cfg.max_model_len)
        return place.rounded(need)  # type: ignore[union-attr]

    while pending_q or waiting or running:
        if not waiting and not running:
            now = max(now, pending_q[0].arrival_ps)
        while pending_q and pending_q[0].arrival_ps <= now:
            r = pending_q.popleft()
            waiting.append(Group(req=r, t=r.prompt, queued_at=r.arrival_ps))
        peak_waiting = max(peak_waiting, len(waiting))

        # growth
        preempted = False
        if alloc.paged:
            alive = list(running)
            i = 0
            while i < len(alive):
                g = alive[i]
                need = g.req.n * (cdiv(g.t + 1, B) - cdiv(g.t, B))
                while need > free_blocks:
                    victim = alive.pop()  # the most recently admitted
                    running.remove(victim)
                    free_blocks += group_blocks(victim, victim.t) + (Pb if not running else 0)
                    waiting.appendleft(victim)
                    preemptions += 1
                    preempted = True
                    if victim is g:
                        break
                else:
                    free_blocks -= need
                    g.t += 1
                    i += 1
        else:
            for g in running:
                g.t += 1

        # admission
        prefill = 0
        blocked = None
        first_time: list[Group] = []
        if not preempted:
            seqs = sum(g.req.n for g in running)
            while waiting:
                g = waiting[0]
                if seqs + g.req.n > cfg.max_num_seqs:
                    blocked = "seqs"
                    break
                cost = prefill_cost(g.t, g.started, cfg)
                if not fits_budget(cost, prefill, cfg):
                    blocked = "budget"
                    break
                if alloc.paged:
                    need = group_blocks(g, g.t) + (Pb if not running else 0)
                    if need > free_blocks:
                        blocked = "memory"
                        break
                    free_blocks -= need
                else:
                    size = region_size(g)
                    got = []
                    for _ in range(g.req.n):
                        off = place.allocate(size)  # type: ignore[union-attr]
                        if off is None:
                            break
                        got.append(off)
                    if len(got) < g.req.n:
                        for off in got:
                            place.free(off)  # type: ignore[union-attr]
                        blocked = "memory"
                        break
                    g.offsets, g.region = tuple(got), size
                waiting.popleft()
                if not g.started:
                    queue_ps += now - g.queued_at
                    g.started = True
                    g.admitted_at = now
                    first_time.append(g)
                prefill += cost
                order += 1
                g.order = order
                running.append(g)
                seqs += g.req.n

        stuck = not preempted and bool(waiting) and not running  # progress guard, applied at the step's end

        # accounting
        if alloc.paged:
            allocated = B * (pool_blocks - free_blocks)
            used = (B * Pb if running else 0) + sum(B * (G(g) - Pb) + g.req.n * (g.t - B * G(g)) for g in running)
            internal = sum(g.req.n * (B * cdiv(g.req.final_len, B) - g.req.final_len)
                           for g in running if cdiv(g.t, B) == cdiv(g.req.final_len, B))
        else:
            allocated = sum(g.req.n * g.region for g in running)
            used = sum(g.req.n * g.t for g in running)
            internal = sum(g.req.n * (g.region - g.req.final_len) for g in running)
        reserved = allocated - used - internal
        external = 0
        if blocked == "memory" and not alloc.paged:
            head = waiting[0]
            if cfg.pool_slots - allocated >= head.req.n * region_size(head):
                external = cfg.pool_slots - allocated
        free = cfg.pool_slots - allocated - external
        batch = sum(g.req.n for g in running)
        for k, v in (("token", used), ("reserved", reserved), ("internal", internal), ("external", external),
                     ("free", free), ("batch", batch)):
            sums[k] += v
        peak_batch = max(peak_batch, batch)
        steps += 1
        duration = cfg.step.duration(used, prefill)
        busy_ps += duration if batch else 0
        now += duration
        for g in first_time:
            g.first_token_at = now

        # completion
        for g in list(running):
            if g.t == g.req.final_len:
                running.remove(g)
                completed += 1
                generated += g.req.n * g.req.output
                lat_queue.append(g.admitted_at - g.queued_at)
                lat_ttft.append(g.first_token_at - g.queued_at)
                lat_e2e.append(now - g.queued_at)
                if alloc.paged:
                    free_blocks += group_blocks(g, g.t) + (Pb if not running else 0)
                else:
                    for off in g.offsets:
                        place.free(off)  # type: ignore[union-attr]

        if stuck:  # nothing ran after admission: nothing will ever free room for the head
            why = no_progress_reason(blocked)
            reasons[why] = reasons.get(why, 0) + 1
            waiting.popleft()

    denom = max(1, steps) * cfg.pool_slots
    seconds = (now - first_arrival) / 1e12 if steps else 0.0
    busy = busy_ps / 1e12
    return SimResult(
        allocator=alloc.name,
        token_states_frac=sums["token"] / denom, reserved_frac=sums["reserved"] / denom,
        internal_frag_frac=sums["internal"] / denom, external_frag_frac=sums["external"] / denom,
        free_frac=sums["free"] / denom, mean_batch_size=sums["batch"] / max(1, steps), peak_batch_size=peak_batch,
        preemptions=preemptions, completed=completed, rejected=sum(reasons.values()), rejected_reasons=reasons,
        makespan_steps=steps, makespan_seconds=seconds, generated_tokens=generated,
        throughput_tokens_per_s=generated / busy if busy else 0.0, busy_seconds=busy,
        drain_seconds=(now - last_arrival) / 1e12 if steps else 0.0, peak_waiting=peak_waiting,
        mean_queue_seconds=queue_ps / max(1, completed) / 1e12,
        latency=latency_of(lat_queue, lat_ttft, lat_e2e) if completed else None,
    )
