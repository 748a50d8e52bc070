"""Parameter counts against published figures, and weight bytes by format and parallelism."""

from __future__ import annotations

import pytest

from kvplan.core.sizing import pp_stages
from kvplan.core.weights import count_params, get_weight_format, weight_bytes
from kvplan.errors import InputError
from kvplan.io.models import load_model


@pytest.mark.parametrize(
    "name,published",
    [
        ("llama2-7b", 6.74e9),  # Touvron et al. 2023, Table 1 / HF model card
        ("llama2-13b", 13.0e9),
        ("llama2-70b", 69.0e9),
        ("llama3-8b", 8.03e9),
        ("llama3-70b", 70.6e9),
        ("llama3.1-8b", 8.03e9),
        ("llama3.1-70b", 70.6e9),
        ("llama3.1-405b", 405.9e9),
        ("mixtral-8x7b", 46.7e9),  # Mistral AI: 46.7B total, 12.9B active
        ("deepseek-v3", 671e9),  # DeepSeek-V3 report: 671B (685B with the MTP module, not loaded for serving)
        ("deepseek-v2", 236e9),
        ("qwen3-30b-a3b", 30.5e9),
        ("qwen3-32b", 32.8e9),
        ("qwen2.5-72b", 72.7e9),
        ("qwen2.5-7b", 7.61e9),
        ("gemma2-27b", 27.2e9),
        ("gemma2-9b", 9.24e9),
        ("gpt-oss-120b", 116.8e9),  # OpenAI gpt-oss model card: 116.8B total
        ("gpt-oss-20b", 20.9e9),
        ("phi-3-mini", 3.8e9),
        ("opt-13b", 12.9e9),
        ("qwen3-next-80b-a3b", 79.7e9),
        ("jamba-mini", 51.6e9),
        ("gpt2", 124.4e6),
        ("phi-2", 2.78e9),  # PhiForCausalLM: plain fc1/fc2, biases on every linear layer, one LayerNorm per layer
        ("phi-4", 14.7e9),
        ("qwen3-14b", 14.8e9),  # Qwen3-14B model card: 14.8B (13.2B non-embedding)
        ("gemma2-2b", 2.61e9),
    ],
)
def test_parameter_counts_within_one_percent(name, published):
    spec = load_model(name)
    total = count_params(spec, spec.arch).total
    assert abs(total - published) / published < 0.01, f"{name}: {total / 1e9:.3f}B vs {published / 1e9:.3f}B"


@pytest.mark.parametrize("name,active", [("mixtral-8x7b", 12.9e9), ("deepseek-v3", 37.6e9), ("qwen3-30b-a3b", 3.3e9)])
def test_active_parameters_of_moe_models(name, active):
    spec = load_model(name)
    assert abs(count_params(spec, spec.arch).active(spec.arch.moe) - active) / active < 0.03


def test_llama2_7b_bf16_weights_bytes_and_tp_split():
    spec = load_model("llama2-7b")
    bf16 = get_weight_format("bf16")
    one = weight_bytes(spec, spec.arch, fmt=bf16, keep_fmt=bf16)
    rope = 4096 * 128 * 2  # the RoPE cos/sin cache: 4,096 positions x 128 rotary dims in bf16 (kvplan.io.rope)
    assert spec.arch.rope_cache_elems * 2 == rope
    assert one.total_bytes == 2 * one.params + rope and one.params == 6_738_415_616
    four = weight_bytes(spec, spec.arch, fmt=bf16, keep_fmt=bf16, tp=4)
    whole = (2 * 32 + 1) * 4096 * 2 + rope  # norms and the RoPE cache, held whole by each rank
    assert four.per_gpu_bytes == (one.total_bytes - whole) // 4 + whole


def test_pp_puts_embeddings_first_and_head_last():
    spec = load_model("llama2-7b")
    bf16 = get_weight_format("bf16")
    w = weight_bytes(spec, spec.arch, fmt=bf16, keep_fmt=bf16, stages=pp_stages(32, 2))
    # each stage builds its own RoPE cache (4,096 x 128 in bf16); the layers, vocabulary and norms are split
    assert len(w.per_stage_bytes) == 2 and sum(w.per_stage_bytes) == w.total_bytes + 4096 * 128 * 2
    assert w.per_stage_bytes[0] - w.per_stage_bytes[1] == -2 * 4096  # same layers and vocab; the final norm is last


@pytest.mark.parametrize("fmt,bytes_per_million", [("fp8", 1_000_000 + 4 * 62), ("int4-g128", 500_000 + 19_533),
                                                    ("mxfp4", 500_000 + 31_250), ("int8", 1_000_000 + 490)])
def test_quantized_formats_count_their_scales(fmt, bytes_per_million):
    assert get_weight_format(fmt).bytes_for(1_000_000) == bytes_per_million


def test_fp8_checkpoint_is_read_from_quantization_config():
    from kvplan.core.capacity.common import FitRequest, model_weights
    from kvplan.core.gpus import GPUSpec

    spec = load_model("deepseek-v3")
    w, notes = model_weights(FitRequest(spec=spec, gpu=GPUSpec(name="x", memory_bytes=1 << 40)))
    assert w.format == "fp8" and any("FP8" in n for n in notes)
    assert 671e9 < w.total_bytes < 700e9  # ~1 byte per parameter, embeddings and norms in bf16


def test_unknown_weight_format():
    with pytest.raises(InputError, match="unknown weight dtype"):
        get_weight_format("fp6")


@pytest.mark.parametrize("ranks", [2, 3, 8])
def test_routed_experts_over_data_parallel_ranks_with_and_without_expert_parallel(ranks):
    """vLLM's MoE layers span dp x tp GPUs (fused_moe/config.py::FusedMoEParallelConfig.make): without EP each GPU
    holds 1/ranks of every expert, with EP whole experts, the most loaded ceil(num_experts / ranks)
    (fused_moe/layer.py::determine_expert_map); the rest of the model stays split over tp (here 1)."""
    spec = load_model("qwen3-30b-a3b")  # bf16: 2 bytes a parameter, 128 experts a layer
    arch = spec.arch
    bf16 = get_weight_format("bf16")
    counts = count_params(spec, arch)
    experts = sum(counts.layers_experts)
    rest = counts.total - experts
    alone = weight_bytes(spec, arch, fmt=bf16, keep_fmt=bf16).per_gpu_bytes
    shared = weight_bytes(spec, arch, fmt=bf16, keep_fmt=bf16, expert_ranks=ranks).per_gpu_bytes
    whole = weight_bytes(spec, arch, fmt=bf16, keep_fmt=bf16, expert_ranks=ranks, whole_experts=True).per_gpu_bytes
    n = arch.moe.num_experts
    assert alone == 2 * counts.total + 2 * arch.rope_cache_elems
    assert shared == 2 * (rest + -(-experts // ranks)) + 2 * arch.rope_cache_elems
    assert whole == 2 * (rest + experts // n * -(-n // ranks)) + 2 * arch.rope_cache_elems
    assert whole >= shared and (whole == shared) == (n % ranks == 0)


def test_expert_parallel_leaves_a_dense_model_as_it_is():
    spec = load_model("llama3.1-8b")
    bf16 = get_weight_format("bf16")
    plain = weight_bytes(spec, spec.arch, fmt=bf16, keep_fmt=bf16)
    assert weight_bytes(spec, spec.arch, fmt=bf16, keep_fmt=bf16, expert_ranks=8, whole_experts=True) == plain


def test_attention_and_embedding_over_the_attention_groups():
    """SGLang's data-parallel attention (models/deepseek_v2.py, 0.5.10): the MLA projections and the embedding split
    over attn_tp = tp // dp, the MLP, experts and LM head over tp."""
    spec = load_model("deepseek-v2-lite")
    arch = spec.arch
    bf16 = get_weight_format("bf16")
    counts = count_params(spec, arch)
    tp8 = weight_bytes(spec, arch, fmt=bf16, keep_fmt=bf16, tp=8).per_gpu_bytes
    dp8 = weight_bytes(spec, arch, fmt=bf16, keep_fmt=bf16, tp=8, attn_ranks=1).per_gpu_bytes
    attn = sum(counts.layers_attn)
    assert dp8 - tp8 == 2 * (attn - -(-attn // 8)) + 2 * (counts.embedding - -(-counts.embedding // 8))
    assert weight_bytes(spec, arch, fmt=bf16, keep_fmt=bf16, tp=8, attn_ranks=8).per_gpu_bytes == tp8


def test_mla_down_projections_are_in_the_attentions_format():
    """DeepSeek-V3's q_a_proj (7168 x 1536) and kv_a_proj_with_mqa (7168 x 576) in each of 61 layers are quantized
    linears every rank holds whole (vLLM ReplicatedLinear / the fused qkv_a projection with quant_config): in the
    FP8 checkpoint 1 B a parameter plus a 4 B scale per 128 x 128 block, not the model's bf16."""
    spec = load_model("deepseek-v3")
    counts = count_params(spec, spec.arch)
    down = 61 * 7168 * (1536 + 576)
    assert sum(counts.layers_whole_fmt) == down
    fp8, bf16 = get_weight_format("fp8"), get_weight_format("bf16")
    as_fp8 = weight_bytes(spec, spec.arch, fmt=fp8, keep_fmt=bf16, tp=8).per_gpu_bytes
    whole_bf16 = bf16.bytes_for(down) - fp8.bytes_for(down)  # what counting them in bf16 would add
    assert whole_bf16 == pytest.approx(down * (1 - 4 / (128 * 128)), abs=8)
    # the model without quantization keeps them in bf16: the difference is theirs and the split weights' alone
    as_bf16 = weight_bytes(spec, spec.arch, fmt=bf16, keep_fmt=bf16, tp=8).per_gpu_bytes
    assert as_bf16 - as_fp8 > whole_bf16


def test_placements_move_bytes_between_gpus_not_into_the_model():
    """SGLang's placements (dense MLPs, shared experts and LM head whole, redundant expert copies) weigh on each GPU;
    the model's one copy (total_bytes) stays what it is."""
    spec = load_model("deepseek-v3")
    bf16 = get_weight_format("bf16")
    plain = weight_bytes(spec, spec.arch, fmt=bf16, keep_fmt=bf16, tp=8, whole_experts=True)
    placed = weight_bytes(spec, spec.arch, fmt=bf16, keep_fmt=bf16, tp=8, whole_experts=True, attn_ranks=4,
                          mlp_ranks=1, shared_ranks=1, head_ranks=4, physical_experts=256 + 8)
    assert placed.total_bytes == plain.total_bytes
    assert placed.per_gpu_bytes > plain.per_gpu_bytes
