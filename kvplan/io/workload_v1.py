"""Workload files run by the exact vLLM v1 scheduler simulator (kvplan.core.sim.v1): which simulator a
file needs, and its requests as segment lists.

- ``scheduler.model``: ``event`` (kvplan's event-driven engine), ``vllm-v1``, or ``auto``, which picks
  vllm-v1 when the event engine's assumptions break: sessions, documents, a conversation or Mooncake
  trace (prefix caching of blocks shared by some requests), offload (a CPU tier), a sliding-window,
  chunked-local or linear-attention model (per-group pools), a prompt longer than max_num_batched_tokens
  (chunked prefill). The engine must be vLLM.
- Requests become ``V1Request``s whose prompts are segments (a segment's tokens depend only on its id
  and position, so two prompts share cache blocks exactly when they share leading segments):
  a shared system prompt is one segment; a conversation's turn k is turn k-1's prompt + its answer's
  segment + a new message; a document is one segment read by every request that picks it; a Mooncake
  trace's hash id is one 512-token segment.
- Arrivals are fixed before the run (the simulator, like vLLM's benchmark harness, takes arrival times):
  turn k arrives think_time after turn k-1 *arrived*; a note counts turns that arrived before the previous
  answer had finished (their prompts then include an answer the user had not seen).
- The pool: the same vLLM plan `kvplan fit` makes (kvplan.core.engines.vllm.plan.plan_vllm) with fit's
  block count, turned into cache groups by kvplan.core.sim.v1.layout_from_plan.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path

from kvplan.core.engines.registry import SERVING
from kvplan.core.sim.v1 import OffloadConfig, SchedulerConfig, V1Inputs, V1Request, layout_from_plan
from kvplan.core.sim.workload import PS_PER_S, Arrivals
from kvplan.errors import ConfigError, InputError, KvplanError
from kvplan.io.workload import (
    MAX_COUNT,
    ConstantS,
    Duration,
    ExponentialS,
    UniformS,
    WorkloadFile,
    _jsonl_rows,
    _length,
    load_workload_file,
    resolve_workload,
    trace_file,
)

EVENT, V1 = "event", "vllm-v1"
# The Mooncake traces' hash_ids cover 512-token blocks (kvcache-ai/Mooncake, FAST'25 traces README).
MOONCAKE_BLOCK_TOKENS = 512
MAX_TRACE_ROWS = MAX_COUNT
EVENT_ONLY_NOTE = "the simulator holds every token in every attention layer"


@dataclass(frozen=True, kw_only=True)
class V1Workload:
    name: str
    inputs: V1Inputs
    reason: str  # why the v1 simulator runs
    bytes_per_token: int
    pool_bytes: int
    block_size: int
    session_turns: tuple[tuple[int, int], ...] = ()  # (index of the previous turn's request, this request's index)
    rejected: int = 0  # requests whose prompt reaches max_model_len (vLLM rejects them)
    user_requests: int = 0  # requests as the workload counts them (before parallel sampling's fan-out)
    origin: str = ""
    notes: tuple[str, ...] = ()


# -- which simulator --------------------------------------------------------------------------------------
def read_file(path: Path, engine: str | None) -> WorkloadFile:
    """The workload file with ``engine`` applied and an ``auto`` trace format resolved."""
    wf = load_workload_file(path)
    if engine is not None:
        from kvplan.core.profiles import parse_engine

        parse_engine(engine, allowed=SERVING)
        wf = wf.model_copy(update={"serving": wf.serving.model_copy(update={"engine": engine})})
    r = wf.requests
    if r.trace and r.trace_format == "auto":
        fmt = trace_format(_trace_path(wf, path))
        wf = wf.model_copy(update={"requests": r.model_copy(update={"trace_format": fmt})})
    return wf


def _trace_path(wf: WorkloadFile, origin: Path) -> Path:
    return trace_file(origin, wf.requests.trace or "")


def trace_format(path: Path) -> str:
    """mooncake (hash_ids), conversation (a session id) or requests, from a JSONL trace's first row."""
    if path.suffix not in (".jsonl", ".ndjson"):
        return "requests"
    for _, row in _jsonl_rows(path):
        keys = {str(k).lower() for k in row}
        if "hash_ids" in keys:
            return "mooncake"
        if keys & {"session_id", "conversation_id", "session"}:
            return "conversation"
        return "requests"
    return "requests"


def choose(wf: WorkloadFile, path: Path, override: str | None = None) -> tuple[str, str]:
    """(simulator, why): ``override`` (the CLI's --scheduler-model) or scheduler.model, auto resolved
    from what the workload needs; the long-prompt check is made later (needs the requests)."""
    wanted = override or wf.scheduler.model
    if wanted not in ("auto", EVENT, V1):
        raise InputError(f"--scheduler-model must be auto, event or vllm-v1 (got {wanted!r})")
    r = wf.requests
    needs = []
    if r.sessions is not None:
        needs.append("multi-turn sessions (prefix caching across turns)")
    if r.documents is not None:
        needs.append("shared documents (prefix caching)")
    if r.trace_format in ("conversation", "mooncake"):
        needs.append(f"a {r.trace_format} trace (prefix caching of shared blocks)")
    if wf.offload is not None:
        needs.append("a CPU offload tier")
    if wf.scheduler.async_scheduling:
        needs.append("async scheduling (two batches in flight)")
    if wanted == EVENT:
        if needs:
            raise ConfigError(f"{path}: scheduler.model event cannot simulate {needs[0]}; use vllm-v1 or auto")
        return EVENT, "scheduler.model: event"
    if wanted == V1:
        return V1, "scheduler.model: vllm-v1"
    kinds = _window_kinds(wf)
    if kinds:
        needs.append(f"{kinds} layers (a pool per KV cache group)")
    if needs and not wf.serving.engine.startswith("vllm"):
        raise ConfigError(f"{path}: {needs[0]} is simulated with vLLM v1's scheduler only; set serving.engine: "
                          f"vllm (got {wf.serving.engine})")
    if needs:
        return V1, "auto: " + "; ".join(needs)
    return EVENT, "auto: full attention, every prompt within max_num_batched_tokens, one shared prefix at most"


def _window_kinds(wf: WorkloadFile) -> str:
    if not wf.serving.model:
        return ""
    from kvplan.io.models import load_model

    try:
        spec = load_model(wf.serving.model)
    except KvplanError:
        return ""  # resolve_workload reports it
    kinds = sorted({layer.kind.value for layer in spec.layers} & {"sliding", "chunked", "linear"})
    return "/".join(kinds)


def long_prompt_reason(wf: WorkloadFile, prompts: list[int], max_num_batched_tokens: int, max_model_len: int) -> str:
    """Why auto turns to vllm-v1 for plain requests: prompts longer than the token budget that vLLM accepts
    (shorter than max_model_len) need chunked prefill."""
    if not wf.serving.engine.startswith("vllm") or wf.scheduler.model != "auto":
        return ""
    longer = sum(max_num_batched_tokens < p < max_model_len for p in prompts)
    if not longer:
        return ""
    return (f"auto: {longer} prompt(s) longer than max_num_batched_tokens {max_num_batched_tokens} "
            "(vLLM v1 chunks their prefill over several steps)")


# -- the v1 workload --------------------------------------------------------------------------------------
def resolve_v1(path: Path, wf: WorkloadFile, reason: str) -> V1Workload:
    """The pool (fit's vLLM plan), the scheduler, the step model and the requests for kvplan.core.sim.v1."""
    from kvplan.core.engines.vllm.plan import plan_vllm
    from kvplan.core.engines.vllm.scheduler_rules import scheduler_notes
    from kvplan.core.profiles import parse_engine
    from kvplan.core.spec import LinearLayer
    from kvplan.io.gpus import get_gpu
    from kvplan.io.models import load_model

    s, sch = wf.serving, wf.scheduler
    if not s.engine.startswith("vllm"):
        raise ConfigError(f"{path}: the vllm-v1 simulator needs serving.engine: vllm (got {s.engine})")
    if s.pipeline_parallel_size != 1:
        raise ConfigError(f"{path}: the vllm-v1 simulator plans one pipeline stage; set pipeline_parallel_size: 1")
    if wf.sharing.beam_width > 1:
        raise ConfigError(f"{path}: vLLM v1's scheduler has no beam search; set sharing.beam_width: 1")
    if s.model is None:
        raise ConfigError(f"{path}: the vllm-v1 simulator needs serving.model (its KV cache groups)")
    choice = parse_engine(s.engine, allowed=("vllm",))
    notes: list[str] = []
    try:
        spec = load_model(s.model)
        gpu = get_gpu(s.gpu, memory=s.gpu_memory) if (s.gpu or s.gpu_memory) else None
    except KvplanError as exc:
        raise type(exc)(f"{path}: serving: {exc}") from None
    max_len = sch.max_model_len or spec.max_model_len
    mnbt = sch.max_num_batched_tokens
    if mnbt is None:
        from kvplan.core.engines.vllm.profiles import batch_defaults

        mnbt = batch_defaults(choice.profile.rules, gpu, max_len)[0] if gpu is not None else 2048
        notes.append(f"max_num_batched_tokens {mnbt}: the OpenAI server's default for this GPU in vLLM "
                     f"{choice.version} (vllm/engine/arg_utils.py); set scheduler.max_num_batched_tokens to change it")
    wf = wf.model_copy(update={"scheduler": sch.model_copy(update={"max_num_batched_tokens": mnbt})})
    w = resolve_workload(path, wf=wf)
    notes.extend(n for n in w.notes if not n.startswith(EVENT_ONLY_NOTE))
    caching = wf.sharing.prefix_caching
    linear = any(isinstance(layer, LinearLayer) for layer in spec.layers)
    if linear and caching and "prefix_caching" not in wf.sharing.model_fields_set:
        caching = False  # the default (true) is the event engine's; the v1 core does not model Mamba's align mode
        notes.append("prefix caching is off: the vllm-v1 simulator does not model it for linear-attention "
                     "(Mamba) layers (vLLM's mamba_cache_mode align)")
    available = w.pool_bytes if not w.num_blocks else 0
    async_ = choice.profile.rules.async_default if sch.async_scheduling is None else sch.async_scheduling
    if sch.async_scheduling is None and async_:
        notes.append("async scheduling on (vLLM's default from 0.14.0: two batches in flight); set "
                     "scheduler.async_scheduling: false for the synchronous scheduler")
    try:
        plan = plan_vllm(spec.layers, available, max_len, choice.profile, model_dtype=spec.dtype,
                         in_flight_tokens=mnbt * (2 if async_ else 1), kv_dtype=s.kv_cache_dtype,
                         tp=s.tensor_parallel_size,
                         num_gpu_blocks_override=w.num_blocks or None,
                         mamba_cache_mode="align" if (linear and caching) else "none")
        layout = layout_from_plan(plan, max_len)
        scheduler = SchedulerConfig(max_num_seqs=sch.max_num_seqs, max_num_batched_tokens=mnbt, max_model_len=max_len,
                                    enable_prefix_caching=caching,
                                    long_prefill_token_threshold=sch.long_prefill_token_threshold,
                                    async_scheduling=async_, rules=choice.profile.rules.scheduler)
        notes.extend(scheduler_notes(choice.profile, layout, caching=caching))
        offload = None
        if wf.offload is not None:
            cpu_bytes, bw = wf.offload.bytes()
            offload = OffloadConfig(cpu_bytes=cpu_bytes, bandwidth_bytes_per_s=float(bw),
                                    blocks_per_chunk=wf.offload.blocks_per_chunk)
    except KvplanError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    gen = _Gen(wf, path, max_len, notes)
    requests = gen.build(w.requests)
    if not requests:
        raise ConfigError(f"{path}: every request's prompt reaches max_model_len {max_len}: nothing to simulate")
    if sch.preemption != "recompute":
        notes.append("vLLM v1 preempts by recompute only: scheduler.preemption swap is not used")
    contiguous = any(not a.name.startswith("paged") for a in w.allocators)
    if contiguous and "allocators" in wf.model_fields_set:
        notes.append("vllm-v1 simulates vLLM's paged pool only: the contiguous allocators are not run "
                     "(scheduler.model: event compares them, without chunked prefill or per-group pools)")
    block = min(g.block_size for g in layout.groups)
    notes.append(f"simulator: vllm-v1 ({reason}); pool: {layout.num_blocks:,} blocks of {block} tokens in "
                 f"{len(layout.groups)} KV cache group(s), from vLLM {choice.version}'s plan as `kvplan fit`")
    inputs = V1Inputs(requests=tuple(requests), scheduler=scheduler, layout=layout, offload=offload,
                      step_model=w.config.step, notes=tuple(notes))
    return V1Workload(name=w.name, inputs=inputs, reason=reason, bytes_per_token=w.bytes_per_token,
                      pool_bytes=w.pool_bytes, block_size=block, session_turns=tuple(gen.turn_links),
                      rejected=gen.rejected, user_requests=gen.user_requests or len(requests) + gen.rejected,
                      origin=str(path), notes=tuple(notes))


class _Gen:
    """Requests as segment lists, one random stream per workload seed."""

    def __init__(self, wf: WorkloadFile, origin: Path, max_len: int, notes: list[str]) -> None:
        self.wf, self.origin, self.max_len, self.notes = wf, origin, max_len, notes
        self.next_seg = 1
        self.rejected = 0
        self.user_requests = 0  # set when one request fans out into several (parallel sampling)
        self.turn_links: list[tuple[int, int]] = []
        self.out: list[V1Request] = []

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
        i = len(self.out)
        self.out.append(V1Request(id=str(i), prompt=tuple(prompt), output=self.seg(output),
                                  arrival_ps=round(arrival_s * PS_PER_S)))
        return i

    def length(self, spec, key: str):
        try:
            return _length(spec, self.origin.parent)
        except ConfigError as exc:
            raise ConfigError(f"{self.origin}: {key}: {exc}") from None

    def arrivals(self, count: int, rng: random.Random) -> list[float]:
        a = self.wf.requests.arrival
        if a is None:
            raise ConfigError(f"{self.origin}: requests.arrival is needed (when the requests or sessions start)")
        return Arrivals(process=a.process, rate=a.rate, cv=a.cv).times_s(count, rng)

    def build(self, plain) -> list[V1Request]:
        r = self.wf.requests
        if r.sessions is not None:
            self.sessions()
        elif r.documents is not None:
            self.documents()
        elif r.trace_format == "conversation":
            self.conversation(_trace_path(self.wf, self.origin))
        elif r.trace_format == "mooncake":
            self.mooncake(_trace_path(self.wf, self.origin))
        else:
            self.plain(plain)
        if self.rejected:
            self.notes.append(f"{self.rejected:,} request(s) whose prompt reaches max_model_len {self.max_len} were "
                              "left out (vLLM rejects them)")
        return self.out

    def plain(self, requests) -> None:
        """The event engine's requests: a shared prefix segment, then the request's own tokens; parallel
        sampling (n) as n requests with the same prompt (vLLM v1 fans a request with n > 1 out into n child
        requests: vllm/v1/engine/parallel_sampling.py)."""
        prefix = self.wf.sharing.shared_prefix_tokens
        shared = self.seg(prefix) if prefix else None
        rejected = 0
        for q in requests:
            own = self.seg(q.prompt - prefix)
            for _ in range(q.n):
                if self.add([shared, own] if shared else [own], q.output, q.arrival_ps / PS_PER_S) is None:
                    rejected += 1
                    break
        self.rejected = rejected
        self.user_requests = len(requests)

    def sessions(self) -> None:
        ss = self.wf.requests.sessions
        assert ss is not None
        rng = random.Random(self.wf.requests.seed)
        starts = self.arrivals(ss.count, rng)
        turns = self.length(ss.turns, "requests.sessions.turns").sampler(rng)
        msg = self.length(ss.message_tokens, "requests.sessions.message_tokens").sampler(rng)
        ans = self.length(ss.output_tokens, "requests.sessions.output_tokens").sampler(rng)
        think = _duration(ss.think_time_s, rng)
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
                out = max(1, ans())
                i = self.add(prompt, out, t)
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
        doc_len = self.length(d.tokens, "requests.documents.tokens").sampler(rng)
        question = self.length(d.question_tokens, "requests.documents.question_tokens").sampler(rng)
        out = self.length(r.output_tokens, "requests.output_tokens").sampler(rng)
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

    def _rows(self, path: Path):
        r = self.wf.requests
        for k, (line, row) in enumerate(_jsonl_rows(path)):
            if r.limit and k >= r.limit:
                return
            if k >= MAX_TRACE_ROWS:
                raise ConfigError(f"{path}: more than {MAX_TRACE_ROWS:,} rows; set requests.limit")
            yield line, {str(key).lower(): v for key, v in row.items()}

    def conversation(self, path: Path) -> None:
        """JSONL rows {session_id, turn, timestamp (s), input_tokens (the whole prompt), output_tokens}."""
        rows = []
        for line, row in self._rows(path):
            sid = _first(row, ("session_id", "conversation_id", "session"))
            turn = _first(row, ("turn", "turn_id", "round"))
            ts = _first(row, ("timestamp", "arrival_time", "arrival", "time"))
            inp = _first(row, ("input_tokens", "prompt_tokens", "input_length"))
            outp = _first(row, ("output_tokens", "generated_tokens", "output_length"))
            if None in (sid, ts, inp, outp):
                raise ConfigError(f"{path}: line {line}: a conversation row needs session_id, timestamp (seconds), "
                                  "input_tokens (the whole prompt) and output_tokens")
            rows.append((line, str(sid), _num(turn if turn is not None else line, path, line, "turn"),
                         _num(ts, path, line, "timestamp", real=True), _num(inp, path, line, "input_tokens"),
                         _num(outp, path, line, "output_tokens")))
        if not rows:
            raise ConfigError(f"{path}: the trace has no requests")
        t0 = min(r[3] for r in rows)
        scale = self.wf.requests.time_scale
        hist: dict[str, tuple[list[tuple[int, int]], int]] = {}
        restarted = 0
        for _, sid, _, ts, inp, outp in sorted(rows, key=lambda r: (r[1], r[2], r[3])):
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
        """Mooncake's FAST'25 traces: {timestamp (ms), input_length, output_length, hash_ids}; hash id h is the
        h-th distinct 512-token block, so requests sharing leading hash ids share those blocks."""
        seg_of: dict[int, int] = {}
        scale = self.wf.requests.time_scale
        t0 = None
        for line, row in self._rows(path):
            ids, ts = row.get("hash_ids"), row.get("timestamp")
            inp, outp = row.get("input_length"), row.get("output_length")
            if not isinstance(ids, list) or None in (ts, inp, outp):
                raise ConfigError(f"{path}: line {line}: a Mooncake row needs timestamp (ms), input_length, "
                                  "output_length and hash_ids (a list)")
            inp, outp = _num(inp, path, line, "input_length"), _num(outp, path, line, "output_length")
            t = _num(ts, path, line, "timestamp", real=True) / 1000
            t0 = t if t0 is None else t0
            prompt, left = [], inp
            for h in ids:
                if left <= 0:
                    break
                if not isinstance(h, int) or isinstance(h, bool):
                    raise ConfigError(f"{path}: line {line}: hash_ids must be integers (got {str(h)[:20]!r})")
                if h not in seg_of:
                    seg_of[h] = self.seg(0)[0]
                n = min(MOONCAKE_BLOCK_TOKENS, left)
                prompt.append((seg_of[h], n))
                left -= n
            if left > 0:
                prompt.append(self.seg(left))
            self.add(prompt, outp, (t - t0) / scale)
        if t0 is None:
            raise ConfigError(f"{path}: the trace has no requests")


def _first(row: dict, keys: tuple[str, ...]):
    for k in keys:
        if k in row and row[k] is not None:
            return row[k]
    return None


def _num(value, path: Path, line: int, what: str, *, real: bool = False):
    try:
        x = float(value) if real else int(value)
        if isinstance(value, bool) or (not real and float(value) != x):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{path}: line {line}: {what} must be a {'number' if real else 'whole number'} "
                          f"(got {str(value)[:30]!r})") from None
    if not (0 <= x < (1 << 40)):
        raise ConfigError(f"{path}: line {line}: {what} must be between 0 and 2^40 (got {str(value)[:30]})")
    return x


def _duration(spec: Duration, rng: random.Random):
    if isinstance(spec, ConstantS):
        return lambda: spec.value
    if isinstance(spec, UniformS):
        if spec.high < spec.low:
            raise ConfigError(f"think_time_s: high ({spec.high}) must be >= low ({spec.low})")
        return lambda: rng.uniform(spec.low, spec.high)
    if isinstance(spec, ExponentialS):
        return lambda: rng.expovariate(1 / spec.mean)
    import math

    mu = math.log(spec.mean) - spec.sigma**2 / 2
    return lambda: rng.lognormvariate(mu, spec.sigma)

