"""LoRA adapters' GPU buffers: what an engine allocates at start for ``max_loras`` slots of rank ``max_rank``.

vLLM (docs/research/spec-decode-lora.md, 4.1; 0.11.0 and 0.33.0 ``lora/layers/``):

- Every linear module gets, per slot and per output slice, an A of ``rank x in`` and a B of ``out_slice x rank``
  (``BaseLinearLayerWithLoRA.create_lora_weights``; packed modules: ``qkv_proj`` 3 slices,
  ``gate_up_proj`` 2, ``MergedQKVParallelLinearWithLoRA``, ``MergedColumnParallelLinearWithLoRA``). A
  column-parallel module's ``in`` is whole and its outputs are split over TP; a row-parallel module's (``o_proj``,
  ``down_proj``) ``in`` is split and its output whole.
- The embedding and the LM head are LoRA modules too unless the targets leave them out
  (``VocabParallelEmbeddingWithLoRA``: A ``vocab x rank``, B ``hidden x rank``, the whole vocabulary on every rank;
  ``LogitsProcessorWithLoRA``: A ``rank x hidden``, B ``vocab x rank``). Before 0.12.0 both carry 256 extra vocabulary
  rows a slot (``lora_extra_vocab_size``), and the base embedding and LM head grow with them
  (``VLLMRules.lora_extra_vocab``).
- The buffers are allocated in the load profiler (``load_lora_model``): they are in "Model loading took", beside the
  weights, in the model dtype.

SGLang (4.2; 0.5.10 ``lora/mem_pool.py::LoRAMemoryPool.init_buffers``): the same shapes, stacked by module, for
``max_loras_per_batch`` slots and only the modules targeted; allocated before the KV pool.

Counted for decoder layers of softmax attention (MHA, GQA, MQA) with a dense MLP; MLA, linear-attention and MoE
layers are refused rather than counted wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.core.spec import AttentionLayer, LayerKind, ModelSpec
from kvplan.errors import InputError

LINEAR_MODULES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
EMBEDDING_MODULES = ("embed_tokens", "lm_head")
# the names adapters target, as PEFT writes them, mapped to the engines' packed modules
_ALIASES = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
            "up_proj": "gate_up_proj"}
EXTRA_VOCAB = 256  # vLLM before 0.12.0: lora_extra_vocab_size's default (config/lora.py)


@dataclass(frozen=True, kw_only=True)
class LoRASettings:
    max_loras: int  # slots on the GPU (vLLM --max-loras, SGLang --max-loras-per-batch)
    max_rank: int
    targets: frozenset[str] | None = None  # engine module names; None: every module the engine supports

    def __post_init__(self) -> None:
        if self.max_loras < 1 or self.max_rank < 1:
            raise InputError(f"LoRA needs at least 1 slot of rank 1 or more (got {self.max_loras} of rank "
                             f"{self.max_rank})")


def targets(names: list[str] | None) -> frozenset[str] | None:
    """--lora-target-modules as the engines read them: PEFT's q/k/v and gate/up names packed, ``all-linear`` the
    four linear modules; None: every supported module."""
    if not names:
        return None
    out = set()
    for name in names:
        if name in ("all", "all-linear"):
            out |= set(LINEAR_MODULES) | (set(EMBEDDING_MODULES) if name == "all" else set())
            continue
        mod = _ALIASES.get(name, name)
        if mod not in LINEAR_MODULES + EMBEDDING_MODULES:
            raise InputError(f"--lora-target-modules: {name!r} is not a module kvplan counts (the linear "
                             f"{', '.join(LINEAR_MODULES)}, their PEFT names q/k/v/o/gate/up/down_proj, "
                             f"{', '.join(EMBEDDING_MODULES)}, all-linear or all)")
        out.add(mod)
    return frozenset(out)


@dataclass(frozen=True, kw_only=True)
class LoRABytes:
    buffers: int  # the adapters' slots on the binding GPU
    base_growth: int  # the base embedding and LM head's extra vocabulary rows (vLLM before 0.12.0)


def lora_bytes(spec: ModelSpec, lora: LoRASettings, *, tp: int, dtype_bytes: int, extra_vocab: bool = False,
               first_stage: bool = True, last_stage: bool = True, layers: range | None = None) -> LoRABytes:
    """Bytes of the LoRA slots one GPU of a stage holding ``layers`` allocates (module docstring)."""
    arch = spec.arch
    if arch is None:
        raise InputError(f"{spec.name}: the config does not say enough to size LoRA buffers (vocab_size missing)")
    if arch.moe is not None:
        raise InputError(f"{spec.name}: LoRA on routed experts is not counted yet; plan without --enable-lora")
    wanted = lora.targets if lora.targets is not None else frozenset(LINEAR_MODULES + EMBEDDING_MODULES)
    n, r, h = lora.max_loras, lora.max_rank, arch.hidden_size
    heads = spec.num_attention_heads
    elems = 0
    for i in layers if layers is not None else range(spec.num_layers):
        layer = spec.layers[i]
        if not isinstance(layer, AttentionLayer) or layer.kind not in (LayerKind.FULL, LayerKind.SLIDING,
                                                                       LayerKind.CHUNKED):
            raise InputError(f"{spec.name}: LoRA buffers are counted for softmax-attention layers; layer {i} is "
                             f"{layer.kind.value}")
        q = heads * (arch.q_head_dim or layer.k_head_dim)
        kv_ranks = max(1, layer.num_kv_heads // tp) if layer.num_kv_heads >= tp else 1  # KV heads replicated
        k, v = kv_ranks * layer.k_head_dim, kv_ranks * layer.v_head_dim
        inter = arch.layer_intermediate[i] if arch.layer_intermediate else arch.intermediate_size
        modules = {
            "qkv_proj": (3 * h, q // tp + k + v),  # column-parallel: in whole, each slice's out split
            "o_proj": (heads * layer.v_head_dim // tp, h),  # row-parallel: in split, out whole
            "gate_up_proj": ((2 if arch.gated_mlp else 1) * h, (2 if arch.gated_mlp else 1) * (inter // tp)),
            "down_proj": (inter // tp, h),
        }
        for name, (a_in, b_out) in modules.items():
            if name in wanted:
                elems += n * r * (a_in + b_out)
    extra = EXTRA_VOCAB if extra_vocab else 0
    growth = 0
    vocab = arch.vocab_size
    if "embed_tokens" in wanted and first_stage:
        elems += n * r * (vocab + extra) + n * h * r + n * extra * h
        growth += extra * n * h // tp if extra else 0
    if "lm_head" in wanted and last_stage:
        padded = -(-(vocab + extra) // 256) * 256 if extra else vocab
        elems += n * r * h + n * padded * r + n * extra * h
        growth += (padded - vocab) * h // tp if extra else 0
    return LoRABytes(buffers=elems * dtype_bytes, base_growth=growth * dtype_bytes)
