"""kvplan.core.lora: LoRA slots as vLLM and SGLang allocate them. The hand-worked example is
docs/research/spec-decode-lora.md 4.3 (Llama-3.1-8B, 4 slots of rank 16, bf16), each shape cited there to the
engines' lora/layers and lora/mem_pool.py."""

from __future__ import annotations

import pytest

from kvplan.core.lora import LoRASettings, lora_bytes, targets
from kvplan.errors import InputError
from kvplan.io.models import load_model

LLAMA = load_model("llama3.1-8b")
FOUR = LoRASettings(max_loras=4, max_rank=16)


def _bytes(modules: list[str], **kw) -> int:
    return lora_bytes(LLAMA, LoRASettings(max_loras=4, max_rank=16, targets=targets(modules)), dtype_bytes=2,
                      **{"tp": 1, **kw}).buffers


@pytest.mark.parametrize("module, per_layer", [
    ("qkv_proj", 2_359_296),  # A 3 x 4 x 16 x 4096, B 4 x 16 x (4096 + 1024 + 1024)
    ("o_proj", 1_048_576),
    ("gate_up_proj", 4_718_592),
    ("down_proj", 2_359_296),
])
def test_each_linear_modules_slots(module, per_layer):
    assert _bytes([module]) == 32 * per_layer


def test_the_seven_projections_are_320_mib_and_peft_names_pack():
    every_linear = _bytes(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    assert every_linear == _bytes(["all-linear"]) == 335_544_320


def test_vllm_012_adds_the_embedding_and_lm_head():
    both = lora_bytes(LLAMA, FOUR, tp=1, dtype_bytes=2)
    assert both.buffers == 369_426_432 and both.base_growth == 0  # 335,544,320 + 2 x 16,941,056


def test_before_012_the_extra_vocabulary():
    old = lora_bytes(LLAMA, FOUR, tp=1, dtype_bytes=2, extra_vocab=True)
    assert old.buffers == 335_544_320 + 2 * 25_362_432
    assert old.base_growth == 1024 * 4096 * 2 + 256 * 4096 * 2  # embed_tokens + 256 x 4 rows, lm_head + 256


def test_tensor_parallel_splits_each_modules_split_side():
    assert _bytes(["all-linear"], tp=2) == 226_492_416  # 216 MiB a GPU
    # the embedding's slots keep the whole vocabulary on every rank
    assert _bytes(["embed_tokens"], tp=2) == _bytes(["embed_tokens"]) == 16_941_056


def test_a_pipeline_stage_holds_its_layers_and_its_end():
    first = lora_bytes(LLAMA, FOUR, tp=1, dtype_bytes=2, layers=range(0, 16), last_stage=False).buffers
    last = lora_bytes(LLAMA, FOUR, tp=1, dtype_bytes=2, layers=range(16, 32), first_stage=False).buffers
    assert first == last == 16 * 10_485_760 + 16_941_056 and first + last == 369_426_432


@pytest.mark.parametrize("model, match", [("qwen3-30b-a3b", "routed experts"), ("deepseek-v2-lite", "routed experts"),
                                          ("qwen3-next-80b-a3b", "routed experts")])
def test_what_is_not_counted_is_refused(model, match):
    with pytest.raises(InputError, match=match):
        lora_bytes(load_model(model), FOUR, tp=1, dtype_bytes=2)


def test_bad_settings_are_refused():
    with pytest.raises(InputError, match="at least 1 slot"):
        LoRASettings(max_loras=0, max_rank=16)
    with pytest.raises(InputError, match="not a module kvplan counts"):
        targets(["mlp"])
