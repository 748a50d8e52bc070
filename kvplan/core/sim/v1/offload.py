"""A CPU tier after vLLM's native offloading (OffloadingConnector with the CPU backend, 0.33.0).

Modelled (vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py, OffloadingConnectorScheduler;
vllm/v1/kv_offload/cpu/spec.py and manager.py):
- the tier holds cpu_bytes // round_up(chunk bytes, host page) chunks of ``blocks_per_chunk`` GPU blocks
  (CPUOffloadingSpec.__init__), keyed by the prefix hash of the chunk's last block and the group;
- stores are write-through: each step, the prompt's full chunks computed so far (offload_prompt_only,
  the default) that the tier lacks are copied GPU -> CPU (_build_store_jobs, CPUOffloadingManager.
  prepare_store), evicting least recently used chunks when full; chunks already there are not copied again;
- at admission, after the GPU prefix hit, the consecutive chunks the tier holds (full-attention prefix
  lookup, _lookup_complete_chunks / _maximal_prefix_lookup, no hit shorter than one chunk) are loaded into
  newly allocated GPU blocks that then count as cached (KVCacheManager.allocate_slots with
  num_external_computed_tokens); a load of every token leaves the last one to compute
  (Scheduler._update_waiting_for_remote_kv).
Simplified: every load is synchronous (vLLM's sync-load budget path): the step that admits the request
waits for the load, so its duration grows by bytes / bandwidth; vLLM's default asynchronous load admits
the request one or more steps later instead. Stores overlap the forward pass (their seconds are
reported, not added to steps). Recency is plain LRU (a store or a hit makes a chunk the newest);
vLLM's LRU ranks a request's chunks together. Only full-attention groups are offloaded (a sliding or
Mamba group raises), and the GPU prefix cache must be on (the connector reads its block hashes).
"""

from __future__ import annotations

from collections import OrderedDict

from kvplan.core.sim.v1.inputs import FULL, HOST_PAGE_BYTES, CacheLayout, OffloadConfig
from kvplan.errors import InputError


class CPUTier:
    __slots__ = (
        "bandwidth",
        "block_size",
        "bytes_loaded",
        "bytes_stored",
        "capacity",
        "chunk_blocks",
        "chunk_bytes",
        "evicted_chunks",
        "groups",
        "load_ps",
        "loaded_chunks",
        "lru",
        "stored_chunks",
    )

    def __init__(self, cfg: OffloadConfig, layout: CacheLayout, prefix_caching: bool) -> None:
        if not prefix_caching:
            raise InputError("the CPU offload tier needs enable_prefix_caching (it stores blocks by their hashes)")
        if any(g.kind != FULL for g in layout.groups):
            raise InputError("CPU offload is modelled for full-attention (and MLA) models only")
        if layout.block_bytes <= 0:
            raise InputError("CPU offload needs the pool block's bytes (layout.block_bytes)")
        self.chunk_blocks = cfg.blocks_per_chunk
        raw = layout.block_bytes * cfg.blocks_per_chunk
        self.chunk_bytes = -(-raw // HOST_PAGE_BYTES) * HOST_PAGE_BYTES
        self.capacity = cfg.cpu_bytes // self.chunk_bytes
        self.lru: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.groups = len(layout.groups)
        self.block_size = layout.groups[0].block_size
        self.bandwidth = cfg.bandwidth_bytes_per_s
        self.stored_chunks = self.loaded_chunks = self.evicted_chunks = 0
        self.bytes_stored = self.bytes_loaded = 0
        self.load_ps = 0  # load time of the current step

    def lookup(self, keys: list[int], local_tokens: int, num_tokens: int) -> tuple[int, int]:
        """(tokens loadable beyond the GPU hit, chunks to load) for a request of num_tokens tokens."""
        t = self.block_size * self.chunk_blocks
        num_chunks = len(keys) // self.chunk_blocks  # chunks whose tokens are all known
        start = local_tokens // t
        if min(num_tokens, num_chunks * t) - local_tokens < t:
            return 0, 0
        lru = self.lru
        hits = 0
        for c in range(start, num_chunks):
            k = keys[(c + 1) * self.chunk_blocks - 1]
            if any((g, k) not in lru for g in range(self.groups)):
                break
            hits += 1
        tokens = min(num_tokens, (start + hits) * t) - local_tokens
        if tokens < t:
            return 0, 0
        for c in range(start, start + hits):
            k = keys[(c + 1) * self.chunk_blocks - 1]
            for g in range(self.groups):
                lru.move_to_end((g, k))
        tokens = min(tokens, num_tokens - 1 - local_tokens)  # the last token is computed
        return tokens, hits

    def load(self, chunks: int) -> None:
        n = chunks * self.groups
        self.loaded_chunks += n
        self.bytes_loaded += n * self.chunk_bytes
        self.load_ps += round(n * self.chunk_bytes / self.bandwidth * 1e12)

    def store(self, keys: list[int], first_chunk: int, end_tokens: int) -> int:
        """Offer the full chunks before end_tokens from first_chunk on; the next chunk to offer."""
        t = self.block_size * self.chunk_blocks
        end = min(end_tokens // t, len(keys) // self.chunk_blocks)
        lru, cap = self.lru, self.capacity
        for c in range(first_chunk, end):
            k = keys[(c + 1) * self.chunk_blocks - 1]
            for g in range(self.groups):
                gk = (g, k)
                if gk in lru:
                    lru.move_to_end(gk)
                    continue
                if cap == 0:
                    continue
                if len(lru) >= cap:
                    lru.popitem(last=False)
                    self.evicted_chunks += 1
                lru[gk] = None
                self.stored_chunks += 1
                self.bytes_stored += self.chunk_bytes
        return max(first_chunk, end)

    def take_load_ps(self) -> int:
        ps, self.load_ps = self.load_ps, 0
        return ps
