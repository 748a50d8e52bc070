"""vLLM's own KV cache planning for DeepSeek-V4, run on CPU (no model weights, no GPU).

Run with the vLLM release to test first on PYTHONPATH: its unpacked sdist (`pip download --no-deps --no-binary :all:
vllm==X.Y.Z`, untarred), and a folder DEPS holding einops (and gguf 0.19.0 for 0.20-0.22), installed with
`pip install --target DEPS einops gguf==0.19.0`; the 0.33.0 venv of README.md runs every release from 0.20.0, e.g.
    PYTHONPATH=DIR/vllm-0.25.0:DEPS /work/venvs/vllm033/bin/python tools/vllm_reference/v4_planning.py \
        --cases tools/vllm_reference/v4_cases.json --out out-0.25.0.json
The outputs, trimmed to what the tests compare, are tests/fixtures/vllm_planning/deepseek-v4.json.

What is vLLM's and what is restated here:
- vLLM's: the cache modules (DeepseekV4SWACache, CompressorStateCache, DeepseekV4IndexerCache) are the
  release's own classes, built with the arguments DeepseekV4Attention / DeepseekV4Indexer / DeepseekCompressor
  pass them; their get_kv_cache_spec() builds the specs. The compressed-entry spec is the release's own
  DeepseekV4Attention.get_kv_cache_spec, called on a stand-in `self` holding the four attributes it reads
  (compress_ratio, head_dim, kv_cache_dtype, kv_cache_torch_dtype), the dtype resolved by the release's own
  _resolve_dsv4_kv_cache_dtype. Registration order (static_forward_context) is the model's: per layer the
  indexer's k_cache and its compressor state (CSA), the SWA cache, the attention layer, its compressor state.
  gpu_model_runner.get_kv_cache_spec's replace(indexes_kv_by_block_stride=backend's) is applied.
  Grouping, page unification, num_blocks and the logged capacity are vLLM's functions
  (get_kv_cache_configs; 0.33: kv_cache_planning.get_global_kv_cache_groups + get_kv_cache_configs +
  kv_cache_utils.update_kv_cache_capacity).
- Restated (read from the release's source, cited in docs/research/deepseek-v4-vllm.md): the constructor arguments (state_dim =
  2 x coff x head_dim, indexer k_cache head_dim = index_head_dim + index_head_dim/128 x 4 (0.33 fp4: /2 + /32)),
  which attention class the platform picks (FlashMLA, fp8_ds_mla layout, on every CUDA arch but SM12x by
  default: case "layout"), VllmConfig.max_concurrent_batches' inputs (async scheduling on by default).
- No ModelConfig (its constructor fetches config.json): a stand-in gives max_model_len and the few fields read.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import io
import json
import logging
import os
import sys
import time
from types import SimpleNamespace

os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # DeepSeek-V4 runs on the V1 model runner (config/vllm.py)

MODELS = {
    # DeepSeek-V4-Flash config.json (public): 43 layers (+1 MTP entry in compress_ratios, ignored without MTP)
    "deepseek-v4-flash": dict(num_hidden_layers=43, head_dim=512, sliding_window=128, index_head_dim=128,
                              compress_ratios=[0, 0] + [4, 128] * 20 + [4, 0]),
    # DeepSeek-V4-Pro config.json (kvplan configs/models/deepseek-v4-pro.yaml): 61 layers
    "deepseek-v4-pro": dict(num_hidden_layers=61, head_dim=512, sliding_window=128, index_head_dim=128,
                            compress_ratios=[128, 128] + [4, 128] * 29 + [4, 0]),
}


@dataclasses.dataclass
class _ModelFacts:
    """Stands in for vllm.config.ModelConfig (whose constructor fetches config.json and a tokenizer)."""

    max_model_len: int
    original_max_model_len: int = 0
    dtype: object = None
    use_mla: bool = True
    is_hybrid: bool = False
    runner_type: str = "generate"
    is_diffusion: bool = False
    architecture: str = "DeepseekV4ForCausalLM"
    architectures: list = dataclasses.field(default_factory=lambda: ["DeepseekV4ForCausalLM"])
    model: str = "deepseek-v4"
    hf_config: object = None
    hf_text_config: object = None

    def __post_init__(self):
        self.original_max_model_len = self.original_max_model_len or self.max_model_len

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


def _accepts(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def build_vllm_config(case: dict):
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ParallelConfig, SchedulerConfig, VllmConfig

    L = int(case["max_model_len"])
    kw = dict(max_num_seqs=int(case.get("max_num_seqs", 1024)),
              max_num_batched_tokens=int(case.get("max_num_batched_tokens", 8192)),
              max_model_len=L, enable_chunked_prefill=True, is_encoder_decoder=False,
              async_scheduling=bool(case.get("async_scheduling", True)))
    sched = SchedulerConfig(**{k: v for k, v in kw.items() if _accepts(SchedulerConfig, k)})
    cache = CacheConfig(block_size=int(case.get("block_size", 256)), gpu_memory_utilization=0.9,
                        cache_dtype=case.get("kv_cache_dtype", "fp8"), enable_prefix_caching=True)
    cfg = VllmConfig(scheduler_config=sched, cache_config=cache, parallel_config=ParallelConfig(),
                     device_config=DeviceConfig(device="cpu"))
    object.__setattr__(cfg, "model_config", _ModelFacts(max_model_len=L, dtype=torch.bfloat16))
    cfg.scheduler_config.async_scheduling = bool(case.get("async_scheduling", True))
    # CUDA keeps the hybrid KV cache manager on (no KV connector, no chunked-local attention); the CPU
    # "empty" platform would switch it off in VllmConfig.__post_init__.
    cfg.scheduler_config.disable_hybrid_kv_cache_manager = bool(case.get("disable_hybrid_kv_cache_manager", False))
    if "use_fp4_indexer_cache" in case and hasattr(cfg, "attention_config") and cfg.attention_config is not None:
        cfg.attention_config.use_fp4_indexer_cache = bool(case["use_fp4_indexer_cache"])
    return cfg


def _v4_modules(layout: str):
    """The release's DeepSeek-V4 KV classes, wherever the release keeps them.

    0.20.x-0.21.0: vllm/model_executor/layers/deepseek_v4_attention.py (DeepseekV4MLAAttention,
    DeepseekV4IndexerCache) + vllm/model_executor/layers/deepseek_compressor.py (CompressorStateCache);
    0.22.x: vllm/models/deepseek_v4/attention.py (DeepseekV4MLAAttention, backend from the
    nvidia/flashmla.py impl); 0.23.0+: vllm/models/deepseek_v4/attention.py::DeepseekV4Attention with the
    CUDA subclasses in nvidia/flashmla.py (DeepseekV4FlashMLAAttention) and nvidia/flashinfer_sparse.py
    (DeepseekV4FlashInferMLAAttention, the plain-row layout)."""
    try:
        from vllm.models.deepseek_v4 import attention as v4attn
        from vllm.models.deepseek_v4.compressor import CompressorStateCache
    except ImportError:
        from vllm.model_executor.layers import deepseek_v4_attention as v4attn
        from vllm.model_executor.layers.deepseek_compressor import CompressorStateCache
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache
    attn_cls = getattr(v4attn, "DeepseekV4Attention", None) or v4attn.DeepseekV4MLAAttention
    layer_cls = None  # the CUDA attention class the model instantiates
    attn_backend = swa_backend = None
    if layout == "flashinfer_plain":
        try:
            from vllm.models.deepseek_v4.nvidia.flashinfer_sparse import DeepseekV4FlashInferMLAAttention
        except ImportError as e:
            raise NotImplementedError("no FLASHINFER_MLA_SPARSE_DSV4 (plain-row) DeepSeek-V4 attention class in "
                                      "this release") from e
        layer_cls = DeepseekV4FlashInferMLAAttention
    else:
        try:
            from vllm.models.deepseek_v4.nvidia.flashmla import DeepseekV4FlashMLAAttention
            layer_cls = DeepseekV4FlashMLAAttention
        except ImportError:
            layer_cls = None
    if layer_cls is not None:
        attn_backend = layer_cls.backend_cls
        swa_backend = getattr(layer_cls, "swa_backend_cls", None)
    elif hasattr(v4attn, "_select_v4_sparse_impl"):  # 0.22.x: DeepseekV4MLAAttention.backend_cls = impl's
        from vllm.models.deepseek_v4.nvidia.flashmla import DeepseekV4FlashMLASparseImpl
        attn_backend = DeepseekV4FlashMLASparseImpl.backend_cls
    else:  # 0.20.x / 0.21.0: DeepseekV4MLAAttention.get_attn_backend() -> DeepseekV4FlashMLASparseBackend
        attn_backend = v4attn.DeepseekV4MLAAttention.get_attn_backend(None)
    return v4attn, CompressorStateCache, DeepseekV4SWACache, attn_cls, layer_cls, attn_backend, swa_backend


def _resolve_kv_dtype(v4attn, layer_cls, cache_config):
    """(cache_dtype_str, torch dtype) as the release's attention __init__ resolves them."""
    import torch
    if hasattr(v4attn, "_resolve_dsv4_kv_cache_dtype"):  # 0.23.0+
        uses = getattr(layer_cls, "use_fp8_ds_mla_layout", getattr(layer_cls, "use_flashmla_fp8_layout", True))
        return v4attn._resolve_dsv4_kv_cache_dtype(uses, cache_config.cache_dtype, cache_config)
    # 0.20.x-0.22.x: inline in DeepseekV4MLAAttention.__init__ (restated verbatim)
    kv_cache_dtype = cache_config.cache_dtype
    assert kv_cache_dtype.startswith("fp8"), (
        f"DeepseekV4 only supports fp8 kv-cache format for now, got {kv_cache_dtype}")
    if kv_cache_dtype != "fp8_ds_mla":
        cache_config.cache_dtype = "fp8_ds_mla"
        kv_cache_dtype = "fp8_ds_mla"
    return kv_cache_dtype, torch.uint8


def _indexer_uses_fp4(cfg, case: dict, v4attn) -> tuple[bool, str]:
    """Whether DeepseekV4Indexer.__init__ picks the MXFP4 key layout (68 B) for this case.

    0.20-0.26: the flag exists but the k_cache keeps 132 B ("still allocate the same amount of memory as FP8").
    0.27: use_fp4_indexer_cache -> 68 B. 0.28-0.29: use_fp4_indexer_cache is a deprecated alias of
    indexer_kv_dtype='mxfp4', dsa_indexer_uses_fp4 (SM10x only; assumed here). 0.30+: the alias is gone;
    the case's flag is read as --attention-config.indexer_kv_dtype mxfp4 (SM10x)."""
    import inspect
    want = bool(case.get("use_fp4_indexer_cache", False))
    src = inspect.getsource(v4attn.DeepseekV4Indexer.__init__)
    if "MXFP4_BLOCK_SIZE" not in src:
        return False, "k_cache 132 B whatever the flag (same bytes as FP8)"
    if not want:
        return False, "fp8 indexer"
    ac = cfg.attention_config
    if hasattr(ac, "resolve_indexer_kv_dtype"):
        from vllm.config import AttentionConfig
        if "use_fp4_indexer_cache" in {f.name for f in __import__("dataclasses").fields(AttentionConfig)}:
            a2 = AttentionConfig(use_fp4_indexer_cache=True)
            how = "use_fp4_indexer_cache=True -> indexer_kv_dtype=" + a2.indexer_kv_dtype
        else:
            a2 = AttentionConfig(indexer_kv_dtype="mxfp4")
            how = "use_fp4_indexer_cache removed; indexer_kv_dtype=mxfp4"
        return a2.resolve_indexer_kv_dtype("fp8") == "mxfp4", how + " (dsa_indexer_uses_fp4: SM10x only)"
    return bool(getattr(ac, "use_fp4_indexer_cache", False)), "attention_config.use_fp4_indexer_cache"


def build_specs(cfg, case: dict) -> dict:
    """{layer name: KVCacheSpec} as the release's GPUModelRunner.get_kv_cache_spec returns them: the cache
    modules are the release's own classes registered in the model's order; the spec walk is the release's own
    GPUModelRunner.get_kv_cache_spec, called on a stand-in runner."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    m = MODELS[case["model"]]
    cache_config = cfg.cache_config
    layout = case.get("layout", "flashmla")
    v4attn, StateCache, SWACache, attn_cls, layer_cls, attn_backend, swa_backend = _v4_modules(layout)
    ctx = cfg.compilation_config.static_forward_context
    ctx.clear()

    class _Attn(AttentionLayerBase):
        """Stands in for the DeepseekV4 attention layer: its get_kv_cache_spec is the release's own."""

        def __init__(self, ratio, kv_dtype, torch_dtype):
            self.compress_ratio, self.head_dim = ratio, m["head_dim"]
            self.kv_cache_dtype, self.kv_cache_torch_dtype = kv_dtype, torch_dtype

        def get_kv_cache_spec(self, vllm_config):
            return attn_cls.get_kv_cache_spec(self, vllm_config)

        def get_attn_backend(self):
            return attn_backend

    with set_current_vllm_config(cfg):
        kv_dtype, torch_dtype = _resolve_kv_dtype(v4attn, layer_cls, cache_config)
        ihd = m["index_head_dim"]
        fp4, fp4_how = _indexer_uses_fp4(cfg, case, v4attn)
        k_cache_head_dim = ihd // 2 + ihd // 32 if fp4 else ihd + ihd // 128 * 4

        def swa(prefix):
            kw = {}
            if swa_backend is not None and _accepts(SWACache, "backend_cls"):
                kw["backend_cls"] = swa_backend
            return SWACache(head_dim=m["head_dim"], window_size=m["sliding_window"], dtype=torch_dtype,
                            prefix=f"{prefix}.swa_cache", cache_config=cache_config, **kw)

        for i in range(m["num_hidden_layers"]):
            prefix = f"model.layers.{i}.attn"
            ratio = max(1, m["compress_ratios"][i])
            if ratio == 4:  # DeepseekV4Indexer: k_cache, then its compressor (head_dim 128, overlap)
                v4attn.DeepseekV4IndexerCache(head_dim=k_cache_head_dim, dtype=torch.uint8,
                                              prefix=f"{prefix}.indexer.k_cache", cache_config=cache_config,
                                              compress_ratio=ratio)
                StateCache(state_dim=2 * 2 * ihd, dtype=torch.float32, compress_ratio=ratio,
                           prefix=f"{prefix}.indexer.compressor.state_cache")
            swa(prefix)
            ctx[prefix] = _Attn(ratio, kv_dtype, torch_dtype)
            if ratio > 1:
                coff = 1 + (ratio == 4)
                StateCache(state_dim=2 * coff * m["head_dim"], dtype=torch.float32, compress_ratio=ratio,
                           prefix=f"{prefix}.compressor.state_cache")
        # MTP draft layers (--speculative-config method mtp): compress_ratio 1 (layer_id >= num_hidden_layers),
        # i.e. an SWA cache only; the proposer marks draft attention layers is_draft_layer (0.33.0).
        for j in range(int(case.get("mtp_layers", 0))):
            prefix = f"model.mtp.layers.{m['num_hidden_layers'] + j}.attn"
            mod = swa(prefix)
            mod.is_draft_layer = True
            ctx[prefix] = _Attn(1, kv_dtype, torch_dtype)
        runner = SimpleNamespace(vllm_config=cfg, shared_kv_cache_layers={})
        specs = GPUModelRunner.get_kv_cache_spec(runner)
        spec_backends = {n: mod.get_attn_backend().get_name() for n, mod in ctx.items()
                         if n in specs and hasattr(mod, "get_attn_backend")}
    return specs, kv_dtype, spec_backends, fp4_how


def _spec_row(name, spec) -> dict:
    d = {"layer": name, "type": type(spec).__name__, "block_size": spec.block_size,
         "page_size_bytes": spec.page_size_bytes}
    for f in ("real_page_size_bytes", "storage_block_size", "sliding_window", "compress_ratio", "tokens_per_state",
              "alignment", "cache_dtype_str", "model_version", "head_size", "page_size_padded", "max_tp_shards",
              "indexes_kv_by_block_stride", "state_content_bytes", "block_stride_alignment"):
        if hasattr(spec, f):
            v = getattr(spec, f)
            d[f] = v if isinstance(v, (int, str, bool, type(None))) else str(v)
    d["dtype"] = str(getattr(spec, "dtype", None))
    return d


def _kind(name: str) -> str:
    for suffix, k in ((".indexer.k_cache", "indexer_keys"), (".indexer.compressor.state_cache", "indexer_state"),
                      (".compressor.state_cache", "compressor_state"), (".swa_cache", "swa")):
        if name.endswith(suffix):
            return k
    return "compressed_entries"


def plan(case: dict) -> dict:
    import vllm
    from vllm import logger as vlogger
    from vllm.v1.core import kv_cache_utils as kcu
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs

    out = {"case": case, "vllm_version": vllm.__version__}
    cfg = build_vllm_config(case)
    try:
        specs, kv_dtype, spec_backends, fp4_how = build_specs(cfg, case)
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {e}"
        return out
    out["indexer_fp4"] = fp4_how
    out["resolved_kv_cache_dtype"] = kv_dtype
    out["cache_config_cache_dtype_after"] = cfg.cache_config.cache_dtype
    if hasattr(type(cfg), "max_in_flight_tokens"):
        out["max_in_flight_tokens"] = cfg.max_in_flight_tokens
    # per-kind spec summary (one row per distinct kind x ratio)
    seen = {}
    for name, spec in specs.items():
        key = (_kind(name), getattr(spec, "compress_ratio", getattr(spec, "tokens_per_state", 1)), spec.block_size,
               getattr(spec, "sliding_window", None))
        if key not in seen:
            seen[key] = dict(_spec_row(name, spec), kind=key[0], count=0, backend=spec_backends.get(name))
        seen[key]["count"] += 1
    out["spec_kinds"] = list(seen.values())
    workers = int(case.get("tp", 1)) * int(case.get("dp_local", 1)) if False else int(case.get("tp", 1))
    mems = case["available_memory"]
    if isinstance(mems, int):
        mems = [mems] * workers
    register = getattr(__import__("vllm.v1.core.single_type_kv_cache_manager", fromlist=["x"]),
                       "register_all_kvcache_specs", None)
    if register is not None:
        register(cfg)
    try:
        from vllm.v1.attention.backends.utils import resolve_kv_cache_layout  # 0.29.0+
    except ImportError:
        resolve_kv_cache_layout = None
    logs = io.StringIO()
    handler = logging.StreamHandler(logs)
    handler.setLevel(logging.INFO)
    vl = logging.getLogger("vllm")
    vl.addHandler(handler)
    if vl.getEffectiveLevel() > logging.INFO:  # 0.33.0 leaves the "vllm" logger unconfigured (root: WARNING)
        vl.setLevel(logging.INFO)
    for fn in ("_print_info_once", "_print_warning_once", "_print_debug_once"):
        if hasattr(vlogger, fn):
            getattr(vlogger, fn).cache_clear()
    t0 = time.time()
    spec_list = [dict(specs) for _ in mems]
    try:
        if resolve_kv_cache_layout is not None:
            # v1/engine/core.py: the layouts every worker's backends support (worker_base.
            # get_supported_kv_cache_layouts over the layers' backends), then resolve_kv_cache_layout
            from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
            backends = []
            for mod in cfg.compilation_config.static_forward_context.values():
                b = mod.get_attn_backend()
                if b is not None and b not in backends:
                    backends.append(b)
            names = [layout.name for layout in get_supported_kv_cache_layouts(backends)]
            layout = resolve_kv_cache_layout(cfg, [names] * len(mems), list(specs.values()))
            out["kv_cache_layout"] = layout.name
            out["layout_backends"] = [b.get_name() if hasattr(b, "get_name") else str(b) for b in backends]
        try:
            from vllm.v1.core import kv_cache_planning  # 0.33.0
        except ImportError:
            kv_cache_planning = None
        if kv_cache_planning is not None:
            groups = kv_cache_planning.get_global_kv_cache_groups(cfg, spec_list)
            configs = kv_cache_planning.get_kv_cache_configs(cfg, spec_list, list(mems), groups)
        else:
            configs = kcu.get_kv_cache_configs(cfg, spec_list, list(mems))
        sched_cfg = kcu.generate_scheduler_kv_cache_config(configs)
        if hasattr(kcu, "update_kv_cache_capacity"):  # 0.28.0+: EngineCore logs on the scheduler config
            dev = cfg.device_config.device_type
            cfg.device_config.device_type = "cuda"  # 0.30.0+ prefixes the line with the device ("GPU" on CUDA)
            try:
                kcu.update_kv_cache_capacity(cfg, sched_cfg)
            finally:
                cfg.device_config.device_type = dev
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {e}"
        out["log"] = [ln for ln in logs.getvalue().splitlines() if ln.strip()]
        vl.removeHandler(handler)
        return out
    finally:
        out["plan_seconds"] = round(time.time() - t0, 2)
    vl.removeHandler(handler)
    kc = configs[0]
    out["num_blocks"] = kc.num_blocks
    groups = []
    for g in kc.kv_cache_groups:
        s = g.kv_cache_spec
        row = {"num_layers": len(g.layer_names), "block_size": s.block_size, "page_size_bytes": s.page_size_bytes,
               "spec_type": type(s).__name__,
               "max_memory_usage_bytes": s.max_memory_usage_bytes(cfg)}
        if isinstance(s, UniformTypeKVCacheSpecs):
            inner = list(s.kv_cache_specs.items())
            kinds = {}
            for n, sp in inner:
                k = (_kind(n), sp.page_size_bytes, getattr(sp, "real_page_size_bytes", None))
                kinds[k] = kinds.get(k, 0) + 1
            row["members"] = [{"kind": k[0], "page_size_bytes": k[1], "unpadded_page_bytes": k[2], "count": c}
                              for k, c in kinds.items()]
            row["inner_type"] = type(inner[0][1]).__name__
            row["sliding_window"] = getattr(inner[0][1], "sliding_window", None)
            row["max_pages_per_request"] = (s.max_memory_usage_pages(cfg) if hasattr(s, "max_memory_usage_pages")
                                            else -(-s.max_memory_usage_bytes(cfg) // s.page_size_bytes))
        else:
            row["sliding_window"] = getattr(s, "sliding_window", None)
            row["max_pages_per_request"] = -(-s.max_memory_usage_bytes(cfg) // s.page_size_bytes)
            row["layer_kinds"] = sorted({_kind(n) for n in g.layer_names})
        groups.append(row)
    out["groups"] = groups
    out["kv_cache_tensors"] = len(kc.kv_cache_tensors)
    sizes = {}
    for t in kc.kv_cache_tensors:
        sizes[t.size] = sizes.get(t.size, 0) + 1
    out["tensor_sizes"] = {str(k): v for k, v in sizes.items()}
    if kc.kv_cache_tensors and getattr(kc.kv_cache_tensors[0], "block_stride", 0):
        out["bytes_per_block"] = kc.kv_cache_tensors[0].block_stride
    import re
    log_lines = [ln for ln in logs.getvalue().splitlines() if "KV cache" in ln or "concurrency" in ln.lower()
                 or "num_gpu_blocks" in ln]
    text = "\n".join(log_lines)
    mt = re.search(r"KV cache size: ([\d,]+) tokens", text)
    mc = re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", text)
    # the config the release logs from: the per-worker config inside get_kv_cache_configs (<= 0.27), the
    # scheduler config in EngineCore via update_kv_cache_capacity (0.28+)
    logged_cfg = sched_cfg if hasattr(kcu, "update_kv_cache_capacity") else kc
    conc = kcu.get_max_concurrency_for_kv_cache_config(cfg, logged_cfg)
    out["logged_tokens"] = int(mt.group(1).replace(",", "")) if mt else None
    out["logged_concurrency"] = conc
    out["logged_concurrency_2dp"] = mc.group(2) if mc else None
    assert mc is None or mc.group(2) == f"{conc:.2f}", (mc.group(2), conc)
    out["worker_config_concurrency"] = kcu.get_max_concurrency_for_kv_cache_config(cfg, kc)
    sc = kcu.get_max_concurrency_for_kv_cache_config(cfg, sched_cfg)
    out["scheduler_config_tokens"] = int(sc * cfg.model_config.max_model_len)
    out["scheduler_config_concurrency"] = sc
    out["log"] = log_lines
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default=None, help="comma-separated case names")
    a = ap.parse_args(argv)
    cases = json.load(open(a.cases))
    if a.only:
        keep = set(a.only.split(","))
        cases = [c for c in cases if c["name"] in keep]
    import vllm

    results = []
    for c in cases:
        r = plan(c)
        results.append(r)
        brief = {k: r.get(k) for k in ("num_blocks", "logged_tokens", "logged_concurrency_2dp", "error")}
        print(c["name"], json.dumps(brief), file=sys.stderr)
    json.dump({"vllm_version": vllm.__version__, "vllm_file": vllm.__file__, "results": results},
              open(a.out, "w"), indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
