"""The reference paged KV cache: its bytes equal the vllm-engine prediction, and attention through
it equals attention over a contiguous cache (MHA, GQA, MQA, MLA)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kvplan.core.engines import get_engine  # noqa: E402
from kvplan.core.sizing import size_kv  # noqa: E402
from kvplan.validate.paged import PagedKVCache, attention, mla_expand  # noqa: E402
from tests.factories import make_mla, make_spec  # noqa: E402

LENGTHS = [5, 16, 17, 40]
BLOCK = 16
BLOCKS = 1 + 1 + 2 + 3  # 16-token blocks for 5, 16, 17 and 40 tokens: a partly filled block is a whole block
BF16 = 2  # bytes


def fill(cache: PagedKVCache, layers: int, vectors: list[tuple[int, int]], gen) -> dict[int, list[list]]:
    """Write random tokens into the paged cache and keep the same values contiguously."""
    contiguous: dict[int, list[list]] = {}
    for seq, n in enumerate(LENGTHS):
        contiguous[seq] = [[[] for _ in vectors] for _ in range(layers)]
        for _ in range(n):
            for layer in range(layers):
                values = [torch.randn(h, e, generator=gen, dtype=torch.float32).to(torch.bfloat16) for h, e in vectors]
                cache.append(seq, layer, values)
                for slot, v in enumerate(values):
                    contiguous[seq][layer][slot].append(v)
    return {s: [[torch.stack(vs) for vs in layer] for layer in per] for s, per in contiguous.items()}


@pytest.mark.parametrize("kv_heads,heads", [(8, 8), (2, 8), (1, 8)])  # MHA, GQA, MQA
def test_paged_attention_equals_contiguous_and_bytes_match_vllm(kv_heads, heads):
    layers, head_dim = 2, 32
    vectors = [(kv_heads, head_dim), (kv_heads, head_dim)]
    cache = PagedKVCache(num_layers=layers, num_blocks=BLOCKS, block_size=BLOCK, vectors=vectors, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    contiguous = fill(cache, layers, vectors, gen)
    for seq in range(len(LENGTHS)):
        for layer in range(layers):
            k, v = cache.gather(seq, layer)
            assert torch.equal(k, contiguous[seq][layer][0]) and torch.equal(v, contiguous[seq][layer][1])
            q = torch.randn(heads, head_dim, generator=gen)
            assert torch.equal(attention(q, k, v), attention(q, *contiguous[seq][layer]))
    spec = make_spec(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim, dtype="bf16", num_attention_heads=heads)
    engine = get_engine("vllm", block_size=BLOCK)
    # Worked by hand: 7 blocks x 16 slots x 2 layers x (K and V) x kv_heads x 32 elements x 2 bytes.
    expected = BLOCKS * BLOCK * layers * 2 * kv_heads * head_dim * BF16
    assert expected == {8: 229_376, 2: 57_344, 1: 28_672}[kv_heads]
    assert sum(size_kv(spec, engine, batch=1, seq_len=n).total_bytes for n in LENGTHS) == expected
    assert cache.pool_bytes() == expected
    assert [len(cache.tables[s]) for s in range(len(LENGTHS))] == [1, 1, 2, 3]  # every block of the pool in use
    assert cache.free == [] and cache.table_bytes() == 4 * 7  # int32 block ids


def test_paged_mla_latent_attention_equals_contiguous_and_bytes_match_vllm():
    layers, heads, rank, rope, nope, v_dim = 2, 4, 32, 8, 16, 16
    vectors = [(1, rank + rope)]
    cache = PagedKVCache(num_layers=layers, num_blocks=BLOCKS, block_size=BLOCK, vectors=vectors, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(1)
    contiguous = fill(cache, layers, vectors, gen)
    w_kv_b = torch.randn(rank, heads * (nope + v_dim), generator=gen)
    for seq in range(len(LENGTHS)):
        for layer in range(layers):
            (latent,) = cache.gather(seq, layer)
            assert torch.equal(latent, contiguous[seq][layer][0])
            k, v = mla_expand(latent, w_kv_b, kv_lora_rank=rank, heads=heads, nope=nope, v_dim=v_dim)
            k2, v2 = mla_expand(contiguous[seq][layer][0], w_kv_b, kv_lora_rank=rank, heads=heads, nope=nope, v_dim=v_dim)
            q = torch.randn(heads, nope + rope, generator=gen)
            v_pad = torch.nn.functional.pad(v, (0, nope + rope - v_dim))
            v2_pad = torch.nn.functional.pad(v2, (0, nope + rope - v_dim))
            assert torch.equal(attention(q, k, v_pad), attention(q, k2, v2_pad))
    spec = make_spec([make_mla(num_heads=heads, kv_lora_rank=rank, qk_rope_head_dim=rope, qk_nope_head_dim=nope,
                               v_head_dim=v_dim)] * layers, dtype="bf16", num_attention_heads=heads)
    engine = get_engine("vllm", block_size=BLOCK)
    # One latent of kv_lora_rank + rope = 40 elements per token and layer ((d_c + d_h^R) per layer, DeepSeek-V2
    # paper, Table 1):
    # 7 blocks x 16 slots x 2 layers x 40 x 2 bytes.
    expected = 17_920
    assert expected == BLOCKS * BLOCK * layers * (rank + rope) * BF16
    assert sum(size_kv(spec, engine, batch=1, seq_len=n).total_bytes for n in LENGTHS) == expected
    assert cache.pool_bytes() == expected and cache.free == []


def test_pool_exhaustion_is_reported():
    cache = PagedKVCache(num_layers=1, num_blocks=1, block_size=2, vectors=[(1, 4)], dtype=torch.float32)
    for _ in range(2):
        cache.append(0, 0, [torch.zeros(1, 4)])
    with pytest.raises(MemoryError):
        cache.append(0, 0, [torch.zeros(1, 4)])
