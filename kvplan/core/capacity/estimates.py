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
# CUDA graphs (Table C): V0 0.13 / 0.21 / 3.34 GiB for Qwen3-0.6B / Llama-3.2-1B / a 49B model, about
# 5.5 KiB per layer per hidden unit; V1 piecewise graphs 0.44 / 2.02 GiB for Gemma-3-1B / Llama-3.1-8B,
# about 15.5 KiB per layer per hidden unit (per TP rank: the captured buffers are sharded).
CUDA_GRAPH_BYTES_PER_LAYER_HIDDEN_V1 = 15_872
CUDA_GRAPH_BYTES_PER_LAYER_HIDDEN_V0 = 5_632


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


def cuda_graph_bytes(spec: ModelSpec, *, enforce_eager: bool, tp: int, pp: int, v1: bool = True) -> int:
    if enforce_eager:
        return 0
    per = CUDA_GRAPH_BYTES_PER_LAYER_HIDDEN_V1 if v1 else CUDA_GRAPH_BYTES_PER_LAYER_HIDDEN_V0
    return per * -(-spec.num_layers // pp) * spec.hidden_size // tp
