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

from kvplan.core.spec import AttentionLayer, MLALayer, ModelSpec

GiB = 1 << 30
MiB = 1 << 20

# Transient bytes per token of the profiling forward pass, as a multiple of the widest per-token
# activation (the gate/up projection output of the MLP, or of the active experts for MoE).
ACTIVATION_WIDTH_FACTOR = 2.0
# The sampler's dummy run: fp32 logits for max_num_seqs rows, plus softmax/sort copies.
SAMPLER_COPIES = 2
NON_TORCH_TP1_BYTES = 256 * MiB  # cuBLAS/cuDNN workspaces and context growth after the init snapshot
NON_TORCH_PER_EXTRA_RANK_BYTES = 128 * MiB  # NCCL buffers and IPC handles grow with the ranks
NON_TORCH_MULTI_GPU_BASE_BYTES = 512 * MiB
CUDA_GRAPH_BASE_BYTES = 256 * MiB  # captured graphs' private pools for the default capture sizes
CUDA_GRAPH_PER_LAYER_BYTES = 4 * MiB


def widest_activation(spec: ModelSpec, tp: int) -> int:
    """Elements per token of the widest intermediate activation on one rank."""
    arch = spec.arch
    hidden = spec.hidden_size
    if arch is None:
        return 4 * hidden
    widths = [2 * arch.intermediate_size // tp]
    if arch.moe is not None:
        widths.append(2 * arch.moe.experts_per_token * arch.moe.expert_intermediate // tp)
    for layer in spec.layers:
        if isinstance(layer, AttentionLayer):
            widths.append((spec.num_attention_heads * layer.k_head_dim + 2 * layer.num_kv_heads * layer.k_head_dim) // tp)
        elif isinstance(layer, MLALayer):
            widths.append(layer.num_heads * (layer.qk_nope_head_dim + layer.v_head_dim) // tp)
    return max(widths) + 2 * hidden


def activation_peak_bytes(spec: ModelSpec, *, tokens: int, max_num_seqs: int, tp: int, act_bytes: int,
                          last_stage: bool = True) -> int:
    """Peak activation of a profiling run over ``tokens`` tokens (vLLM ``profile_run``)."""
    forward = int(tokens * widest_activation(spec, tp) * act_bytes * ACTIVATION_WIDTH_FACTOR)
    vocab = spec.arch.vocab_size if spec.arch else 0
    sampler = max_num_seqs * -(-vocab // tp) * 4 * SAMPLER_COPIES if last_stage else 0
    return forward + sampler


def non_torch_bytes(tp: int, pp: int) -> int:
    ranks = tp * pp
    if ranks == 1:
        return NON_TORCH_TP1_BYTES
    return NON_TORCH_MULTI_GPU_BASE_BYTES + NON_TORCH_PER_EXTRA_RANK_BYTES * (ranks - 1)


def cuda_graph_bytes(spec: ModelSpec, *, enforce_eager: bool, pp: int) -> int:
    if enforce_eager:
        return 0
    return CUDA_GRAPH_BASE_BYTES + CUDA_GRAPH_PER_LAYER_BYTES * -(-spec.num_layers // pp)
