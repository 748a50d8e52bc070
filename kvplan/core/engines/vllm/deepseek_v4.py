"""What DeepSeek-V4 allocates in vLLM beside its weights and its KV pool (read in 0.25.0 and 0.26.0; kvplan applies
them to every release it plans DeepSeek-V4 with, 0.20.0 on, the others not read for them).

- **Buffers loaded with the model** (in "Model loading took", vllm/v1/worker/gpu_model_runner.py::load_model):
  two float32 RoPE caches of max_position_embeddings x qk_rope_head_dim, one per theta (rope_theta for the
  window, compress_rope_theta for the compressed entries: vllm/models/deepseek_v4/common/rope.py::
  build_deepseek_v4_rope); the multi-token-prediction hidden buffer, max_num_batched_tokens x hc_mult x hidden
  in bf16, and the top-k index buffer, max_num_batched_tokens x index_topk int32 (vllm/models/deepseek_v4/
  model.py::DeepseekV4Model.__init__).
- **The indexer's key-gather workspace** (torch memory kept by vllm/v1/worker/workspace.py::WorkspaceManager, so in
  the profile run's peak): the profile branch of vllm/model_executor/layers/sparse_attn_indexer.py reserves
  max_model_len x 40 / 4 rows of (index_head_dim fp8 + an fp32 scale) and 1 MiB for the radix top-k
  (v1/attention/backends/mla/indexer.py::get_max_prefill_buffer_size); the FlashMLA warm-up's bf16 gather, 4 x
  (cdiv(max_model_len, 4) + 128 + max_num_batched_tokens) x head_dim, shares it and is smaller.
- **DeepGEMM's MegaMoE buffer** (``--moe-backend deep_gemm_mega_moe``, which needs expert parallelism): one
  symmetric-memory buffer an expert-parallel group, allocated outside PyTorch's allocator at the profile run's
  first MoE layer, so vLLM charges it as non-torch memory (DeepseekV4MegaMoEExperts.get_symm_buffer; DeepGEMM at
  the commit vLLM 0.25.0 pins, csrc/apis/mega.hpp::get_symm_buffer_size_for_mega_moe and
  include/deep_gemm/layout/mega_moe.cuh, with max_num_batched_tokens tokens a rank).

Held against a public start: vllm-project/vllm#51454 (DeepSeek-V4-Flash-0731 on 8 x B200, 0.25.0, TP 8 and
DP 8, both with expert parallelism and MegaMoE): tests/cli/test_fit_deepseek_v4.py.
"""

from __future__ import annotations

import math

from kvplan.core.engines.base import cdiv
from kvplan.core.spec import CompressedLayer, ModelSpec
from kvplan.errors import ConfigError

MiB = 1 << 20
FP32 = 4
BF16 = 2
INT32 = 4
PREFILL_BUFFER_PER_TOKEN = 40  # indexer.py::get_max_prefill_buffer_size: max_model_len x 40
RADIX_TOPK_BYTES = MiB  # the radix top-k's workspace beside the gathered keys
MEGA_MOE_BACKEND = "deep_gemm_mega_moe"
MOE_BACKENDS = ("auto", MEGA_MOE_BACKEND)
# DeepGEMM MegaMoE's token-pool geometry (layout/mega_moe.cuh): block rows it may use, the least of them, their lcm
_MEGA_BLOCK_M = (8, 16, 32, 64, 96, 128, 192)
_MEGA_LCM = 384


def _align(x: int, a: int) -> int:
    return cdiv(x, a) * a


def is_v4(spec: ModelSpec) -> bool:
    return spec.has_layer(CompressedLayer)


def _config(spec: ModelSpec, key: str, default: int) -> int:
    """A whole-number key of the model's config (``default`` where it is absent)."""
    value = spec.raw_config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 \
            or value != int(value):
        raise ConfigError(f"{spec.name}: config key {key} must be a whole number >= 0 (got {value!r})")
    return int(value)


def loaded_buffers(spec: ModelSpec, *, max_num_batched_tokens: int) -> int:
    """Bytes of the buffers DeepSeek-V4 allocates with its weights on every GPU (module docstring)."""
    positions = _config(spec, "max_position_embeddings", 0)
    rope = 2 * positions * _config(spec, "qk_rope_head_dim", 64) * FP32
    hidden = spec.hidden_size
    mtp = max_num_batched_tokens * _config(spec, "hc_mult", 4) * hidden * BF16
    topk = max_num_batched_tokens * _config(spec, "index_topk", 0) * INT32
    return rope + mtp + topk


def indexer_workspace(spec: ModelSpec, *, max_model_len: int, max_num_batched_tokens: int) -> int:
    """The WorkspaceManager's buffer after the profile run (module docstring): the indexer's key gather or the
    FlashMLA warm-up's, the larger."""
    layers = [x for x in spec.layers if isinstance(x, CompressedLayer)]
    index_dim = max((x.indexer_head_dim for x in layers), default=0)
    ratio = min((x.compress_ratio for x in layers if x.indexer_head_dim), default=0)
    gather = 0
    if index_dim and ratio:
        rows = max_model_len * PREFILL_BUFFER_PER_TOKEN // ratio
        gather = _align(rows * index_dim, 256) + _align(rows * (index_dim // 128) * FP32, 256) + RADIX_TOPK_BYTES
    head_dim = max((x.head_dim for x in layers), default=0)
    warmup = 4 * (cdiv(max_model_len, 4) + 128 + max_num_batched_tokens) * head_dim * BF16
    return max(gather, warmup)


def mega_moe_buffer(*, ranks: int, experts: int, tokens: int, topk: int, hidden: int, inter: int) -> int:
    """DeepGEMM MegaMoE's symmetric buffer on each GPU of an expert-parallel group of ``ranks``, for ``tokens``
    tokens a rank (max_num_batched_tokens): the dispatch workspace, the received tokens and their FP8 scales, both
    layers' activations with their scales, and the combine buffer (mega.hpp::get_symm_buffer_size_for_mega_moe)."""
    t = _align(tokens, _MEGA_LCM)
    local = experts // ranks
    received = ranks * t
    pool = _align(received * min(topk, local) + local * (max(_MEGA_BLOCK_M) - 1), _MEGA_LCM)
    blocks = pool // min(_MEGA_BLOCK_M)
    workspace = _align(32 + experts * 16 + local * 8 + _align(blocks, 2) * 4 + blocks * 8 + local * ranks * received * 4
                       + pool * 12, 16)
    sf_pool = max(pool // bm * _align(bm, 128) for bm in _MEGA_BLOCK_M)
    return (workspace + hidden * t + hidden // 32 * t + topk * 8 * t + topk * 4 * t  # dispatch: tokens, scales, top-k
            + hidden * pool + hidden // 32 * sf_pool + 4 * pool  # first layer: activations, scales, weights
            + inter * pool + inter // 32 * sf_pool  # second layer
            + hidden * 2 * topk * t)  # combine
