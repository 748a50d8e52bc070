"""Factories for tests: specs (as vLLM's tests build them: small, explicit, overridable) and hostile inputs."""

from __future__ import annotations

from kvplan.core.spec import AttentionLayer, LayerKind, LinearLayer, MLALayer, ModelSpec


def make_attention(*, num_kv_heads: int = 8, head_dim: int = 128, v_head_dim: int | None = None,
                   kind: LayerKind = LayerKind.FULL, window: int = 0) -> AttentionLayer:
    return AttentionLayer(kind=kind, num_kv_heads=num_kv_heads, k_head_dim=head_dim,
                          v_head_dim=head_dim if v_head_dim is None else v_head_dim, window=window)


def make_mla(*, num_heads: int = 128, kv_lora_rank: int = 512, qk_rope_head_dim: int = 64,
             qk_nope_head_dim: int = 128, v_head_dim: int = 128) -> MLALayer:
    return MLALayer(num_heads=num_heads, kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim,
                    qk_nope_head_dim=qk_nope_head_dim, v_head_dim=v_head_dim)


def make_linear(*, conv_channels: int = 64, conv_kernel: int = 4, state_elems: int = 256, num_heads: int = 4,
                family: str = "gated_delta_net") -> LinearLayer:
    return LinearLayer(family=family, conv_channels=conv_channels, conv_kernel=conv_kernel,
                       state_elems=state_elems, num_heads=num_heads)


def make_spec(layers=None, *, num_layers: int = 4, dtype: str = "fp16", num_attention_heads: int = 32,
              max_model_len: int = 4096, **attn) -> ModelSpec:
    if layers is None:
        layers = [make_attention(**attn)] * num_layers
    return ModelSpec(name="test", layers=tuple(layers), dtype=dtype, max_model_len=max_model_len,
                     num_attention_heads=num_attention_heads, hidden_size=4096)


def alias_bomb() -> str:
    """A 1 KB YAML "billion laughs": ten levels of nine aliases each, 9**10 nodes once expanded."""
    text = "a: &a [x,x,x,x,x,x,x,x,x]\n"
    for i in range(9):
        prev, name = chr(97 + i), chr(98 + i)
        text += f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]\n"
    return text
