"""Weights of compressed-tensors, ModelOpt and fbgemm_fp8 checkpoints, counted by hand on a tiny Llama.

The tiny model (bf16): hidden 64, intermediate 128, 2 layers, 4 query heads / 2 KV heads of 16, vocab 100, untied.
Per layer: attention q 64x64 + k 64x32 + v 64x32 + o 64x64 = 12,288; MLP 3 x 64 x 128 = 24,576; 2 norms x 64.
Linear parameters: 2 x (12,288 + 24,576) = 73,728. Kept in bf16: norms 2 x 128 + final 64, embeddings and LM head
2 x 100 x 64 = 12,800: 13,120 parameters = 26,240 bytes.
"""

from __future__ import annotations

import pytest

from kvplan.core.capacity.common import FitRequest, model_weights
from kvplan.core.gpus import GPUSpec
from kvplan.io.hf_config import spec_from_hf_config
from kvplan.io.models import load_model

KEPT = 26_240
TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def ct(weights: dict, *, ignore=("lm_head",), targets=("Linear",), act: dict | None = None) -> dict:
    group = {"targets": list(targets), "weights": weights, "input_activations": act}
    return {"quant_method": "compressed-tensors", "config_groups": {"group_0": group}, "ignore": list(ignore)}


W8A8_ACT = {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True, "symmetric": True}
FP8_CHANNEL = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}


def weights(quant: dict | None, tp: int = 1) -> tuple[int, list[str]]:
    spec = spec_from_hf_config({**TINY, **({"quantization_config": quant} if quant else {})}, name="tiny",
                               origin="test")
    w, notes = model_weights(FitRequest(spec=spec, gpu=GPUSpec(name="x", memory_bytes=1 << 40), tp=tp))
    return w.per_gpu_bytes, notes


def test_tiny_model_in_bf16():
    assert weights(None)[0] == 2 * 73_728 + KEPT  # 173,696


@pytest.mark.parametrize("quant,expected", [
    # fp8 per channel (CompressedTensorsW8A8Fp8): 73,728 bytes + fp32 scales, one per 64 (hidden_size) values:
    # 1,152 x 4 = 4,608
    (ct(FP8_CHANNEL), 73_728 + 4_608 + KEPT),
    # int8 per channel with int8 activations (CompressedTensorsW8A8Int8): the same layout, int8 for fp8
    (ct({**FP8_CHANNEL, "type": "int"}, act=W8A8_ACT), 73_728 + 4_608 + KEPT),
    # fp8 per tensor: one fp32 per module, not counted
    (ct({**FP8_CHANNEL, "strategy": "tensor"}), 73_728 + KEPT),
    # fp8 blocks of 128 x 128: ceil(73,728 / 16,384) = 5 fp32 scales
    (ct({**FP8_CHANNEL, "strategy": "block", "block_structure": [128, 128]}), 73_728 + 20 + KEPT),
    # W4A16 group 128, asymmetric (CompressedTensorsWNA16): 36,864 bytes of int4, 576 groups x (bf16 scale + 4-bit
    # zero point) = 576 x 20 bits = 1,440 bytes
    (ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": False}),
     36_864 + 1_440 + KEPT),
    # the same, symmetric: no zero points, 576 x 2 = 1,152 bytes of scales
    (ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}),
     36_864 + 1_152 + KEPT),
    # NVFP4 (CompressedTensorsW4A4Fp4): 36,864 bytes of E2M1, one fp8 scale per 16 values: 4,608 bytes
    (ct({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}), 36_864 + 4_608 + KEPT),
    # ModelOpt FP8 (per tensor) and NVFP4, fbgemm fp8 per channel
    ({"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["lm_head"]}, 73_728 + KEPT),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}, 36_864 + 4_608 + KEPT),
    ({"quantization": {"quant_algo": "NVFP4", "exclude_modules": ["lm_head"]}, "quant_method": "modelopt"},
     36_864 + 4_608 + KEPT),
    ({"quant_method": "fbgemm_fp8", "modules_to_not_convert": ["lm_head"]}, 73_728 + 4_608 + KEPT),
])
def test_hand_worked_weight_bytes(quant, expected):
    assert weights(quant)[0] == expected


def test_tensor_parallel_splits_the_quantized_linears():
    # tp 2, fp8 per channel: 36,864 Linear parameters -> 36,864 + 576 x 4 bytes; embeddings and LM head split
    # (3,200 parameters each, 12,800 bytes), norms whole (320 parameters, 640 bytes)
    assert weights(ct(FP8_CHANNEL), tp=2)[0] == 36_864 + 2_304 + 12_800 + 640


@pytest.mark.parametrize("quant", [
    ct(FP8_CHANNEL, ignore=["lm_head", "re:.*self_attn.*"]),  # compressed-tensors: re.match after "re:"
    ct(FP8_CHANNEL, targets=["re:.*mlp.*"]),  # targets only the MLP: attention is left out the same way
    {"quant_method": "modelopt", "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN", "exclude_modules": ["*self_attn*"]},
    {"quant_method": "fbgemm_fp8", "modules_to_not_convert": [
        f"model.layers.{i}.self_attn.{p}_proj" for i in (0, 1) for p in "qkvo"]},
])
def test_modules_left_out_stay_in_the_model_dtype(quant):
    # attention (24,576 parameters) in bf16: 49,152 bytes; MLP 49,152 fp8 + 768 fp32 scales = 52,224 bytes
    assert weights(quant)[0] == 49_152 + 52_224 + KEPT


def test_a_part_is_left_out_only_when_all_its_modules_are():
    # layer 0's MLP entirely: its 24,576 parameters in bf16 (49,152 bytes), the other 49,152 quantized (52,224)
    whole = ct(FP8_CHANNEL, ignore=[f"model.layers.0.mlp.{p}_proj" for p in ("gate", "up", "down")])
    assert weights(whole)[0] == 49_152 + 52_224 + KEPT
    # one of its three modules: still counted quantized (vLLM fuses gate/up; a stray module is rare)
    assert weights(ct(FP8_CHANNEL, ignore=["model.layers.0.mlp.down_proj"]))[0] == 73_728 + 4_608 + KEPT


def test_notes_name_the_scheme_and_unknown_methods_stay_in_the_model_dtype():
    _, notes = weights(ct(FP8_CHANNEL))
    assert any("compressed-tensors float8 channel" in n for n in notes)
    assert weights({"quant_method": "bitsandbytes", "load_in_4bit": True})[0] == 2 * 73_728 + KEPT
    assert weights({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"})[0] == 2 * 73_728 + KEPT


@pytest.mark.parametrize("quantized,base,tp,ratio", [
    # Linear layers 1 byte (+0.2% scales) instead of 2; embeddings and LM head (1.09B of 7.62B parameters) stay bf16:
    # (6.53 + 2 x 1.09) / (2 x 7.62) = 0.571
    ("qwen2.5-7b-w8a8", "qwen2.5-7b-instruct", 1, 0.571),
    # 68.45B Linear parameters of 70.55B: (68.45 + 2 x 2.10) / (2 x 70.55) = 0.515
    ("llama3.3-70b-w8a8", "llama3.1-70b", 2, 0.515),
])
def test_fit_counts_a_bundled_w8a8_checkpoint_at_its_ratio_to_bf16(quantized, base, tp, ratio):
    gpu = GPUSpec(name="x", memory_bytes=1 << 40)
    q, notes = model_weights(FitRequest(spec=load_model(quantized), gpu=gpu, tp=tp))
    b, _ = model_weights(FitRequest(spec=load_model(base), gpu=gpu, tp=tp))
    assert q.per_gpu_bytes / b.per_gpu_bytes == pytest.approx(ratio, abs=0.003)
    assert q.format == "int8 channel" and b.format == "bf16"


# RedHatAI checkpoints as the llm-d-planner sweep started them (vLLM 0.19.0, H100-80GB; the logs are in
# /work/shared/vllm-logs/llm-d-planner-v0.19.0/): the name its non-default args give, tp, and "Model loading took
# X GiB" of rank 0. The two 8B starts ran with --dtype float16, which keeps the unquantized parts at bf16's width.
# kvplan counts 0.03 GiB less than every log here (0.05 for the GPTQ start), as it does for the bf16 bases.
REDHAT_STARTS = [
    # w8a8-redhatai-llam--h100-80gb--tp1pp1dp1--8192-dtf16.log: "Model loading took 8.49 GiB"
    ("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8", "llama3.1-8b-w8a8", 1, 8.49, "int8 channel"),
    # w4a16-redhatai-lla--h100-80gb--tp1pp1dp1--8192-dtf16.log: "Model loading took 5.38 GiB" (gptq_marlin)
    ("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16", "llama3.1-8b-w4a16", 1, 5.38, "int4-g128"),
    # fp8dyn-llama-3-3-70b--h100-80gb--tp2pp1dp1--8192.log: "Model loading took 33.88 GiB"
    ("RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic", "llama3.3-70b-fp8dyn", 2, 33.88, "float8 channel"),
    # fp8dyn-llama-3-3-70b--h100-80gb--tp4pp1dp1--8192.log: "Model loading took 16.96 GiB"
    ("RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic", "llama3.3-70b-fp8dyn", 4, 16.96, "float8 channel"),
    # fp8dyn-redhatai-qwen2-5---h100-80gb--tp1pp1dp1--8192.log: "Model loading took 8.14 GiB"
    ("RedHatAI/Qwen2.5-7B-Instruct-fp8-dynamic", "qwen2.5-7b-fp8dyn", 1, 8.14, "float8 channel"),
]


@pytest.mark.parametrize("name,bundled,tp,logged_gib,fmt", REDHAT_STARTS,
                         ids=[f"{s[1]}-tp{s[2]}" for s in REDHAT_STARTS])
def test_a_bundled_redhat_checkpoint_weighs_what_its_vllm_start_loaded(name, bundled, tp, logged_gib, fmt):
    spec = load_model(name)
    assert spec.name == bundled
    w, _ = model_weights(FitRequest(spec=spec, gpu=GPUSpec(name="x", memory_bytes=1 << 40), tp=tp))
    assert w.format == fmt
    assert abs(w.per_gpu_bytes / 2**30 - logged_gib) <= 0.05, w.per_gpu_bytes / 2**30


@pytest.mark.parametrize("name", ["neuralmagic/Meta-Llama-3.1-8B-Instruct-quantized.w8a8",
                                  "neuralmagic/Meta-Llama-3.1-8B-Instruct-quantized.w4a16",
                                  "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic",
                                  "neuralmagic/Qwen2.5-7B-Instruct-FP8-dynamic"])
def test_the_hub_spellings_of_a_redhat_checkpoint_resolve_to_its_quantized_config(name):
    assert load_model(name).raw_config["quantization_config"]["quant_method"] in ("compressed-tensors", "gptq")


@pytest.mark.parametrize("quant,field", [
    ({"quant_method": "compressed-tensors", "config_groups": [{"weights": FP8_CHANNEL}]}, "config_groups"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": "fp8"}}}, "weights"),
    (ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": float("nan")}), "group_size"),
    (ct({"num_bits": 4, "type": "int", "strategy": "group"}), "group_size"),
    (ct({**FP8_CHANNEL, "strategy": "block", "block_structure": [128]}), "block_structure"),
    (ct(FP8_CHANNEL, ignore=("re:(unclosed",)), "ignore"),
    (ct({**FP8_CHANNEL, "num_bits": True}), "num_bits"),
])
def test_a_malformed_quantization_config_is_refused_naming_the_field(quant, field):
    from kvplan.errors import ConfigError

    with pytest.raises(ConfigError, match=field):
        weights(quant)


def test_one_module_named_as_a_string_is_that_module_not_its_letters():
    # ModelOpt's exclude_modules "lm_head" as a string: a list of its letters would match every module by substring
    # (is_layer_excluded) and count the whole model in bf16
    as_list = {"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["lm_head"]}
    assert weights({**as_list, "exclude_modules": "lm_head"}) == weights(as_list)
    assert weights(as_list)[0] == 73_728 + KEPT  # fp8 per tensor, the LM head in the model dtype
