"""An exact, step-by-step simulator of vLLM v1's scheduler and KV cache manager (0.33.0 rules).

``inputs.py`` what is simulated (scheduler settings, KV cache groups, requests as segments, CPU tier, the
allocator); ``pool.py`` the block pool; ``hashing.py`` block hashes from segments; ``state.py`` a request's state;
``manager.py`` the KV cache manager and its groups; ``contiguous.py`` contiguous allocators behind the same
interface; ``offload.py`` the CPU tier; ``scheduler.py`` the step loop; ``shares.py`` where the pool's memory
goes; ``result.py`` what it reports.
Checked against vLLM's own scheduler by tests/core/sim/test_vllm_reference.py.
"""

from kvplan.core.sim.v1.inputs import (
                                       CHUNKED,
                                       FULL,
                                       MAMBA,
                                       SLIDING,
                                       CacheGroup,
                                       CacheLayout,
                                       OffloadConfig,
                                       SchedulerConfig,
                                       V1Inputs,
                                       V1Request,
                                       layout_from_plan,
)
from kvplan.core.sim.v1.result import Percentiles, RequestRecord, TierStats, V1Result
from kvplan.core.sim.v1.scheduler import simulate_v1

__all__ = ["CHUNKED", "FULL", "MAMBA", "SLIDING", "CacheGroup", "CacheLayout", "OffloadConfig", "Percentiles",
           "RequestRecord", "SchedulerConfig", "TierStats", "V1Inputs", "V1Request", "V1Result", "layout_from_plan",
           "simulate_v1"]
