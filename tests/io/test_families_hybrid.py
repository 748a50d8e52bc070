"""Hybrid families (kvplan.io.families.hybrid): layer kinds, state shapes and engine rules against figures
worked by hand from each config.json, the engines' state-shape rules and the published parameter counts."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.core.engines.vllm.plan import build_layout
from kvplan.core.dtypes import get_dtype
from kvplan.core.engines import get_engine
from kvplan.core.engines.vllm.profiles import newest
from kvplan.core.sizing import size_kv
from kvplan.core.spec import AttentionLayer, LayerKind, LinearLayer, MLALayer, NoCacheLayer
from kvplan.core.weights import count_params
from kvplan.errors import ConfigError, UnmodeledError
from kvplan.io.families import _MODULE_TYPES, family_module, hybrid
from kvplan.io.hf_config import spec_from_hf_config
from kvplan.io.models import load_model

runner = CliRunner()
BUNDLED = ("kimi-linear-48b-a3b", "minimax-m1-80k", "nemotron-3-nano-30b", "granite-4.0-h-small", "falcon-h1-34b",
           "lfm2-1.2b", "qwen3.5-27b", "qwen3.5-35b-a3b")


def spec(**cfg):
    return spec_from_hf_config(cfg, name="t", origin="cfg.json")


def linear(s) -> LinearLayer:
    return next(x for x in s.layers if isinstance(x, LinearLayer))


def indices(s, kind) -> list[int]:
    return [i for i, x in enumerate(s.layers) if x.kind is kind]


def test_module_types_match_the_registry():
    assert hybrid.MODEL_TYPES == _MODULE_TYPES["kvplan.io.families.hybrid"]
    assert all(family_module(t) is hybrid for t in hybrid.MODEL_TYPES)


# -- the bundled configs, worked by hand --------------------------------------------------------

def test_kimi_linear_kda_and_mla_layers():
    s = load_model("kimi-linear-48b-a3b")
    # full_attn_layers [4, 8, ..., 24, 27] are 1-based: 0-based 3, 7, ..., 23, 26
    assert indices(s, LayerKind.MLA) == [3, 7, 11, 15, 19, 23, 26]
    assert len(indices(s, LayerKind.LINEAR)) == 20
    kda = linear(s)
    # KDA: q, k, v each 32 heads x 128 = 4096 channels through the short conv (kernel 4); a 128 x 128 state per head
    assert (kda.family, kda.conv_channels, kda.conv_kernel) == ("kda", 3 * 4096, 4)
    assert kda.state_shape == (32, 128, 128) and kda.state_elems == 32 * 128 * 128
    mla = s.layers[3]
    assert isinstance(mla, MLALayer) and mla.latent_dim == 512 + 64
    assert s.max_model_len == 1_048_576  # model_max_length
    assert any("num_key_value_heads 32 ignored" in n for n in s.notes)


def test_minimax_lightning_every_eighth_layer_softmax():
    s = load_model("minimax-m1-80k")
    assert indices(s, LayerKind.FULL) == list(range(7, 80, 8))
    full = s.layers[7]
    assert isinstance(full, AttentionLayer) and (full.num_kv_heads, full.k_head_dim) == (8, 128)
    light = linear(s)
    # one 128 x 128 K^T V matrix per attention head (64), no conv
    assert (light.family, light.conv_channels, light.state_shape) == ("lightning", 0, (64, 128, 128))
    assert any("0.23.0" in n for n in s.notes)


def test_minimax_original_attn_type_list_reads_like_layer_types():
    base = dict(model_type="minimax_text_01", hidden_size=64, num_hidden_layers=8, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=100, num_local_experts=4, num_experts_per_tok=2,
                intermediate_size=32)
    a = spec(**base, attn_type_list=[0, 0, 0, 1, 0, 0, 0, 1])
    b = spec(**dict(base, model_type="minimax"),
             layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"])
    assert a.layers == b.layers and indices(a, LayerKind.FULL) == [3, 7]
    with pytest.raises(ConfigError, match="attn_type_list"):
        spec(**base, attn_type_list=[0, 1, 2, 0, 0, 0, 0, 1])


def test_nemotron_h_pattern_mamba2_attention_moe():
    s = load_model("nemotron-3-nano-30b")
    pattern = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
    assert [x.kind for x in s.layers] == [{"M": LayerKind.LINEAR, "*": LayerKind.FULL, "E": LayerKind.NONE}[c]
                                          for c in pattern]
    m = linear(s)
    # d_inner 64 x 64 = 4096; conv adds B and C: 2 x 8 groups x 128 = 2048 channels
    assert (m.family, m.conv_channels, m.state_shape, m.n_groups, m.group_state) == ("mamba2", 6144, (64, 64, 128), 8, 128)
    assert m.ssm_cache_dtype == "fp32"
    attn = s.layers[5]
    assert (attn.num_kv_heads, attn.k_head_dim) == (2, 128)


def test_nemotron_h_bad_pattern_and_length_note():
    base = dict(model_type="nemotron_h", hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=2)
    with pytest.raises(UnmodeledError, match="block kvplan does not model: 'X'") as info:
        spec(**base, hybrid_override_pattern="MX*")
    assert info.value.config["hybrid_override_pattern"] == "MX*"  # kept for --engine hf to measure
    with pytest.raises(UnmodeledError, match="'indexed_attention'"):
        spec(**base, layers_block_type=["mamba", "indexed_attention", "mlp"])
    s = spec(**base, hybrid_override_pattern="M*-M")
    assert s.num_layers == 4 and any("the pattern wins" in n for n in s.notes)
    with pytest.raises(ConfigError, match="groups \\(3\\) must divide"):
        spec(**dict(base, n_groups=3), hybrid_override_pattern="M*-")


def test_granite_4_h_layers_and_mamba_head_auto():
    s = load_model("granite-4.0-h-small")
    assert indices(s, LayerKind.FULL) == [5, 15, 25, 35]
    m = linear(s)
    # d_inner = 2 x 4096 = 8192 = 128 heads x 64; one group of d_state 128
    assert (m.conv_channels, m.state_shape) == (8192 + 2 * 128, (128, 64, 128))
    auto = spec(model_type="granitemoehybrid", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                layer_types=["mamba", "attention"], mamba_n_heads=8, mamba_d_head="auto", mamba_d_state=16)
    assert linear(auto).state_shape == (8, 16, 16)  # 2 x 64 / 8 heads


def test_falcon_h1_every_layer_holds_attention_and_state():
    s = load_model("falcon-h1-34b")
    assert s.num_layers == 72 and len(set(s.layers)) == 1
    layer = s.layers[0]
    assert isinstance(layer, LinearLayer) and layer.holds_tokens
    assert (layer.attention.num_kv_heads, layer.attention.k_head_dim) == (4, 128)
    # mamba_d_ssm 4096 + 2 x 2 groups x 256; 32 heads x 128 x 256
    assert (layer.conv_channels, layer.state_shape) == (4096 + 1024, (32, 128, 256))
    r = size_kv(s, get_engine("ideal"), batch=1, seq_len=1000)
    per_token = 72 * 2 * 4 * 128 * 2  # K and V, bf16
    state = 72 * (3 * 5120 * 2 + 32 * 128 * 256 * 2)
    assert (r.bytes_per_token, r.bytes_per_sequence) == (per_token, per_token * 1000 + state)


def test_lfm2_short_convolutions():
    s = load_model("lfm2-1.2b")
    assert indices(s, LayerKind.FULL) == [2, 5, 8, 10, 12, 14]
    conv = linear(s)
    assert (conv.family, conv.conv_channels, conv.conv_kernel, conv.state_elems) == ("short_conv", 2048, 3, 0)
    # vLLM keeps L_cache - 1 = 2 columns of 2048 bf16 channels; transformers all 3
    assert get_engine("vllm").linear_state_bytes(conv, "bf16", 1) == (2 * 2048 * 2,)
    assert get_engine("hf").linear_state_bytes(conv, "bf16", 1) == (3 * 2048 * 2,)
    assert all(x.kind is LayerKind.FULL for x in spec(model_type="lfm2", hidden_size=64, num_hidden_layers=2,
                                                      num_attention_heads=4).layers)


@pytest.mark.parametrize("name,full,k_heads,v_heads", [("qwen3.5-27b", 16, 16, 48), ("qwen3.5-35b-a3b", 10, 16, 32)])
def test_qwen35_gated_delta_net(name, full, k_heads, v_heads):
    s = load_model(name)
    assert indices(s, LayerKind.FULL) == [i for i in range(s.num_layers) if i % 4 == 3] and len(indices(s, LayerKind.FULL)) == full
    g = linear(s)
    assert g.conv_channels == 2 * k_heads * 128 + v_heads * 128 and g.state_shape == (v_heads, 128, 128)
    assert (g.ssm_dtype, g.n_groups, g.group_state) == ("fp32", k_heads, 128)


def test_qwen35_wrapped_text_config_and_interval_default():
    text = dict(model_type="qwen3_5_text", hidden_size=64, num_hidden_layers=8, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8,
                linear_num_key_heads=2, linear_num_value_heads=4)
    s = spec(model_type="qwen3_5", text_config=text)
    assert indices(s, LayerKind.FULL) == [3, 7]
    with pytest.raises(ConfigError, match="must divide linear_num_value_heads"):
        spec(**dict(text, linear_num_value_heads=3))


def test_kimi_layer_lists_must_cover_every_layer():
    base = dict(model_type="kimi_linear", hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)
    with pytest.raises(ConfigError, match="split the layers 1..4"):
        spec(**base, linear_attn_config={"kda_layers": [1, 2], "full_attn_layers": [3]})
    s = spec(**base)  # transformers' default: MLA at 4, 8, ... (0-based, from layer 4)
    assert indices(s, LayerKind.MLA) == [] and s.num_layers == 4
    assert indices(spec(**dict(base, num_hidden_layers=9)), LayerKind.MLA) == [4, 8]


# -- engine rules, by hand ----------------------------------------------------------------------

def test_vllm_state_dtypes_per_model():
    vllm = get_engine("vllm")
    # Qwen3.5: conv 3 x 8192 bf16 + 32 x 128 x 128 in the config's mamba_ssm_dtype float32
    assert vllm.linear_state_bytes(linear(load_model("qwen3.5-35b-a3b")), "bf16", 1) == (3 * 8192 * 2 + 32 * 128 * 128 * 4,)
    # Qwen3-Next (same shapes, no mamba_ssm_dtype): both in the model dtype
    assert vllm.linear_state_bytes(linear(load_model("qwen3-next-80b-a3b")), "bf16", 1) == (3 * 8192 * 2 + 32 * 128 * 128 * 2,)
    # Kimi Delta Attention: float32 whatever the model dtype (kda_state_dtype)
    assert vllm.linear_state_bytes(linear(load_model("kimi-linear-48b-a3b")), "bf16", 1) == (3 * 12288 * 2 + 32 * 128 * 128 * 4,)
    # Nemotron-H: mamba_ssm_cache_dtype float32
    assert vllm.linear_state_bytes(linear(load_model("nemotron-3-nano-30b")), "bf16", 1) == (3 * 6144 * 2 + 64 * 64 * 128 * 4,)
    # Granite 4.0-H: model dtype; MiniMax lightning: model dtype, no conv
    assert vllm.linear_state_bytes(linear(load_model("granite-4.0-h-small")), "bf16", 1) == (3 * 8448 * 2 + 128 * 64 * 128 * 2,)
    assert vllm.linear_state_bytes(linear(load_model("minimax-m1-80k")), "bf16", 1) == (64 * 128 * 128 * 2,)


def test_sglang_conv_is_bf16_and_state_fp32_by_default():
    granite = linear(load_model("granite-4.0-h-small"))
    # an fp32 model: vLLM keeps fp32 conv and state, SGLang bf16 conv (SGLANG_MAMBA_CONV_DTYPE) and fp32 state
    assert get_engine("sglang").linear_state_bytes(granite, "fp32", 1) == (3 * 8448 * 2 + 128 * 64 * 128 * 4,)
    assert get_engine("vllm").linear_state_bytes(granite, "fp32", 1) == (3 * 8448 * 4 + 128 * 64 * 128 * 4,)


def test_mamba2_groups_are_replicated_when_tp_does_not_divide_them():
    granite = linear(load_model("granite-4.0-h-small"))  # one group
    state_rank = 64 * 64 * 128 * 2  # 128 heads / 2 ranks
    # vLLM at tp 2: groups padded to 2, so each rank convolves 8192 / 2 + 2 x 128 channels
    assert get_engine("vllm").linear_state_bytes(granite, "bf16", 2) == (3 * (4096 + 256) * 2 + state_rank,) * 2
    # ideal splits the one group
    assert get_engine("ideal").linear_state_bytes(granite, "bf16", 2) == (3 * (8448 // 2) * 2 + state_rank,) * 2
    nemotron = linear(load_model("nemotron-3-nano-30b"))  # 8 groups: tp 8 divides them, nothing replicated
    # per rank: conv 6144 / 8 channels x 3 x bf16, state 64 / 8 heads x 64 x 128 x fp32
    assert get_engine("vllm").linear_state_bytes(nemotron, "bf16", 8) == (768 * 3 * 2 + 8 * 64 * 128 * 4,) * 8


@settings(max_examples=40, deadline=None)
@given(groups=st.sampled_from([1, 2, 4, 8]), tp=st.sampled_from([1, 2, 4, 8, 16]), kernel=st.integers(2, 6))
def test_replication_never_shrinks_and_vanishes_when_tp_divides_groups(groups, tp, kernel):
    heads, head_dim, d_state = 16, 8, 16
    layer = LinearLayer(family="mamba2", conv_channels=heads * head_dim + 2 * groups * d_state, conv_kernel=kernel,
                        state_elems=heads * head_dim * d_state, num_heads=heads, state_shape=(heads, head_dim, d_state),
                        n_groups=groups, group_state=d_state)
    vllm, ideal = get_engine("vllm"), get_engine("ideal")
    per_rank = vllm.linear_state_bytes(layer, "bf16", tp)
    even = ideal.linear_state_bytes(layer, "bf16", tp)
    assert all(a >= b for a, b in zip(per_rank, even))
    assert (per_rank == even) == (groups % tp == 0)


def test_hf_keeps_the_full_kernel_and_fp32_states():
    hf = get_engine("hf")
    kda = linear(load_model("kimi-linear-48b-a3b"))
    assert hf.linear_state_bytes(kda, "bf16", 1) == (4 * 12288 * 2 + 32 * 128 * 128 * 4,)
    lightning = linear(load_model("minimax-m1-80k"))
    assert hf.linear_state_bytes(lightning, "bf16", 1) == (64 * 128 * 128 * 2,)  # MiniMaxCache keeps the model dtype


# -- vLLM's hybrid pool ---------------------------------------------------------------------------

def _layout(name, tp=1):
    s = load_model(name)
    return build_layout(s.layers, rules=newest().rules, kv_dtype=get_dtype(s.dtype), model_dtype=s.dtype,
                        block_size=64 if any(isinstance(x, MLALayer) for x in s.layers) else 16, tp=tp)


def test_vllm_hybrid_block_sizes_by_hand():
    # Qwen3.5-35B-A3B: mamba page 2,146,304 B; attention 2 KV heads x 256 x (K, V) x 2 B = 2,048 B a token;
    # block = 16 x cdiv(2,146,304, 16 x 2,048) = 16 x 66
    q = _layout("qwen3.5-35b-a3b")
    assert min(b.block_size for b in q.buckets) == 1056
    # 10 attention and 30 mamba layers: group size 10, so 1 attention group and 3 mamba groups
    assert (q.group_size, q.num_groups, q.page_bytes) == (10, 4, 1056 * 2048)
    # Nemotron 3 Nano: page 3 x 6144 x 2 + 64 x 64 x 128 x 4 = 2,134,016; attention 2 x 128 x 2 x 2 = 1,024 B
    assert min(b.block_size for b in _layout("nemotron-3-nano-30b").buckets) == 16 * 131
    # Kimi-Linear at tp 2 (MLA: 128-token alignment): KDA page 3 x 6144 x 2 + 16 x 128 x 128 x 4 = 1,085,440 B;
    # the latent 576 x 2 = 1,152 B a token: 128 x cdiv(1,085,440, 128 x 1,152) = 128 x 8
    assert min(b.block_size for b in _layout("kimi-linear-48b-a3b", tp=2).buckets) == 1024
    # LFM2: the conv page (2 x 2048 x 2 = 8 KiB) is below one 16-token attention block (32 KiB): no growth
    assert min(b.block_size for b in _layout("lfm2-1.2b").buckets) == 16


def test_vllm_falcon_h1_plans_both_pools():
    layout = _layout("falcon-h1-34b")
    kinds = {b.kind: b.num_layers for b in layout.buckets}
    assert kinds == {LayerKind.LINEAR: 72, LayerKind.FULL: 72}  # each layer registers an attention and a mamba layer
    # attention 4 x 128 x 2 x 2 = 2,048 B a token; mamba page 3 x 5120 x 2 + 32 x 128 x 256 x 2 = 2,127,872 B
    assert min(b.block_size for b in layout.buckets) == 16 * 65
    # one request of 32,768 tokens: cdiv(32768, 1040) = 32 attention blocks + 1 mamba block
    assert layout.blocks_per_request(32768, 8192) == 33


# -- weights ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,published", [
    ("minimax-m1-80k", 456e9),  # MiniMax-M1 model card / MiniMax-01 report: 456B total, 45.9B activated
    ("nemotron-3-nano-30b", 31.6e9),  # NVIDIA model card: 31.6B total parameters
    ("granite-4.0-h-small", 32e9),  # IBM model card: 32B total, 9B active
    ("lfm2-1.2b", 1_170_340_608),  # LiquidAI model card: 1,170,340,608 parameters
    ("qwen3.5-27b", 27e9),  # Qwen model card: 27B (language model; the vision tower is not counted)
    ("qwen3.5-35b-a3b", 35e9),  # Qwen model card: 35B total, 3B activated (language model, MTP not counted)
])
def test_parameter_counts_within_one_percent(name, published):
    s = load_model(name)
    total = count_params(s, s.arch).language_model  # Qwen3.5's card counts the language model, not its tower
    assert abs(total - published) / published < 0.01, f"{name}: {total / 1e9:.3f}B vs {published / 1e9:.3f}B"


def test_nemotron_experts_are_not_gated():
    """Nemotron-H's ReLU^2 experts have up and down projections only: gated counting would add 14.7B."""
    s = load_model("nemotron-3-nano-30b")
    assert s.arch.moe is not None and not s.arch.moe.gated
    experts = sum(count_params(s, s.arch).layers_experts)
    assert experts == 23 * 128 * 2 * 2688 * 1856  # 23 MoE layers, 128 experts, up + down


# -- the command line -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", BUNDLED)
def test_size_and_fit_work_on_every_hybrid(name):
    r = runner.invoke(app, ["size", name, "--seq-len", "4096", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["bytes_per_sequence"] > out["bytes_per_token"] * 4096  # the fixed states come on top of the tokens
    assert {"layers", "bytes_per_token", "total_bytes"} <= set(out)
    r = runner.invoke(app, ["fit", name, "--gpu", "h100", "-tp", "4", "--max-model-len", "32768", "--json"])
    assert r.exit_code in (0, 1), r.output
    out = json.loads(r.output)
    assert {"fits", "max_concurrency", "block_size", "num_blocks"} <= set(out)


def test_fit_reports_the_hybrid_block_size():
    r = runner.invoke(app, ["fit", "qwen3.5-35b-a3b", "--gpu", "h100", "--max-model-len", "32768", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["block_size"] == 1056  # worked in test_vllm_hybrid_block_sizes_by_hand


def test_models_lists_the_hybrids_and_show_prints_states():
    r = runner.invoke(app, ["models", "--json"])
    assert r.exit_code == 0, r.output
    names = {m["name"] for m in json.loads(r.output)["models"]}
    assert set(BUNDLED) <= names
    r = runner.invoke(app, ["show", "falcon-h1-34b", "--json"])
    assert r.exit_code == 0, r.output
    (group,) = json.loads(r.output)["groups"]
    assert group["state_shape"] == [32, 128, 256] and group["conv_channels"] == 5120
    assert group["attention"] == "full GQA 4x128" and group["bytes_per_token"] == 2 * 4 * 128 * 2
    r = runner.invoke(app, ["show", "qwen3.5-35b-a3b"])
    assert r.exit_code == 0 and "gated_delta_net" in r.output and "32 x 128 x 128" in r.output


def test_nothing_cached_by_mlp_and_moe_layers():
    s = load_model("nemotron-3-nano-30b")
    assert sum(isinstance(x, NoCacheLayer) for x in s.layers) == 23


@settings(max_examples=30, deadline=None)
@given(engine=st.sampled_from(["ideal", "hf", "vllm", "sglang", "trtllm"]), seq=st.integers(1, 5000),
       extra=st.integers(0, 5000), batch=st.integers(1, 8))
def test_a_parallel_hybrid_never_needs_less_for_longer_sequences(engine, seq, extra, batch):
    """Falcon-H1's layers hold tokens and a fixed state: more tokens never need less, and the state is paid at
    any length (a 1-token sequence already holds all 72 states)."""
    s = load_model("falcon-h1-34b")
    eng = get_engine(engine)
    short = size_kv(s, eng, batch=batch, seq_len=seq, tp=4)
    long = size_kv(s, eng, batch=batch, seq_len=seq + extra, tp=4)
    assert long.total_bytes >= short.total_bytes
    states = batch * 72 * sum(eng.linear_state_bytes(s.layers[0], s.dtype, 4))
    assert short.total_bytes > states
