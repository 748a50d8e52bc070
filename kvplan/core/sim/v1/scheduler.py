"""vLLM v1's scheduler, one schedule() / model step / update_from_output() per loop (0.33.0), sync or async.

vllm/v1/core/sched/scheduler.py::Scheduler (FCFS policy):
- schedule(): a token budget of max_num_batched_tokens; first the running requests in order, each asking
  num_tokens - num_computed_tokens (a decode asks 1, a prefill its remainder), capped by
  long_prefill_token_threshold (only when more than one request is running or waiting), by the budget
  left and by max_model_len - num_computed - 1; when the KV cache manager cannot allocate, the last
  running request is preempted (``self.running.pop()``, _preempt_request: blocks freed, computed tokens
  reset, to the front of the waiting queue), until it can or the request preempted itself;
- then, only when nothing was preempted this step, waiting requests in order while the budget lasts and
  fewer than max_num_seqs run: the prefix-cache hit (and a connector's hit), the chunk (the rest of its
  tokens, capped by the threshold and the budget: chunked prefill), allocate_slots with the full-prompt
  gate; the first that cannot be allocated stops admission;
- _update_after_schedule: num_computed += scheduled tokens.
update_from_output(): a request whose computed tokens reach its known tokens samples one token (the
reference harness's fake runner); it stops at max_tokens or max_model_len (sched/utils.py::check_stop)
and its blocks are freed at once, in scheduling order.
Async scheduling (sched/async_scheduler.py::AsyncScheduler, engine/core.py::step_with_batch_queue with two
batches): a placeholder for each token being sampled, asked for by the next schedule(); a request whose
last token is in flight is skipped; each batch's output is processed after the next batch is scheduled
(finished requests free their blocks a batch later); a preempted request still receives its token in
flight (stale); sliding windows free on the processed tokens (KVCacheManager.allocate_slots).
Earlier releases (SchedulerConfig.rules): the threshold caps a request alone too before 0.31.0; async
scheduling schedules one more decode for a request whose last token is in flight in 0.11.0.
The KV cache manager is vLLM's paged one, or with V1Inputs.allocator a contiguous allocator behind the same
interface (contiguous.py): the loop is the same. Each counted step adds the pool's memory books to their sums
(shares.py: O(1) a step, no walk over the running requests).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator

from kvplan.core.sim.v1.contiguous import ContiguousManager
from kvplan.core.sim.v1.hashing import BlockHasher, PrivateKeys, shared_firsts
from kvplan.core.sim.v1.inputs import V1Inputs
from kvplan.core.sim.v1.offload import CPUTier
from kvplan.core.sim.v1.quiet import Quiet
from kvplan.core.sim.v1.outcome import Tally, v1_result
from kvplan.core.sim.v1.ranks import FinishedLog, View
from kvplan.core.sim.v1.result import V1Result
from kvplan.core.sim.v1.setup import check_books, checked_columns, manager_for, outgrows
from kvplan.core.sim.v1.shares import shares, split, thin, timeline_every
from kvplan.core.sim.v1.state import ReqState
from kvplan.core.sim.v1.tables import Columns, Pending, RequestRecords
from kvplan.errors import InputError

MAX_IDLE_STEPS = 1 << 40


def simulate_v1(inputs: V1Inputs, *, check_invariants: bool = False, fast_path: bool = True,
                timeline_points: int = 0, per_step: bool = True) -> V1Result:
    """Run every request to completion; ``check_invariants`` verifies the pool's books every step;
    ``fast_path=False`` calls allocate_slots for every scheduled request (the tests check both agree);
    ``timeline_points``: about that many samples of the pool's split (V1Result.timeline), 0 for none;
    ``per_step``: keep every counted step's figures (V1Result.per_step_*: a plot's, and five numbers a step, which
    a million requests' 24 million steps make gigabytes of); the peaks are kept either way."""
    sim = _Sim(inputs, check_invariants)
    sim.fast, sim.timeline_points, sim.per_step = fast_path, timeline_points, per_step
    return sim.run()


class _Sim:
    def __init__(self, inputs: V1Inputs, check: bool, *, routed: list[int] | None = None,
                 columns: Columns | None = None) -> None:
        self.inputs = inputs
        cfg = inputs.scheduler
        self.cfg = cfg
        self.mgr = manager_for(inputs)
        self.cpu = CPUTier(inputs.offload, inputs.layout, cfg.enable_prefix_caching) if inputs.offload else None
        if self.cpu is not None:
            self.mgr.deferred = False  # the CPU tier stores blocks by their keys as they fill
        self.check = check
        self.fast, self.timeline_points, self.per_step = True, 0, True
        self.private_keys = True  # False: every request's keys hashed and filed as its blocks fill (the tests compare)
        requests = inputs.requests
        cols = self.columns = columns if columns is not None else checked_columns(inputs)
        self.timed = cols.arrival_ps is not None
        self.shared = shared_firsts(cols.first)  # the others' block keys are numbered, not hashed (PrivateKeys)
        if isinstance(self.mgr, ContiguousManager) and routed is None:
            self.mgr.screen(self._state(i) for i in range(len(requests)))
        # the requests in arrival order, each made a state when the loop first reads it (a million requests' states,
        # block keys included, would take gigabytes), and recorded when it finishes
        self.pending = Pending(cols.arrival_order() if routed is None else routed, self._state)
        # a routed rank keeps no records (its result is its own run's): only the rows as they finish
        self.records = RequestRecords(requests, timed=inputs.step_model is not None) if routed is None else FinishedLog()
        # driven by a router (dp.rank_sim): more requests may still be sent (``open``), each arriving at ``horizon``
        # or later; the loop yields its view (View) before a step whose check would see that far
        self.open, self.horizon, self.routed = False, 0, routed is not None  # (dp.route: the requests are timed)
        self.finished: list[int] = self.records.log if routed is not None else []  # (its router's books)

    def _state(self, i: int) -> ReqState:
        cols = self.columns
        due = cols.arrival_ps[i] if self.timed else cols.arrival_step[i]  # type: ignore[index]
        st = ReqState(i, self.inputs.requests, cols.prompt[i], cols.output[i], due, len(self.inputs.layout.groups))
        if st.final >= self.cfg.max_model_len:  # the last sampled token's KV is never written
            st.final = self.cfg.max_model_len - 1
        hash_block = self.mgr.hash_block
        if hash_block:
            if self.private_keys and cols.first[i] not in self.shared:
                st.hasher = PrivateKeys(i, hash_block)
                st.private = self.mgr.deferred
            else:
                r = self.inputs.requests[i]
                st.hasher = BlockHasher([*r.prompt, r.output], hash_block)
            st.hasher.extend(st.num_tokens)
        return st

    # -- the loop --------------------------------------------------------------------------------------
    def run(self) -> V1Result:
        loop = self.steps()
        try:
            while True:
                next(loop)  # a router drives a rank's loop (dp.rank_sim); alone it never yields
        except StopIteration as done:
            return done.value

    def steps(self) -> Generator[View, None, V1Result | None]:
        """The loop. Driven by a router (``open``), it yields its View whenever its next check would see the
        router's ``horizon``, or it is idle with nothing sent; once the router closes it, it runs to the end and
        returns None (a rank's result comes from its own run over the requests it was sent)."""
        # One function on purpose: a measured hot loop (benchmarks/bench_v1.py, bench_default_path.py). Its state
        # lives in local variables, since an attribute read is a dictionary lookup and a call one more frame, for
        # every request at every step; steady decode stretches run in stretch.py, the pool's rules in
        # manager.py, and the invariants are checked from outside (_check, tests only).
        cfg, mgr, pool, cpu = self.cfg, self.mgr, self.mgr.pool, self.cpu
        books = mgr.books
        capacity = books.capacity  # what pool.num_free counts: usage = 1 - free / capacity (BlockPool.usage)
        caching = cfg.enable_prefix_caching
        hash_block = mgr.hash_block
        async_ = cfg.async_scheduling
        # pipelined: more batches in flight than async scheduling's two (or than one, sync), or pipeline stages
        # timed apart: the engine's batch queue (EngineCore.step_with_batch_queue) holds up to K batches
        K = cfg.batches_in_flight
        stagger = cfg.decode_stagger if cfg.decode_stagger > 1 else 0
        step_model = self.inputs.step_model
        stages = step_model.stages if step_model is not None else 1
        piped = K > (2 if async_ else 1) or stages > 1
        track = async_ or piped  # each request's tokens in flight (a preempted one's output arrives stale)
        fast = self.fast
        budget0, max_seqs, mml = cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.max_model_len
        lpt0 = cfg.long_prefill_token_threshold
        rules = cfg.rules
        lpt_alone = 0 if rules.threshold_needs_company else lpt0  # 0.31.0: no cap for a request alone
        skip_last = rules.async_skip_last_in_flight  # 0.11.1
        stale_waits = rules.stale_output_waits  # 0.27.0
        pending, timed, record = self.pending, self.timed, self.records.write
        n_pending = len(pending)
        nxt = 0
        waiting: deque[ReqState] = deque()
        running: list[ReqState] = []
        s = 0  # schedule() calls so far
        clock = 0  # picoseconds: the end of the last batch (when the GPU is free)
        launched = 0  # picoseconds: the start of the batch in flight (async: the next one is scheduled then)
        busy_ps = 0
        steps = run_sum = peak = preemptions = completed = generated = 0
        peak_pm = peak_w = 0  # the peaks of the usage (permille) and of the waiting queue
        ps_running: list[int] = []
        ps_usage: list[int] = []
        ps_tokens: list[int] = []
        ps_waiting: list[int] = []
        ps_start: list[int] = []
        gpu_hit = cpu_hit = recomputed = 0
        # memory books (kvplan.core.sim.v1.shares): the computed tokens of the requests holding memory, and the
        # sums over counted steps of the free blocks (slots), table entries, computed tokens, internal and
        # external fragmentation
        held_c = sum_free = sum_entries = sum_c = sum_int = sum_ext = 0
        points = self.timeline_points
        timeline: list[TimelinePoint] = []
        tl_every = timeline_every(points, n_pending, sum(self.columns.output) if points else 0, max_seqs)
        # a batch: (its requests with the tokens scheduled and whether the fake runner samples a token for
        # each, its step, the clock at its end); async scheduling keeps one in flight
        in_flight: tuple[list[tuple[ReqState, int, bool]], int, int] | None = None
        queue: deque[tuple[list[tuple[ReqState, int, bool]], int, int]] = deque()  # pipelined: the batches in flight
        now = free0 = last_end = 0  # pipelined: the engine's time, when the first stage is free, the last batch's end
        keep = self.per_step
        quiet = Quiet(self, (ps_running, ps_usage, ps_tokens, ps_waiting, ps_start) if keep else None, timeline,
                      points)
        use_quiet = quiet.usable and not piped
        while nxt < n_pending or waiting or running or self.open:
            if self.open:  # a data-parallel rank: what arrives by the horizon or later is the router's to say
                if not waiting and not running:  # idle: its next check is at the next request sent, if any
                    # (the clock jumps to the arrival, or stays where it is past it)
                    sees = max(clock, now, pending[nxt].due) if nxt < n_pending else self.horizon
                else:
                    sees = now if piped else launched if in_flight is not None else clock
                if sees >= self.horizon:
                    yield View(waiting=len(waiting), running=len(running), free=pool.num_free, capacity=capacity)
                    n_pending = len(pending)
                    continue
            if not waiting and not running:  # idle: jump to the next arrival
                in_flight = None  # only finished requests' outputs could be left: nothing to process
                queue.clear()
                if timed:
                    clock = launched = max(clock, pending[nxt].due)
                    now = max(now, clock)
                else:
                    s = max(s, pending[nxt].due)
            if piped:  # schedule() runs at the engine's time; its batch starts when the first stage is free
                seen_by = now if timed else s
                clock = max(now, free0)
            else:
                seen_by = (launched if in_flight is not None else clock) if timed else s
            while nxt < n_pending and pending[nxt].due <= seen_by:
                st = pending[nxt]
                st.arrival_step = s
                st.arrival_ps = st.due if timed else clock
                waiting.append(st)
                nxt += 1

            if use_quiet and running:  # a quiet stretch, event to event (quiet.py, stretch.py)
                q = quiet.run(running, waiting, pending, nxt, in_flight, s, clock, launched, held_c, steps, tl_every)
                if q is not None:
                    nxt = q.nxt
                    nr, k = len(running), q.steps
                    s += k
                    steps += k
                    run_sum += q.run_sum
                    generated += q.generated
                    completed += q.completed
                    gpu_hit += q.gpu_hit
                    recomputed += q.recomputed
                    sum_ext += q.external
                    peak = max(peak, q.peak)
                    clock, launched, held_c, tl_every, in_flight = q.clock, q.launched, q.held_c, q.tl_every, q.batch
                    peak_pm = max(peak_pm, q.peak_usage)
                    peak_w = max(peak_w, q.peak_waiting)
                    sum_free += q.free
                    sum_entries += q.entries
                    sum_c += q.computed
                    sum_int += q.internal
                    busy_ps += q.busy
                    if self.check:
                        self._check(running, waiting, held_c, budget0 - nr,
                                    split(books, 1, pool.num_free, mgr.entries, held_c, mgr.internal, 0))
                    continue

            # ---- schedule() ----
            # num_computed is advanced as soon as a request is scheduled (vLLM does it in
            # _update_after_schedule, after the loops: nothing later in the step reads it, as a preemption
            # victim under FCFS is never a request already scheduled in the step)
            budget = budget0
            lpt = lpt0 if len(running) + len(waiting) > 1 else lpt_alone
            batch: list[tuple[ReqState, int, bool]] = []
            kv_tokens = prefill = 0
            preempted = False
            i = 0
            n_run = len(running)  # less each request preempted (running.pop(), below)
            while i < n_run and budget > 0:
                r = running[i]
                if s < r.eligible:
                    i += 1  # V2 runner, async, pipeline: its last decode was fewer than pp steps ago
                    continue
                c = r.num_computed
                if skip_last and r.placeholders and c + 2 - r.placeholders >= r.prompt_len + r.max_tokens:
                    i += 1  # async: the batch in flight brings its last token; no step more
                    continue
                num = left = r.num_tokens + r.placeholders - c
                if not left:
                    i += 1  # its token is in flight (pipeline stages): nothing to schedule until it is back
                    continue
                if left != 1 or async_:  # a prefill chunk (sync: a decode always fits below max_model_len - 1)
                    if 0 < lpt < num:
                        num = lpt
                    num = min(num, budget, mml - c - 1)
                    if num <= 0:
                        i += 1
                        continue
                end = c + num
                if fast and end <= r.cap_tokens and c < r.next_free_at and end < r.prompt_len + r.max_tokens:
                    # the blocks held cover the step, nothing falls behind a window (async scheduling frees on
                    # fewer, the processed, tokens) and the step is not 0.11.0's extra one past the last token:
                    # allocate_slots would only file newly full blocks in the prefix cache
                    ok = True
                    if caching and min(end, r.num_tokens) >= (r.ncached[0] + 1) * hash_block:
                        mgr.cache_blocks(r, min(end, r.num_tokens))
                else:
                    ok = mgr.allocate_slots(r, num)
                while not ok:
                    victim = running.pop()
                    n_run -= 1
                    mgr.free(victim)
                    held_c -= victim.num_computed
                    victim.num_computed = 0
                    victim.num_preemptions += 1
                    victim.next_store_chunk = 0
                    victim.stale = victim.in_flight  # its output in flight still arrives, stale
                    victim.placeholders = 0
                    waiting.appendleft(victim)
                    preemptions += 1
                    preempted = True
                    if victim is r:
                        if not mgr.reserve_full_isl and pool.num_free == pool.num_blocks - 1:
                            raise outgrows(r, pool.num_blocks, cfg.rules.release)
                        break
                    ok = mgr.allocate_slots(r, num)
                if not ok:
                    break
                r.num_computed = end
                samples = end >= r.num_tokens + r.placeholders  # not a prefill chunk: the runner samples
                if track:
                    r.in_flight += num
                    if samples and async_:
                        r.placeholders += 1
                        if stagger:
                            r.eligible = s + stagger
                batch.append((r, num, samples))
                kv_tokens += end
                if left != 1:
                    prefill += num
                budget -= num
                i += 1
            ext_now = 0  # contiguous: free slots that could not hold the head's region
            if not preempted:
                skipped = None
                while budget > 0 and waiting and len(running) < max_seqs:
                    r = waiting[0]
                    if r.stale and stale_waits:  # its output from before its preemption is still in flight
                        if skipped is None:
                            skipped = []
                        skipped.append(waiting.popleft())  # passed over this step, in front again after it
                        continue
                    hits, hit_len = mgr.find_hit(r) if caching else (None, 0)
                    ext = chunks = 0
                    if cpu is not None:
                        ext, chunks = cpu.lookup(r.hasher.keys, hit_len, r.num_tokens)  # type: ignore[union-attr]
                    computed = hit_len + ext
                    num = r.num_tokens - computed
                    if 0 < lpt < num:
                        num = lpt
                    num = min(num, budget)
                    if not mgr.allocate_slots(r, num, hits, hit_len, ext, admitting=True, has_running=bool(running)):
                        ext_now = mgr.ext
                        break
                    waiting.popleft()
                    running.append(r)
                    r.num_computed = end = computed + num
                    held_c += computed  # and its scheduled tokens, in the step's total
                    samples = end >= r.num_tokens
                    if track:
                        r.in_flight += num
                        if samples and async_:
                            r.placeholders += 1
                            if stagger:
                                r.eligible = s + stagger
                    if chunks:
                        cpu.load(chunks)  # type: ignore[union-attr]
                    gpu_hit += hit_len
                    cpu_hit += ext
                    recomputed += r.num_tokens - computed
                    if r.first_scheduled_step < 0:
                        r.first_scheduled_step = s
                        r.first_scheduled_ps = clock
                        r.cached_tokens = hit_len
                        r.cpu_tokens = ext
                    batch.append((r, num, samples))
                    kv_tokens += end
                    prefill += num
                    budget -= num

                if skipped:
                    waiting.extendleft(reversed(skipped))
            total = budget0 - budget
            if total:
                steps += 1
                held_c += total
                nr = len(running)
                run_sum += nr
                peak = max(peak, nr)
                nf = pool.num_free
                permille = round((1.0 - nf / capacity) * 1000)
                if permille > peak_pm:
                    peak_pm = permille
                nw = len(waiting)
                if nw > peak_w:
                    peak_w = nw
                sum_free += nf
                sum_entries += mgr.entries
                sum_c += held_c
                sum_int += mgr.internal
                sum_ext += ext_now
                if tl_every and steps % tl_every == 0:
                    timeline.append((s, clock, *split(books, 1, nf, mgr.entries, held_c, mgr.internal, ext_now)))
                    tl_every = thin(timeline, points, tl_every)
                if keep:
                    ps_running.append(nr)
                    ps_usage.append(permille)
                    ps_tokens.append(total)
                    ps_waiting.append(nw)
                    if step_model is not None:
                        ps_start.append(clock)
            if cpu is not None:
                for r, _, _ in batch:  # write-through of the prompt's computed chunks
                    end = min(r.num_computed, r.prompt_len)
                    r.next_store_chunk = cpu.store(r.hasher.keys, r.next_store_chunk, end)  # type: ignore[union-attr]
            if self.check:
                self._check(running, waiting, held_c, budget,
                            split(books, 1, pool.num_free, mgr.entries, held_c, mgr.internal, ext_now) if total else None)
            duration = 0
            if step_model is not None and total:
                duration = step_model.duration(kv_tokens, prefill) + (cpu.take_load_ps() if cpu else 0)
                busy_ps += duration
            if piped:  # through every stage: it leaves the last one after the batch before it
                free0 = clock + duration
                last_end = max(clock + stages * duration, last_end + duration)
                this = (batch, s, last_end)
            else:
                launched = clock  # the GPU runs batches back to back: this one starts when the last one ends
                clock += duration
                this = (batch, s, clock)
            s += 1
            if not total and not running and waiting and not preempted and not waiting[0].stale:
                head = waiting[0]
                raise InputError(mgr.cannot_admit(head))
            if piped:
                # v1/engine/core.py::EngineCore.step_with_batch_queue: with room in the queue, schedule the next
                # batch (an empty one takes a place too); else wait for the oldest batch's output
                queue.append(this)
                if len(queue) < K and (total or waiting or running):
                    continue
                done = queue.popleft()
                now = max(now, done[2])
            elif async_:
                # v1/engine/core.py::EngineCore.step_with_batch_queue (two batches): with none in flight,
                # schedule the next batch before waiting for this one's output
                done, in_flight = in_flight, this
                if done is None:
                    if total or waiting or running:
                        continue
                    done, in_flight = this, None
            else:
                done = this

            # ---- update_from_output() of the oldest batch ----
            items, at, end_clock = done
            finished = None
            for r, num, samples in items:
                stale = False
                if track:
                    r.in_flight -= num
                    if r.stale > 0:
                        stale = True
                        r.stale -= num
                if not samples or r.finish_step >= 0:
                    continue
                r.num_tokens += 1
                r.generated += 1
                generated += 1
                if r.first_token_step < 0:
                    r.first_token_step = at
                    r.first_token_ps = end_clock
                if caching and r.num_tokens >= (r.hasher.n + 1) * hash_block:  # type: ignore[union-attr]
                    r.hasher.extend(r.num_tokens)  # type: ignore[union-attr]
                if not stale and r.placeholders:
                    r.placeholders -= 1
                    if caching and r.tracked:  # file the blocks its processed tokens filled (a call only when one
                        # more block is full: every group holds as many filed blocks, ncached, as the first)
                        filled = min(r.num_computed - r.in_flight, r.num_tokens)
                        if filled >= (r.ncached[0] + 1) * hash_block:
                            mgr.cache_blocks(r, filled)
                if r.num_tokens >= mml or r.generated >= r.max_tokens:
                    r.finish_step = at
                    r.finish_ps = end_clock
                    mgr.free(r)
                    r.hasher = None  # its block keys: the pool files what it keeps; a million requests' keys add up
                    record(r)
                    held_c -= r.num_computed
                    completed += 1
                    if finished is None:
                        finished = set()
                    finished.add(r.index)
            if finished:
                before = len(running)
                running = [r for r in running if r.index not in finished]
                if track and before - len(running) < len(finished):  # a stale token ended a preempted one
                    waiting = deque(r for r in waiting if r.index not in finished)
            if s > MAX_IDLE_STEPS:  # pragma: no cover - a guard, not a path
                raise InputError("the simulation did not end")
        self.quiet_stretches = quiet.count
        self.quiet_counts = (quiet.steps, quiet.admitted, quiet.stopped)
        self.final = (steps, preemptions, completed, generated, last_end if piped else clock)
        if self.routed:
            return None  # a rank driven by a router: its requests are a subset
        memory = shares(books, steps, sum_free, sum_entries, sum_c, sum_int, sum_ext)
        # the mean of 1 - free / capacity over the counted steps, from the exact sum of the free blocks
        usage = 1.0 - sum_free / (steps * capacity) if steps and capacity else 0.0
        if piped:
            clock = last_end
        return v1_result(self, Tally(steps=steps, run_sum=run_sum, peak=peak, preemptions=preemptions, usage=usage,
                                     completed=completed, generated=generated, calls=s, clock=clock, busy_ps=busy_ps,
                                     gpu_hit=gpu_hit, cpu_hit=cpu_hit, recomputed=recomputed, peak_usage=peak_pm,
                                     peak_waiting=peak_w),
                         (ps_running, ps_usage, ps_tokens, ps_waiting, ps_start), memory, tuple(timeline))

    def _check(self, running: list[ReqState], waiting: deque[ReqState], computed: int, budget: int,
               books: tuple[int, int, int, int, int] | None) -> None:
        """The invariants at a step (tests only): kvplan.core.sim.v1.setup.check_books; ``budget``: the token budget
        the step left, which the tests recount from."""
        check_books(self.mgr, running, waiting, computed, books)
