"""vLLM's decode context parallelism (--decode-context-parallel-size C, from 0.10.2): the KV of each sequence
sharded over C of the tp ranks, token i on rank i % C (vllm/v1/worker/block_table.py::BlockTable.
compute_slot_mapping: a "virtual block" of B x C tokens, each rank's physical block holding B of them).

- each rank's pool is as without it: num_blocks = the rank's KV memory // the page (the same block ids on every
  DCP rank); the scheduler, the KV cache manager and the coordinator count blocks of B x C tokens
  (0.10.2: vllm/v1/core/sched/scheduler.py::Scheduler.__init__; 0.33.0: v1/core/kv_cache_utils.py::
  resolve_dcp_kv_block_size), so the pool holds num_blocks x B x C tokens and a request of L tokens
  cdiv(cdiv(L, C), B) blocks (v1/kv_cache_interface.py::FullAttentionSpec.max_memory_usage_bytes);
- the startup log multiplies its block count by C ("Multiplying the GPU KV cache size by the dcp_world_size",
  0.10.2 kv_cache_utils.py; x pcp x dcp from 0.12.0), or from 0.20.1 prints int(concurrency x L), whose
  concurrency already counts cdiv(L, C);
- which layers: MLA only in 0.10.2-0.11.0 (backends that return the softmax LSE); GQA/MQA too from 0.11.1,
  where tp exceeds the KV heads so that ranks hold copies of a head whose tokens C of them can split
  (0.11.1: vllm/config/model.py::ModelConfig.verify_with_parallel_config); C divides tp (config/parallel.py);
  the hybrid, sliding-window, chunked-local and Mamba managers assert dcp_world_size == 1
  (v1/core/single_type_kv_cache_manager.py, kv_cache_coordinator.py).
"""

from __future__ import annotations

from kvplan.core.engines.vllm.rules import DecodeContextParallel, VLLMRules
from kvplan.core.spec import AttentionLayer, LayerKind, MLALayer, ModelSpec
from kvplan.errors import ConfigError, InputError


def check_dcp(spec: ModelSpec, rules: VLLMRules, version: str, *, tp: int, dcp: int, kv_dtype: str) -> None:
    """Refuse a --decode-context-parallel-size the release or the model does not take, saying what would."""
    if dcp == 1:
        return
    if rules.dcp is DecodeContextParallel.NONE:
        raise ConfigError(f"vLLM {version} has no --decode-context-parallel-size (from 0.10.2); pin --engine "
                          "vllm==0.10.2 or later")
    if tp % dcp:
        raise InputError(f"--decode-context-parallel-size {dcp} must divide the tensor parallel size {tp} (DCP shards "
                         f"the KV over the tp ranks): use -tp {dcp * -(-tp // dcp)}, or a -dcp that divides {tp}")
    kinds = {layer.kind for layer in spec.layers if isinstance(layer, AttentionLayer | MLALayer)}
    others = [layer for layer in spec.layers if layer.kind not in (LayerKind.FULL, LayerKind.MLA)
              and not _no_cache(layer)]
    if others:
        raise ConfigError(f"{spec.name}: vLLM's decode context parallelism takes full attention and MLA only (its "
                          f"sliding-window, chunked and Mamba managers assert dcp_world_size == 1); this model has "
                          f"{others[0].kind.value} layers")
    if rules.dcp is DecodeContextParallel.MLA and kinds != {LayerKind.MLA}:
        raise ConfigError(f"vLLM {version} shards MLA models only with --decode-context-parallel-size; GQA from "
                          "0.11.1: pin --engine vllm==0.11.1 or later")
    if kinds == {LayerKind.MLA}:
        if rules.dcp_fp8_and_sparse_mla:
            return
        if any(isinstance(layer, MLALayer) and layer.indexer_head_dim for layer in spec.layers):
            # FlashMLA-sparse returns no softmax LSE for decode, which DCP merges ranks with (vllm#46178, #46145)
            raise ConfigError(f"{spec.name}: vLLM {version}'s sparse-MLA backend does not run decode context "
                              "parallelism (it returns no softmax LSE to merge the ranks with: vllm#46178); use -dcp 1 "
                              "or a release that runs it (0.33.0 does)")
        if kv_dtype.startswith("fp8"):
            # "DCP not support fp8 kvcache now." (vllm#34795, #40609: MLA backends assert it)
            raise ConfigError(f"{spec.name}: vLLM {version}'s MLA backends refuse an fp8 KV cache with decode "
                              "context parallelism ('DCP not support fp8 kvcache now', vllm#34795); use "
                              "--kv-cache-dtype auto, -dcp 1, or a release that runs it (0.33.0 does)")
        return
    kv = max(layer.num_kv_heads for layer in spec.layers if isinstance(layer, AttentionLayer))
    q = spec.num_attention_heads
    if not (tp > kv and dcp <= tp // kv and (q // kv) % dcp == 0):
        least = kv * dcp if q % (kv * dcp) == 0 and (q // kv) % dcp == 0 else 0
        use = f": use -tp {least} or more with -dcp {dcp}" if least else f": -dcp {dcp} cannot divide its heads"
        raise InputError(f"{spec.name}: vLLM shards GQA KV over DCP ranks only where tp ({tp}) exceeds the {kv} KV "
                         f"heads, dcp <= tp // {kv} = {tp // kv}, and dcp divides the {q // kv} query heads a KV "
                         f"head serves (config/model.py::ModelConfig.verify_with_parallel_config){use}")


def _no_cache(layer) -> bool:  # type: ignore[no-untyped-def]
    """A layer that holds no KV of its own (it reads another's, or has no token mixer)."""
    return layer.kind is LayerKind.NONE
