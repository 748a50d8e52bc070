"""A workload file's traffic as the simulators' requests.

- ``plain_requests``: a trace or synthetic traffic (count, arrival, lengths) as flat columns (arrival, prompt,
  output, n): what the event engine runs, and what the vllm-v1 simulator turns into segment lists.
- ``V1Requests``: requests as segment lists for kvplan.core.sim.v1 (a segment's tokens depend only on its id and
  position, so two prompts share cache blocks exactly when they share leading segments): a shared system prompt is
  one segment; a conversation's turn k is turn k-1's prompt + its answer's segment + a new message; a document is
  one segment read by every request that picks it; a Mooncake trace's hash id is one 512-token segment. Arrivals are
  fixed before the run (the simulator, like vLLM's benchmark harness, takes arrival times): turn k arrives
  think_time after turn k-1 *arrived*.
"""

from __future__ import annotations

import random
from array import array
from bisect import bisect_left
from pathlib import Path
from typing import Any

from kvplan.core.sim.model import RequestArrays
from kvplan.core.sim.v1.tables import RequestTable
from kvplan.core.sim.workload import PS_PER_S, Arrivals, clip_columns, synthetic_columns
from kvplan.errors import ConfigError, InputError
from kvplan.io.traces import conversation_rows, mooncake_rows, read_trace, trace_file
from kvplan.io.workload import MAX_COUNT, WorkloadFile, duration_sampler, length_dist

# The Mooncake traces' hash_ids cover 512-token blocks (kvcache-ai/Mooncake, FAST'25 traces README).
MOONCAKE_BLOCK_TOKENS = 512


def needs_segments(wf: WorkloadFile) -> bool:
    """Traffic only the vllm-v1 simulator runs: sessions, documents, a conversation or Mooncake trace."""
    r = wf.requests
    return r.sessions is not None or r.documents is not None or r.trace_format in ("conversation", "mooncake")


def plain_requests(wf: WorkloadFile, origin: Path, *, max_model_len: int, notes: list[str]) -> RequestArrays:
    """A trace's rows or synthetic requests; ``notes`` gets a line when prompts shorter than the shared prefix
    were raised to it."""
    r, sh = wf.requests, wf.sharing
    n = max(sh.parallel_sampling, sh.beam_width)
    prefix = sh.shared_prefix_tokens
    if r.trace:
        rows = read_trace(trace_file(origin, r.trace), r.limit)
        times = [t / r.time_scale for t, _, _ in rows]
        prompts = [p for _, p, _ in rows]
        _note_raised(notes, sum(1 for p in prompts if p < prefix), len(rows), prefix)
        return _columns(origin, times, prompts, [o for _, _, o in rows], max_model_len=max_model_len,
                        shared_prefix=prefix, n=n, clip_prompt=False)
    missing = [k for k in ("count", "arrival", "prompt_tokens", "output_tokens") if getattr(r, k) is None]
    if missing:
        raise ConfigError(f"{origin}: requests: give a trace, or count, arrival, prompt_tokens and output_tokens "
                          f"(missing: {', '.join(missing)})")
    assert r.count and r.arrival and r.prompt_tokens and r.output_tokens
    prompt = _dist(origin, "requests.prompt_tokens", r.prompt_tokens)
    output = _dist(origin, "requests.output_tokens", r.output_tokens)
    times, prompts, outputs = synthetic_columns(
        count=r.count, arrivals=Arrivals(process=r.arrival.process, rate=r.arrival.rate, cv=r.arrival.cv),
        prompt=prompt, output=output, seed=r.seed)
    _note_raised(notes, sum(1 for p in prompts if p < prefix), len(prompts), prefix)
    return _columns(origin, times, prompts, outputs, max_model_len=max_model_len, shared_prefix=prefix, n=n)


def _dist(origin: Path, key: str, spec: Any) -> Any:
    try:
        return length_dist(spec, origin.parent)
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {key}: {exc}") from None


def _columns(origin: Path, times: list[float], prompts: list[int], outputs: list[int], **kw: Any) -> RequestArrays:
    try:
        return clip_columns(times, prompts, outputs, **kw)
    except InputError as exc:
        raise ConfigError(f"{origin}: requests: {exc}") from None


def _note_raised(notes: list[str], raised: int, total: int, prefix: int) -> None:
    if raised:
        notes.append(f"{raised:,} of {total:,} prompts were shorter than the {prefix:,}-token shared prefix and were "
                     f"raised to it (the prefix is part of the prompt)")


class V1Requests:
    """Requests as segment lists, one random stream per workload seed. ``build`` fills ``out`` and, for
    conversations, ``turn_links`` (the previous turn's index, this turn's)."""

    def __init__(self, wf: WorkloadFile, origin: Path, max_len: int, notes: list[str]) -> None:
        self.wf, self.origin, self.max_len, self.notes = wf, origin, max_len, notes
        self.next_seg = 1
        self.rejected = 0
        self.user_requests = 0  # set when one request fans out into several (parallel sampling)
        self.turn_links: list[tuple[int, int]] = []
        self.out = RequestTable()  # columns: a million requests in about 50 MB

    def seg(self, n: int) -> tuple[int, int]:
        self.next_seg += 1
        return (self.next_seg - 1, n)

    def add(self, prompt: list[tuple[int, int]], output: int, arrival_s: float) -> int | None:
        """Append a request; None when its prompt reaches max_model_len (vLLM rejects it)."""
        prompt = [p for p in prompt if p[1] > 0]
        plen = sum(n for _, n in prompt)
        if plen >= self.max_len or plen < 1:
            self.rejected += 1
            return None
        output = max(1, min(output, self.max_len - plen))
        return self.out.append(prompt, self.seg(output), round(arrival_s * PS_PER_S))

    def arrivals(self, count: int, rng: random.Random) -> list[float]:
        a = self.wf.requests.arrival
        if a is None:
            raise ConfigError(f"{self.origin}: requests.arrival is needed (when the requests or sessions start)")
        return Arrivals(process=a.process, rate=a.rate, cv=a.cv).times_s(count, rng)

    def build(self, plain: RequestArrays | None) -> RequestTable:
        r = self.wf.requests
        if r.sessions is not None:
            self.sessions()
        elif r.documents is not None:
            self.documents()
        elif r.trace_format == "conversation":
            self.conversation(trace_file(self.origin, r.trace or ""))
        elif r.trace_format == "mooncake":
            self.mooncake(trace_file(self.origin, r.trace or ""))
        else:
            assert plain is not None
            self.plain(plain)
        if self.rejected:
            self.notes.append(f"{self.rejected:,} request(s) whose prompt reaches max_model_len {self.max_len} were "
                              "left out (vLLM rejects them)")
        return self.out

    def plain(self, requests: RequestArrays) -> None:
        """A shared prefix segment, then the request's own tokens; parallel sampling (n) as n requests with the
        same prompt (vLLM v1 fans a request with n > 1 out into n child requests: vllm/v1/engine/parallel_sampling.py)."""
        prefix = self.wf.sharing.shared_prefix_tokens
        self.user_requests = len(requests)
        if not prefix and requests.n.count(1) == len(requests) and (
                not requests or 1 <= min(requests.prompt) and max(requests.prompt) < self.max_len):
            # one segment a prompt, none rejected: ``add``'s rows, a column at a time (100,000: 0.2 s less)
            room = self.max_len
            outputs = array("q", (max(1, min(o, room - p)) for o, p in zip(requests.output, requests.prompt)))
            self.out.extend_own(self.next_seg, requests.prompt, outputs, requests.arrival_ps)
            self.next_seg += 2 * len(requests)
            return
        shared = self.seg(prefix) if prefix else None
        rejected = 0
        for q in requests:
            own = self.seg(q.prompt - prefix)
            for _ in range(q.n):
                if self.add([shared, own] if shared else [own], q.output, q.arrival_ps / PS_PER_S) is None:
                    rejected += 1
                    break
        self.rejected = rejected

    def sessions(self) -> None:
        ss = self.wf.requests.sessions
        assert ss is not None
        rng = random.Random(self.wf.requests.seed)
        starts = self.arrivals(ss.count, rng)
        turns = _dist(self.origin, "requests.sessions.turns", ss.turns).sampler(rng)
        msg = _dist(self.origin, "requests.sessions.message_tokens", ss.message_tokens).sampler(rng)
        ans = _dist(self.origin, "requests.sessions.output_tokens", ss.output_tokens).sampler(rng)
        think = duration_sampler(ss.think_time_s, rng)
        system = self.seg(ss.system_prompt_tokens) if ss.system_prompt_tokens else None
        total = cut = 0
        for start in starts:
            history = [system] if system else []
            t, prev = start, None
            for _ in range(max(1, turns())):
                total += 1
                if total > MAX_COUNT:
                    raise ConfigError(f"{self.origin}: requests.sessions: more than {MAX_COUNT} turns in all; "
                                      "give fewer sessions or turns")
                prompt = [*history, self.seg(max(1, msg()))]
                i = self.add(prompt, max(1, ans()), t)
                if i is None:
                    cut += 1
                    self.rejected -= 1
                    break
                if prev is not None:
                    self.turn_links.append((prev, i))
                history = [*prompt, self.out[i].output]
                prev = i
                t += think()
        if cut:
            self.notes.append(f"{cut:,} conversation(s) ended early: the next turn's prompt reached max_model_len "
                              f"{self.max_len}")

    def documents(self) -> None:
        r = self.wf.requests
        d = r.documents
        assert d is not None
        if r.count is None or r.output_tokens is None:
            raise ConfigError(f"{self.origin}: requests.documents needs requests.count, arrival and output_tokens")
        rng = random.Random(r.seed)
        times = self.arrivals(r.count, rng)
        doc_len = _dist(self.origin, "requests.documents.tokens", d.tokens).sampler(rng)
        question = _dist(self.origin, "requests.documents.question_tokens", d.question_tokens).sampler(rng)
        out = _dist(self.origin, "requests.output_tokens", r.output_tokens).sampler(rng)
        docs = [self.seg(max(1, doc_len())) for _ in range(d.count)]
        cum, acc = [], 0.0
        for k in range(1, d.count + 1):
            acc += 1 / k**d.popularity
            cum.append(acc)
        prefix = self.wf.sharing.shared_prefix_tokens
        shared = [self.seg(prefix)] if prefix else []
        for t in times:
            doc = docs[min(bisect_left(cum, rng.random() * acc), d.count - 1)]
            self.add([*shared, doc, self.seg(max(1, question()))], max(1, out()), t)

    def conversation(self, path: Path) -> None:
        """Turns in session order; a turn's prompt extends the previous turn's prompt and answer when it is longer."""
        rows = conversation_rows(path, self.wf.requests.limit)
        t0 = min(r[2] for r in rows)
        scale = self.wf.requests.time_scale
        hist: dict[str, tuple[list[tuple[int, int]], int]] = {}
        restarted = 0
        for sid, _, ts, inp, outp in sorted(rows, key=lambda r: (r[0], r[1], r[2])):
            history, prev = hist.get(sid, ([], -1))
            known = sum(n for _, n in history)
            if history and inp > known:
                prompt = [*history, self.seg(inp - known)]
            else:
                restarted += bool(history)  # the history was cut (a context window): nothing to reuse
                prompt, prev = [self.seg(inp)], -1
            i = self.add(prompt, outp, (ts - t0) / scale)
            if i is None:
                hist.pop(sid, None)
                continue
            if prev >= 0:
                self.turn_links.append((prev, i))
            hist[sid] = ([*prompt, self.out[i].output], i)
        if restarted:
            self.notes.append(f"{restarted:,} turn(s) had a prompt no longer than the history before them (cut "
                              "history): simulated as new prompts")

    def mooncake(self, path: Path) -> None:
        """Hash id h is the h-th distinct 512-token block, so requests sharing leading hash ids share those blocks."""
        seg_of: dict[int, int] = {}
        scale = self.wf.requests.time_scale
        rows = mooncake_rows(path, self.wf.requests.limit)
        t0 = rows[0][0]
        for t, inp, outp, ids in rows:
            prompt, left = [], inp
            for h in ids:
                if left <= 0:
                    break
                if h not in seg_of:
                    seg_of[h] = self.seg(0)[0]
                n = min(MOONCAKE_BLOCK_TOKENS, left)
                prompt.append((seg_of[h], n))
                left -= n
            if left > 0:
                prompt.append(self.seg(left))
            self.add(prompt, outp, (t - t0) / scale)
