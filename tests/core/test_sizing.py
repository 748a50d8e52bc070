"""Sizing laws and published figures."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.core.engines import ENGINES, get_engine
from kvplan.core.sizing import pp_stages, size_kv
from kvplan.core.spec import LayerKind
from kvplan.errors import InputError
from tests.factories import make_attention, make_linear, make_mla, make_spec

GiB = 1 << 30


def test_llama2_7b_shape_is_512_kib_per_token_and_2_gib_at_4096():
    spec = make_spec(num_layers=32, num_kv_heads=32, head_dim=128, dtype="fp16")
    r = size_kv(spec, get_engine("ideal"), batch=1, seq_len=4096)
    assert r.bytes_per_token == 524_288
    assert r.total_bytes == 2 * GiB


def test_gqa_divides_by_group_and_mqa_by_heads():
    mha = size_kv(make_spec(num_kv_heads=32), get_engine("ideal"), batch=1, seq_len=1)
    gqa = size_kv(make_spec(num_kv_heads=8), get_engine("ideal"), batch=1, seq_len=1)
    mqa = size_kv(make_spec(num_kv_heads=1), get_engine("ideal"), batch=1, seq_len=1)
    assert mha.bytes_per_token == 4 * gqa.bytes_per_token == 32 * mqa.bytes_per_token


def test_separate_k_and_v_head_dims():
    spec = make_spec(num_layers=1, num_kv_heads=2, head_dim=192, v_head_dim=128, dtype="bf16")
    assert size_kv(spec, get_engine("ideal"), batch=1, seq_len=1).bytes_per_token == 2 * (192 + 128) * 2


def test_mla_latent_has_no_factor_two():
    spec = make_spec([make_mla()] * 61, dtype="bf16")
    r = size_kv(spec, get_engine("ideal"), batch=1, seq_len=10)
    assert r.bytes_per_token == 61 * (512 + 64) * 2 == 70_272


def test_mla_latent_is_replicated_on_every_tp_rank():
    spec = make_spec([make_mla()] * 4, dtype="bf16")
    one = size_kv(spec, get_engine("vllm"), batch=1, seq_len=16, tp=1)
    eight = size_kv(spec, get_engine("vllm"), batch=1, seq_len=16, tp=8)
    assert eight.per_gpu_bytes == one.per_gpu_bytes
    assert eight.total_bytes == 8 * one.total_bytes


@pytest.mark.parametrize("tp,per_gpu_heads,total_heads", [(1, 8, 8), (2, 4, 8), (8, 1, 8), (16, 1, 16)])
def test_tp_splits_kv_heads_and_replicates_when_fewer_heads_than_ranks(tp, per_gpu_heads, total_heads):
    spec = make_spec(num_layers=2, num_kv_heads=8, head_dim=128, dtype="fp16")
    r = size_kv(spec, get_engine("vllm"), batch=1, seq_len=16, tp=tp)
    per_head = 2 * 2 * 128 * 2 * 16  # K+V, 2 layers, 128 dims, 2 B, 16 tokens
    assert r.per_gpu_bytes == per_gpu_heads * per_head
    assert r.total_bytes == total_heads * per_head


def test_strict_engines_refuse_uneven_head_split_and_ideal_takes_the_max():
    spec = make_spec(num_kv_heads=8)
    with pytest.raises(InputError, match="cannot be split evenly"):
        size_kv(spec, get_engine("vllm"), batch=1, seq_len=1, tp=3)
    r = size_kv(spec, get_engine("ideal"), batch=1, seq_len=1, tp=3)
    assert r.total_bytes == size_kv(spec, get_engine("ideal"), batch=1, seq_len=1).total_bytes
    assert r.per_gpu_bytes * 8 == r.total_bytes * 3  # ranks hold 3, 3, 2 heads


def test_pp_split_follows_vllm_and_reports_the_most_loaded_stage():
    assert [len(s) for s in pp_stages(61, 4)] == [15, 15, 16, 15]
    assert [len(s) for s in pp_stages(32, 4)] == [8, 8, 8, 8]
    assert [len(s) for s in pp_stages(10, 4)] == [2, 3, 3, 2]
    spec = make_spec(num_layers=61)
    r = size_kv(spec, get_engine("ideal"), batch=2, seq_len=100, pp=4)
    per_layer = r.total_bytes // 61
    assert r.per_gpu_bytes == 16 * per_layer
    with pytest.raises(InputError, match="exceeds the model's 61 layers"):
        pp_stages(61, 62)


def test_sliding_window_holds_min_of_tokens_and_window():
    spec = make_spec(num_layers=1, kind=LayerKind.SLIDING, window=4096)
    ideal = get_engine("ideal")
    full = make_spec(num_layers=1)
    per_token = size_kv(full, ideal, batch=1, seq_len=1).total_bytes
    assert size_kv(spec, ideal, batch=1, seq_len=100).total_bytes == 100 * per_token
    assert size_kv(spec, ideal, batch=1, seq_len=100_000).total_bytes == 4096 * per_token
    # bytes_per_token is the growth before the window is full
    assert size_kv(spec, ideal, batch=1, seq_len=100_000).bytes_per_token == per_token


@pytest.mark.parametrize("seq_len,expected", [(1, 1), (8, 8), (9, 1), (16, 8), (17, 1), (20, 4)])
def test_chunked_ideal_holds_the_current_chunk(seq_len, expected):
    spec = make_spec(num_layers=1, kind=LayerKind.CHUNKED, window=8)
    assert size_kv(spec, get_engine("ideal"), batch=1, seq_len=seq_len).groups[0].tokens_held_per_layer == expected


# vLLM single_type_kv_cache_manager: held blocks = cdiv(S, B) - skipped // B (N = S - 1 computed tokens)
@pytest.mark.parametrize(
    "seq_len,window,blocks",
    [(10_001, 4096, 626 - 369), (16, 4096, 1), (17, 4096, 2), (4096, 4096, 256), (4097, 4096, 257),
     (4112, 4096, 256), (4113, 4096, 258 - 1)],
)
def test_vllm_sliding_window_frees_whole_blocks(seq_len, window, blocks):
    spec = make_spec(num_layers=1, kind=LayerKind.SLIDING, window=window)
    r = size_kv(spec, get_engine("vllm"), batch=1, seq_len=seq_len)
    assert r.groups[0].tokens_held_per_layer == blocks * 16


@pytest.mark.parametrize("seq_len,blocks", [(8192, 512), (8193, 1), (8200, 1), (8210, 2), (20_000, 1250 - 1024)])
def test_vllm_chunked_frees_blocks_before_the_chunk(seq_len, blocks):
    spec = make_spec(num_layers=1, kind=LayerKind.CHUNKED, window=8192)
    assert size_kv(spec, get_engine("vllm"), batch=1, seq_len=seq_len).groups[0].tokens_held_per_layer == blocks * 16


def test_trtllm_sliding_is_a_cyclic_window_of_blocks():
    spec = make_spec(num_layers=1, kind=LayerKind.SLIDING, window=4096)
    r = size_kv(spec, get_engine("trtllm"), batch=1, seq_len=100_000)
    assert r.groups[0].tokens_held_per_layer == 4096
    r = size_kv(spec, get_engine("trtllm"), batch=1, seq_len=33)
    assert r.groups[0].tokens_held_per_layer == 64


def test_paged_engines_round_up_to_blocks():
    spec = make_spec(num_layers=2, num_kv_heads=8, head_dim=128, dtype="fp16")
    ideal = size_kv(spec, get_engine("ideal"), batch=3, seq_len=17).total_bytes
    assert size_kv(spec, get_engine("vllm"), batch=3, seq_len=17).total_bytes == ideal * 32 // 17
    assert size_kv(spec, get_engine("sglang"), batch=3, seq_len=17).total_bytes == ideal
    assert size_kv(spec, get_engine("trtllm"), batch=3, seq_len=17).total_bytes == ideal * 32 // 17
    # one-token blocks are the ideal (vLLM's BlockSize had 1, but no CUDA backend starts with it)
    one_token_blocks = dataclasses.replace(get_engine("vllm"), block_size=1)
    assert size_kv(spec, one_token_blocks, batch=3, seq_len=17).total_bytes == ideal


def test_linear_layers_hold_a_fixed_state_per_sequence():
    spec = make_spec([make_linear(conv_channels=64, conv_kernel=4, state_elems=256)] * 3 + [make_attention()], dtype="bf16")
    short = size_kv(spec, get_engine("ideal"), batch=2, seq_len=10)
    long = size_kv(spec, get_engine("ideal"), batch=2, seq_len=10_000)
    linear_short, linear_long = short.groups[0], long.groups[0]
    assert linear_short.total_bytes == linear_long.total_bytes == 3 * 2 * (64 * 3 * 2 + 256 * 2)
    assert linear_short.bytes_per_token == 0
    # conv width: transformers keeps the whole kernel; its gated-delta state is fp32
    hf = size_kv(spec, get_engine("hf"), batch=2, seq_len=10).groups[0]
    assert hf.total_bytes == 3 * 2 * (64 * 4 * 2 + 256 * 4)
    sglang = size_kv(spec, get_engine("sglang"), batch=2, seq_len=10).groups[0]
    assert sglang.total_bytes == 3 * 2 * (64 * 3 * 2 + 256 * 4)


@pytest.mark.parametrize("kv_dtype,expected", [("fp8", 64 * 1), ("int8", 64 + 4), ("int4", 32 + 4), ("nvfp4", 32 + 4)])
def test_quantized_kv_counts_scale_bytes(kv_dtype, expected):
    spec = make_spec(num_layers=1, num_kv_heads=1, head_dim=64)
    r = size_kv(spec, get_engine("ideal"), batch=1, seq_len=1, kv_dtype=kv_dtype)
    assert r.bytes_per_token == 2 * expected


@pytest.mark.parametrize("field,value", [("batch", 0), ("seq_len", -1), ("tp", 0), ("pp", 10_000), ("batch", 1 << 40)])
def test_out_of_range_numbers_are_refused_with_the_allowed_range(field, value):
    kwargs = dict(batch=1, seq_len=1, tp=1, pp=1)
    kwargs[field] = value
    with pytest.raises(InputError, match="must be between 1 and"):
        size_kv(make_spec(), get_engine("ideal"), **kwargs)


def _hybrid_spec(window: int, *, chunked: bool = True):
    layers = [make_attention(kind=LayerKind.SLIDING, window=window), make_attention(), make_mla(num_heads=8), make_linear()]
    if chunked:
        layers.append(make_attention(kind=LayerKind.CHUNKED, window=window))
    return make_spec(layers, num_attention_heads=8)


@settings(max_examples=200, deadline=None)
@given(
    engine=st.sampled_from(sorted(ENGINES)),
    batch=st.integers(1, 64),
    seq=st.integers(1, 5000),
    extra_batch=st.integers(0, 8),
    extra_seq=st.integers(0, 5000),
    window=st.integers(1, 2048),
    tp=st.sampled_from([1, 2, 8]),
)
def test_more_batch_or_longer_sequences_never_need_less_memory(engine, batch, seq, extra_batch, extra_seq, window, tp):
    eng = get_engine(engine)
    # batch: a law for every layer kind
    spec = _hybrid_spec(window)
    base = size_kv(spec, eng, batch=batch, seq_len=seq, tp=tp)
    wider = size_kv(spec, eng, batch=batch + extra_batch, seq_len=seq, tp=tp)
    assert wider.total_bytes >= base.total_bytes and wider.per_gpu_bytes >= base.per_gpu_bytes
    # length: a law except for chunked-local layers, which drop a whole chunk when the next starts,
    # and vLLM's sliding layers, which free a whole block when the window passes it (so a sequence can
    # hold one block less after a step; never more than one less)
    plain = _hybrid_spec(window, chunked=False)
    short = size_kv(plain, eng, batch=batch, seq_len=seq, tp=tp)
    longer = size_kv(plain, eng, batch=batch + extra_batch, seq_len=seq + extra_seq, tp=tp)
    for a, b in zip(short.groups, longer.groups):
        if engine == "vllm" and a.layer.kind is LayerKind.SLIDING:
            block = a.slot_bytes_per_layer * eng.block_size * a.count * batch
            assert b.total_bytes >= a.total_bytes - block
        else:
            assert b.total_bytes >= a.total_bytes and b.per_gpu_bytes >= a.per_gpu_bytes
    # every engine holds at least the ideal token states
    assert base.total_bytes >= size_kv(spec, get_engine("ideal"), batch=batch, seq_len=seq, tp=tp).total_bytes


@settings(max_examples=100, deadline=None)
@given(batch=st.integers(1, 32), seq=st.integers(1, 10_000), tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 3]))
def test_totals_add_up_and_the_most_loaded_gpu_bounds_the_mean(batch, seq, tp, pp):
    spec = _hybrid_spec(512)
    r = size_kv(spec, get_engine("vllm"), batch=batch, seq_len=seq, tp=tp, pp=pp)
    assert r.total_bytes == sum(g.total_bytes for g in r.groups)
    assert r.bytes_per_sequence * batch == r.total_bytes
    assert r.per_gpu_bytes * r.num_gpus >= r.total_bytes
    assert r.per_gpu_bytes == sum(g.per_gpu_bytes for g in r.groups)
