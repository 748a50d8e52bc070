"""kvplan.core.spec_decode: the layers and weights vLLM's speculative drafter adds (docs/research/spec-decode-lora.md,
section 1 and 3, each rule cited there to the release it was read in)."""

from __future__ import annotations

import dataclasses

import pytest

from kvplan.core.spec import LayerKind
from kvplan.core.spec_decode import MTP_ALIASES, drafter, mtp_layer_count
from kvplan.errors import InputError
from kvplan.io.models import load_model


@pytest.mark.parametrize("model, layers", [
    ("deepseek-v3", 1),  # num_nextn_predict_layers: 1
    ("glm4.7", 1),
    ("qwen3-next-80b-a3b", 1),  # vLLM's qwen3_next_mtp.py: getattr(config, "num_nextn_predict_layers", 1)
    ("qwen3.5-27b", 1),  # the bundled config dropped mtp_num_hidden_layers 1 (its notes say so)
    ("llama3-8b", 0),  # no MTP layers
])
def test_the_checkpoints_mtp_layers(model, layers):
    assert mtp_layer_count(load_model(model)) == layers


def test_an_mtp_layer_is_a_copy_of_the_last_full_attention_layer():
    spec = load_model("qwen3-next-80b-a3b")  # 36 linear + 12 full attention layers
    d = drafter(spec, "qwen3_next_mtp", 2)
    last_full = max(i for i, x in enumerate(spec.layers) if x.kind is LayerKind.FULL)
    assert d.method == "mtp" and d.layers == (spec.layers[last_full],) and d.repeat_layers == (last_full,)
    # fc (2h -> h), a ColumnParallelLinear split over TP, and three norms held whole by every rank
    assert d.extra_split_params == 2 * spec.hidden_size ** 2 and d.extra_whole_params == 3 * spec.hidden_size
    ds = load_model("deepseek-v3")  # DeepSeek's eh_proj is a plain nn.Linear: whole on every rank
    assert drafter(ds, "mtp", 1).extra_whole_params == 2 * ds.hidden_size ** 2 + 3 * ds.hidden_size
    assert not d.own_head and "mtp, 2 tokens" in d.note


def test_every_old_mtp_name_is_mtp():
    spec = load_model("deepseek-v3")
    assert {drafter(spec, name, 1).layers for name in MTP_ALIASES} == {(spec.layers[-1],)}
    assert spec.layers[-1].kind is LayerKind.MLA


@pytest.mark.parametrize("method", ["ngram", "ngram_gpu", "suffix"])
def test_methods_without_a_draft_model_add_nothing(method):
    d = drafter(load_model("llama3-8b"), method, 4)
    assert d.layers == () and d.repeat_layers == () and d.extra_whole_params == 0


@pytest.mark.parametrize("model, method, k, match", [
    ("llama3-8b", "mtp", 1, "has no MTP layers"),
    ("deepseek-v3", "mtp", 0, "at least 1"),
    ("deepseek-v3", "eagle3", 3, "needs its head's config"),
    ("deepseek-v3", "draft_model", 3, "not modelled yet"),
])
def test_what_vllm_would_refuse_or_kvplan_does_not_count_is_refused(model, method, k, match):
    with pytest.raises(InputError, match=match):
        drafter(load_model(model), method, k)


def test_speculative_tokens_are_a_multiple_of_the_mtp_layers():
    spec = load_model("deepseek-v3")
    two = dataclasses.replace(spec, raw_config={**spec.raw_config, "num_nextn_predict_layers": 2})
    assert drafter(two, "mtp", 4).layers == (spec.layers[-1],) * 2  # reused: the layers do not grow with k
    with pytest.raises(InputError, match="must be a multiple of"):
        drafter(two, "mtp", 3)


HEAD = load_model(str(__import__("pathlib").Path(__file__).parents[1] / "fixtures" / "configs"
                      / "eagle3-head-llama3.1-8b.json"))  # an EAGLE-3 head of Llama-3.1-8B's shape: 1 layer,
# 8 KV heads of 128, draft_vocab_size 32,000 (docs/research/spec-decode-lora.md 1.6; llama_eagle3.py)


def test_an_eagle3_heads_layer_and_weights():
    from kvplan.core.spec_decode import head_drafter

    target = load_model("llama3.1-8b")
    d = head_drafter(target, "eagle3", 3, HEAD)
    assert d.layers == HEAD.layers and d.layers[0].num_kv_heads == 8 and d.repeat_layers == ()
    h, inter = 4096, 14336
    layer = h * (4096 + 1024 + 1024) + 4096 * h + 3 * h * inter  # q, k, v, o and the MLP
    qkv_inputs = h * (4096 + 1024 + 1024)  # layer 0 takes [embedding, hidden]: h more inputs to q, k and v
    assert d.extra_split_params == layer + qkv_inputs + 32_000 * h  # and its own LM head of the draft vocabulary
    # the layer's two norms and its hidden_norm, the final norm, fc (3h -> h: no target_hidden_size, its own h)
    assert d.extra_whole_params == 2 * h + h + h + 3 * h * h
    assert d.extra_bytes == 8 * 32_000  # draft_id_to_target_id, int64


def test_an_eagle_head_takes_the_targets_lm_head_and_a_2h_fc():
    from kvplan.core.spec_decode import head_drafter

    d = head_drafter(load_model("llama3.1-8b"), "eagle", 2, HEAD)
    h, inter = 4096, 14336
    assert d.extra_split_params == h * (4096 + 1024 + 1024) + 4096 * h + 3 * h * inter
    assert d.extra_whole_params == h + 2 * h * h and d.extra_bytes == 0  # no input norm on layer 0, no final norm


def test_eagle_without_its_heads_config_is_refused():
    with pytest.raises(InputError, match='needs its head\'s config: give "model"'):
        drafter(load_model("llama3.1-8b"), "eagle3", 3)


def test_with_pipeline_stages_the_head_builds_its_own_embedding():
    from kvplan.core.spec_decode import head_drafter

    target = load_model("llama3.1-8b")
    one, two = (head_drafter(target, "eagle3", 3, HEAD, pp=pp) for pp in (1, 2))
    assert two.extra_split_params - one.extra_split_params == 128_256 * 4096


@pytest.mark.parametrize("target, head, match", [
    ("llama3.1-70b", None, "is not llama3.1-70b's 8192"),  # the 8B head (4096 wide) on a 70B target
    ("llama3.1-8b", "deepseek-v3", "Llama-shaped EAGLE heads"),
])
def test_heads_kvplan_cannot_count_are_refused(target, head, match):
    from kvplan.core.spec_decode import head_drafter

    with pytest.raises(InputError, match=match):
        head_drafter(load_model(target), "eagle3", 3, HEAD if head is None else load_model(head))
