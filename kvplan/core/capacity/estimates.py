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
from kvplan.core.units import GiB

MiB = 1 << 20

# Fitted on docs/calibration-points.md, Table A (vLLM V0 logs with the full breakdown): the activation
# peak of a profiling forward pass is linear in the batched tokens with a slope of about 27 bytes per
# hidden unit per token in bf16, whatever the MLP width or TP (Llama-3.1-8B: 2.07 / 2.99 GiB at 20k /
# 29k tokens, predicted 2.06 / 2.99; Qwen2.5-32B tp2: 1.26 GiB at 10k, predicted 1.29; Qwen3-0.6B: 0.23
# at 8k, predicted 0.21). It over-predicts MoE/MLA models (DeepSeek-V3 AWQ tp16: 0.37 GiB logged,
# 1.48 predicted) and under-predicts quantized (bitsandbytes) and multimodal ones.
ACTIVATION_BYTES_PER_HIDDEN_PER_TOKEN = 27  # at 2-byte activations; scaled by the activation width
# vLLM V1's profile also runs the sampler on max_num_seqs rows of fp32 logits (plus a softmax copy):
# ``vllm/v1/worker/gpu_model_runner.py:_dummy_sampler_run``. V0 showed no such term (Table A: the
# activation line passes through zero).
SAMPLER_COPIES = 2
# Non-torch memory after vLLM's init snapshot: 0.03-0.16 GiB at tp 1 (Table A: A2, A5, A6, A10, A11),
# 0.20-0.30 GiB with NCCL (A1, A3, A4).
NON_TORCH_TP1_BYTES = 160 * MiB
NON_TORCH_MULTI_GPU_BYTES = 300 * MiB
# CUDA graphs (Table C): memory per captured batch size, per layer and per hidden unit on one TP rank.
# V1 piecewise: Gemma-3-1B (26 layers x 1152) 0.44 GiB and Llama-3.1-8B (32 x 4096) 2.02 GiB, both 67
# sizes: 235 and 247 B (C2, C4). V0: Qwen3-0.6B 0.13 GiB, Llama-3.2-1B 0.21 GiB, a 49B model 3.34 GiB,
# 35 sizes each: 139, 197 and 156 B (C1, C3, C5). vLLM 0.18+ subtracts its own estimate, which is also
# linear in the number of sizes (first capture + per graph x (n - 1); docs/engine-versions-research.md 2c).
CUDA_GRAPH_BYTES_PER_SIZE_LAYER_HIDDEN_V1 = 238
CUDA_GRAPH_BYTES_PER_SIZE_LAYER_HIDDEN_V0 = 164

def activation_peak_bytes(spec: ModelSpec, *, tokens: int, max_num_seqs: int, tp: int, act_bytes: int,
                          last_stage: bool = True, sampler_run: bool = True) -> int:
    """Peak activation of a profiling run over ``tokens`` batched tokens (vLLM ``profile_run``)."""
    forward = tokens * spec.hidden_size * ACTIVATION_BYTES_PER_HIDDEN_PER_TOKEN * act_bytes // 2
    vocab = spec.arch.vocab_size if spec.arch else 0
    fp32 = get_dtype("fp32").vector_bytes(1)  # the sampler's logits are float32
    sampler = max_num_seqs * -(-vocab // tp) * fp32 * SAMPLER_COPIES if (last_stage and sampler_run) else 0
    return forward + sampler


def non_torch_bytes(tp: int, pp: int) -> int:
    return NON_TORCH_TP1_BYTES if tp * pp == 1 else NON_TORCH_MULTI_GPU_BYTES


def cuda_graph_bytes(spec: ModelSpec, *, num_graphs: int, tp: int, pp: int, v1: bool = True) -> int:
    """Memory of ``num_graphs`` captured batch sizes on one GPU (0 when eager)."""
    per = CUDA_GRAPH_BYTES_PER_SIZE_LAYER_HIDDEN_V1 if v1 else CUDA_GRAPH_BYTES_PER_SIZE_LAYER_HIDDEN_V0
    return per * num_graphs * -(-spec.num_layers // pp) * spec.hidden_size // tp
