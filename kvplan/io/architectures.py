"""Which ``model_type`` values kvplan models, and which it refuses rather than size wrong.

A config is read by a family module (``kvplan.io.families``) or by the generic reader in ``kvplan.io.hf_config``.
The generic reader is right only for architectures whose every layer is plain decoder attention (full, sliding,
chunked, MLA) or one of the linear mixers it knows, so it reads only the model types below, each checked byte for
byte against transformers' own cache: tests/validate/test_hf_architectures.py builds every decoder architecture
the installed transformers knows from its own config class (at the class defaults, and at a released checkpoint's
values where the defaults cannot run or leave a feature off) and compares.

- ``GENERIC``: read by the generic reader, checked.
- ``NOT_MODELED``: known to transformers, not modelled by kvplan: refused with the reason (``UnmodeledError``), so
  that no engine answers with bytes kvplan cannot stand behind; ``--engine hf`` measures transformers' own cache
  for the config on the meta device instead (kvplan.validate.meta).
- Anything else (a type newer than this list, or remote code): read by the generic reader when the config holds
  nothing it does not understand, with a note saying it is unchecked.
"""

from __future__ import annotations

GENERIC: frozenset[str] = frozenset({
    "afmoe", "apertus", "apertus1p5_text", "arcee", "aria_text", "axk1", "beam", "bitnet", "bloom", "codegen",
    "cohere", "cohere2", "cohere2_moe", "ctrl", "cwm", "deepseek_v2", "dots1", "deepseek_v3", "diffllama", "doge", "emu3",
    "ernie4_5", "ernie4_5_moe", "exaone", "exaone4", "exaone_moe", "falcon", "flex_olmo", "flint", "fuyu", "gemma",
    "gemma2", "gemma3", "gemma3_text", "git", "glm", "glm4", "glm4_moe_lite", "got_ocr2", "gpt-sw3", "gpt2",
    "gpt_bigcode", "gpt_neo", "gpt_neox", "gpt_neox_japanese", "gpt_oss", "gptj", "granite", "granite_swa",
    "granitemoe", "granitemoe_swa", "granitemoeshared", "helium", "hrm_text", "hy_v3", "hyperclovax", "internlm3",
    "iquestcoder", "jais2", "jamba", "kolibri1", "laguna", "lara_mini", "llama", "llama4", "llama4_text", "mellum",
    "minicpm3", "minimax_m3_vl_text", "ministral3", "mistral", "mixtral", "modernbert-decoder",
    "moss_transcribe_diarize", "mpt", "nanochat", "nemotron", "olmo", "olmo2", "olmo_hybrid", "olmoe", "opt", "persimmon",
    "phi", "phi3", "phi4_multimodal", "phimoe", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next",
    "sarvam_mla", "sarvam_moe", "smollm3", "solar_open", "stablelm", "starcoder2", "vaultgemma", "xglm", "youtu",
})

_ENCODER_DECODER = ("an encoder-decoder model: its decoder also caches the encoder's keys and values for "
                    "cross-attention, and kvplan sizes decoder-only models")
_ENCODER = ("an encoder (BERT-style) model: it keeps a cache only when configured as a decoder, and kvplan sizes "
            "decoder-only LLMs")
_RECURRENT = "a recurrent / state-space model whose per-sequence state kvplan does not model"
_UNCHECKED = ("its layers differ from plain decoder attention in ways kvplan's readers do not model (the generic "
              "reading differs from transformers' own cache)")

NOT_MODELED: dict[str, str] = {
    **dict.fromkeys(("bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "mvp",
                     "pegasus", "plbart", "prophetnet", "xlm-prophetnet", "trocr", "whisper", "musicgen",
                     "musicgen_melody", "t5", "mt5", "umt5"), _ENCODER_DECODER),
    **dict.fromkeys(("bert", "bert-generation", "big_bird", "camembert", "data2vec-text", "electra", "ernie",
                     "megatron-bert", "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer",
                     "xlm-roberta", "xlm-roberta-xl", "xmod", "xlm", "xlnet", "reformer"), _ENCODER),
    **dict.fromkeys(("mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm", "recurrent_gemma"), _RECURRENT),
    "mllama": ("Llama 3.2 Vision: its cross-attention layers cache the image's keys and values, not the text's, "
               "and kvplan does not model them"),
    "openai-gpt": "GPT-1 keeps no KV cache in transformers",
    "ministral": ("transformers' ministral class cannot run at its own defaults and no released checkpoint uses it "
                  "(Ministral-8B's config.json says mistral, which kvplan reads), so kvplan has not checked it"),
    "jetmoe": ("JetMoE's mixture of attention heads has not been checked: transformers' forward cannot run it "
               "without weights"),
    "lfm2_moe": ("LFM2-MoE's weights are not modelled (its conv and attention layers are LFM2's; `--engine hf` "
                 "measures them)"),
    "zamba": "Zamba's shared attention blocks beside its Mamba layers are not modelled",
    "zamba2": "Zamba2's shared attention blocks beside its Mamba-2 layers are not modelled",
    "moshi": "a speech model with a depth decoder kvplan does not model",
    **dict.fromkeys(("bailing_hybrid", "dots3_note", "dots3_note_text", "hy_v4", "mimo_v2_flash", "axk2", "dory",
                     "gemma4_unified", "gemma4_unified_text", "gemma4_unified_assistant", "gemma4_assistant",
                     "inkling_text", "inkling2_text", "inkling2_loop_text", "lfm3", "zaya", "qwen4_exp",
                     "qwen4_exp_text", "cpmant", "biogpt", "blt", "cohere_compass_text", "dbrx"), _UNCHECKED),
}


def not_modeled_reason(model_type: str) -> str | None:
    """Why kvplan refuses ``model_type``, or None when it reads it."""
    return NOT_MODELED.get(model_type)


def is_checked(model_type: str, family_types: frozenset[str]) -> bool:
    """Whether kvplan's readers are checked for ``model_type`` (the generic reader's list or a family module)."""
    return model_type in GENERIC or model_type in family_types
