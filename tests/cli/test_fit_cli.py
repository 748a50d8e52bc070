"""`kvplan fit` and `kvplan gpus` through the CLI: the JSON contract and exit codes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli import app

runner = CliRunner()
GiB = 1 << 30


def test_fit_json_contract_and_exit_0():
    r = runner.invoke(app, ["fit", "llama3-70b", "--gpu", "H100-80GB", "-tp", "4", "--max-model-len", "8192", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    for key in ("kv_cache_memory_bytes", "num_blocks", "kv_cache_tokens", "max_concurrency", "max_model_len_fit", "fits"):
        assert key in out
    assert set(out["breakdown"]) >= {"weights", "activation", "non_torch", "cuda_graph", "kv_cache"}
    assert out["fits"] is True and out["gpu"] == "H100-80GB" and out["tensor_parallel_size"] == 4
    assert out["breakdown"]["kv_cache"] == out["kv_cache_memory_bytes"] > 30 * GiB
    assert out["num_blocks"] * out["page_size_bytes"] <= out["kv_cache_memory_bytes"]
    assert out["max_concurrency"] > 30


def test_fit_does_not_fit_exits_1_with_what_if():
    r = runner.invoke(app, ["fit", "llama3-70b", "--gpu", "L40S", "--json"])
    assert r.exit_code == 1, r.output
    out = json.loads(r.stdout)
    assert out["fits"] is False and out["reasons"]
    changes = {w["change"]: w for w in out["what_if"]}
    assert changes["--tensor-parallel-size 4"]["fits"] is True


@pytest.mark.parametrize("memory", ["80GiB", "48GiB"])  # qwen3-32b (61 GiB of bf16 weights) fits the first only
def test_fit_table_output_names_the_verdict(memory):
    args = ["fit", "qwen3-32b", "--gpu-memory", memory, "--gpu-memory-utilization", "0.9",
            "--kv-cache-dtype", "fp8", "--engine", "vllm", "--max-model-len", "8192"]
    verdict = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert verdict["fits"] is (memory == "80GiB")  # both branches below are exercised
    r = runner.invoke(app, args)
    assert r.exit_code == (0 if verdict["fits"] else 1), r.output
    lines = r.stdout.splitlines()
    if verdict["fits"]:
        assert any(line.startswith(f"fits: {verdict['max_concurrency']:.2f} requests") for line in lines), r.stdout
        assert not any(line.startswith("does not fit") for line in lines)
    else:
        assert any(line.startswith("does not fit: ") for line in lines), r.stdout
        assert not any(line.startswith("fits: ") for line in lines)


def test_fit_with_measured_overrides_is_exact():
    r = runner.invoke(app, ["fit", "llama2-7b", "--gpu-memory", "80GiB", "--gpu-memory-utilization", "0.9",
                            "--weights-memory", "12GiB", "--activation-memory", "1GiB", "--non-torch-memory", "512MiB",
                            "--cuda-graph-memory", "0", "--json"])
    out = json.loads(r.stdout)
    assert out["kv_cache_memory_bytes"] == 58.5 * GiB and out["num_blocks"] == 7488 and out["estimated"] == []


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_other_engines(engine):
    r = runner.invoke(app, ["fit", "deepseek-v3", "--gpu", "H200", "-tp", "8", "--engine", engine, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["kv_cache_tokens"] > 100_000


@pytest.mark.parametrize(
    "args,message",
    [
        (["fit", "llama2-7b", "--gpu", "H10"], "unknown GPU 'H10'; did you mean"),
        (["fit", "llama2-7b", "--gpu", "H100", "--gpu-memory-utilization", "1.5"], "must be in (0, 1]"),
        (["fit", "llama2-7b", "--gpu", "H100", "-tp", "3"], "divide the 32 attention heads"),
        (["fit", "llama2-7b"], "give --gpu NAME"),
        (["fit", "llama2-7b", "--gpu-memory", "lots"], "expected a size like 80GiB"),
        (["fit", "llama2-7b", "--gpu", "H100", "--weights-memory", "-3GiB"], "expected a size"),
    ],
)
def test_fit_bad_input_exits_2(args, message):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert message in r.stderr and "Traceback" not in r.output


def test_gpus_catalog():
    r = runner.invoke(app, ["gpus", "--json"])
    assert r.exit_code == 0
    names = {g["name"]: g for g in json.loads(r.stdout)["gpus"]}
    need = {"A10", "A10G", "L4", "L40S", "A100-40GB", "A100-80GB", "A800-80GB", "H100-80GB", "H100-PCIe", "H20",
            "H200", "B200", "MI300X", "RTX-3090", "RTX-4090", "RTX-5090"}
    assert need <= set(names)
    assert all(g["source"] and g["memory_bytes"] > 10 * GiB for g in names.values())
    assert 79 * GiB < names["H100-80GB"]["memory_bytes"] < 80 * GiB  # driver-reported, not the marketing 80 GB
    # what vLLM's profile-run model reads: H100 SXM's 132 SMs and Hopper's capability; MI300X is not CUDA
    assert (names["H100-80GB"]["sm_count"], names["H100-80GB"]["compute_capability"]) == (132, 9.0)
    assert names["MI300X"]["compute_capability"] is None and all(g["sm_count"] > 0 for g in names.values())


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_max_model_len_fit_has_one_meaning_across_engines(engine):
    """The longest max_model_len that fits is searched up to the configured one on every engine (vLLM's own
    estimate is): a short context that fits shows itself, not the model's 131,072 positions."""
    def run(*extra: str) -> dict:
        r = runner.invoke(app, ["fit", "llama3.1-8b", "--gpu", "H100", "--engine", engine, *extra, "--json"])
        assert r.exit_code in (0, 1), r.output
        return json.loads(r.stdout)

    short = run("--max-model-len", "4096")
    assert short["fits"] and short["max_model_len_fit"] == 4096
    tight = run("--gpu-memory", "20GiB", "--max-model-len", "131072")  # 15 GiB of weights: a few GiB of KV
    assert not tight["fits"] and 0 < tight["max_model_len_fit"] < 131072


def _fit(*args: str) -> tuple[int, dict]:
    r = runner.invoke(app, ["fit", *args, "--json"])
    assert r.exit_code in (0, 1), r.output
    return r.exit_code, json.loads(r.stdout)


@pytest.mark.parametrize(("engine", "variable"), [("vllm", "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"),
                                                  ("sglang", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")])
def test_a_context_past_the_models_does_not_start_unless_the_variable_is_set(engine, variable):
    # issue 19: `fit --max-model-len 200000` on a 131,072-position model printed a note and "fits" (exit 0)
    args = ["llama3.1-8b", "--gpu", "H100", "--engine", engine, "--max-model-len", "200000"]
    code, out = _fit(*args)
    assert code == 1 and out["fits"] is False
    assert "does not start" in out["reasons"][0] and variable in out["reasons"][0] and "131,072" in out["reasons"][0]
    assert out["context_limit"] == {"engine": {"vllm": "vLLM", "sglang": "SGLang"}[engine], "max_model_len": 131072,
                                    "source": "max_position_embeddings", "override": variable,
                                    "when_exceeded": "refuses to start", "exceeded": True, "override_set": False}
    changes = {w["change"]: w for w in out["what_if"]}
    assert changes["--max-model-len 131072"]["fits"] and changes["--allow-long-max-model-len"]["fits"]
    assert out["fewest_gpus"] is None  # more GPUs do not start it either
    code, out = _fit(*args, "--allow-long-max-model-len")
    assert code == 0 and out["fits"] and out["max_model_len"] == 200000 and out["context_limit"]["override_set"]
    assert any(variable in note for note in out["notes"])


def test_trtllm_starts_with_the_models_length_instead():
    code, out = _fit("llama3.1-8b", "--gpu", "H100", "--engine", "trtllm", "--max-model-len", "200000")
    assert code == 0 and out["fits"] and out["max_model_len"] == 131072
    assert out["context_limit"]["when_exceeded"] == "clamps" and out["context_limit"]["exceeded"]
    assert any("not 200000" in note for note in out["notes"])
    code, out = _fit("llama3.1-8b", "--gpu", "H100", "--engine", "trtllm", "--max-model-len", "200000",
                     "--allow-long-max-model-len")
    assert code == 0 and out["max_model_len"] == 200000


def test_an_engine_limit_from_the_rope_factor(tmp_path):
    # SGLang multiplies by a linear RoPE factor (get_context_length); vLLM's releases differ, so only a note
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 1024, "intermediate_size": 2816,
        "num_attention_heads": 16, "num_key_value_heads": 4, "num_hidden_layers": 4, "vocab_size": 32000,
        "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
        "rope_scaling": {"rope_type": "linear", "factor": 4.0}}))
    code, out = _fit(str(config), "--gpu", "L4", "--engine", "sglang", "--max-model-len", "16384")
    assert code == 0 and out["context_limit"]["max_model_len"] == 16384
    code, out = _fit(str(config), "--gpu", "L4", "--engine", "sglang", "--max-model-len", "16385")
    assert code == 1 and "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in out["reasons"][0]
    code, out = _fit(str(config), "--gpu", "L4", "--engine", "vllm", "--max-model-len", "16384")
    assert code == 0 and out["context_limit"]["max_model_len"] is None
    assert any("VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in note for note in out["notes"])


def test_the_fewest_gpus_when_nothing_fits():
    # issue 19: llama3.1-405b on one H100 printed six what-if rows of "no, 0 B"
    code, out = _fit("llama3.1-405b", "--gpu", "H100-80GB")
    assert code == 1 and not any(w["fits"] for w in out["what_if"])
    few = out["fewest_gpus"]
    assert few["fits"] and few["num_gpus"] == few["tensor_parallel_size"] * few["pipeline_parallel_size"] > 8
    assert few["change"] == f"-tp {few['tensor_parallel_size']} -pp {few['pipeline_parallel_size']}"
    code, there = _fit("llama3.1-405b", "--gpu", "H100-80GB", "-tp", str(few["tensor_parallel_size"]),
                       "-pp", str(few["pipeline_parallel_size"]))
    assert code == 0 and there["kv_cache_memory_bytes"] == few["kv_cache_memory_bytes"]
    for tp in (1, 2, 4, 8):  # no smaller count fits, at any tensor-parallel size the engine allows
        for pp in range(1, (few["num_gpus"] - 1) // tp + 1):
            code, smaller = _fit("llama3.1-405b", "--gpu", "H100-80GB", "-tp", str(tp), "-pp", str(pp))
            assert code == 1, (tp, pp)
    text = runner.invoke(app, ["fit", "llama3.1-405b", "--gpu", "H100-80GB"]).stdout
    assert "What would make it fit" not in text and "The fewest GPUs that fit" in text and few["change"] in text
    code, out = _fit("llama3-70b", "--gpu", "L40S")
    assert code == 1 and out["fewest_gpus"] is None  # a single change fits: the what-if table stays


def _fit_json(*args: str) -> dict:
    r = runner.invoke(app, ["fit", *args, "--gpu", "H100-80GB", "--max-model-len", "32768",
                            "--kv-cache-memory-bytes", "20GiB", "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("flag,in_flight,concurrency", [
    # gemma3-27b: 52 sliding layers (window 1024) and 10 full in 7 groups of 10 (1 full, 6 sliding), a block 16
    # tokens x 10 layers x 2 x 16 KV heads x 128 x 2 B = 1,310,720 B; 20 GiB holds 16,384 blocks. Full:
    # cdiv(32768, 16) = 2048 blocks. Sliding: cdiv(min(1023 + in_flight, 32768), 16) + 1 (0.26.0:
    # vllm/v1/kv_cache_interface.py::SlidingWindowSpec.max_admission_blocks_per_request).
    ("--no-async-scheduling", 8192, 16384 / (2048 + 6 * 577)),  # cdiv(9215, 16) + 1 = 577
    ("--async-scheduling", 16384, 16384 / (2048 + 6 * 1089)),  # 2 batches: cdiv(17407, 16) + 1 = 1089
])
def test_async_scheduling_sizes_sliding_layers_from_0_26(flag, in_flight, concurrency):
    out = _fit_json("gemma3-27b", "--engine", "vllm==0.26.0", flag)
    assert out["num_blocks"] == 16384 and out["page_size_bytes"] == 1310720
    assert out["settings"]["async_scheduling"] is (flag == "--async-scheduling")
    assert out["settings"]["max_in_flight_tokens"] == in_flight
    assert out["max_concurrency"] == round(concurrency, 4)
    assert any(f"max_in_flight_tokens {in_flight} =" in note for note in out["notes"]), out["notes"]
    # 0.25 admits one batch either way: the setting does not move its plan, nor is it reported
    before = _fit_json("gemma3-27b", "--engine", "vllm==0.25.0", flag)
    assert before["max_concurrency"] == round(16384 / (2048 + 6 * 577), 4)
    assert "async_scheduling" not in before["settings"]


def test_the_release_default_is_async_and_the_text_says_so():
    assert _fit_json("gemma3-27b", "--engine", "vllm==0.26.0")["settings"]["max_in_flight_tokens"] == 16384
    r = runner.invoke(app, ["fit", "gemma3-27b", "--gpu", "H100-80GB", "--engine", "vllm==0.26.0", "--max-model-len",
                            "32768", "--kv-cache-memory-bytes", "20GiB"])
    assert r.exit_code == 0, r.output
    assert "async scheduling on: vLLM's default" in " ".join(r.stdout.split()), r.stdout


@pytest.mark.parametrize("model,version,flag,batches,page,concurrency", [
    # gpt-oss-20b at pp 2: 6 sliding (window 128) and 6 full layers a stage, 2 groups of 6; a block 16 x 6 x 2 x 8
    # KV heads x 64 x 2 B = 196,608 B, 20 GiB holds 109,226. Full 2048 blocks; sliding cdiv(127 + in_flight, 16) + 1.
    # 0.28: a MoE not on DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES runs the V1 model runner: pp = 2 batches, async or not
    ("gpt-oss-20b", "0.28.0", "--async-scheduling", 2, 196608, 109226 / (2048 + 1033)),  # cdiv(16511, 16) + 1
    ("gpt-oss-20b", "0.28.0", "--no-async-scheduling", 2, 196608, 109226 / (2048 + 1033)),
    # 0.29: every model runs the V2 model runner: pp + 1 = 3 batches with async scheduling
    ("gpt-oss-20b", "0.29.0", "--async-scheduling", 3, 196608, 109226 / (2048 + 1545)),  # cdiv(24703, 16) + 1
    ("gpt-oss-20b", "0.29.0", "--no-async-scheduling", 2, 196608, 109226 / (2048 + 1033)),
    # gemma3-27b is dense: the V2 model runner from 0.26. pp 2: stages of 31 layers (26 sliding, 5 full) in 7 groups
    # of 5, a block 655,360 B, 32,768 blocks; 3 batches: cdiv(1023 + 24576, 16) + 1 = 1601 blocks a sliding group
    # (pp alone, 2 batches, would be 1089: 3.82 requests)
    ("gemma3-27b", "0.26.0", "--async-scheduling", 3, 655360, 32768 / (2048 + 6 * 1601)),
])
def test_pipeline_parallel_async_counts_pp_plus_one_on_the_v2_runner(model, version, flag, batches, page,
                                                                     concurrency):
    out = _fit_json(model, "-pp", "2", "--engine", f"vllm=={version}", flag)
    assert out["settings"]["max_in_flight_tokens"] == batches * 8192
    assert out["page_size_bytes"] == page and out["num_blocks"] == 20 * GiB // page
    assert out["max_concurrency"] == round(concurrency, 4)


def test_a_default_max_num_seqs_is_cut_to_the_token_budget_from_0_11():
    # vllm/engine/arg_utils.py (0.11.0 _set_default_args; 0.33.0 the same): min(default max_num_seqs, budget)
    code, out = _fit("llama3.1-8b", "--gpu", "H100-80GB", "--max-num-batched-tokens", "512", "--engine", "vllm==0.19.0")
    assert code == 0 and out["settings"]["max_num_seqs"] == 512  # not the H100 default 1024
    code, out = _fit("llama3.1-8b", "--gpu", "H100-80GB", "--max-num-batched-tokens", "4096", "--engine", "vllm==0.19.0")
    assert code == 0 and out["settings"]["max_num_seqs"] == 1024


def test_a_budget_below_max_num_seqs_does_not_start_before_0_11():
    # 0.10.0 keeps the default 1024 (arg_utils.py, no cut) and SchedulerConfig refuses a smaller budget
    r = runner.invoke(app, ["fit", "llama3.1-8b", "--gpu", "H100-80GB", "--max-num-batched-tokens", "512",
                            "--engine", "vllm==0.10.0"])
    assert r.exit_code == 2
    assert "max_num_batched_tokens 512 must be at least max_num_seqs (1024" in " ".join(r.output.split())


def _gemma3_fit(*extra: str) -> dict:
    r = runner.invoke(app, ["fit", "gemma3-12b", "--gpu", "H100", "--max-model-len", "8192", "--json", *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_limit_mm_per_prompt_leaves_the_vision_tower_out_from_0_16():
    from kvplan.io.models import load_model

    tower = load_model("gemma3-12b").arch.tower
    base = _gemma3_fit("--engine", "vllm==0.19.0")["breakdown"]
    none = _gemma3_fit("--engine", "vllm==0.19.0", "--limit-mm-per-prompt", '{"image": 0}')["breakdown"]
    # vLLM 0.16+ builds no tower whose every modality is limited to 0 (SupportsMultiModal._mark_tower_model), and
    # profiles no encoder: the tower's bf16 parameters and the 32 dummy images' 207 MiB (test_vllm_activation.py) go
    assert base["weights"] - none["weights"] == 2 * tower.params
    assert base["activation"] - none["activation"] == 217_055_232
    two = _gemma3_fit("--engine", "vllm==0.19.0", "--limit-mm-per-prompt", '{"image": {"count": 2}}')["breakdown"]
    assert two == base  # 2 images a prompt still let the encoder budget's 32 run at once
    old = _gemma3_fit("--engine", "vllm==0.14.0", "--limit-mm-per-prompt", '{"image": 0}')["breakdown"]
    assert old["weights"] == _gemma3_fit("--engine", "vllm==0.14.0")["breakdown"]["weights"]  # built before 0.16


@pytest.mark.parametrize("value", ["2", "{\"image\": -1}", "{\"image\": true}", "[1]"])
def test_a_malformed_limit_mm_per_prompt_is_refused(value):
    r = runner.invoke(app, ["fit", "gemma3-12b", "--gpu", "H100", "--limit-mm-per-prompt", value])
    assert r.exit_code == 2 and "--limit-mm-per-prompt" in r.output and "Traceback" not in r.output


def test_data_parallel_engines_each_their_own_pool():
    """vLLM -dp N: N engines of tp x pp GPUs, each its own KV pool (v1/engine/core.py: one EngineCore a DP rank).
    A dense model's engine is the -dp 1 deployment, N times over; the JSON's all_ranks sums them."""
    base = ("llama3.1-8b", "--gpu", "H100-80GB", "--max-model-len", "32768")
    code, one = _fit(*base)
    code_n, four = _fit(*base, "-dp", "4")
    assert code == code_n == 0
    for key in ("kv_cache_memory_bytes", "num_blocks", "kv_cache_tokens", "max_concurrency", "breakdown"):
        assert four[key] == one[key], key
    assert four["data_parallel_size"] == 4 and four["num_gpus"] == 4 and four["expert_parallel_size"] is None
    assert four["all_ranks"]["kv_cache_tokens"] == 4 * one["kv_cache_tokens"]
    # a request is held by one engine: 13.82 an engine is 13 whole ones, 52 on 4 (not 55.27)
    assert four["all_ranks"]["max_concurrency"] == 4 * int(one["max_concurrency"])
    assert one["all_ranks"]["kv_cache_tokens"] == one["kv_cache_tokens"] and one["num_gpus"] == 1


def test_deepseek_v3_data_parallel_with_expert_parallel_on_8_h200():
    """DeepSeek-V3 on 8 x H200 (issue 22): -dp 8 --enable-expert-parallel holds every weight but the routed experts
    whole on each GPU, the experts 32 a GPU, and each engine's requests only on its own GPU: more weights a GPU
    than -tp 8, a smaller pool a GPU, and more requests in all, because MLA's latent is held by every TP rank."""
    code, tp8 = _fit("deepseek-v3", "--gpu", "H200", "-tp", "8", "--json")
    code_ep, ep = _fit("deepseek-v3", "--gpu", "H200", "-dp", "8", "--enable-expert-parallel", "--json")
    assert code == code_ep == 0
    assert ep["num_gpus"] == tp8["num_gpus"] == 8 and ep["expert_parallel_size"] == 8
    assert ep["breakdown"]["weights"] > tp8["breakdown"]["weights"]
    assert ep["kv_cache_tokens"] < tp8["kv_cache_tokens"]
    assert ep["all_ranks"]["max_concurrency"] == 8 * int(ep["max_concurrency"]) > 3 * tp8["max_concurrency"]
    # the -tp 8 fit says what the DP alternative gives, in the same figures
    note = next(n for n in tp8["notes"] if n.startswith("data parallel instead"))
    assert f"{ep['kv_cache_tokens']:,} tokens each" in note
    assert f"{ep['all_ranks']['max_concurrency']:.0f} requests of 163,840 tokens" in note


def test_concurrency_over_data_parallel_ranks_counts_whole_requests_on_each():
    """--concurrency c over dp engines needs cdiv(c, dp) requests on the busiest: -c 16 fits 8 engines of 2.64,
    -c 17 does not (one engine would hold 3)."""
    base = ("deepseek-v3", "--gpu", "H200", "-dp", "8", "--enable-expert-parallel")
    code16, _ = _fit(*base, "-c", "16")
    code17, out = _fit(*base, "-c", "17")
    assert code16 == 0 and code17 == 1 and "17 concurrent requests" in out["reasons"][0]


def test_data_parallel_is_refused_where_it_is_not_modelled():
    r = runner.invoke(app, ["fit", "deepseek-v3", "--gpu", "H200", "--engine", "trtllm", "-tp", "8", "-dp", "8"])
    assert r.exit_code == 2 and "modelled for vLLM and SGLang" in r.output


def test_sglang_dp_attention_on_deepseek_v3_holds_back_its_buffers_and_keeps_a_pool_a_gpu():
    """SGLang --tp 8 --dp-size 8 --enable-dp-attention (0.5.3 rules): mem_fraction_static reserves 512 + 1.5 x 8192
    + 2 x 512 + 8 / 8 x 1024 = 14,848 MiB, plus 512 x 8 x 3 and 512 x 8 x 1.5 for the ranks' gathered decode
    buffers = 33,280 MiB: (143,155 - 33,280) / 143,155 = 0.768 on an H200 of 139.80 GiB (server_args.py::
    _handle_gpu_memory_settings); each GPU its own pool of the MLA latent, 8 in all."""
    code, tp8 = _fit("deepseek-v3", "--gpu", "H200", "--engine", "sglang==0.5.3", "-tp", "8")
    code_dp, dp8 = _fit("deepseek-v3", "--gpu", "H200", "--engine", "sglang==0.5.3", "-tp", "8", "-dp", "8",
                        "--enable-dp-attention")
    assert code == code_dp == 0
    assert dp8["settings"]["mem_fraction_static"] == 0.768 and dp8["dp_attention"] is True
    assert dp8["num_gpus"] == 8 and dp8["data_parallel_size"] == 8
    assert dp8["breakdown"]["weights"] > tp8["breakdown"]["weights"]  # attention and embedding whole on each GPU
    assert dp8["all_ranks"]["kv_cache_tokens"] == 8 * dp8["kv_cache_tokens"] > tp8["kv_cache_tokens"]
    note = next(n for n in tp8["notes"] if n.startswith("data parallel instead: -dp 8 --enable-dp-attention"))
    assert f"{dp8['kv_cache_tokens']:,} tokens each" in note


def test_sglang_dp_attention_replays_a_public_deepseek_v3_log():
    """sgl-project/sglang#6017 (2025-05-09, DeepSeek-V3, ranks DP0 TP0 .. DP7 TP7): 'Load weight end ... avail
    mem=31.87 GB, mem usage=105.59 GB' and 'KV Cache is allocated. #tokens: 161488'. Its flags are inferred from the
    same user's launch line in the thread (--mem-fraction-static 0.846, --context-length 4096) and its GPU from the
    137.46 GiB free before loading (an H200-class card): a replay from the log's own figures, not a prediction.
    rest = 137.46 x 0.846 - 105.59 GiB, over 70,272 B a token (the MLA latent of 61 layers, whole on each rank)."""
    code, out = _fit("deepseek-v3", "--gpu", "H200", "--engine", "sglang==0.4.6", "-tp", "8", "-dp", "8",
                     "--enable-dp-attention", "--gpu-memory-utilization", "0.846", "--weights-memory", "105.59GiB",
                     "--non-torch-memory", f"{139.80 - 137.46:.2f}GiB", "--max-model-len", "4096")
    assert code == 0 and out["page_size_bytes"] == 70_272
    assert abs(out["kv_cache_tokens"] / 161_488 - 1) < 0.02  # +1.3%: SGLang takes the smallest rank's figures


def test_sglang_data_parallel_replicas_are_side_by_side():
    code, one = _fit("qwen3-30b-a3b", "--gpu", "H100-80GB", "--engine", "sglang", "-tp", "2")
    code_r, two = _fit("qwen3-30b-a3b", "--gpu", "H100-80GB", "--engine", "sglang", "-tp", "2", "-dp", "2")
    assert code == code_r == 0 and two["num_gpus"] == 4 and two["dp_attention"] is False
    assert two["kv_cache_tokens"] == one["kv_cache_tokens"] and two["breakdown"] == one["breakdown"]
    assert two["all_ranks"]["kv_cache_tokens"] == 2 * one["kv_cache_tokens"]


@pytest.mark.parametrize(("args", "says"), [
    (("--engine", "vllm", "-tp", "8", "-dp", "8", "--enable-dp-attention"), "is SGLang's"),
    (("--engine", "sglang", "-tp", "8", "-dp", "3", "--enable-dp-attention"), "dividing the tensor parallel size 8"),
])
def test_dp_attention_is_refused_where_it_does_not_apply(args, says):
    r = runner.invoke(app, ["fit", "deepseek-v3", "--gpu", "H200", *args])
    assert r.exit_code == 2 and says in r.output


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_fp8_block_experts_split_only_in_whole_blocks(engine):
    """DeepSeek-V3's experts (intermediate 2048, FP8 blocks of 128): split over 32 GPUs they would be 64 wide, which
    vLLM's Fp8MoEMethod.create_weights and SGLang refuse at load; whole experts (expert parallel) load."""
    args = (["-tp", "8", "-dp", "4"] if engine == "vllm" else ["-tp", "32"])
    r = runner.invoke(app, ["fit", "deepseek-v3", "--gpu", "H200", "--engine", engine, *args])
    assert r.exit_code == 2 and "not a multiple of the FP8 block 128" in r.output
    assert "--enable-expert-parallel" in r.output
    if engine == "vllm":
        code, out = _fit("deepseek-v3", "--gpu", "H200", "--engine", engine, *args, "--enable-expert-parallel")
        assert code == 0 and out["expert_parallel_size"] == 32


def test_sglang_dp_attention_reserve_on_an_h100():
    """0.5.3 (server_args.py::_handle_gpu_memory_settings): an H100 at tp 2 reserves 512 + 1.5 x 8192 + 2 x 256 +
    2 / 8 x 1024 = 13,568 MiB, and with DP attention over 2 ranks 256 x 2 x 3 = 1,536 MiB more (cuda_graph_max_bs
    256 is not above 300): (81,090 - 15,104) / 81,090 = 0.814 on a card of 79.19 GiB."""
    code, out = _fit("qwen3-30b-a3b", "--gpu", "H100-80GB", "--engine", "sglang==0.5.3", "-tp", "2", "-dp", "2",
                     "--enable-dp-attention")
    assert code in (0, 1) and out["settings"]["mem_fraction_static"] == 0.814


@pytest.mark.parametrize(("model", "args", "fraction"), [
    # 512 + 1.5 x 8192 + 2 x 256 + 1 / 8 x 1024 = 13,440 MiB, + 58 piecewise sizes up to 8192 x 8 = 464 MiB:
    # (81,090 - 13,904) / 81,090 = 0.829 (0.835 in 0.5.3-0.5.9)
    ("llama3.1-8b", ("--gpu", "H100-80GB"), 0.829),
    # 512 + 12,288 + 2 x 512 + 1,024 = 14,848 MiB, + 1.5 GiB for an MLA model: (143,155 - 16,384) / 143,155 = 0.886
    ("deepseek-v3", ("--gpu", "H200", "-tp", "8"), 0.886),
    # Qwen3NextForCausalLM is on SGLang's list of architectures without piecewise graphs: 13,568 MiB alone
    ("qwen3-next-80b-a3b", ("--gpu", "H100-80GB", "-tp", "2"), 0.833),
])
def test_sglang_0_5_10_reserves_piecewise_cuda_graphs(model, args, fraction):
    """SGLang 0.5.10 turns piecewise CUDA graphs on by default and its default mem_fraction_static holds them back
    (server_args.py::_handle_gpu_memory_settings, _generate_piecewise_cuda_graph_tokens, _handle_piecewise_cuda_graph,
    configs/model_config.py::piecewise_cuda_graph_disabled_model_archs)."""
    _, out = _fit(model, *args, "--engine", "sglang==0.5.10")
    assert out["settings"]["mem_fraction_static"] == fraction


def test_sglang_dp_attention_splits_gqa_heads_over_the_attention_tp():
    """Qwen3-30B-A3B's 4 KV heads: at tp 4 one a GPU (48 layers x K and V x 128 x 2 B = 24,576 B a token); with 2
    attention groups of tp 2, two a GPU: 49,152 B (model_runner_kv_cache_mixin.py: get_num_kv_heads(attn_tp))."""
    _, tp4 = _fit("qwen3-30b-a3b", "--gpu", "H100-80GB", "--engine", "sglang", "-tp", "4")
    _, dp2 = _fit("qwen3-30b-a3b", "--gpu", "H100-80GB", "--engine", "sglang", "-tp", "4", "-dp", "2",
                  "--enable-dp-attention")
    assert tp4["page_size_bytes"] == 24_576 and dp2["page_size_bytes"] == 49_152


@pytest.mark.parametrize(("args", "fraction"), [
    # by class above 90 GiB: (12 + 8 / 2) GiB reserved, and 4096 MiB more for DP attention (0.4.8-0.5.2):
    # (143,155 - 20,480) / 143,155 = 0.857; without it 0.886
    (("--engine", "sglang==0.4.8", "-tp", "8", "-dp", "8", "--enable-dp-attention"), 0.857),
    (("--engine", "sglang==0.4.8", "-tp", "8"), 0.886),
    # 0.5.10 turns piecewise graphs off under DP attention: the 0.5.3 reserve alone
    (("--engine", "sglang==0.5.10", "-tp", "8", "-dp", "8", "--enable-dp-attention"), 0.768),
])
def test_sglang_dp_attention_reserve_by_release(args, fraction):
    _, out = _fit("deepseek-v3", "--gpu", "H200", *args)
    assert out["settings"]["mem_fraction_static"] == fraction


@pytest.mark.parametrize(("model", "args", "fraction"), [
    ("gemma3-27b", (), 0.829),  # Gemma3ForConditionalGeneration: SGLang leaves its multimodal side off by default
    ("gemma3n-e4b", (), 0.834),  # a text and a vision sub-config: multimodal, no piecewise graphs
    ("llama3.1-8b", ("-pp", "2"), 0.833),  # pipeline parallel: none either (512 + 12,288 + 512 + 256 MiB)
])
def test_sglang_0_5_10_piecewise_graphs_off_where_sglang_turns_them_off(model, args, fraction):
    _, out = _fit(model, "--gpu", "H100-80GB", "--engine", "sglang==0.5.10", *args)
    assert out["settings"]["mem_fraction_static"] == fraction
