"""Where the pool's memory goes in a v1 simulation: the shares the event engine reports (kvplan/core/sim/engine.py),
defined the same way so both simulators' rows compare.

At each counted step (V1Result.steps: a schedule() that scheduled a token), right after schedule(), every unit of
the pool is one of:
- token states: slots holding a token's KV, the tokens computed by the end of the step (num_computed); a block
  shared by several requests through prefix caching counted once;
- reserved: allocated slots a later token of the request will fill;
- internal fragmentation: allocated slots no token of the request will ever fill: past the tokens it will compute
  (prompt + output - 1 within max_model_len: the last sampled token's KV is never written), in its last block once
  its table has reached that block (paged), or in its region, the placement's rounding included (contiguous);
- external fragmentation: free slots the head of the queue could not use: all the free slots at a step whose
  admission stopped at a region the placement could not place although that many slots were free (the event
  engine's rule); 0 for the paged pool;
- free: the rest. Evictable prefix-cached blocks are free, as vLLM's usage counts them.
Each share is averaged over the counted steps (each step weighted equally, as the event engine weights its busy
steps).

Units: the paged pool is (num_blocks - 1) blocks (the null block is never handed out); a block is ``unit`` units,
the least common multiple of the token groups' block sizes, so a slot of a group of block size B is unit / B
units: with one block size a unit is a slot and the pool (num_blocks - 1) x block_size slots summed over the
groups' blocks. A contiguous pool is num_blocks x block_size slots, one unit each. Layouts with a Mamba/linear
group are not measured (a per-sequence state is not token slots).

Kept in O(1) per step (incremental books, no walk over the running requests): the managers keep ``entries`` (the
table entries of the requests holding memory, nulls included; contiguous: their regions' slots) and ``internal``;
the scheduler keeps the computed tokens of those requests. A request's table holds cdiv(computed, B) entries, a
block shared through the prefix cache is always full, and a block behind a sliding window is a null entry, so
``unit x entries - weight x computed`` is exactly the slack of the requests' last blocks (reserved + internal),
and token states are the allocated units less that slack. The split is linear, so the averages are the split of
the sums. tests/core/sim/test_v1_shares.py recounts it slot by slot at every step.
"""

from __future__ import annotations

from dataclasses import dataclass

# (step, clock ps at the step's start (0 without a step model), token, reserved, internal, external, free units)
TimelinePoint = tuple[int, int, int, int, int, int, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class Books:
    """What the managers tell the split: a pool block's units, a token's units over the groups, the pool's units
    and what ``pool.num_free`` counts (blocks, or slots of a contiguous pool)."""

    unit: int
    weight: int
    pool_units: int
    capacity: int
    measured: bool


def split(b: Books, steps: int, free: int, entries: int, computed: int, internal: int,
          external: int) -> tuple[int, int, int, int, int]:
    """(token, reserved, internal, external, free) units of ``steps`` steps whose ``pool.num_free``, entries,
    computed tokens, internal and external units sum to the arguments (one step: the values themselves)."""
    allocated = steps * b.pool_units - b.unit * free
    slack = b.unit * entries - b.weight * computed
    return allocated - slack, slack - internal, internal, external, b.unit * free - external


@dataclass(frozen=True, slots=True, kw_only=True)
class Shares:
    token_states_frac: float
    reserved_frac: float
    internal_frag_frac: float
    external_frag_frac: float
    free_frac: float


def shares(b: Books, steps: int, free: int, entries: int, computed: int, internal: int,
           external: int) -> Shares | None:
    """The shares averaged over ``steps`` counted steps (None: not measured, or no step counted)."""
    if not b.measured or not steps:
        return None
    parts = split(b, steps, free, entries, computed, internal, external)
    total = steps * b.pool_units
    return Shares(**dict(zip(("token_states_frac", "reserved_frac", "internal_frag_frac", "external_frag_frac",
                              "free_frac"), (p / total for p in parts))))


def timeline_every(points: int, requests: int, output_tokens: int, max_num_seqs: int) -> int:
    """Sample every this many counted steps for about ``points`` points (0: no timeline): the event engine's guess
    at the run's steps, halved as the run turns out longer (``thin``)."""
    if not points:
        return 0
    return max(1, (output_tokens // max(1, max_num_seqs) + requests) // points)


def thin(timeline: list[TimelinePoint], points: int, every: int) -> int:
    """Every other point once there are twice as many as asked; the sampling interval from here on."""
    if len(timeline) >= 2 * points:
        del timeline[1::2]
        return every * 2
    return every
