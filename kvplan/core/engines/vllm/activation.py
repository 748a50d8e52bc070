"""The activation peak of vLLM V1's profile run, from the release's source.

vLLM charges the KV budget with the torch peak of ``profile_run`` (vllm/v1/worker/gpu_model_runner.py, 0.19.0):
a forward pass over max_num_batched_tokens dummy tokens, then, on the last pipeline stage, ``_dummy_sampler_run``
on one row per request (num_reqs = min(max_num_seqs, tokens)) with top-k, top-p and a temperature set. The peak
is the larger of the two phases, plus what stays allocated through both:

- **Sampler phase** (last stage): the logits of the whole vocabulary in the model dtype (every TP rank holds them
  all: LogitsProcessor._gather_logits), their float32 copy (sampler.py::Sampler.forward, ``logits.to(float32)``:
  the same tensor when the model runs in float32), then by release:
  - ``TRITON`` (0.17.0 on: ops/topk_topp_sampler.py::apply_top_k_top_p sends a batch of 8 or more to
    topk_topp_triton.py::apply_top_k_top_p_triton, in place, with a cached buffer of min(SMs, rows) x vocab
    float32): the probabilities (``softmax(dtype=float32)``) and the exponential noise beside them
    (``random_sample``: ``torch.empty_like(probs)``): 8 bytes an element;
  - ``SORT`` (0.8.0-0.16.x, the PyTorch path): ``logits.sort`` (float32 values, int64 indices), the top-k and
    top-p boolean masks, the softmax of the sorted logits (the cumsum written into it) and the ``scatter`` back:
    22 bytes an element at its peak (FlashInfer's sampler, opt-in, is not modelled).
  The forward's output stays referenced: hidden states (tokens x hidden), the sampled rows and their
  ``torch.rand_like`` copy (2 x rows x hidden).
- **Forward phase**, an estimate: the widest dense MLP's gate/up output and its activation (3 x width / tp a
  token; 2 x without a gate) and four hidden-size tensors a token (the residual stream, its norm, the attention
  and MLP outputs).
- **Held through both**: PyTorch's cuBLAS(Lt) workspace, made by the run's first GEMM (aten/src/ATen/cuda/
  CUDABlas.cpp::_parseChosenWorkspaceSize: 32 MiB on compute capability 9.0 and later, 4 MiB on 8.x cards of
  24 GiB or more, else 1 MiB; pytorch#120925); from 0.13.0 the fused-MoE workspace, kept by
  vllm/v1/worker/workspace.py::WorkspaceManager (modular_kernel.py::_allocate_buffers: max(workspace13, output) +
  workspace2, Triton experts: fused_moe.py::TritonExperts.workspace_shapes, tokens x top-k x (max(I, H) +
  max(2I, H)) in the activation dtype; the monolithic MXFP4 kernels of gpt-oss keep none:
  gpt_oss_triton_kernels_moe.py::OAITritonMxfp4ExpertsMonolithic); on a stage after the first, the intermediate
  tensors it receives (hidden states and residual, tokens x hidden each: GPUModelRunner._dummy_run); for a
  multimodal model the encoder profile's dummy images, their pixel values and the encoder's outputs, both in
  the model dtype (GPUModelRunner.profile_run keeps batched_dummy_mm_inputs and the encoder cache until it ends;
  encoder_items counts them).

Measured against 51 vLLM 0.19.0 starts on H100 SXM (benchmarks/bench_real_starts.py; the llm-d-planner logs'
DEBUG "torch peak memory increase"): dense, MoE and multimodal models at tp 1-4 and pp 1-4 within 0.02 GiB but
Mixtral tp 2 (+0.06) and RedHatAI's int8 Mistral-Small-3.1 at tp 1 (-0.15), inside ACTIVATION_BAND_MEASURED.
Outside the band: float32 runs (+0.37 GiB logged).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kvplan.core.gpus import GPUSpec
from kvplan.core.spec import ModelSpec

MiB = 1 << 20
FP32 = 4


class Sampler(str, Enum):
    """What ``_dummy_sampler_run`` allocates beside the float32 logits, by release (the module docstring)."""

    NONE = "none"  # V0: the profile run samples nothing
    SORT = "sort"  # 0.8.0-0.16.x: PyTorch sort for top-k/top-p
    TRITON = "triton"  # 0.17.0 on: Triton top-k/top-p in place


# bytes per (row x vocab) element beside the float32 logits, at the phase's peak
SAMPLER_EXTRA_BYTES = {Sampler.TRITON: FP32 + FP32,  # probs, exponential noise
                       Sampler.SORT: FP32 + 8 + 1 + FP32 + 1 + FP32}  # sorted, indices, masks, softmax, scatter
TRITON_MIN_ROWS = 8  # apply_top_k_top_p: fewer rows take the PyTorch path
HIDDEN_TENSORS = 4  # forward-phase estimate: hidden-size tensors live a token
# Measured band of the whole estimate on the 0.19.0 H100 starts (the module docstring), and the band where no start
# measures the release's sampler, model runner or GPU (SORT releases, the V2 model runner, GPUs other than Hopper:
# the 0.21.0 point C6 on an RTX A5000 sits 17% above the estimate).
ACTIVATION_BAND_MEASURED = 0.05
ACTIVATION_BAND_UNMEASURED = 0.25


def cublas_workspace_bytes(gpu: GPUSpec) -> int:
    """PyTorch's cuBLASLt workspace on ``gpu`` (the module docstring); an unknown GPU is taken as Hopper."""
    cc = gpu.compute_capability
    if cc is None or cc >= 9:
        return 32 * MiB
    if cc >= 8 and gpu.memory_bytes >= 24 * (1 << 30):
        return 4 * MiB
    return MiB


@dataclass(frozen=True, kw_only=True)
class ProfileRun:
    """One GPU's profile run: what vLLM's peak is made of, each part in bytes."""

    forward: int  # the forward phase's transient peak (estimate)
    sampler: int  # the sampler phase (last stage; 0 elsewhere)
    held: int  # allocated through both phases: workspaces, received pipeline tensors, the encoder profile's items

    @property
    def peak(self) -> int:
        return self.held + max(self.forward, self.sampler)


def encoder_items(spec: ModelSpec, *, tokens: int, max_num_seqs: int, max_model_len: int, limit: int = 999) -> int:
    """Dummy items the encoder profile runs (vllm/multimodal/encoder_budget.py::MultiModalBudget._get_max_items):
    the encoder budget, max(max_num_batched_tokens, an item's tokens) (encoder_cache_manager.py::
    compute_mm_encoder_budget), over an item's tokens, capped by max_num_seqs x the items a prompt can hold
    (``limit``, --limit-mm-per-prompt's, 999 by default, at most max_model_len / an item's tokens); 0 for a text
    model or a limit of 0 (GPUModelRunner.profile_run profiles no encoder)."""
    tower = spec.arch.tower if spec.arch is not None else None
    if tower is None or not tower.item_tokens or limit == 0:
        return 0
    per = tower.item_tokens
    return max(1, min(max(tokens, per) // per, max_num_seqs * max(1, min(limit, max_model_len // per))))


def profile_run(spec: ModelSpec, *, tokens: int, max_num_seqs: int, tp: int, act_bytes: int, gpu: GPUSpec,
                sampler: Sampler, moe_workspace: bool, monolithic_moe: bool = False, first_stage: bool = True,
                last_stage: bool = True, mm_items: int = 0) -> ProfileRun:
    """The profile run of ``spec`` on one GPU of ``gpu`` (the module docstring's parts). ``act_bytes``: the model
    dtype's bytes (4 under --dtype float32); ``moe_workspace``: the release keeps the fused-MoE workspace (0.13.0
    on); ``monolithic_moe``: the experts run a kernel without it (gpt-oss's MXFP4); ``mm_items``: the
    multimodal encoder profile's dummy items, whose pixel values and encoder outputs stay referenced through the
    forward and the sampler run (GPUModelRunner.profile_run: batched_dummy_mm_inputs and encoder_cache)."""
    arch = spec.arch
    hidden = spec.hidden_size
    forward = tokens * _mlp_width(spec, tp) * act_bytes + HIDDEN_TENSORS * tokens * hidden * act_bytes
    held = cublas_workspace_bytes(gpu)
    moe = arch.moe if arch is not None else None
    if moe is not None and not monolithic_moe:
        ws = _moe_workspace(tokens, moe.experts_per_token, -(-moe.expert_intermediate // tp), hidden, act_bytes)
        if moe_workspace:
            held += ws
        else:
            forward += ws  # freed after each layer before 0.13.0
    if not first_stage:
        held += 2 * tokens * hidden * act_bytes
    tower = arch.tower if arch is not None else None
    if mm_items and tower is not None:
        held += mm_items * (tower.item_pixels + tower.item_embeds * hidden) * act_bytes
    sample = 0
    if last_stage and sampler is not Sampler.NONE and arch is not None:
        rows = min(max_num_seqs, tokens)
        vocab = arch.vocab_size
        kind = sampler if rows >= TRITON_MIN_ROWS else Sampler.SORT
        per = act_bytes + (FP32 if act_bytes != FP32 else 0) + SAMPLER_EXTRA_BYTES[kind]
        sample = rows * vocab * per + (tokens + 2 * rows) * hidden * act_bytes
        if kind is Sampler.TRITON:
            sample += min(gpu.sm_count or 132, rows) * vocab * FP32
    return ProfileRun(forward=forward, sampler=sample, held=held)


def _mlp_width(spec: ModelSpec, tp: int) -> int:
    """Elements a token of the widest dense MLP's transient tensors: gate/up output and activation per rank."""
    arch = spec.arch
    if arch is None:
        return 0
    widths = [arch.intermediate_size, *arch.layer_intermediate]
    if arch.moe is not None:
        widths.append(arch.moe.shared_intermediate)
    width = -(-max(widths) // tp)
    return (3 if arch.gated_mlp else 2) * width


def _moe_workspace(tokens: int, topk: int, inter: int, hidden: int, act_bytes: int) -> int:
    """TritonExperts.workspace_shapes through WorkspaceManager.get_simultaneous (each part aligned to 256 B)."""
    ws13 = max(tokens * topk * max(inter, hidden), tokens * hidden)  # shared with the output (one chunk)
    ws2 = tokens * topk * max(2 * inter, hidden)
    return sum(-(-n * act_bytes // 256) * 256 for n in (ws13, ws2))
