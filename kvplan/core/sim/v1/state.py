"""A request inside the v1 simulator: its token counts, block tables per group and statistics, as one object with
slots (the scheduler's loop reads and writes them every step)."""

from __future__ import annotations

from kvplan.core.sim.v1.hashing import BlockHasher, PrivateKeys


class ReqState:
    """A request inside the simulator: token counts, block tables per group, statistics."""

    __slots__ = (
        "arrival_ps",
        "arrival_step",
        "blocks",
        "cached_tokens",
        "cap_tokens",
        "cpu_tokens",
        "due",
        "final",
        "eligible",
        "entries",
        "finish_ps",
        "finish_step",
        "first_scheduled_ps",
        "first_scheduled_step",
        "first_token_ps",
        "first_token_step",
        "generated",
        "hasher",
        "in_flight",
        "index",
        "internal",
        "mapped",
        "max_tokens",
        "ncached",
        "next_free_at",
        "next_store_chunk",
        "num_computed",
        "num_preemptions",
        "num_tokens",
        "placeholders",
        "private",
        "prompt_len",
        "source",
        "stale",
        "tracked",
    )

    def __init__(self, index: int, source, prompt_len: int, max_tokens: int, due: int, num_groups: int) -> None:
        self.index = index
        self.source = source  # the run's requests: this one is source[index] (``req``)
        self.due = due  # its arrival: picoseconds where the run is timed, else its step
        self.prompt_len = prompt_len
        self.num_tokens = prompt_len
        self.max_tokens = max_tokens
        self.final = prompt_len + max_tokens - 1  # its last computed token's count (_Sim._state: max_model_len at most)
        self.generated = 0
        self.num_computed = 0
        self.blocks: list[list[int]] = [[] for _ in range(num_groups)]
        self.ncached = [0] * num_groups
        self.tracked = False  # vLLM: request id in num_cached_block (admitted, blocks held)
        self.hasher: BlockHasher | PrivateKeys | None = None
        # Its first segment its own (kvplan.core.sim.v1.hashing.PrivateKeys) where the manager files such requests'
        # blocks when they are freed (KVCacheManager.deferred): its leading blocks in the prefix-cache map (hits)
        self.private = False
        self.mapped = 0
        self.num_preemptions = 0
        self.arrival_step = -1
        self.arrival_ps = 0
        self.first_scheduled_step = -1
        self.first_token_step = -1
        self.finish_step = -1
        self.cached_tokens = 0
        self.cpu_tokens = 0
        self.first_scheduled_ps = 0
        self.first_token_ps = 0
        self.finish_ps = 0
        self.next_store_chunk = 0
        # Fast path of a running request's allocation: the tokens its blocks hold in every group, and the
        # computed count at which a sliding/chunked group next frees a block (both kept by KVCacheManager).
        self.cap_tokens = 0
        self.next_free_at = 0
        # Async scheduling (vllm/v1/request.py): tokens scheduled in a batch whose output is not yet
        # processed; tokens being sampled in flight (num_output_placeholders); in-flight tokens of a
        # preempted request whose output is stale (num_stale_output_tokens).
        self.in_flight = 0
        self.placeholders = 0
        self.stale = 0
        # the first schedule() call that may decode it again: async scheduling on vLLM's V2 model runner with
        # pipeline parallelism staggers a request's decodes pp steps apart (next_decode_eligible_step)
        self.eligible = 0
        # Memory books (KVCacheManager.entries / internal): its table entries in token-slot groups, and its
        # internal fragmentation in pool units
        self.entries = 0
        self.internal = 0

    @property
    def req(self):  # type: ignore[no-untyped-def]
        """The request (a V1Request; made from its table's row where the run's requests are a RequestTable)."""
        return self.source[self.index]
