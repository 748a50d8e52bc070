"""Weights of compressed-tensors, ModelOpt, fbgemm_fp8, GPTQ, AWQ and bitsandbytes checkpoints, counted by hand on a
tiny Llama.

The tiny model (bf16): hidden 64, intermediate 128, 2 layers, 4 query heads / 2 KV heads of 16, vocab 100, untied.
Per layer: attention q 64x64 + k 64x32 + v 64x32 + o 64x64 = 12,288; MLP 3 x 64 x 128 = 24,576; 2 norms x 64.
Linear parameters: 2 x (12,288 + 24,576) = 73,728. Kept in bf16: norms 2 x 128 + final 64, embeddings and LM head
2 x 100 x 64 = 12,800: 13,120 parameters = 26,240 bytes; and the RoPE cos/sin cache, 4,096 positions x 16 rotary
dims = 131,072 bytes, whole on every GPU (kvplan.io.rope).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.core.capacity.common import FitRequest, model_weights
from kvplan.core.gpus import GPUSpec
from kvplan.io.hf_config import spec_from_hf_config
from kvplan.io.models import load_model

CONFIGS = Path(__file__).parent.parent / "fixtures" / "configs"
LOGS = Path(__file__).parent.parent / "fixtures" / "vllm_logs"

ROPE = 4096 * 16 * 2
KEPT = 26_240 + ROPE
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
    # (3,200 parameters each, 12,800 bytes), norms whole (320 parameters, 640 bytes), the RoPE cache whole
    assert weights(ct(FP8_CHANNEL), tp=2)[0] == 36_864 + 2_304 + 12_800 + 640 + ROPE


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
    assert weights({"quant_method": "hqq", "nbits": 4})[0] == 2 * 73_728 + KEPT
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
    ("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16", "llama3.1-8b-w4a16", 1, 5.38, "gptq int4 g128"),
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
    ({"quant_method": "gptq", "bits": 4, "group_size": "128"}, "group_size"),  # a string, not a number
    ({"quant_method": "awq", "bits": 4, "group_size": 0}, "group_size"),
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


def _vllm(version: str):
    from kvplan.core.engines.vllm.profiles import VLLM_PROFILES
    from kvplan.core.profiles import Version

    return next(p for p in VLLM_PROFILES if p.covers(Version.parse(version)))


def release_weights(quant: dict, version: str) -> int:
    spec = spec_from_hf_config({**TINY, "quantization_config": quant}, name="tiny", origin="test")
    req = FitRequest(spec=spec, gpu=GPUSpec(name="x", memory_bytes=1 << 40), engine="vllm", profile=_vllm(version))
    return model_weights(req)[0].per_gpu_bytes


@pytest.mark.parametrize("quant,expected", [
    # GPTQ 4-bit, group 128, sym (gptq_marlin: qzeros emptied after loading): 36,864 bytes + 576 bf16 scales
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}, 36_864 + 1_152 + KEPT),
    # asymmetric: a 4-bit zero point beside each scale, 576 x 20 bits = 1,440 bytes
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": False}, 36_864 + 1_440 + KEPT),
    # 8-bit, group -1: one scale per output channel, counted one per 64 (hidden_size) inputs: 1,152 x 2 bytes
    ({"quant_method": "gptq", "bits": 8, "group_size": -1, "sym": True}, 73_728 + 2_304 + KEPT),
    # AWQ 4-bit, group 128 with zero points (awq_marlin): as GPTQ asymmetric
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, 36_864 + 1_440 + KEPT),
    # AutoAWQ's older keys (w_bit, q_group_size) and the modules it leaves out: layer 0's MLP in bf16 (49,152 bytes
    # of its 24,576 parameters); the other 49,152 at 4 bits + 384 groups x 20 bits
    ({"quant_method": "awq", "w_bit": 4, "q_group_size": 128, "zero_point": True,
      "modules_to_not_convert": [f"model.layers.0.mlp.{p}_proj" for p in ("gate", "up", "down")]},
     24_576 + 960 + 24_576 * 2 + KEPT),
    # bitsandbytes 8-bit: int8 and an fp32 scale per output row (counted one per 64 inputs): 73,728 + 4,608
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, 73_728 + 4_608 + KEPT),
    # bitsandbytes 4-bit nf4 without double quantization: an fp32 absmax per 64 values: 1,152 x 4 bytes
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, 36_864 + 4_608 + KEPT),
])
def test_gptq_awq_bitsandbytes_by_hand(quant, expected):
    assert release_weights(quant, "0.19.0") == expected


def test_double_quantized_bitsandbytes_follows_the_release():
    nested = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
              "bnb_4bit_use_double_quant": True}
    # kept as loaded (up to 0.9.x): a uint8 absmax per 64 values and an fp32 one per 256 of them: per 16,384 values
    # 256 + 4 bytes, ceil(73,728 / 16,384) = 5 blocks: 1,300 bytes
    assert release_weights(nested, "0.9.2") == 36_864 + 5 * 260 + KEPT
    # 0.10.0-0.27.x dequantize the absmax to fp32 at load (_dequantize_dq): as without double quantization
    assert release_weights(nested, "0.10.0") == release_weights(nested, "0.27.0") == 36_864 + 4_608 + KEPT


def test_bitsandbytes_is_refused_from_0_28():
    from kvplan.app.fit import fit_model
    from kvplan.errors import KvplanError

    path = CONFIGS / "qwen2.5-7b-bnb-4bit.json"
    with pytest.raises(KvplanError, match="0.28.0 removed"):
        fit_model(str(path), gpu_memory="8GiB", engine="vllm==0.28.0", max_model_len=4096)


def test_a_bitsandbytes_start_of_vllm_0_7_3():
    # vllm#13882 (tests/fixtures/vllm_logs/v0_7_3_qwen25_7b_bnb4_rtx4060.log): Qwen2.5-7B-Instruct bnb-4bit on an RTX
    # 4060, vLLM 0.7.3 (V0): "model weights take 5.20GiB". Double-quantized nf4 kept as loaded: 5.17 GiB (the RoPE
    # cos/sin cache and rounding are the rest); with the absmax in fp32, as 0.10.0 on loads it, 5.45 GiB
    from kvplan.app.fit import fit_model
    from kvplan.io.vllm_log import read_vllm_log

    log = read_vllm_log(LOGS / "v0_7_3_qwen25_7b_bnb4_rtx4060.log")
    path = str(CONFIGS / "qwen2.5-7b-bnb-4bit.json")
    old = fit_model(path, gpu_memory="8GiB", engine="vllm==0.7.3", max_model_len=4096).result.breakdown.weights
    new = fit_model(path, gpu_memory="8GiB", engine="vllm==0.19.0", max_model_len=4096).result.breakdown.weights
    assert abs(old / log.weights_bytes - 1) < 0.01
    assert new / log.weights_bytes - 1 > 0.04
