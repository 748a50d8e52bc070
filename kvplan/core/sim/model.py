"""What a simulation is made of, shared by the engine and its reference.

Semantics (one iteration = one step):
1. requests whose arrival time has come join the waiting queue (FCFS);
2. every running sequence gets one more token slot; a paged pool that runs out preempts the most
   recently admitted running request (recompute or swap) until the growth fits;
3. unless something was preempted this step, waiting requests are admitted in order while the
   sequence limit (``max_num_seqs``), the prefill token budget (``max_num_batched_tokens``, as vLLM
   V0 schedules prompts without chunked prefill) and the allocator allow; a request's prompt is
   prefilled at admission. A recomputed request (preempted, then re-admitted under ``recompute``)
   must prefill its prompt plus the tokens it had generated, which can exceed the whole budget: it
   is admitted when the step's budget is still untouched (see ``fits_budget``);
4. the step takes ``weights + KV read`` over the bandwidth plus the prefill compute (integer
   picoseconds, so every engine and the reference agree exactly);
5. sequences that hold prompt + output tokens complete and free their memory;
6. progress guard: when a step that tried to admit ends with nothing running and someone waiting,
   nothing can ever free memory or budget for the head of the queue (arrivals only join behind it),
   so the head is rejected with ``no_progress_blocked_by_<memory|budget|seqs>`` instead of waiting
   forever. ``rejection`` rules these out up front; the guard makes any gap a reason, not a hang.
Memory is counted in token slots of the pool at step 3's end, each step weighted equally over the
busy period (steps with something running or waiting). Busy time is the clock over steps with at
least one running sequence; throughput is generated tokens per busy second.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import overload

from kvplan.core.sim.stats import Percentiles, percentiles_s  # noqa: F401  (re-exported)
from kvplan.errors import InputError


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (a pow2 reservation; a buddy allocator's block)."""
    return 1 << (n - 1).bit_length()


class Preemption(str, Enum):
    RECOMPUTE = "recompute"
    SWAP = "swap"


@dataclass(frozen=True, slots=True)
class SimRequest:
    id: int
    arrival_ps: int  # arrival time, integer picoseconds
    prompt: int  # prompt tokens (including any shared prefix)
    output: int  # output tokens per sequence
    n: int = 1  # sequences (parallel sampling n, or beam width)

    @property
    def final_len(self) -> int:
        return self.prompt + self.output


class RequestArrays(Sequence[SimRequest]):
    """Requests as four flat ``array('q')`` columns, request ``i`` being position ``i`` (its id).

    A million ``SimRequest`` objects take about 200 MB, and forked simulator workers copy the pages
    their reference counts touch; four arrays take 32 MB and are shared as they are. Indexing and
    iteration still give ``SimRequest`` values, so code written for a list keeps working.
    """

    __slots__ = ("arrival_ps", "n", "output", "prompt")

    def __init__(self, arrival_ps: Iterable[int], prompt: Iterable[int], output: Iterable[int],
                 n: Iterable[int]) -> None:
        self.arrival_ps = arrival_ps if isinstance(arrival_ps, array) else array("q", arrival_ps)
        self.prompt = prompt if isinstance(prompt, array) else array("q", prompt)
        self.output = output if isinstance(output, array) else array("q", output)
        self.n = n if isinstance(n, array) else array("q", n)
        if not len(self.arrival_ps) == len(self.prompt) == len(self.output) == len(self.n):
            raise ValueError("request columns differ in length")

    @classmethod
    def of(cls, requests: Iterable[SimRequest]) -> RequestArrays:
        """The requests in (arrival, id) order; ids become positions in that order."""
        if isinstance(requests, RequestArrays):
            return requests
        rs = sorted(requests, key=lambda r: (r.arrival_ps, r.id))
        return cls([r.arrival_ps for r in rs], [r.prompt for r in rs], [r.output for r in rs], [r.n for r in rs])

    def __len__(self) -> int:
        return len(self.arrival_ps)

    @overload
    def __getitem__(self, i: int) -> SimRequest: ...

    @overload
    def __getitem__(self, i: slice) -> list[SimRequest]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        return SimRequest(id=i, arrival_ps=self.arrival_ps[i], prompt=self.prompt[i], output=self.output[i],
                          n=self.n[i])

    def __iter__(self) -> Iterator[SimRequest]:
        for i, (a, p, o, n) in enumerate(zip(self.arrival_ps, self.prompt, self.output, self.n)):
            yield SimRequest(id=i, arrival_ps=a, prompt=p, output=o, n=n)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RequestArrays):
            return NotImplemented
        return (self.arrival_ps == other.arrival_ps and self.prompt == other.prompt and self.output == other.output
                and self.n == other.n)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RequestArrays({len(self)} requests)"

    def is_sorted(self) -> bool:
        """Whether arrivals never decrease (synthetic arrivals are a running sum: always)."""
        from itertools import islice
        from operator import le

        a = self.arrival_ps
        return all(map(le, a, islice(a, 1, None)))


@dataclass(frozen=True, slots=True, kw_only=True)
class StepModel:
    """Step duration = base + per KV token held + per prefill token, in integer picoseconds."""

    base_ps: int  # reading the weights once
    per_token_ps: int  # reading one token slot of KV
    per_prefill_token_ps: int  # prefill compute per prompt token
    # pipeline stages, each taking ``duration`` for its share of the layers: a batch enters the first stage when it
    # is free and leaves the last ``stages`` durations later (vllm-v1 only)
    stages: int = 1

    def duration(self, kv_tokens: int, prefill_tokens: int) -> int:
        return self.base_ps + self.per_token_ps * kv_tokens + self.per_prefill_token_ps * prefill_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    pool_slots: int  # KV pool, in token slots
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    step: StepModel
    shared_prefix: int = 0  # tokens every prompt starts with (a system prompt)
    prefix_caching: bool = True  # paged allocators share the prefix's full blocks
    preemption: Preemption = Preemption.RECOMPUTE


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatorSpec:
    """``contiguous-{max,pow2,oracle}`` (placed by ``placement``) or ``paged-B``."""

    name: str
    paged: bool
    block_size: int = 1
    reservation: str = ""  # contiguous: "max", "pow2", "oracle"
    placement: str = "buddy"  # contiguous: "buddy" or "first-fit"

    def reservation_slots(self, prompt: int, output: int, max_model_len: int) -> int:
        """Slots a contiguous allocator reserves for one sequence (before placement rounding).

        The vLLM paper's Orca baselines (Kwon et al., SOSP 2023, section 6.1): Max reserves "up to the
        maximum sequence length of the model"; Pow2 "over-reserves the space for outputs by at most 2x.
        For example, if the true output length is 25, it reserves 32 positions for outputs": the prompt
        plus the output rounded up to a power of two (never past max_model_len, Max's reservation);
        Oracle knows the output length: prompt + output.
        """
        if self.reservation == "max":
            return max_model_len
        if self.reservation == "pow2":
            return min(prompt + next_pow2(output), max_model_len)
        return prompt + output


CONTIGUOUS = {"contiguous-max": "max", "contiguous-pow2": "pow2", "contiguous-oracle": "oracle"}
PLACEMENTS = ("buddy", "first-fit")


def allocator_spec(name: str, *, placement: str = "buddy") -> AllocatorSpec:
    """The registry: ``contiguous-max``, ``contiguous-pow2``, ``contiguous-oracle``, ``paged-<B>``."""
    if placement not in PLACEMENTS:
        raise InputError(f"placement must be one of {', '.join(PLACEMENTS)} (got {placement!r})")
    if name in CONTIGUOUS:
        return AllocatorSpec(name=name, paged=False, reservation=CONTIGUOUS[name], placement=placement)
    if name.startswith("paged-"):
        size = name.removeprefix("paged-")
        # isascii: str.isdigit also accepts "²" and "①", which int() refuses
        if size.isascii() and size.isdigit() and 1 <= int(size) <= 4096:
            return AllocatorSpec(name=name, paged=True, block_size=int(size))
    raise InputError(f"unknown allocator {name!r}; use {', '.join(CONTIGUOUS)} or paged-B (e.g. paged-16)")


def prefill_cost(tokens: int, started: bool, cfg: SimConfig) -> int:
    """Tokens a waiting request prefills when admitted: its prompt, or under ``recompute`` everything
    it held when preempted (a swapped-in request prefills nothing)."""
    return tokens if (not started or cfg.preemption is Preemption.RECOMPUTE) else 0


def fits_budget(cost: int, prefill: int, cfg: SimConfig) -> bool:
    """Whether a prefill of ``cost`` tokens fits after ``prefill`` tokens admitted this step.

    A recomputed request holds prompt + generated tokens, which may exceed ``max_num_batched_tokens``;
    with the budget as a hard limit it could never come back and the run would never end. vLLM's v1
    engine continues such a prefill in chunks of the budget over several steps; the simulator admits
    it alone, when the step's budget is untouched, and charges all its tokens to that step's prefill
    compute (the same compute, in one step instead of several). Fresh prompts over the budget are
    rejected up front (``prompt_exceeds_max_num_batched_tokens``), so only recomputes use this.
    """
    return cost <= cfg.max_num_batched_tokens - prefill or prefill == 0


def no_progress_reason(blocked: str | None) -> str:
    """The rejection reason of a head that can never be admitted (model.py rule 6)."""
    return f"no_progress_blocked_by_{blocked or 'unknown'}"


def rejection(req: SimRequest, cfg: SimConfig, alloc: AllocatorSpec) -> str | None:
    """Why a request can never run under this config, or None."""
    if req.prompt >= cfg.max_model_len:
        return "prompt_exceeds_max_model_len"
    if req.final_len > cfg.max_model_len:  # workloads clip outputs; a request past the limit cannot run
        return "exceeds_max_model_len"
    if req.prompt < cfg.shared_prefix:  # workloads build prompts as the shared prefix plus their own tokens
        return "prompt_shorter_than_shared_prefix"
    if req.n > cfg.max_num_seqs:
        return "more_sequences_than_max_num_seqs"
    if req.prompt > cfg.max_num_batched_tokens:
        return "prompt_exceeds_max_num_batched_tokens"
    if alloc.paged:
        b = alloc.block_size
        shared = req.prompt // b if req.n > 1 else 0
        blocks = shared + req.n * (-(-req.final_len // b) - shared)
        if blocks > cfg.pool_slots // b:
            return "larger_than_kv_pool"
    else:
        need = alloc.reservation_slots(req.prompt, req.output, cfg.max_model_len)
        if alloc.placement == "buddy":
            need = next_pow2(need)
        if req.n * need > cfg.pool_slots:
            return "larger_than_kv_pool"
    return None




def screen(reqs: RequestArrays, cfg: SimConfig, alloc: AllocatorSpec,
           rule=None) -> tuple[list[int] | None, dict[str, int]]:
    """The requests that can run (positions, or None for all) and the others' reasons.

    ``rule`` is ``rejection`` unless a test substitutes its own. With ``rejection``, bounds over the
    columns (largest prompt, output, n; smallest prompt) show in one pass of C loops that no rule
    can fire, which is the usual case; otherwise every request is asked.
    """
    rule = rule or rejection
    n_req = len(reqs)
    if not n_req:
        return None, {}
    if rule is rejection:
        from operator import add

        p, o, ns = reqs.prompt, reqs.output, reqs.n
        max_p, max_o, max_n = max(p), max(o), max(ns)
        max_final = max(map(add, p, o))
        mml = cfg.max_model_len
        ok = (max_p < mml and max_final <= mml and min(p) >= cfg.shared_prefix and max_n <= cfg.max_num_seqs
              and max_p <= cfg.max_num_batched_tokens)
        if ok and alloc.paged:
            ok = max_n * -(-max_final // alloc.block_size) <= cfg.pool_slots // alloc.block_size
        elif ok:
            bound = (mml if alloc.reservation == "max" else
                     min(max_p + next_pow2(max_o), mml) if alloc.reservation == "pow2" else max_final)
            if alloc.placement == "buddy":
                bound = next_pow2(bound)
            ok = max_n * bound <= cfg.pool_slots
        if ok:
            return None, {}
    keep: list[int] = []
    reasons: dict[str, int] = {}
    for i, r in enumerate(reqs):
        why = rule(r, cfg, alloc)
        if why:
            reasons[why] = reasons.get(why, 0) + 1
        else:
            keep.append(i)
    return keep, reasons


@dataclass(frozen=True, slots=True, kw_only=True)
class Latency:
    """Per-request latency of the completed requests, by percentile, in seconds.

    queue: arrival to first admission; ttft (time to first token): arrival to the end of the step that
    first prefilled the prompt (a step's clock is its start plus its duration); e2e: arrival to the end
    of the step that completed the request (preemptions and recomputes included).
    """

    queue_s: Percentiles
    ttft_s: Percentiles
    e2e_s: Percentiles


def latency_of(queue_ps: Sequence[int], ttft_ps: Sequence[int], e2e_ps: Sequence[int]) -> Latency:
    return Latency(queue_s=percentiles_s(queue_ps), ttft_s=percentiles_s(ttft_ps), e2e_s=percentiles_s(e2e_ps))


@dataclass(frozen=True, kw_only=True)
class SimResult:
    allocator: str
    token_states_frac: float
    reserved_frac: float
    internal_frag_frac: float
    external_frag_frac: float
    free_frac: float
    mean_batch_size: float
    peak_batch_size: int
    preemptions: int
    completed: int
    rejected: int
    rejected_reasons: dict[str, int]
    makespan_steps: int
    makespan_seconds: float
    generated_tokens: int
    throughput_tokens_per_s: float  # generated tokens per busy second (drain included, idle gaps not)
    busy_seconds: float  # clock time with at least one running sequence
    drain_seconds: float  # from the last arrival to the end of the run
    peak_waiting: int
    mean_queue_seconds: float
    # (step, clock ps at the step's start, token, reserved, internal, external, free slots)
    timeline: tuple[tuple[int, int, int, int, int, int, int], ...] = ()
    latency: Latency | None = None  # None from an engine that does not time requests
