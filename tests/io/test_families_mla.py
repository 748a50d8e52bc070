"""The MLA families (kvplan.io.families.mla): DeepSeek-V3.2 and GLM-5 (sparse attention with an indexer cache),
LongCat-Flash (two MLA blocks per layer), Kimi-K2.5 (DeepSeek-V3 text model under a multimodal wrapper) and
DeepSeek-V4 (sliding window + compressed entries). Every expected figure is worked by hand from the config's
numbers (and the engines' sources) in the comments, not copied from kvplan's output."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.core.dtypes import get_dtype
from kvplan.core.engines import get_engine
from kvplan.core.engines.vllm.pages import v4_pages
from kvplan.core.sizing import size_kv
from kvplan.core.spec import CompressedLayer, MLALayer
from kvplan.core.weights import count_params
from kvplan.errors import ConfigError, InputError
from kvplan.io.families import _MODULE_TYPES, family_module
from kvplan.io.hf_config import spec_from_hf_config
from kvplan.io.models import load_model

GiB = 1 << 30
runner = CliRunner()


def _spec(raw: dict, name: str = "t"):
    return spec_from_hf_config(raw, name=name, origin=f"{name}.json")


def _per_token(spec, engine: str = "ideal", kv_dtype: str = "auto") -> int:
    return size_kv(spec, get_engine(engine), batch=1, seq_len=1, kv_dtype=kv_dtype).bytes_per_token


def test_module_types_match_the_registry():
    module = family_module("deepseek_v32")
    assert module is not None and module.MODEL_TYPES == _MODULE_TYPES["kvplan.io.families.mla"]


# -- DeepSeek-V3.2: MLA + a lightning-indexer key per token ------------------------------------------------------

def test_deepseek_v32_caches_the_latent_and_an_indexer_key_on_every_layer():
    spec = load_model("deepseek-v3.2")
    assert spec.num_layers == 61 and all(isinstance(x, MLALayer) for x in spec.layers)
    layer = spec.layers[0]
    assert (layer.kv_lora_rank, layer.qk_rope_head_dim, layer.indexer_head_dim, layer.indexer_heads) == (512, 64, 128, 64)
    # bf16: DeepSeek-V3's published latent, 61 x (512 + 64) x 2 = 70,272 B, plus the indexer's 61 x 128 x 2 = 15,616 B
    assert _per_token(spec) == 70_272 + 15_616 == 85_888
    assert any("num_key_value_heads 128 ignored" in n for n in spec.notes)


@pytest.mark.parametrize("kv_dtype,per_layer", [
    ("auto", 576 * 2 + 132),  # bf16 latent + the indexer's 128 fp8 + 4 B fp32 scale (DeepseekV32Indexer)
    ("fp8_ds_mla", 656 + 132),  # 512 fp8 + 4 x 4 B scales + 64 x 2 B RoPE (MLAAttentionSpec) + indexer
    ("fp8", 656 + 132),  # FlashMLA sparse takes "fp8" as fp8_ds_mla (flashmla_sparse.py)
])
def test_deepseek_v32_in_vllm(kv_dtype, per_layer):
    assert _per_token(load_model("deepseek-v3.2"), "vllm", kv_dtype) == 61 * per_layer


@pytest.mark.parametrize("kv_dtype,per_layer", [
    ("auto", 576 * 2 + 132),  # NSATokenToKVPool: latent in the KV dtype + index_k_with_scale_buffer 132 B
    ("fp8", 512 + 512 // 128 * 4 + 64 * 2 + 132),  # calculate_mla_kv_cache_dim: 656 B scaled fp8 latent
])
def test_deepseek_v32_in_sglang(kv_dtype, per_layer):
    assert _per_token(load_model("deepseek-v3.2"), "sglang", kv_dtype) == 61 * per_layer


def test_sglang_pages_nsa_models_by_64_tokens():
    out = json.loads(runner.invoke(app, ["size", "deepseek-v3.2", "--engine", "sglang", "--seq-len", "65",
                                         "--json"]).stdout)
    assert out["block_size"] == 64
    assert out["layers"][0]["tokens_held"] == 128  # 65 tokens take two 64-token pages


def test_trtllm_refuses_the_indexer_it_has_not_been_read_for():
    with pytest.raises(InputError, match="TensorRT-LLM's sparse-attention indexer"):
        size_kv(load_model("deepseek-v3.2"), get_engine("trtllm"), batch=1, seq_len=16)


# -- GLM-5: shared indexers ---------------------------------------------------------------------------------------

def test_glm5_caches_an_indexer_key_on_all_78_layers():
    spec = load_model("glm-5.1")
    assert spec.num_layers == 78 and {x.indexer_head_dim for x in spec.layers} == {128}  # type: ignore[union-attr]
    assert spec.layers[0].indexer_heads == 32  # type: ignore[union-attr]
    assert _per_token(spec) == 78 * (512 + 64 + 128) * 2 == 109_824
    assert load_model("zai-org/GLM-5").name == "glm-5.1"


_GLM52_TYPES = ["full"] * 3 + ["shared", "shared", "shared", "full"] * 18 + ["shared"] * 3  # GLM-5.2's IndexShare


def _glm(**extra) -> dict:
    raw = dict(load_model("glm-5.1").raw_config)
    raw.update(extra)
    return raw


@pytest.mark.parametrize("keys", [
    {"indexer_types": _GLM52_TYPES},
    {"index_topk_freq": 4, "index_skip_topk_offset": 3},  # full when max(i - 2, 0) % 4 == 0: the same schedule
    {"index_topk_pattern": "".join("F" if t == "full" else "S" for t in _GLM52_TYPES)},
])
def test_glm_shared_indexer_layers_cache_no_indexer_key(keys):
    spec = _spec(_glm(**keys))
    assert ["full" if x.indexer_head_dim else "shared" for x in spec.layers] == _GLM52_TYPES  # type: ignore[union-attr]
    # 21 full layers: 3 + 18; every layer keeps the latent
    assert _per_token(spec) == 78 * 576 * 2 + 21 * 128 * 2 == 95_232


def test_glm_default_offset_with_a_frequency():
    spec = _spec(_glm(index_topk_freq=2))  # offset 2: full when max(i - 1, 0) % 2 == 0 -> layers 0, 1, 3, 5, ...
    full = [i for i, x in enumerate(spec.layers) if x.indexer_head_dim]  # type: ignore[union-attr]
    assert full[:5] == [0, 1, 3, 5, 7] and len(full) == 2 + 38
    assert any("index_topk_freq 2" in n for n in spec.notes)


@pytest.mark.parametrize("keys,match", [
    ({"indexer_types": ["full"] * 3}, "indexer_types must list"),
    ({"index_topk_pattern": "FX" * 39}, "index_topk_pattern must give"),
    ({"index_topk_freq": 0}, "index_topk_freq must be >= 1"),
])
def test_glm_bad_indexer_schedules_are_one_line_errors(keys, match):
    with pytest.raises(ConfigError, match=match):
        _spec(_glm(**keys))


# -- LongCat-Flash: two MLA caches per decoder layer ----------------------------------------------------------------

def test_longcat_flash_caches_two_mla_latents_per_decoder_layer():
    spec = load_model("longcat-flash")
    assert spec.num_layers == 56 and all(isinstance(x, MLALayer) and not x.indexer_head_dim for x in spec.layers)
    assert _per_token(spec) == 2 * 28 * (512 + 64) * 2 == 64_512


def test_longcat_without_num_layers_reads_num_hidden_layers_as_transformers_does():
    raw = dict(load_model("longcat-flash").raw_config)
    raw.pop("num_layers")
    raw["num_hidden_layers"] = 56  # transformers' setter: num_layers = 56 // 2
    assert _spec(raw).num_layers == 56


# -- Kimi-K2.5: DeepSeek-V3 text model under kimi_k25 ---------------------------------------------------------------

def test_kimi_k25_text_model_is_read_as_deepseek_v3():
    spec = load_model("moonshotai/Kimi-K2.5")
    assert spec.name == "kimi-k2.5" and spec.num_layers == 61
    assert {(x.kv_lora_rank, x.num_heads, x.indexer_head_dim) for x in spec.layers} == {(512, 64, 0)}  # type: ignore[union-attr]
    assert _per_token(spec) == 61 * 576 * 2 == 70_272
    # the MoE is counted only because kimi_k2 is read as deepseek_v3: 384 experts on layers 1..60
    assert spec.arch is not None and spec.arch.moe is not None and spec.arch.moe.num_experts == 384
    assert spec.arch.moe_layers == (False,) + (True,) * 60


# -- DeepSeek-V4: window + compressed entries ----------------------------------------------------------------------

def test_deepseek_v4_pro_layer_schedule_from_compress_ratios():
    spec = load_model("deepseek-v4-pro")
    layers = spec.layers
    assert len(layers) == 61 and all(isinstance(x, CompressedLayer) for x in layers)
    ratios = [x.compress_ratio for x in layers]  # type: ignore[union-attr]
    # config.json: [128, 128, then 4/128 alternating, ..., 4, 0]; the 62nd entry is the MTP layer's
    assert ratios[:4] == [128, 128, 4, 128] and ratios[-1] == 4
    assert ratios.count(128) == 31 and ratios.count(4) == 30
    csa = [x for x in layers if x.compress_ratio == 4]  # type: ignore[union-attr]
    assert all(x.overlap and x.indexer_head_dim == 128 for x in csa)  # type: ignore[union-attr]
    assert all(x.window == 128 and x.head_dim == 512 for x in layers)  # type: ignore[union-attr]
    assert any("MTP" in n for n in spec.notes)


def test_deepseek_v4_pro_kv_cache_at_one_million_tokens_is_the_published_9_62_gib():
    """DeepSeek's V4 release: 9.62 GiB a 1M-token sequence in bf16 (8.7x less than V3.2). By hand, 1M = 2**20:
    windows 61 x 128 x 1024 B; HCA 31 x 2**13 entries x 1024 B; CSA 30 x 2**18 x (1024 + 256) B; every compressor
    window is closed at 2**20, but CSA keeps the last one's first half, kv and gate: 2 x 4 x (512 + 128) x 2 B."""
    spec = load_model("deepseek-v4-pro")
    n = 1 << 20
    cache = 61 * 128 * 1024 + 31 * (n // 128) * 1024 + 30 * (n // 4) * (1024 + 256)
    r = size_kv(spec, get_engine("ideal"), batch=1, seq_len=n)
    assert r.total_bytes == cache + 30 * 2 * 4 * (512 + 128) * 2
    assert abs(r.total_bytes / GiB - 9.62) < 0.01
    v32 = size_kv(load_model("deepseek-v3.2"), get_engine("ideal"), batch=1, seq_len=n).total_bytes
    assert round(v32 / r.total_bytes, 1) == 8.7


def test_deepseek_v4_ideal_keeps_the_open_window_of_the_compressor():
    """A CSA layer (ratio 4, head 512, indexer 128) at 10 tokens, bf16: window 10 x 1024; 2 entries x (1024 + 256);
    2 open tokens x kv and gate x 1024 channels x 2 B; the indexer's compressor 2 x 2 x 256 x 2 B; with a window
    closed, the previous window's first half, kv and gate: 2 x 4 x 512 x 2 B, and the indexer's 2 x 4 x 128 x 2 B."""
    layer = load_model("deepseek-v4-pro").layers[2]
    bf16 = get_dtype("bf16")
    expected = 10 * 1024 + 2 * 1280 + 2 * 2 * 1024 * 2 + 2 * 2 * 256 * 2 + 2 * 4 * 512 * 2 + 2 * 4 * 128 * 2
    assert get_engine("ideal").compressed_sequence_bytes(layer, 10, bf16, "bf16") == expected


def test_deepseek_v4_vllm_pages_by_hand():
    """vLLM 0.33: fp8_ds_mla rows of 584 B, pages padded to a multiple of 576 B. A CSA layer at 1,000 tokens:
    window: 64-token blocks, 1000 - 128 = 872 tokens dropped = 13 whole blocks of cdiv(1000, 64) = 16 -> 3 pages of
    64 x 584 = 37,376 -> 37,440; entries: cdiv(1000, 256) = 4 pages of 256 / 4 x 584 -> 37,440; state: window 8,
    4-token blocks: 250 - 248 = 2 pages of 4 x 2 x 2 x 512 x 4 B = 32,768 -> 32,832; indexer: 4 pages of 64 x 132 =
    8,448 -> 8,640; its compressor: 2 pages of 4 x 2 x 2 x 128 x 4 B = 8,192 -> 8,640."""
    csa = load_model("deepseek-v4-pro").layers[2]
    assert v4_pages(csa, 1000) == [("window", 3, 37_440), ("entries", 4, 37_440), ("state", 2, 32_832),
                                   ("indexer", 4, 8_640), ("indexer state", 2, 8_640)]
    hca = load_model("deepseek-v4-pro").layers[0]
    # entries: 256 / 128 = 2 a page: 1,168 -> 1,728; state: window 128 in 8-token blocks: 125 - 109 = 16 pages of
    # 8 x 2 x 512 x 4 B = 32,768 -> 32,832
    assert v4_pages(hca, 1000) == [("window", 3, 37_440), ("entries", 4, 1_728), ("state", 16, 32_832)]
    spec = load_model("deepseek-v4-pro")
    r = size_kv(spec, get_engine("vllm"), batch=1, seq_len=1000)
    assert r.total_bytes == 30 * sum(h * p for _, h, p in v4_pages(csa, 1000)) + 31 * sum(
        h * p for _, h, p in v4_pages(hca, 1000))


@pytest.mark.parametrize("engine,match", [("sglang", "SGLang 0.5.10 has no DeepSeek-V4"),
                                          ("trtllm", "DeepSeek-V4 compressed-attention")])
def test_engines_without_deepseek_v4_refuse_it(engine, match):
    with pytest.raises(InputError, match=match):
        size_kv(load_model("deepseek-v4-pro"), get_engine(engine), batch=1, seq_len=16)


@pytest.mark.parametrize("keys,match", [
    ({"compress_ratios": [4, 128]}, "compress_ratios must give 0, 4 or 128 for each of the 61"),
    ({"compress_ratios": [7] * 61}, "compress_ratios must give"),
    ({"num_key_value_heads": 8}, "one shared K=V head"),
    ({"layer_types": ["full_attention"] * 61}, "layer_types must give one of"),
])
def test_deepseek_v4_bad_configs_are_one_line_errors(keys, match):
    raw = dict(load_model("deepseek-v4-pro").raw_config)
    raw.update(keys)
    with pytest.raises(ConfigError, match=match):
        _spec(raw)


def test_deepseek_v4_default_schedule_without_compress_ratios():
    raw = dict(load_model("deepseek-v4-pro").raw_config)
    del raw["compress_ratios"]
    ratios = [x.compress_ratio for x in _spec(raw).layers]  # type: ignore[union-attr]
    # DeepseekV4Config default: 2 HCA, then CSA at odd positions of the rest (i % 2 over i = 0..58)
    assert ratios == [128, 128] + [128 if i % 2 == 0 else 4 for i in range(59)]


# -- weights: within 1% of the published totals ------------------------------------------------------------------

@pytest.mark.parametrize("name,published", [
    # DeepSeek-V3 report: 671B, 685B with the MTP module; V3.2 adds the indexer (61 x ~14M). MTP not counted.
    ("deepseek-v3.2", 671e9),
    # GLM-5 report: 744B total (40B active). GLM-5.1's checkpoint holds 753,864,139,008 with its MTP layer 78
    # (attention + indexer + 256-expert MoE + eh_proj 6144 x 12288 + 5 norms), which is not counted here.
    ("glm-5.1", 744e9),
    # Kimi-K2's checkpoint (the same text model): 1,026,470,731,056 tensors, FP8 block scales included; the model
    # card rounds to 1T. The MoonViT vision tower (~0.4B) is not counted.
    ("kimi-k2.5", 1_026.47e9),
    # LongCat-Flash model card / tech report: 560B total.
    ("longcat-flash", 560e9),
])
def test_parameter_counts_within_one_percent(name, published):
    spec = load_model(name)
    total = count_params(spec, spec.arch).total
    assert abs(total - published) / published < 0.01, f"{name}: {total / 1e9:.3f}B vs {published / 1e9:.3f}B"


def test_glm5_mtp_layer_is_the_checkpoints_difference():
    """GLM-5.1's checkpoint (753,864,139,008) less its MTP layer, summed from its tensor list, is what we count."""
    h, q, heads, nope, v, rope, kv = 6144, 2048, 64, 192, 256, 64, 512
    attention = h * q + q + q * heads * (nope + rope) + h * (kv + rope) + kv + kv * heads * (nope + v) + heads * v * h
    indexer = q * 32 * 128 + h * 128 + 2 * 128 + h * 32
    moe = 256 * 3 * h * 2048 + 3 * h * 2048 + 256 * h + 256  # experts, shared, router, e_score_correction_bias
    mtp = attention + indexer + moe + 2 * h + h * 2 * h + 3 * h  # + layernorms, eh_proj, enorm/hnorm/head norm
    spec = load_model("glm-5.1")
    ours = count_params(spec, spec.arch).total
    checkpoint_bias = 75 * 256  # the checkpoint also holds e_score_correction_bias on the 75 MoE layers
    assert abs(ours - (753_864_139_008 - mtp - checkpoint_bias)) < 1e6


def test_deepseek_v4_pro_parameters_from_the_checkpoint_tensor_list():
    """The model card's 1.6T counts the MTP layer. Summed by hand from DeepSeek-V4-Pro's tensor list without
    mtp.* (FP4 experts counted as two values a byte, scales and the hash layers' tid2eid index tables left out)."""
    h, d, hc = 7168, 512, 4
    per_layer = (512 * h + 16384 * 4096 + h * 16384 + 1536 * h + 65536 * 1536  # wkv, wo_a, wo_b, wq_a, wq_b
                 + 128 + 512 + 1536 + 2 * h  # attn_sink, kv_norm, q_norm, attn_norm, ffn_norm
                 + 2 * (24 * hc * h + 24 + 3)  # hc_attn_*, hc_ffn_*
                 + 384 * 3 * 3072 * h + 3 * 3072 * h + 384 * h  # experts, shared experts, gate
                 + d)  # compressor.norm
    hca = 31 * (128 * 512 + 2 * 512 * h)  # ape, wgate, wkv
    csa = 30 * (4 * 1024 + 2 * 1024 * h)
    indexer = 30 * (4 * 256 + 128 + 2 * 256 * h + 64 * h + 8192 * 1536)
    gate_bias = 58 * 384  # layers 3-60
    top = 2 * 129280 * h + h + 4 * hc * h + 4 + 1  # embed, head, norm, hc_head_*
    by_hand = 61 * per_layer + hca + csa + indexer + gate_bias + top
    spec = load_model("deepseek-v4-pro")
    total = count_params(spec, spec.arch).total
    assert abs(total - by_hand) / by_hand < 0.01
    assert 1.55e12 < by_hand < 1.6e12  # 1.6T with the MTP layer's ~26B


# -- CLI -------------------------------------------------------------------------------------------------------------

def _json(*args: str) -> dict:
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("name", ["deepseek-v3.2", "glm-5.1", "kimi-k2.5", "longcat-flash", "deepseek-v4-pro"])
def test_size_and_fit_work_on_each_new_model(name):
    out = _json("size", name, "--seq-len", "8192", "--engine", "vllm")
    for key in ("model", "engine", "bytes_per_token", "total_bytes", "layers"):
        assert key in out
    assert out["total_bytes"] > 0
    fit = _json("fit", name, "--gpu", "h100", "-tp", "8", "--max-model-len", "8192")
    for key in ("fits", "kv_cache_memory_bytes", "max_concurrency", "params", "notes"):
        assert key in fit


def test_fit_deepseek_v4_pro_on_eight_h200s_at_one_million_tokens():
    fit = _json("fit", "deepseek-v4-pro", "--gpu", "h200", "-tp", "8", "--max-model-len", "1048576")
    assert fit["fits"] is True and fit["block_size"] == 256
    assert any("FP4" in n for n in fit["notes"]) and any("packs 5 cache groups" in n for n in fit["notes"])


def test_show_prints_the_indexer_and_the_compressed_layers():
    dsa = _json("show", "deepseek-v3.2")["groups"]
    assert dsa[0]["indexer_head_dim"] == 128 and dsa[0]["indexer_bytes_per_token"] == 256
    assert dsa[0]["latent_bytes_per_token"] == (576 + 128) * 2  # the slot holds the latent and the indexer key
    v4 = _json("show", "deepseek-v4-pro")["groups"]
    assert {(g["kind"], g["compress_ratio"], g["indexer_head_dim"]) for g in v4} == {
        ("compressed", 128, 0), ("compressed", 4, 128)}
    table = runner.invoke(app, ["show", "deepseek-v3.2"]).output
    assert "indexer key: 128 per" in table


def test_models_lists_the_new_families():
    names = {m["name"] for m in _json("models")["models"]}
    assert {"deepseek-v3.2", "glm-5.1", "kimi-k2.5", "longcat-flash", "deepseek-v4-pro"} <= names


def test_deepseek_v4_vllm_pool_by_hand():
    """vLLM 0.25.0's pool for V4-Pro (docs/research/deepseek-v4-vllm.md): layer tuples approximate_gcd([31 HCA
    entries, 61 windows, 31 HCA states, 30 CSA states], at least 31) = 31; the windows split 31 + 30; state pages
    padded to 37,440. Groups: entries and keys 31 x 1,728 + 30 x (37,440 + 8,640) = 1,435,968; windows 31 x 37,440
    and 30 x 37,440; HCA states 31 x 37,440; CSA states 30 x (37,440 + 8,640). A block: 31 x 37,440 + 31 x 1,728 +
    30 x 8,640 = 1,473,408 B. One request of 2**20 tokens at 8,192 tokens a step: 4,096 entry pages; windows
    cdiv(127 + 8192, 64) + 1 = 131; HCA states cdiv(127 + 8192, 8) + 1 = 1,041; CSA states cdiv(7 + 8192, 4) + 1 =
    2,051; logged, each weighed by its group's page over 1,435,968."""
    from kvplan.core.engines.vllm.plan import v4_layout
    from kvplan.core.profiles import parse_engine

    rules = parse_engine("vllm==0.25.0").profile.rules
    layout = v4_layout(list(load_model("deepseek-v4-pro").layers), rules, 256)  # type: ignore[arg-type]
    pages = sorted((b.num_layers, b.group_page_bytes) for b in layout.buckets)
    assert pages == sorted([(91, 1_435_968), (31, 31 * 37_440), (30, 30 * 37_440), (31, 31 * 37_440),
                            (60, 30 * (37_440 + 8_640))])
    assert layout.pool_block_bytes == 31 * 37_440 + 31 * 1_728 + 30 * 8_640 == 1_473_408
    weighed = (4096 * 1_435_968 + 131 * 31 * 37_440 + 131 * 30 * 37_440 + 1041 * 31 * 37_440
               + 2051 * 30 * (37_440 + 8_640))
    assert layout.blocks_per_request(1 << 20, 8192) == -(-weighed // 1_435_968)
    assert layout.blocks_admitted(1 << 20, 8192) == 4096 + 131 + 131 + 1041 + 2051
