"""Typed, bounded reads of a Hugging Face ``config.json``'s keys (``_Cfg``), with messages that name the file and
the key; kvplan.io.hf_config and the family readers (kvplan.io.families) read every key through it.
"""

from __future__ import annotations

from typing import Any

from kvplan.errors import ConfigError


# Upper bounds on config.json integers, so that no input can build per-layer structures of a billion
# layers or sizes no machine has (``num_hidden_layers: 1000000`` made `fit` hang). Each is the largest
# value in a released model's config.json times a wide margin:
_MAX_LAYERS = 4096  # Llama 3.1 405B: 126 layers (x32)
_MAX_HEADS = 1 << 14  # DeepSeek-V3, Llama 3.1 405B: 128 attention heads (x128)
_MAX_WIDTH = 1 << 20  # Llama 3.1 405B: hidden 16,384, intermediate 53,248 (x19)
_MAX_HEAD_DIM = 1 << 14  # Gemma 2: head_dim 256; DeepSeek-V3: kv_lora_rank 512 (x32)
_MAX_VOCAB = 1 << 24  # Gemma 3: 262,208 (x64)
_MAX_POSITIONS = 1 << 30  # Llama 4 Scout: 10,485,760 positions (x100); also windows and chunks
_MAX_EXPERTS = 1 << 16  # Qwen3-Next: 512 routed experts (x128)
_MAX_SMALL = 1024  # conv kernels (Mamba, gated delta net: 4), expansion factors (Mamba: 2)
_BOUNDS: dict[str, int] = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers", "first_k_dense_replace",
                     "moe_layer_freq", "decoder_sparse_step", "interleave_moe_layer_step", "expert_layer_period",
                     "expert_layer_offset", "attn_layer_period", "attn_layer_offset", "sliding_window_pattern",
                     "no_rope_layer_interval", "full_attention_interval", "max_window_layers"), _MAX_LAYERS),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "n_heads", "attention_heads", "num_key_value_heads",
                     "num_kv_heads",
                     "n_head_kv", "linear_num_key_heads", "linear_num_value_heads"), _MAX_HEADS),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "intermediate_size", "ffn_dim", "n_inner",
                     "intermediate_size_mlp", "moe_intermediate_size", "shared_expert_intermediate_size",
                     "q_lora_rank", "mamba_dt_rank"), _MAX_WIDTH),
    **dict.fromkeys(("head_dim", "v_head_dim", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                     "linear_key_head_dim", "linear_value_head_dim", "mamba_d_state"), _MAX_HEAD_DIM),
    **dict.fromkeys(("mamba_d_conv", "linear_conv_kernel_dim", "mamba_expand"), _MAX_SMALL),
    "vocab_size": _MAX_VOCAB,
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "max_seq_len",
                     "sliding_window", "attention_chunk_size"), _MAX_POSITIONS),
    **dict.fromkeys(("n_routed_experts", "num_experts", "num_local_experts", "num_experts_per_tok",
                     "n_shared_experts"), _MAX_EXPERTS),
    # attention family readers (kvplan.io.families.attention): Gemma 3n/4, GLM-4.x MoE, MiniMax-M2, Hunyuan
    **dict.fromkeys(("num_kv_shared_layers", "num_nextn_predict_layers", "num_mtp_modules"), _MAX_LAYERS),
    "num_global_key_value_heads": _MAX_HEADS,
    **dict.fromkeys(("global_head_dim", "attention_head_dim"), _MAX_HEAD_DIM),
    **dict.fromkeys(("hidden_size_per_layer_input", "laurel_rank", "shared_intermediate_size"), _MAX_WIDTH),
    "vocab_size_per_layer_input": _MAX_VOCAB,
    "altup_num_inputs": _MAX_SMALL,
    "top_k_experts": _MAX_EXPERTS,
    # MLA families (kvplan.io.families.mla): DSA indexers, LongCat-Flash, DeepSeek-V4
    **dict.fromkeys(("index_head_dim",), _MAX_HEAD_DIM),
    **dict.fromkeys(("index_n_heads",), _MAX_HEADS),
    **dict.fromkeys(("index_topk", "compress_rate_csa", "compress_rate_hca"), _MAX_POSITIONS),
    **dict.fromkeys(("index_topk_freq", "index_skip_topk_offset", "num_hash_layers"), _MAX_LAYERS),
    **dict.fromkeys(("ffn_hidden_size", "expert_ffn_hidden_size", "o_lora_rank"), _MAX_WIDTH),
    **dict.fromkeys(("zero_expert_num", "moe_topk"), _MAX_EXPERTS),
    **dict.fromkeys(("o_groups", "hc_mult"), _MAX_SMALL),
    # hybrid families (kvplan.io.families.hybrid): Mamba-2, KDA, lightning attention, LFM2 short convs
    **dict.fromkeys(("mamba_num_heads", "mamba_n_heads", "linear_num_heads", "n_groups", "mamba_n_groups"), _MAX_HEADS),
    **dict.fromkeys(("mamba_head_dim", "mamba_d_head", "ssm_state_size", "linear_head_dim"), _MAX_HEAD_DIM),
    **dict.fromkeys(("conv_kernel", "expand", "conv_L_cache", "short_conv_kernel_size", "block_multiple_of"), _MAX_SMALL),
    **dict.fromkeys(("mamba_d_ssm", "block_ff_dim", "moe_shared_expert_intermediate_size"), _MAX_WIDTH),
    **dict.fromkeys(("num_experts_per_token", "num_shared_experts"), _MAX_EXPERTS),
    "model_max_length": _MAX_POSITIONS,
    # vision towers (kvplan.io.towers): Gemma 3's SigLIP 896 px in 14 px patches, Llama 4's projector 4096 wide
    **dict.fromkeys(("image_size",), 1 << 16),
    **dict.fromkeys(("patch_size", "num_channels", "spatial_merge_size"), _MAX_SMALL),
    **dict.fromkeys(("vision_output_dim", "projector_input_dim", "projector_output_dim"), _MAX_WIDTH),
}
_MAX_OTHER = 1 << 30  # any integer key not listed above


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Cfg:
    """Typed reads from a config dict with messages that name the file and the key.

    Every key kvplan reads goes through ``int``/``bool``/``str``/``int_list``: the type is checked (a
    number written as a string, ``"14336"``, is refused; a bool is not an int), and integers are
    bounded below by ``minimum`` and above by ``_BOUNDS``.
    """

    def __init__(self, data: dict[str, Any], origin: str) -> None:
        self.data = data
        self.origin = origin

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def int(self, *names: str, default: int | None = None, minimum: int = 1) -> int:
        for name in names:
            value = self.data.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{self.origin}: {name} must be an integer (got {_show(value)})")
            maximum = _BOUNDS.get(name, _MAX_OTHER)
            if value < minimum:
                raise ConfigError(f"{self.origin}: {name} must be >= {minimum} (got {value})")
            if value > maximum:
                raise ConfigError(f"{self.origin}: {name} must be <= {maximum} (got {_show(value)}); "
                                  "no released model comes near that")
            return value
        if default is not None:
            return default
        alt = f" (or {', '.join(names[1:])})" if len(names) > 1 else ""
        raise ConfigError(f"{self.origin}: required key {names[0]}{alt} is missing")

    def bool(self, name: str, default: bool = False) -> bool:
        value = self.data.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(f"{self.origin}: {name} must be true or false (got {_show(value)})")
        return value

    def str(self, name: str, default: str = "") -> str:
        value = self.data.get(name)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ConfigError(f"{self.origin}: {name} must be a string (got {_show(value)})")
        return value

    def int_list(self, name: str, *, minimum: int = 0, maximum: int = _MAX_LAYERS) -> list[int]:
        value = self.data.get(name)
        if value is None:
            return []
        if not isinstance(value, list) or len(value) > _MAX_LAYERS or any(
                isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= maximum for v in value):
            raise ConfigError(f"{self.origin}: {name} must be a list of integers in {minimum}..{maximum} "
                              f"(got {_show(value)})")
        return value
