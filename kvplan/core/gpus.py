"""A GPU as the planner sees it: memory the driver reports, bandwidth, peak throughput."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    name: str
    memory_bytes: int  # total as CUDA reports it (torch.cuda.mem_get_info()[1])
    hbm_bandwidth_bytes_per_s: int = 0
    bf16_dense_tflops: float | None = None
    fp8_dense_tflops: float | None = None
    vendor: str = ""
    sm_count: int = 0  # streaming multiprocessors; 0: unknown (a GPU given by memory size)
    compute_capability: float | None = None  # CUDA major.minor; None: unknown or not CUDA
    source: str = ""
    aliases: tuple[str, ...] = ()

    @property
    def nvswitch_hopper_class(self) -> bool:
        """Hopper or later on an NVSwitch board (HGX: H100 SXM, H200, H20, B200), not the PCIe or NVL-bridge cards:
        where NCCL's NVLink SHARP buffers back the tensor-parallel all-reduce (estimates.NON_TORCH_NVSWITCH_TP_BYTES)."""
        return self.name.upper() in ("H100-80GB", "H200", "H20", "B200")

    @property
    def is_a100_class(self) -> bool:
        """vLLM lowers its batching defaults on A100s (vllm/engine/arg_utils.py)."""
        return self.name.upper().startswith(("A100", "A800"))
