"""vLLM's data parallelism (``-dp N``): N engines, each its own scheduler and KV pool, behind the front end's load
balancer, which sends each request to one engine as it arrives.

The balancer (v1/engine/core_client.py::DPLBAsyncMPClient.get_core_engine_for_request, one API server) scores each
engine from the counts the DP coordinator last published (v1/engine/coordinator.py: each engine's waiting and
running requests and, from 0.27.0, its KV cache usage, published at most every 100 ms) and the balancer's own
books, takes the lowest score (ties: the first in a scan whose start rotates by one each request), and adds one to
that engine's waiting count until the next publication. The score is a release's rule (RouterRules, carried by the
release's scheduler rules: kvplan.core.engines.vllm.scheduler_rules).

How the simulation runs it: each rank is the exact v1 loop (rank_sim), driven in
time order. Before each arrival, and at each 100 ms publication before it, every rank is run up to that time and
reports its queues, free blocks and finished requests (scheduler.View); the request is sent to the rank the rule
picks. Once every request is sent, each rank's own run over the requests it was sent gives its result (the same
loop, so the same figures: the tests hold the two to each other), and the ranks' results are merged.

What is not modelled, said in the run's notes: the coordinator publishes on its own wall clock, and the engines'
step reports reach it a little late (kvplan publishes exactly at each 100 ms mark what each rank has done by its
first step boundary at or after it); an MoE model's ranks run in lockstep (an idle rank runs dummy batches, and
the collectives make each step as long as the busiest rank's), where kvplan times each rank's steps on its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from kvplan.core.engines.vllm.scheduler_rules import RouterRules, Score
from kvplan.core.sim.v1.inputs import V1Inputs, V1Request
from kvplan.core.sim.v1.outcome import latency
from kvplan.core.sim.v1.result import TierStats, V1Result
from kvplan.core.sim.v1.ranks import View
from kvplan.core.sim.v1.scheduler import _Sim, simulate_v1
from kvplan.core.sim.v1.setup import checked_columns
from kvplan.core.sim.v1.tables import Columns, RequestRecords, RequestTable
from kvplan.errors import InputError

MAX_RANKS = 512


@dataclass(frozen=True, kw_only=True)
class DPResult:
    """Each rank's run over the requests it was sent (``rows``: their rows in the inputs' requests, in arrival
    order), and the ranks together (``merged``: V1Result's fields over every request; see ``merge``)."""

    ranks: tuple[V1Result, ...]
    rows: tuple[tuple[int, ...], ...]
    merged: V1Result


def rank_sim(inputs: V1Inputs, routed: list[int], columns: Columns) -> _Sim:
    """One data-parallel rank's scheduler for a router to drive: ``routed`` holds the rows of ``inputs.requests``
    sent to it so far, in arrival order, and grows as the router sends more; ``steps()`` runs it until it needs to
    know what arrives next. ``columns``: the requests' (checked_columns), read once for all ranks."""
    sim = _Sim(inputs, False, routed=routed, columns=columns)
    sim.per_step = False
    sim.open = True
    return sim


def simulate_dp(inputs: V1Inputs, size: int, rules: RouterRules, *, moe: bool = False, servers: int | None = None,
                per_step: bool = False, timeline_points: int = 0) -> DPResult:
    """``size`` engines under ``inputs``' scheduler and pool, the requests sent by ``rules``' balancers (``servers``
    API servers; None: the release's default); ``moe``: the model has experts (its engines publish their counts in
    every release)."""
    if not 1 <= size <= MAX_RANKS:
        raise InputError(f"data-parallel size must be between 1 and {MAX_RANKS} (got {size})")
    if inputs.allocator is not None and not inputs.allocator.paged:
        raise InputError(f"{inputs.allocator.name}: data-parallel ranks are simulated with vLLM's paged pool only; "
                         "compare allocators on one engine (data_parallel_size 1)")
    rows = route(inputs, size, rules, moe=moe, servers=servers)
    ranks = tuple(simulate_v1(dataclasses.replace(inputs, requests=subset(inputs.requests, r)), per_step=per_step,
                              timeline_points=timeline_points) for r in rows)
    return DPResult(ranks=ranks, rows=rows, merged=merge(inputs, ranks, rows))


def api_servers(rules: RouterRules, size: int, servers: int | None) -> int:
    """The balancers: the servers given, else one, or one per engine from 0.15.0 (RouterRules.servers_per_engine)."""
    if servers is not None:
        if not 1 <= servers <= MAX_RANKS:
            raise InputError(f"api_server_count must be between 1 and {MAX_RANKS} (got {servers})")
        return servers
    return size if rules.servers_per_engine else 1


@dataclass
class _Balancer:
    """One API server's DPLBAsyncMPClient: the counts last published with its own additions, where its scan starts,
    and its requests in flight on each engine."""

    counts: list[list[float]]
    start: int
    in_flight: list[int]


def route(inputs: V1Inputs, size: int, rules: RouterRules, *, moe: bool = False, servers: int | None = None,
          finals: list[tuple[int, ...]] | None = None) -> tuple[tuple[int, ...], ...]:
    """The rows of ``inputs.requests`` each rank is sent, in arrival order: the ranks run side by side in time.
    Requests reach the API servers in turn (an assumption: the kernel spreads connections over them). ``finals``
    (tests) gets each rank's closing figures as it ran here (steps, preemptions, completed, generated tokens, clock),
    which its own run over the same requests must repeat."""
    cols = checked_columns(inputs)
    if cols.arrival_ps is None:
        raise InputError("data-parallel ranks need requests that arrive in time (a step-time model)")
    arrival = cols.arrival_ps
    clients = api_servers(rules, size, servers)
    reports = moe or rules.dense_counts  # engines that publish their counts (else the balancers see zeros)
    sent: list[list[int]] = [[] for _ in range(size)]
    sims = [rank_sim(inputs, sent[r], cols) for r in range(size)]
    loops = [sim.steps() for sim in sims]
    views: list[View] = [next(loop) for loop in loops]  # each runs until it waits for the router
    finished = [0] * size  # of each rank's finished rows (sim.finished), those already taken off the books

    def run_to(t: int) -> None:
        for r, sim in enumerate(sims):
            sim.horizon = t
            views[r] = next(loops[r])

    balancers = [_Balancer(counts=[[0, 0, 0.0] for _ in range(size)], start=size * c // clients,
                           in_flight=[0] * size) for c in range(clients)]
    client_of: dict[int, int] = {}
    published: list[tuple[int, int]] | None = None
    last_publication = 0
    last_mark = -1
    sent_since = 0  # requests sent since the last publication
    ended_then = [0] * size  # requests each rank had finished at the last publication
    for n, row in enumerate(cols.arrival_order()):
        t = arrival[row]
        mark = t // rules.interval_ps * rules.interval_ps
        if mark > last_mark:  # the coordinator's publication at the last 100 ms mark, if it made one
            last_mark = mark
            run_to(mark)
            now = [(v.waiting, v.running) if reports else (0, 0) for v in views]
            # an engine reports each change of its counts; a request sent or finished since changed them even where
            # they are back where they were (a preemption alone shows only if the counts differ now)
            ended = [len(sim.finished) for sim in sims]
            moved = reports and (sent_since > 0 or ended != ended_then)
            if now != published or moved or mark - last_publication >= rules.republish_ps:
                sent_since, ended_then = 0, ended
                # after a change at this mark; else the unchanged counts again, every 5 s since the last time
                last_publication = mark if (now != published or moved) else (
                    last_publication + (mark - last_publication) // rules.republish_ps * rules.republish_ps)
                published = now
                usage = [1.0 - v.free / v.capacity if reports and v.capacity else 0.0 for v in views]
                for b in balancers:  # each balancer's counts replaced: its own additions dropped
                    b.counts = [[w, r, u] for (w, r), u in zip(now, usage)]
        run_to(t)
        for r, sim in enumerate(sims):  # requests finished by now leave their balancer's books
            done = sim.finished
            for i in range(finished[r], len(done)):
                balancers[client_of.pop(done[i])].in_flight[r] -= 1
            finished[r] = len(done)
        c = n % clients
        b = balancers[c]
        r = pick(rules, b.counts, b.in_flight, b.start, clients)
        b.counts[r][0] += clients
        b.in_flight[r] += 1
        if rules.rotate:
            b.start = (b.start + 1) % size
        sent[r].append(row)
        client_of[row] = c
        sent_since += 1
    for sim, loop in zip(sims, loops):
        sim.open = False
        for _ in loop:  # pragma: no cover - a closed rank never yields
            raise AssertionError("a closed rank yielded")
        if finals is not None:
            finals.append(sim.final)
    return tuple(tuple(s) for s in sent)


def pick(rules: RouterRules, counts: Sequence[Sequence[float]], in_flight: Sequence[int], start: int,
         clients: int = 1) -> int:
    """The engine a balancer sends the next request to: the lowest score, the first scanned from ``start`` among
    equals (``clients``: the API servers, each one balancer)."""
    size = len(counts)
    best, best_score = start, float("inf")
    for i in range(size):
        idx = (start + i) % size
        waiting, running, usage = counts[idx]
        if rules.score is Score.QUEUE:
            score = waiting * 4 + running
        else:
            score = max(clients * in_flight[idx], waiting + running)
            if waiting:
                score += waiting * 6.0 * max(0.0, usage - 0.5)
        if score < best_score:
            best, best_score = idx, score
    return best


def subset(requests: Sequence[V1Request], rows: Sequence[int]) -> Sequence[V1Request]:
    """The requests at ``rows``, in that order: a table's rows copied into a table of their own."""
    if isinstance(requests, RequestTable):
        table = RequestTable()
        for i in rows:
            q = requests[i]
            table.append(q.prompt, q.output, q.arrival_ps or 0)
        return table
    return tuple(requests[i] for i in rows)


def merge(inputs: V1Inputs, ranks: Sequence[V1Result], rows: Sequence[Sequence[int]]) -> V1Result:
    """The ranks together: requests, tokens, preemptions and the CPU tier summed; means over all the ranks' steps
    (running requests, KV usage, the pool's shares); peaks, the clock and busy seconds the largest; throughput
    the ranks' rates summed (the engines run side by side);
    latency percentiles over every request; each request's record as its rank's (steps counted on that rank)."""
    timed = inputs.step_model is not None
    records = RequestRecords(inputs.requests, timed=timed)
    for result, where in zip(ranks, rows):
        records.place(result.per_request, where)
    steps = sum(r.steps for r in ranks)

    def mean(field: str) -> float | None:
        values = [(getattr(r, field), r.steps) for r in ranks]
        if any(v is None for v, _ in values):
            return None
        return sum(v * n for v, n in values) / steps if steps else 0.0

    prompt = sum(r.prompt_tokens for r in ranks)
    cached = sum(r.cached_tokens for r in ranks)
    busy = max((r.busy_seconds for r in ranks if r.busy_seconds is not None), default=None)
    return V1Result(
        steps=steps, mean_running=mean("mean_running") or 0.0, peak_running=max(r.peak_running for r in ranks),
        preemptions=sum(r.preemptions for r in ranks), mean_kv_usage=mean("mean_kv_usage") or 0.0,
        prompt_tokens=prompt, cached_tokens=cached, prefix_hit_rate=cached / prompt if prompt else 0.0,
        completed=sum(r.completed for r in ranks), generated_tokens=sum(r.generated_tokens for r in ranks),
        schedule_calls=max(r.schedule_calls for r in ranks), per_request=records, per_step_running=(),
        per_step_kv_usage_permille=(), per_step_scheduled_tokens=(),
        peak_kv_usage_permille=max(r.peak_kv_usage_permille for r in ranks),
        peak_waiting=max(r.peak_waiting for r in ranks), tiers=_tiers(ranks), **latency(records, timed),
        seconds=max(r.seconds for r in ranks if r.seconds is not None) if timed else None, busy_seconds=busy,
        throughput_tokens_per_s=sum(r.throughput_tokens_per_s or 0.0 for r in ranks) if timed else None,
        notes=tuple(dict.fromkeys(n for r in ranks for n in r.notes)), allocator=ranks[0].allocator,
        token_states_frac=mean("token_states_frac"), reserved_frac=mean("reserved_frac"),
        internal_frag_frac=mean("internal_frag_frac"), external_frag_frac=mean("external_frag_frac"),
        free_frac=mean("free_frac"))


def _tiers(ranks: Sequence[V1Result]) -> TierStats:
    return TierStats(**{f.name: sum(getattr(r.tiers, f.name) for r in ranks)
                        for f in dataclasses.fields(TierStats)})
