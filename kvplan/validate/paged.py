"""A small torch reference paged KV cache: block pools, block tables, attention through them.

Per layer one pool of ``num_blocks x block_size x kv_heads x head_dim`` for K and one for V (or one
latent pool for MLA, ``kv_lora_rank + qk_rope_head_dim`` wide, as vLLM's ``MLAAttentionSpec``);
a sequence owns a block table and its tokens are written slot by slot. Reading gathers the blocks
of a sequence back in order. It serves two checks (tests/validate/test_paged.py): its pools hold
exactly the bytes the ``vllm`` engine predicts, and attention through it equals attention over a
contiguous cache, for MHA, GQA, MQA and MLA.
"""

from __future__ import annotations

from typing import Any

from kvplan.validate import require_torch


class PagedKVCache:
    def __init__(self, *, num_layers: int, num_blocks: int, block_size: int, vectors: list[tuple[int, int]],
                 dtype: Any, device: str = "cpu") -> None:
        """``vectors``: per token slot, (heads, elements) of each stored tensor (K and V, or the latent)."""
        require_torch()
        import torch

        self.block_size = block_size
        self.pools = [[torch.zeros(num_blocks, block_size, heads, elems, dtype=dtype, device=device)
                       for heads, elems in vectors] for _ in range(num_layers)]
        self.free = list(range(num_blocks))
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    def pool_bytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for layer in self.pools for t in layer)

    def table_bytes(self) -> int:
        """Block tables as int32, as engines keep them."""
        return 4 * sum(len(t) for t in self.tables.values())

    def append(self, seq: int, layer: int, tensors: list[Any]) -> None:
        """Write one token's vectors (each [heads, elements]) for ``seq`` at ``layer``."""
        table = self.tables.setdefault(seq, [])
        pos = self.lengths.get(seq, 0) if layer == 0 else self.lengths[seq] - 1
        if layer == 0:
            if pos % self.block_size == 0:
                if not self.free:
                    raise MemoryError("paged pool exhausted")
                table.append(self.free.pop(0))
            self.lengths[seq] = pos + 1
        block, offset = table[pos // self.block_size], pos % self.block_size
        for pool, value in zip(self.pools[layer], tensors):
            pool[block, offset] = value

    def gather(self, seq: int, layer: int) -> list[Any]:
        """The sequence's tensors for ``layer``, contiguous: [tokens, heads, elements] each."""
        import torch

        idx = torch.tensor(self.tables[seq], dtype=torch.long, device=self.pools[layer][0].device)
        n = self.lengths[seq]
        return [pool.index_select(0, idx).flatten(0, 1)[:n] for pool in self.pools[layer]]


def attention(q: Any, k: Any, v: Any) -> Any:
    """Causal-free attention of one query token over cached K/V: q [heads, d], k/v [tokens, kv_heads, d].
    GQA/MQA: each KV head serves heads // kv_heads query heads."""
    import torch

    heads, kv_heads = q.shape[0], k.shape[1]
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.einsum("hd,thd->ht", q.float(), k.float()) / k.shape[-1] ** 0.5
    return torch.einsum("ht,thd->hd", scores.softmax(-1), v.float())


def mla_expand(latent: Any, w_kv_b: Any, *, kv_lora_rank: int, heads: int, nope: int, v_dim: int) -> tuple[Any, Any]:
    """DeepSeek MLA: per-head K (nope part from the latent, the shared RoPE part) and V from the cached
    latent [tokens, 1, kv_lora_rank + rope]."""
    import torch

    c, k_rope = latent[:, 0, :kv_lora_rank], latent[:, 0, kv_lora_rank:]
    kv = (c.float() @ w_kv_b.float()).view(c.shape[0], heads, nope + v_dim)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    k = torch.cat([k_nope, k_rope.float()[:, None, :].expand(-1, heads, -1)], dim=-1)
    return k, v
