"""Speculative decoding's drafter: the attention layers it adds to the KV cache and the weights it loads.

vLLM (docs/research/spec-decode-lora.md, sections 1 and 3):

- The drafter's attention layers register in the same forward context as the target's, so each is an ordinary
  KV-cache layer of its own: the bytes per token grow by them (0.10.1.1 ``v1/spec_decode/eagle.py::
  EagleProposer.load_model``; 0.33.0 ``v1/spec_decode/llm_base_proposer.py::SpecDecodeBaseProposer.load_model``,
  ``v1/worker/gpu_model_runner.py::GPUModelRunner.get_kv_cache_spec``). They group with the target's layers of
  their type, so a hybrid model's groups are padded by vLLM's own rule (kvplan.core.engines.vllm.plan).
- ``mtp`` (``deepseek_mtp``, ``glm4_moe_mtp``, ``qwen3_next_mtp``, ... are its old names) builds the checkpoint's
  ``num_nextn_predict_layers`` MTP layers (Qwen 3.5: ``mtp_num_hidden_layers``; Qwen3-Next: 1 when the config does
  not say, ``qwen3_next_mtp.py``); a larger ``num_speculative_tokens`` reuses them (0.33.0
  ``config/speculative.py::SpeculativeConfig.__post_init__``). Each is a decoder layer of the target's shape with
  full attention (MLA for DeepSeek and GLM-5) plus ``eh_proj`` (2 x hidden -> hidden, a plain nn.Linear held whole
  by every rank) and three norms (``deepseek_mtp.py``). The embedding is the target's; the LM head is the
  target's from vLLM 0.16.0, before which DeepSeek's MTP layer loads its own ``shared_head.head``
  (VLLMRules.mtp_own_head).
- ``ngram``, ``ngram_gpu``, ``suffix`` add no layers and no weights on the GPU.

Pure: no I/O. The weights' bytes are counted by kvplan.core.weights (the layer) and here (the extras).
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass

from kvplan.core.spec import CompressedLayer, Layer, LayerKind, ModelSpec
from kvplan.errors import InputError

# vLLM's names of the MTP method by model, each now an alias of "mtp" (0.33.0 config/speculative.py, MTPModelTypes)
MTP_ALIASES = frozenset({"mtp", "deepseek_mtp", "glm4_moe_mtp", "qwen3_next_mtp", "mimo_mtp", "ernie_mtp",
                         "longcat_flash_mtp", "pangu_ultra_moe_mtp", "glm_ocr_mtp", "qwen3_5_mtp"})
NO_DRAFT_METHODS = frozenset({"ngram", "ngram_gpu", "suffix"})
# MTP layers a config leaves unsaid: vLLM reads getattr(config, "num_nextn_predict_layers", 1) for Qwen3-Next
# (qwen3_next_mtp.py); Qwen 3.5's published configs give mtp_num_hidden_layers 1 (kvplan's bundled notes)
_MTP_DEFAULT_ONE = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"})
_MTP_SPLIT_FC = _MTP_DEFAULT_ONE


@dataclass(frozen=True, kw_only=True)
class Drafter:
    """What a speculative method adds to a start: its KV layers and its weights beyond the decoder layers."""

    method: str  # vLLM's name: "mtp", "ngram", ...
    num_speculative_tokens: int
    layers: tuple[Layer, ...] = ()  # attention layers added to the KV cache (the last pipeline stage holds them)
    repeat_layers: tuple[int, ...] = ()  # target layers whose shape the drafter builds again (MTP)
    extra_whole_params: int = 0  # parameters every rank holds whole (DeepSeek's eh_proj, the norms)
    extra_split_params: int = 0  # parameters split over TP (Qwen3-Next's and Qwen 3.5's fc: a ColumnParallelLinear)
    own_head: bool = False  # an LM head of its own (vocab x hidden, split over TP as the target's)
    extra_bytes: int = 0  # held whole by every rank beside the parameters in the model dtype (EAGLE-3's d2t map)
    note: str = ""

    @property
    def kv_layers(self) -> int:
        return len(self.layers)


def _text(spec: ModelSpec) -> dict:
    raw = spec.raw_config
    return raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw


def mtp_layer_count(spec: ModelSpec) -> int:
    """The MTP layers the checkpoint has (0: none)."""
    text, raw = _text(spec), spec.raw_config
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        for cfg in (text, raw):
            if isinstance(cfg.get(key), int):
                return cfg[key]
    return 1 if (spec.model_type in _MTP_DEFAULT_ONE or text.get("model_type") in _MTP_DEFAULT_ONE) else 0


def drafter(spec: ModelSpec, method: str, num_speculative_tokens: int, *, mtp_own_head: bool = False) -> Drafter:
    """The drafter ``method`` builds for ``spec`` (vLLM's rules: module docstring)."""
    if num_speculative_tokens < 1:
        raise InputError(f"num_speculative_tokens must be at least 1 (got {num_speculative_tokens})")
    name = "mtp" if method in MTP_ALIASES else method
    if name in NO_DRAFT_METHODS:
        return Drafter(method=name, num_speculative_tokens=num_speculative_tokens,
                       note=f"speculative decoding ({name}): no draft model, no KV layers")
    if name in ("eagle", "eagle3"):
        raise InputError(f"speculative method {name} needs its head's config: give \"model\" (a bundled name, hub id "
                         "or config.json kvplan can read)")
    if name != "mtp":
        raise InputError(f"speculative method {method!r} is not modelled yet: kvplan counts mtp, eagle, eagle3 (with "
                         "the head's config), ngram, ngram_gpu and suffix")
    n = mtp_layer_count(spec)
    if n < 1:
        raise InputError(f"{spec.name} has no MTP layers (its config gives no num_nextn_predict_layers or "
                         "mtp_num_hidden_layers): speculate with method ngram, or a draft model")
    if num_speculative_tokens % n:
        raise InputError(f"num_speculative_tokens {num_speculative_tokens} must be a multiple of {spec.name}'s {n} MTP "
                         "layers (vLLM config/speculative.py: 'must be divisible by n_predict')")
    full = [i for i, layer in enumerate(spec.layers) if layer.kind in (LayerKind.FULL, LayerKind.MLA,
                                                                        LayerKind.COMPRESSED)]
    if not full:
        raise InputError(f"{spec.name} has no full-attention layer for an MTP layer to copy")
    last = full[-1]
    kv_layer = spec.layers[last]
    if isinstance(kv_layer, CompressedLayer):
        # DeepSeek-V4's MTP layer sits past num_hidden_layers, where vLLM reads compress_ratio 1: its sliding window
        # only (vllm/models/deepseek_v4/attention.py; one more window cache, as vLLM's own planning shows)
        kv_layer = dataclasses.replace(kv_layer, compress_ratio=0, overlap=False, indexer_head_dim=0, indexer_heads=0)
    hidden = spec.hidden_size
    # the projection of [embedding, hidden] (2h -> h) and three norms (h each): DeepSeek's eh_proj is a plain
    # nn.Linear, whole on every rank (deepseek_mtp.py); Qwen3-Next's and Qwen 3.5's fc a ColumnParallelLinear, split
    # over TP (vLLM 0.20.0 qwen3_next_mtp.py, qwen3_5_mtp.py)
    split_fc = spec.model_type in _MTP_SPLIT_FC or _text(spec).get("model_type") in _MTP_SPLIT_FC
    fc, norms = 2 * hidden * hidden, 3 * hidden
    layers = (kv_layer,) * n
    tokens = f"{num_speculative_tokens} token{'s' if num_speculative_tokens > 1 else ''}"
    return Drafter(method="mtp", num_speculative_tokens=num_speculative_tokens, layers=layers,
                   repeat_layers=(last,) * n, extra_whole_params=n * (norms + (0 if split_fc else fc)),
                   extra_split_params=n * fc if split_fc else 0, own_head=mtp_own_head,
                   note=(f"speculative decoding (mtp, {tokens}): {n} MTP layer{'s' if n > 1 else ''} in the KV cache "
                         "and the weights" + ("; its LM head its own (vLLM before 0.16.0)" if mtp_own_head else "")))


_LLAMA_HEADS = ("LlamaForCausalLM", "LlamaForCausalLMEagle", "LlamaForCausalLMEagle3", "EagleLlamaForCausalLM",
                "Eagle3LlamaForCausalLM")


def head_drafter(target: ModelSpec, method: str, num_speculative_tokens: int, head: ModelSpec, *,
                 pp: int = 1, engine: str = "vLLM") -> Drafter:
    """A Llama-shaped EAGLE or EAGLE-3 head (vLLM 0.20.0 model_executor/models/llama_eagle.py, llama_eagle3.py;
    v1/spec_decode/llm_base_proposer.py): its decoder layers are KV-cache layers beside the target's. Its weights:
    those layers (EAGLE's first without its input norm; EAGLE-3's each with a ``hidden_norm``, the first taking
    2 x hidden into q, k and v), ``fc`` (a ReplicatedLinear, whole on every rank: 2 x hidden into hidden for EAGLE;
    3 x ``target_hidden_size``, else 3 x its own hidden, for EAGLE-3 where ``use_aux_hidden_state``, with
    ``input_norm`` when ``norm_before_fc``), EAGLE-3's final norm, own LM head of ``draft_vocab_size`` rows and int64
    draft-to-target map. The embedding is the target's at pp 1, where vLLM shares it when the head ships none or an
    identical one (``_maybe_share_embeddings``); with pipeline stages the head builds its own (split over TP).
    EAGLE's LM head is the target's (it loads none). The rules are 0.20.0's (earlier releases share by shape)."""
    from kvplan.core.weights import count_params

    if num_speculative_tokens < 1:
        raise InputError(f"num_speculative_tokens must be at least 1 (got {num_speculative_tokens})")
    raw = head.raw_config
    arch = (raw.get("architectures") or ["?"])[0]
    if head.arch is None or not head.layers or head.model_type != "llama" or arch not in _LLAMA_HEADS:
        raise InputError(f"{head.name}: kvplan counts Llama-shaped EAGLE heads ({', '.join(_LLAMA_HEADS)}); "
                         f"{arch} ({head.model_type or '?'}) is not modelled")
    if head.arch.moe is not None or any(layer.kind is not LayerKind.FULL for layer in head.layers):
        raise InputError(f"{head.name}: an EAGLE head of other than full-attention dense layers is not modelled")
    if isinstance(raw.get("quantization_config"), dict):
        raise InputError(f"{head.name}: a quantized EAGLE head is not counted yet (vLLM quantizes it with its own "
                         "config); plan with an unquantized head")
    h = head.hidden_size
    if h != target.hidden_size:
        raise InputError(f"{head.name}'s hidden size {h} is not {target.name}'s {target.hidden_size}: {engine} shares "
                         "the target's embedding with the head and needs them equal")
    counts = count_params(head, head.arch)
    split = sum(counts.layers_split) + sum(counts.layers_experts)
    whole = sum(counts.layers_whole)
    extra = 0
    n = len(head.layers)
    if method == "eagle3":
        eagle_config = raw.get("eagle_config") if isinstance(raw.get("eagle_config"), dict) else {}
        if eagle_config.get("use_aux_hidden_state", True):
            fc_in = 3 * (raw.get("target_hidden_size") or h)
            whole += fc_in * h + (fc_in if raw.get("norm_before_fc") else 0)  # fc, input_norm
        whole += n * h + counts.final_norm  # each layer's hidden_norm, the final norm
        first = head.layers[0]
        heads = head.num_attention_heads
        split += h * (heads * (head.arch.q_head_dim or first.k_head_dim)
                      + first.num_kv_heads * (first.k_head_dim + first.v_head_dim))
        draft_vocab = raw.get("draft_vocab_size") or head.arch.vocab_size
        split += draft_vocab * h  # its own LM head
        extra = 8 * draft_vocab  # draft_id_to_target_id, int64
    else:
        whole += 2 * h * h - h  # fc; the first layer has no input norm, the model no final norm
    if pp > 1:  # vLLM shares the embedding only without pipeline stages
        split += head.arch.vocab_size * h
    return Drafter(method=method, num_speculative_tokens=num_speculative_tokens, layers=tuple(head.layers),
                   extra_split_params=split, extra_whole_params=whole, extra_bytes=extra,
                   note=(f"speculative decoding ({method}, {num_speculative_tokens} token"
                         f"{'s' if num_speculative_tokens > 1 else ''}): the {head.name} head's "
                         f"{n} layer{'s' if n > 1 else ''} in the KV cache and its weights (vLLM 0.20's rules); "
                         + ("its own embedding (pipeline stages)" if pp > 1 else
                            "the embedding counted as the target's (vLLM shares one the head does not ship or "
                            "ships identical)")))


# SGLang (docs/research/spec-decode-lora.md, section 2; 0.5.10 server_args.py and configs/model_config.py)
SGLANG_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
# Architectures whose EAGLE draft is the target's own MTP layers when no draft path is given
# (0.5.10 server_args.py::_handle_speculative_decoding); Qwen3-Next and Qwen 3.5 read their MTP head the same way
# (configs/model_config.py::_config_draft_model: num_nextn_predict_layers forced to 1)
_SGLANG_NEXTN_ARCHS = frozenset({"DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeForCausalLM",
                                 "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM", "Qwen3NextForCausalLM",
                                 "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
                                 "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"})
_ONE_MTP_LAYER = frozenset({"Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration",
                            "Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"})
# auto_choose_speculative_params (0.5.10): (num_steps, eagle_topk, num_draft_tokens) by architecture
_SGLANG_AUTO = {"LlamaForCausalLM": (5, 4, 8), "Grok1ForCausalLM": (5, 4, 8), "Grok1VForCausalLM": (5, 4, 8)}


@dataclass(frozen=True, kw_only=True)
class SGLangSpeculative:
    """--speculative-algorithm and its steps as SGLang runs them, with the draft it loads."""

    algorithm: str  # EAGLE (NEXTN resolves to it) or NGRAM
    num_steps: int
    topk: int
    num_draft_tokens: int
    drafter: Drafter

    @property
    def tokens_a_request(self) -> int:
        """Pool slots a running request takes beside its tokens, 0.4.6 to 0.5.6: steps x topk + draft tokens."""
        return self.num_steps * self.topk + self.num_draft_tokens


def sglang_drafter(spec: ModelSpec, algorithm: str, *, num_steps: int | None = None, topk: int | None = None,
                   num_draft_tokens: int | None = None, head: ModelSpec | None = None) -> SGLangSpeculative:
    """The draft SGLang loads for ``algorithm`` on ``spec`` (module docstring and research section 2); ``head``: the
    checkpoint --speculative-draft-model-path names (an EAGLE or EAGLE-3 head)."""
    algo = algorithm.upper()
    if algo not in SGLANG_ALGORITHMS:
        raise InputError(f"--speculative-algorithm {algorithm!r}: SGLang's are {', '.join(SGLANG_ALGORITHMS)}")
    arch = (spec.raw_config.get("architectures") or ["?"])[0]
    steps, k, drafts = _SGLANG_AUTO.get(arch, (3, 1, 4))
    given = {"--speculative-num-steps": num_steps, "--speculative-eagle-topk": topk,
             "--speculative-num-draft-tokens": num_draft_tokens}
    bad = [f"{flag} {v}" for flag, v in given.items() if v is not None and v < 1]
    if bad:
        raise InputError(f"{', '.join(bad)}: each must be at least 1")
    steps = steps if num_steps is None else num_steps
    k = k if topk is None else topk
    drafts = drafts if num_draft_tokens is None else num_draft_tokens
    if head is not None and algo not in ("EAGLE", "EAGLE3"):
        raise InputError(f"--speculative-draft-model-path goes with EAGLE or EAGLE3; {algorithm} takes none")
    if algo == "NGRAM":
        return SGLangSpeculative(algorithm="NGRAM", num_steps=steps, topk=k, num_draft_tokens=drafts,
                                 drafter=Drafter(method="NGRAM", num_speculative_tokens=drafts,
                                                 note="speculative decoding (NGRAM): no draft model, no KV pool"))
    if head is not None:  # EAGLE or EAGLE3
        head_arch = (head.raw_config.get("architectures") or ["?"])[0]
        named = "Eagle3" if "Eagle3" in head_arch else "Eagle" if "Eagle" in head_arch else None  # else either
        if named is not None and (named == "Eagle3") != (algo == "EAGLE3"):
            want = "an EAGLE-3 head (LlamaForCausalLMEagle3)" if algo == "EAGLE3" else "an EAGLE head"
            raise InputError(f"--speculative-algorithm {algo} loads {want}; {head.name} is {head_arch}: give the "
                             f"algorithm its head was trained for ({'EAGLE3' if 'Eagle3' in head_arch else 'EAGLE'})")
        # the head's decoder layers are the draft pool's layers; SGLang's EAGLE worker gives an EAGLE head the
        # target's embedding and LM head (speculative/eagle_worker.py::EAGLEWorker.__init__: set_embed_and_head),
        # an EAGLE-3 head the embedding and its own draft-vocabulary head (set_embed), as vLLM's do (head_drafter)
        d = head_drafter(spec, algo.lower(), drafts, head, engine="SGLang")
        note = (f"speculative decoding (SGLang {algo}: {steps} steps, topk {k}, {drafts} draft tokens): the "
                f"{head.name} head's {len(d.layers)} layer{'s' if len(d.layers) > 1 else ''} in a draft KV pool "
                "beside the target's, its weights out of the reserve")
        return SGLangSpeculative(algorithm="EAGLE", num_steps=steps, topk=k, num_draft_tokens=drafts,
                                 drafter=dataclasses.replace(d, method="EAGLE", num_speculative_tokens=drafts,
                                                             note=note))
    if algo in ("EAGLE3", "STANDALONE") or (algo == "EAGLE" and arch not in _SGLANG_NEXTN_ARCHS):
        raise InputError(f"--speculative-algorithm {algorithm}: give the draft's checkpoint with "
                         "--speculative-draft-model-path (an EAGLE or EAGLE-3 head); kvplan counts those, NEXTN "
                         "(and EAGLE from the model's own MTP layers: DeepSeek-V3/V3.2, GLM-4.5+, Qwen3-Next, "
                         "Qwen 3.5) and NGRAM; a STANDALONE draft model is not counted yet")
    n = 1 if arch in _ONE_MTP_LAYER else mtp_layer_count(spec)
    if n < 1:
        raise InputError(f"{spec.name} has no MTP layers for NEXTN (num_nextn_predict_layers)")
    base = drafter(spec, "mtp", n)
    note = (f"speculative decoding (SGLang EAGLE from the model's MTP layers: {steps} steps, topk {k}, {drafts} draft "
            f"tokens): a draft KV pool of {n} layer{'s' if n > 1 else ''} beside the target's")
    return SGLangSpeculative(algorithm="EAGLE", num_steps=steps, topk=k, num_draft_tokens=drafts,
                             drafter=Drafter(method="EAGLE", num_speculative_tokens=drafts, layers=base.layers,
                                             repeat_layers=base.repeat_layers,
                                             extra_whole_params=base.extra_whole_params,
                                             extra_split_params=base.extra_split_params, note=note))


def with_drafter(spec: ModelSpec, d: Drafter | None) -> ModelSpec:
    """The model's layers and the drafter's, for sizing the KV both hold a token (the drafter's after the model's)."""
    if d is None or not d.layers:
        return spec
    from dataclasses import replace

    return replace(spec, layers=spec.layers + d.layers)
