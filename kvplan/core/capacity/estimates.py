"""Estimates of the memory that is not weights or KV cache: the activation peak of the engine's
profiling run, non-torch memory (CUDA context growth, cuBLAS workspaces, NCCL buffers) and CUDA
graph memory.

These cannot be known to the byte without running the engine: they are *estimates*, always marked
as such in the output, and each can be replaced by a measured value (``--activation-memory``,
``--non-torch-memory``, ``--cuda-graph-memory``). The constants are calibrated on the measured
points in docs/calibration-points.md (real vLLM startup logs); the fit and its error are reported
there.
"""

from __future__ import annotations

from kvplan.core.dtypes import get_dtype
from kvplan.core.spec import ModelSpec

MiB = 1 << 20

# Fitted on docs/calibration-points.md, Table A (vLLM V0 logs with the full breakdown): the activation
# peak of a profiling forward pass is linear in the batched tokens with a slope of about 27 bytes per
# hidden unit per token in bf16, whatever the MLP width or TP (Llama-3.1-8B: 2.07 / 2.99 GiB at 20k /
# 29k tokens, predicted 2.06 / 2.99; Qwen2.5-32B tp2: 1.26 GiB at 10k, predicted 1.29; Qwen3-0.6B: 0.23
# at 8k, predicted 0.21). It over-predicts MoE/MLA models (DeepSeek-V3 AWQ tp16: 0.37 GiB logged,
# 1.48 predicted) and under-predicts quantized (bitsandbytes) and multimodal ones.
ACTIVATION_BYTES_PER_HIDDEN_PER_TOKEN = 27  # at 2-byte activations; scaled by the activation width
# A sampler run over max_num_seqs rows of fp32 logits (plus a softmax copy), for the engines whose profile runs one
# (SGLang, TensorRT-LLM); vLLM V0 showed no such term (Table A: the activation line passes through zero).
SAMPLER_COPIES = 2
# Non-torch memory after vLLM's init snapshot (0.6.5+ meaning: the increase during the profile run): 0.03-0.16
# GiB at tp 1 (Table A: A2, A5, A6, A10, A11; the k8s H100 log 0.16), 0.20-0.30 GiB with NCCL (A1, A3, A4).
NON_TORCH_TP1_BYTES = 160 * MiB
# vLLM V1 on one GPU: the llm-d-planner logs (vLLM 0.19.0, H100 SXM, tp 1 pp 1, 38 starts of 20 models) count
# 0.24-0.27 GiB (median 0.25; one outlier, granite-3.3-8b, 0.46), and the V1 0.21.0 point C6 (RTX A5000) implies
# the same beside the source-derived activation (tests/core/capacity/test_estimates.py). The kernels V1 loads in its
# profile run (torch.compile's Triton kernels, FlashAttention, the sampler's) are not counted by torch: an estimate,
# the mean of the 37 (255 MiB), inside the band below.
NON_TORCH_V1_TP1_BYTES = 255 * MiB
NON_TORCH_MULTI_GPU_BYTES = 300 * MiB
# vLLM V1 at tp >= 2 on NVSwitch boards of Hopper and later (H100 SXM, H200, H20, B200): the llm-d-planner logs
# (vLLM 0.19.0, H100 SXM, 12 starts at tp 2 and 4 of 8 models: tests/fixtures/vllm_logs/llm-d-planner-v0.19.0,
# benchmarks/bench_real_starts.py) count 2.06-2.21 GiB of non-torch memory per GPU, flat in tp and model, where the
# PCIe and consumer cards above (A1, A3, A4, tp 2-16) counted 0.20-0.30. The tensor-parallel all-reduce's
# buffers (NCCL communicators and their NVLink SHARP buffers on NVSwitch Hopper: vllm#9699) are created by the
# profile run's first collective and counted in it. Their size is NCCL's, not vLLM's: an estimate, the mean of
# the 12 (2.107 GiB), inside the same band (largest |error| 0.10 GiB). A100 SXM boards (NVSwitch, no NVLink
# SHARP) are not covered by any log and keep the PCIe figure.
NON_TORCH_NVSWITCH_TP_BYTES = 2157 * MiB
# CUDA graphs: memory per captured batch size, per layer and per hidden unit on one TP rank, by era
# (docs/calibration-points.md Table C; the number of sizes from kvplan/core/engines/vllm/profiles.py::capture_sizes).
# V0 (captured after the KV cache, measured by "Graph capturing finished ... took"): Qwen3-0.6B 0.13 GiB,
# Llama-3.2-1B 0.21 GiB, a 49B model 3.34 GiB, 35 sizes each: 142, 197 and 156 B (C1, C3, C5); mean 165.
CUDA_GRAPH_BYTES_PER_SIZE_LAYER_HIDDEN_V0 = 164
# V1 piecewise, 0.7-0.17 (measured after capture): Gemma-3-1B (26 layers x 1152) 0.44 GiB and Llama-3.1-8B
# (32 x 4096) 2.02 GiB, both 67 sizes: 235 and 247 B (C2, C4).
CUDA_GRAPH_BYTES_PER_SIZE_LAYER_HIDDEN_V1 = 238
# V1 0.18+: vLLM profiles the graphs itself and logs "Estimated CUDA graph memory: X GiB total" (subtracted
# from the KV budget from 0.20): Qwen3-8B (36 x 4096), 51 PIECEWISE sizes (+35 FULL decode graphs sharing the
# pool), 0.52 GiB on vLLM 0.21.0 (C6, LMCache#3430): 74 B. A single point: the graph pool shrank threefold
# from the 0.8 era (graph memory is shared across sizes), so the older constant would over-charge 3x.
CUDA_GRAPH_BYTES_PER_SIZE_LAYER_HIDDEN_V1_PROFILED = 74

# The error bands of the estimates on the calibration points (tests/core/capacity/test_estimates.py checks
# every point lies inside its band). The lead flags a fit "borderline" when its margin is smaller than these.
# Activation, dense bf16 text models (A1, A5, A7, A8; and C6's activation + non-torch, 0.21): errors +2.2%,
# -8.3%, -0.5%, +0.0%, -1.6%: the band is 10%. Outside it (not covered): bitsandbytes (-74%, A2), MoE/MLA
# (DeepSeek-V3 AWQ tp16 +300%, A4), fp32 tiny models where the sampler dominates (opt-125m -84%, A6),
# multimodal/encoder-decoder (A10, A11) and V1 0.8 (residual 5.6 GiB, B1).
ACTIVATION_ERROR_FRAC = 0.10
# Non-torch (0.6.5+ meaning): largest |kvplan - logged| is 0.13 GiB (0.03 logged on Windows/WSL at tp 1, A2,
# A6; 0.20 at tp 16 vs 0.29, A4). 0.6.4 counted more (0.35 GiB, A7): 0.19 GiB off, outside the band.
NON_TORCH_ERROR_BYTES = 140 * MiB
# CUDA graphs: V0 +15%, -17%, +5% (C1, C3, C5); V1 piecewise +1%, -4% (C2, C4); V1 profiled 0% (one point,
# C6, so the band is the V0 one): 20%.
CUDA_GRAPH_ERROR_FRAC = 0.20


def activation_peak_bytes(spec: ModelSpec, *, tokens: int, max_num_seqs: int, tp: int, act_bytes: int,
                          last_stage: bool = True, sampler_run: bool = True) -> int:
    """Peak activation of a profiling run over ``tokens`` batched tokens: vLLM V0's ``profile_run`` and the other
    engines' (vLLM V1 has its own model, kvplan/core/engines/vllm/activation.py). The sampler term counts a rank's
    share of the vocabulary, vocab / tp."""
    forward = tokens * spec.hidden_size * ACTIVATION_BYTES_PER_HIDDEN_PER_TOKEN * act_bytes // 2
    vocab = spec.arch.vocab_size if spec.arch else 0
    fp32 = get_dtype("fp32").vector_bytes(1)  # the sampler's logits are float32
    width = -(-vocab // tp)
    sampler = max_num_seqs * width * fp32 * SAMPLER_COPIES if (last_stage and sampler_run) else 0
    return forward + sampler


def non_torch_bytes(tp: int, pp: int, *, nvswitch_all_reduce: bool = False, v1: bool = False) -> int:
    """Non-torch memory one GPU's profile run adds; ``nvswitch_all_reduce``: vLLM V1's tensor-parallel all-reduce
    on an NVSwitch board of Hopper and later (counted at tp >= 2); ``v1``: vLLM's V1 engine (one GPU)."""
    if nvswitch_all_reduce and tp >= 2:
        return NON_TORCH_NVSWITCH_TP_BYTES
    if tp * pp == 1:
        return NON_TORCH_V1_TP1_BYTES if v1 else NON_TORCH_TP1_BYTES
    return NON_TORCH_MULTI_GPU_BYTES


CUDA_GRAPH_ERAS = {"v0": CUDA_GRAPH_BYTES_PER_SIZE_LAYER_HIDDEN_V0, "v1": CUDA_GRAPH_BYTES_PER_SIZE_LAYER_HIDDEN_V1,
                   "v1_profiled": CUDA_GRAPH_BYTES_PER_SIZE_LAYER_HIDDEN_V1_PROFILED}


def cuda_graph_era(rules: object) -> str:
    """The CUDA-graph calibration era of a vLLM release's rules (kvplan/core/engines/vllm/profiles.py::VLLMRules)."""
    if not getattr(rules, "v1", True):
        return "v0"
    return "v1" if getattr(rules, "cuda_graphs", "after_kv") == "after_kv" else "v1_profiled"


def cuda_graph_bytes(spec: ModelSpec, *, num_graphs: int, tp: int, pp: int, v1: bool = True,
                     era: str | None = None) -> int:
    """Memory of ``num_graphs`` captured batch sizes on one GPU (0 when eager). ``era``: a key of
    CUDA_GRAPH_ERAS (default: "v1" or "v0" by ``v1``)."""
    per = CUDA_GRAPH_ERAS[era or ("v1" if v1 else "v0")]
    return per * num_graphs * -(-spec.num_layers // pp) * spec.hidden_size // tp
