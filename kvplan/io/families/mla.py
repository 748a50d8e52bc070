"""MLA and its descendants: DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5), LongCat-Flash's two MLA blocks per
layer, Kimi-K2.x's DeepSeek-V3 text model, and DeepSeek-V4's compressed attention.

What each config means is read from transformers v5.23 (``models/<type>/configuration_<type>.py`` and
``modeling_<type>.py``); defaults for absent keys are those config classes' own:

- ``deepseek_v32``: DeepSeek-V3's MLA on every layer plus a lightning indexer per layer
  (``DeepseekV32Indexer``: one ``index_head_dim`` key per token, ``index_n_heads`` query heads; defaults 128 and
  64, ``DeepseekV32Config``).
- ``glm_moe_dsa``: the same, but a layer whose ``indexer_types`` entry is "shared" has no indexer and caches no
  indexer key (``GlmMoeDsaAttention``: ``self.indexer = None if self.skip_topk``). ``indexer_types`` is given, or
  comes from ``index_topk_pattern`` ("F"/"S" per layer), or from ``index_topk_freq``/``index_skip_topk_offset``:
  full when max(i - offset + 1, 0) % freq == 0 (``GlmMoeDsaConfig.__post_init__``; defaults freq 1, offset 2:
  every layer full). Defaults 32 indexer heads of 128.
- ``longcat_flash``: each of ``num_layers`` decoder layers runs two MLA blocks with cache indices 2i and 2i + 1
  (``LongcatFlashDecoderLayer``; ``num_hidden_layers`` is 2 x ``num_layers``), two dense MLPs and one MoE whose
  router also picks ``zero_expert_num`` identity experts (no weights).
- ``kimi_k2``: the text model of Kimi-K2.5 (``kimi_k25`` nests it under ``text_config``); transformers maps the
  name to ``deepseek_v3`` (``Kimi_K25Config.__post_init__``), so it is read as DeepSeek-V3.
- ``deepseek_v4``: ``CompressedLayer`` per layer; ``layer_types`` given, else the legacy ``compress_ratios`` per
  layer (0 sliding, 4 CSA, 128 HCA; entries past ``num_hidden_layers`` are the MTP layers'), else 2 HCA then CSA/HCA
  alternating (``DeepseekV4Config.__post_init__``). Rates from ``compress_rates`` (default CSA 4, HCA 128).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kvplan.core.spec import ArchShape, CompressedLayer, Layer, MLALayer, MoEShape
from kvplan.errors import ConfigError

MODEL_TYPES: tuple[str, ...] = ("deepseek_v32", "glm_moe_dsa", "longcat_flash", "kimi_k2", "deepseek_v4")

# transformers v5.23 config-class defaults for the indexer (DeepseekV32Config, GlmMoeDsaConfig, DeepseekV4Config)
_INDEXER_DEFAULTS = {"deepseek_v32": (128, 64), "glm_moe_dsa": (128, 32), "deepseek_v4": (128, 64)}
_V4_TYPES = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
_V4_RATIO_TYPES = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


def _mla(cfg: Any, num_heads: int, notes: list[str], *, indexer: tuple[int, int] = (0, 0)) -> MLALayer:
    if cfg.has("num_key_value_heads"):
        notes.append(f"num_key_value_heads {cfg.get('num_key_value_heads')} ignored: MLA caches the kv_lora_rank "
                     f"latent ({cfg.int('kv_lora_rank')} + {cfg.int('qk_rope_head_dim')} rope)")
    return MLALayer(num_heads=num_heads, kv_lora_rank=cfg.int("kv_lora_rank"),
                    qk_rope_head_dim=cfg.int("qk_rope_head_dim", minimum=0), qk_nope_head_dim=cfg.int("qk_nope_head_dim"),
                    v_head_dim=cfg.int("v_head_dim"), indexer_head_dim=indexer[0], indexer_heads=indexer[1])


def _num_layers(cfg: Any) -> int:
    return cfg.int("num_hidden_layers", "num_layers")


def _glm_indexer_types(cfg: Any, num_layers: int, notes: list[str]) -> list[str]:
    types = cfg.get("indexer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers or any(t not in ("full", "shared") for t in types):
            raise ConfigError(f"{cfg.origin}: indexer_types must list 'full' or 'shared' for each of the "
                              f"{num_layers} layers")
        return list(types)
    pattern = cfg.get("index_topk_pattern")
    if pattern is not None:
        letters = list(pattern) if isinstance(pattern, (str, list)) else None
        if letters is None or len(letters) != num_layers or any(c not in ("F", "S") for c in letters):
            raise ConfigError(f"{cfg.origin}: index_topk_pattern must give 'F' or 'S' for each of the {num_layers} "
                              "layers")
        return ["full" if c == "F" else "shared" for c in letters]
    freq = cfg.int("index_topk_freq", default=1)
    offset = cfg.int("index_skip_topk_offset", default=2, minimum=0)
    types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(num_layers)]
    if freq > 1:
        notes.append(f"index_topk_freq {freq}: {types.count('shared')} of {num_layers} layers reuse an earlier "
                     "layer's top-k and cache no indexer key")
    return types


def _v4_layer_types(cfg: Any, num_layers: int, notes: list[str]) -> list[str]:
    given = cfg.get("layer_types")
    if given is not None:
        if not isinstance(given, list) or len(given) < num_layers or any(t not in _V4_TYPES for t in given):
            raise ConfigError(f"{cfg.origin}: layer_types must give one of {', '.join(_V4_TYPES)} for each of the "
                              f"{num_layers} layers")
        return list(given[:num_layers])
    if cfg.has("compress_ratios"):
        ratios = cfg.int_list("compress_ratios", maximum=1 << 16)
        if len(ratios) < num_layers or any(r not in _V4_RATIO_TYPES for r in ratios):
            raise ConfigError(f"{cfg.origin}: compress_ratios must give 0, 4 or 128 for each of the {num_layers} "
                              f"layers (got {len(ratios)} entries)")
        if len(ratios) > num_layers:
            notes.append(f"compress_ratios has {len(ratios)} entries for {num_layers} layers: the ones past the last "
                         "layer belong to the MTP layer(s), not cached here")
        return [_V4_RATIO_TYPES[r] for r in ratios[:num_layers]]
    tail = ["compressed_sparse_attention" if i % 2 else "heavily_compressed_attention" for i in range(max(num_layers - 2, 0))]
    return (["heavily_compressed_attention"] * min(num_layers, 2) + tail)[:num_layers]


def _v4_rates(cfg: Any) -> dict[str, int]:
    rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
    given = cfg.get("compress_rates")
    if given is not None:
        if not isinstance(given, dict) or any(k not in rates or isinstance(v, bool) or not isinstance(v, int)
                                              or not 1 <= v <= 1 << 16 for k, v in given.items()):
            raise ConfigError(f"{cfg.origin}: compress_rates must map compressed_sparse_attention / "
                              "heavily_compressed_attention to integer rates")
        rates.update(given)
    if cfg.has("compress_rate_csa"):
        rates["compressed_sparse_attention"] = cfg.int("compress_rate_csa")
    if cfg.has("compress_rate_hca"):
        rates["heavily_compressed_attention"] = cfg.int("compress_rate_hca")
    return rates


def _v4_rope_dim(cfg: Any, head_dim: int) -> int:
    if cfg.has("qk_rope_head_dim"):
        return cfg.int("qk_rope_head_dim")
    factor = cfg.get("partial_rotary_factor")
    if isinstance(factor, (int, float)) and not isinstance(factor, bool) and 0 < factor <= 1:
        return int(head_dim * factor)
    return head_dim * 64 // 512  # DeepseekV4Config.default_partial_rotary_factor = 64 / 512


def layers(cfg: Any, model_type: str, *, hidden: int, num_heads: int, notes: list[str]) -> list[Layer]:
    if model_type == "kimi_k2":
        notes.append("kimi_k2 text model: read as deepseek_v3 (transformers' Kimi_K25Config maps it so)")
        return [_mla(cfg, num_heads, notes)] * _num_layers(cfg)
    if model_type == "longcat_flash":
        decoder_layers = cfg.int("num_layers") if cfg.has("num_layers") else cfg.int("num_hidden_layers") // 2
        notes.append(f"{decoder_layers} decoder layers of two MLA blocks each: {2 * decoder_layers} cached layers "
                     "(transformers' LongcatFlashConfig.num_hidden_layers = 2 x num_layers)")
        return [_mla(cfg, num_heads, notes)] * (2 * decoder_layers)
    if model_type == "deepseek_v4":
        return _v4_layers(cfg, hidden=hidden, num_heads=num_heads, notes=notes)
    n = _num_layers(cfg)
    head_dim, heads = _INDEXER_DEFAULTS[model_type]
    indexer = (cfg.int("index_head_dim", default=head_dim), cfg.int("index_n_heads", default=heads))
    full = _mla(cfg, num_heads, notes, indexer=indexer)
    if model_type == "deepseek_v32":
        return [full] * n
    shared = dataclasses.replace(full, indexer_head_dim=0, indexer_heads=0)
    return [full if t == "full" else shared for t in _glm_indexer_types(cfg, n, notes)]


def _v4_layers(cfg: Any, *, hidden: int, num_heads: int, notes: list[str]) -> list[Layer]:
    n = _num_layers(cfg)
    head_dim = cfg.int("head_dim", default=512)
    kv_heads = cfg.int("num_key_value_heads", default=1)
    if kv_heads != 1:
        raise ConfigError(f"{cfg.origin}: DeepSeek-V4 attention has one shared K=V head (num_key_value_heads "
                          f"{kv_heads}); transformers' DeepseekV4Attention broadcasts a single head")
    rates = _v4_rates(cfg)
    window = cfg.int("sliding_window", default=128)
    rope = _v4_rope_dim(cfg, head_dim)
    indexer = (cfg.int("index_head_dim", default=128), cfg.int("index_n_heads", default=64))
    out: list[Layer] = []
    for t in _v4_layer_types(cfg, n, notes):
        csa = t == "compressed_sparse_attention"
        out.append(CompressedLayer(head_dim=head_dim, rope_head_dim=rope, window=window,
                                   compress_ratio=rates.get(t, 0), overlap=csa,
                                   indexer_head_dim=indexer[0] if csa else 0, indexer_heads=indexer[1] if csa else 0,
                                   num_heads=num_heads))
    notes.append("DeepSeek-V4: every layer keeps one K=V head over a sliding window of "
                 f"{window}; CSA layers add an entry per {rates['compressed_sparse_attention']} tokens plus an "
                 f"indexer key, HCA layers an entry per {rates['heavily_compressed_attention']} tokens; vLLM stores "
                 "them as fp8_ds_mla (584 B an entry) whatever --kv-cache-dtype")
    return out


def arch(cfg: Any, model_type: str, *, layers: tuple[Layer, ...], hidden: int) -> ArchShape | None:
    from kvplan.io.arch import arch_from_config

    if not cfg.has("vocab_size"):
        return None
    if model_type == "longcat_flash":
        return _longcat_arch(cfg, layers, hidden)
    if model_type == "deepseek_v4":
        return _v4_arch(cfg, layers, hidden)
    shape = arch_from_config(cfg, model_type="deepseek_v3", layers=layers, hidden=hidden)
    kinds = cfg.get("mlp_layer_types")
    if shape is not None and shape.moe is not None and isinstance(kinds, list) and len(kinds) == len(layers):
        # GLM-5 / DeepSeek-V3.2 may list the MLP kind per layer ("dense"/"sparse"), which wins over
        # first_k_dense_replace (DeepseekV32Config / GlmMoeDsaConfig.__post_init__)
        shape = dataclasses.replace(shape, moe_layers=tuple(k == "sparse" for k in kinds))
    return shape


def _longcat_arch(cfg: Any, layers: tuple[Layer, ...], hidden: int) -> ArchShape:
    """Two MLA blocks and two dense MLPs per decoder layer (the spec's layers 2i, 2i + 1), the MoE counted on the
    second: its routed experts, a router over routed + zero experts (``LongcatFlashTopkRouter.classifier``), and
    the second dense MLP. Zero experts are identities with no weights (transformers allocates gate_up rows for
    them, the released checkpoint holds experts 0..n_routed_experts - 1 only)."""
    experts = cfg.int("n_routed_experts")
    zero = cfg.int("zero_expert_num", default=0, minimum=0)
    ffn = cfg.int("ffn_hidden_size", "intermediate_size")
    moe = MoEShape(num_experts=experts, experts_per_token=cfg.int("moe_topk", "num_experts_per_tok"),
                   expert_intermediate=cfg.int("expert_ffn_hidden_size", "moe_intermediate_size"))
    second = (3 * hidden * ffn, zero * hidden)  # the second dense MLP; the router's zero-expert columns
    return ArchShape(
        vocab_size=cfg.int("vocab_size"), hidden_size=hidden, tie_word_embeddings=cfg.bool("tie_word_embeddings"),
        intermediate_size=ffn, moe=moe, moe_layers=tuple(i % 2 == 1 for i in range(len(layers))),
        q_lora_rank=cfg.int("q_lora_rank", default=0, minimum=0), qkv_bias=cfg.bool("attention_bias"),
        o_bias=cfg.bool("attention_bias"),
        layer_extra_params=tuple(second if i % 2 else (0, 0) for i in range(len(layers))),
    )


def _v4_arch(cfg: Any, layers: tuple[Layer, ...], hidden: int) -> ArchShape:
    """DeepSeek-V4 (transformers DeepseekV4Attention / DeepseekV4DecoderLayer; the released checkpoint's tensors):
    every layer is MoE (routed + shared experts; hash-routed layers have a router too, and the others a router
    bias), attention with a q latent, one K=V projection, a grouped low-rank output and per-head sinks, a
    compressor (CSA and HCA) and an indexer (CSA), and two hyper-connection mixers."""
    q_lora = cfg.int("q_lora_rank")
    head_dim = cfg.int("head_dim", default=512)
    heads = cfg.int("num_attention_heads")
    o_groups, o_lora = cfg.int("o_groups", default=8), cfg.int("o_lora_rank", default=1024)
    hc = cfg.int("hc_mult", default=4)
    experts = cfg.int("n_routed_experts")
    expert = cfg.int("moe_intermediate_size")
    hash_layers = cfg.int("num_hash_layers", default=3, minimum=0)
    moe = MoEShape(num_experts=experts, experts_per_token=cfg.int("num_experts_per_tok"), expert_intermediate=expert,
                   shared_intermediate=cfg.int("n_shared_experts", default=1, minimum=0) * expert)
    hc_mixer = hc * (2 + hc) * (hc * hidden) + hc * (2 + hc) + 3  # fn, base, scale (hc_attn_*, hc_ffn_*)
    extra, quantized, fp32 = [], [], []
    for i, layer in enumerate(layers):
        assert isinstance(layer, CompressedLayer)
        split = q_lora * heads * head_dim + o_lora * heads * head_dim + hidden * o_groups * o_lora  # wq_b, wo_a, wo_b
        whole = hidden * q_lora + q_lora + hidden * head_dim + head_dim + heads  # wq_a, q_norm, wkv, kv_norm, sinks
        # wq_a and wkv are one FP8 linear every rank holds whole (vLLM fused_wqa_wkv, disable_tp), as is the indexer's
        # wq_b (a ReplicatedLinear); the hyper-connection mixers are float32 (vllm/models/deepseek_v4/model.py, 0.25.0)
        q = hidden * q_lora + hidden * head_dim
        if layer.compress_ratio:
            c = layer.compressor_channels
            whole += 2 * hidden * c + layer.compress_ratio * c + head_dim  # wkv, wgate, ape, norm
        if layer.indexer_head_dim:
            d, n = layer.indexer_head_dim, layer.indexer_heads
            whole += q_lora * n * d + hidden * n  # wq_b, weights_proj
            q += q_lora * n * d
            whole += 2 * hidden * 2 * d + layer.compress_ratio * 2 * d + d  # its compressor: wkv, wgate, ape, norm
        whole += 2 * hc_mixer + (experts if i >= hash_layers else 0)  # router bias past the hash-routed layers
        extra.append((split, whole))
        quantized.append(q)
        fp32.append(2 * hc_mixer)
    return ArchShape(
        vocab_size=cfg.int("vocab_size"), hidden_size=hidden, tie_word_embeddings=cfg.bool("tie_word_embeddings"),
        moe=moe, moe_layers=(True,) * len(layers), layer_extra_params=tuple(extra),
        layer_whole_quantized=tuple(quantized), layer_whole_fp32=tuple(fp32),
        extra_params=hc * (hc * hidden) + hc + 1,  # the output head's hyper-connection (hc_head_fn, base, scale)
    )
