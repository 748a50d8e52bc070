"""`--engine NAME==VERSION` across commands, and `kvplan engines`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli import app

runner = CliRunner()
GiB = 1 << 30
# The deployment: vLLM 0.11 ran it with 4.45 GiB of KV cache (measured weights/activation/non-torch).
QWEN = ["fit", "qwen3-32b", "--gpu-memory", "79.18GiB", "--gpu-memory-utilization", "0.9", "--block-size", "128",
        "--max-model-len", "16000", "--weights-memory", "61.03GiB", "--activation-memory", "5.64GiB",
        "--non-torch-memory", "0.14GiB", "--json"]


def run(*args: str, code: int = 0) -> dict:
    r = runner.invoke(app, list(args))
    assert r.exit_code == code, r.output
    return json.loads(r.stdout)


def test_vllm_0_11_did_not_charge_cuda_graphs_and_the_deployment_fits():
    old = run(*QWEN, "--engine", "vllm==0.11.0")
    assert old["fits"] and old["engine_version"] == "0.11.0"
    assert old["kv_cache_memory_bytes"] / GiB == pytest.approx(4.45, abs=0.01)
    new = run(*QWEN, "--engine", "vllm==0.33.0", code=1)
    assert not new["fits"] and new["engine_version"] == "0.32.0"
    eager = {w["change"]: w for w in new["what_if"]}["--enforce-eager"]
    assert eager["fits"] and eager["kv_cache_memory_bytes"] == old["kv_cache_memory_bytes"]


def test_size_names_the_profile_and_old_vllm_keeps_sliding_blocks():
    args = ["size", "gemma3-27b", "--batch", "8", "--seq-len", "30001", "--json"]
    hybrid = run(*args, "--engine", "vllm==0.9.1")
    uniform = run(*args, "--engine", "vllm==0.8.5")
    ideal = run(*args)
    assert hybrid["engine_version"] == "0.9.1" and uniform["engine_version"] == "0.8.5"
    assert ideal["engine_version"] is None
    assert uniform["total_bytes"] == 8 * 62 * 1876 * 16 * 16 * 128 * 2 * 2  # every layer holds cdiv(30001, 16) blocks
    assert hybrid["total_bytes"] < uniform["total_bytes"] / 4


def test_transformers_4_cached_mla_expanded():
    old = run("size", "deepseek-v3", "--engine", "hf==4.57", "--seq-len", "1", "--json")
    new = run("size", "deepseek-v3", "--engine", "hf==5.23", "--seq-len", "1", "--json")
    assert new["bytes_per_token"] == 70_272 and old["bytes_per_token"] == 61 * 128 * (192 + 128) * 2


def test_transformers_5_24_holds_deepseek_v4_overlap_gates_in_float32():
    """5.24 made the CSA compressors' position_bias float32, so the overlap gate it keeps is float32: per sequence
    and CSA layer, m x (head_dim + index_head_dim) values at 4 bytes instead of 2. DeepSeek-V4-Pro: 30 CSA layers
    (ratio m = 4, head_dim 512, index_head_dim 128)."""
    args = ("size", "deepseek-v4-pro", "--seq-len", "1000", "--batch", "2", "--json")
    old, new = run(*args, "--engine", "hf==5.23"), run(*args, "--engine", "hf==5.24")
    assert new["engine_version"] == "5.24.0" and old["engine_version"] == "5.0.0"
    assert new["total_bytes"] - old["total_bytes"] == 2 * 30 * 4 * (512 + 128) * (4 - 2)
    assert run(*args, "--engine", "hf")["total_bytes"] == new["total_bytes"]  # the newest profile by default


@pytest.mark.parametrize("args,message", [
    (["fit", "llama2-7b", "--gpu", "H100", "--engine", "vllm==0.5.4"], "older than the oldest profile"),
    (["fit", "llama2-7b", "--gpu", "H100", "--engine", "hf"], "unknown engine 'hf'"),
    (["size", "llama2-7b", "--engine", "tgi==2.0"], "unknown engine 'tgi'"),
    (["engines", "tgi"], "unknown engine 'tgi'"),
])
def test_bad_engine_exits_2(args, message):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert message in r.stderr


def test_engines_lists_every_profile_with_its_changes():
    data = run("engines", "--json")["engines"]
    assert set(data) == {"vllm", "sglang", "trtllm", "hf"}
    versions = [p["version"] for p in data["vllm"]["profiles"]]
    assert versions[0] == "0.6.2" and "0.20.0" in versions and versions[-1] == "0.32.0"
    assert data["vllm"]["checked_through"] == "0.33.0"
    assert all(p["changes"] and p["rules"] for p in data["vllm"]["profiles"])
    one = run("engines", "sglang", "--json")["engines"]
    assert list(one) == ["sglang"]


def test_engines_states_each_vllm_profiles_block_sizes():
    profiles = run("engines", "vllm", "--json")["engines"]["vllm"]["profiles"]
    rules = {p["version"]: p["rules"]["block_sizes"] for p in profiles}
    assert rules["0.6.2"]["choices"] == [8, 16, 32] and rules["0.29.0"]["choices"] == []
    assert rules["0.29.0"]["cuda_multiple_of"] == 16 and "supports_block_size" in rules["0.29.0"]["cuda_source"]
    text = runner.invoke(app, ["engines", "vllm"]).stdout
    assert text.count("block sizes on CUDA:") == len(profiles) and "any multiple of 16 (--block-size takes" in text


def test_vllm_0_33_takes_any_multiple_of_16_and_sizes_with_it():
    size = run("size", "llama3-8b", "--engine", "vllm==0.33.0", "--block-size", "48", "--seq-len", "100", "--json")
    assert size["block_size"] == 48 and size["total_bytes"] == 144 * size["bytes_per_token"]  # 3 blocks of 48
    fit = run("fit", "llama3-8b", "--gpu", "H100", "--engine", "vllm==0.33.0", "--block-size", "80", "--json")
    assert fit["block_size"] == 80 and fit["page_size_bytes"] == 80 * size["bytes_per_token"]
    assert run("size", "llama3-8b", "--engine", "vllm==0.33.0", "--block-size", "512", "--json")["block_size"] == 512
    old = run("size", "llama3-8b", "--engine", "vllm==0.6.2", "--block-size", "8", "--seq-len", "100", "--json")
    assert old["block_size"] == 8 and old["total_bytes"] == 104 * old["bytes_per_token"]


@pytest.mark.parametrize("engine,block,message", [
    ("vllm==0.33.0", "8", "does not start with --block-size 8 on CUDA: it needs a multiple of 16"),
    ("vllm==0.33.0", "1", "use 16, 32, 48, 64 or another multiple of 16"),
    ("vllm==0.17.1", "48", "has no --block-size 48: it takes 1, 8, 16, 32, 64, 128, 256"),
    ("vllm==0.6.2", "64", "has no --block-size 64: it takes 8, 16, 32"),
])
@pytest.mark.parametrize("command", [["size", "llama3-8b"], ["fit", "llama3-8b", "--gpu", "H100"]])
def test_a_block_size_the_release_refuses_is_one_line_and_exit_2(command, engine, block, message):
    r = runner.invoke(app, [*command, "--engine", engine, "--block-size", block])
    assert r.exit_code == 2, r.output
    assert message in r.stderr and r.stderr.count("\n") == 1


def test_vllm_inputs_reach_fit_from_the_command_line():
    base = ["fit", "llama3-8b", "--gpu", "L4", "--json"]
    override = run(*base, "--num-gpu-blocks-override", "100", code=1)
    assert override["num_blocks"] == 100 and not override["fits"]  # 100 blocks of 16 hold no 8k request
    auto = run("fit", "llama3-8b", "--gpu-memory", "20GiB", "--max-model-len", "-1", "--json")
    assert auto["fits"] and auto["max_model_len"] == auto["max_model_len_fit"] <= 8192
    ranks = run("fit", "llama3-8b", "--gpu-memory", "24GiB,22GiB", "-tp", "2", "--json")
    single = run("fit", "llama3-8b", "--gpu-memory", "22GiB", "-tp", "2", "--json")
    assert ranks["num_blocks"] == single["num_blocks"]  # vLLM plans every rank with the smallest GPU
    mla = run("fit", "deepseek-v3", "--gpu", "H200", "-tp", "8", "--attention-backend", "CUTLASS_MLA", "--json")
    assert mla["block_size"] == 128


@pytest.mark.parametrize("args,message", [
    (["--gpu-memory", "24GiB,22GiB"], "--gpu-memory lists 2 GPUs; tp 1 x pp 1 needs 1"),
    (["--gpu", "L4", "--mamba-cache-mode", "bogus"], "mamba cache mode 'bogus'"),
    (["--gpu", "L4", "--attention-backend", "CUTLASS_MLA"], "CUTLASS_MLA"),
])
def test_bad_vllm_inputs_exit_2(args, message):
    r = runner.invoke(app, ["fit", "llama3-8b", *args])
    assert r.exit_code == 2, r.output
    assert message in r.stderr


def test_before_0_20_graphs_must_fit_the_slack_left_after_the_kv_cache():
    # vLLM 0.11 allocates the KV cache to 0.95 of the GPU, then captures graphs in what is left
    args = ["fit", "llama3.1-70b", "--gpu", "H100", "-tp", "2", "--engine", "vllm==0.11.0", "--max-model-len",
            "20000", "--json"]
    tight = run(*args, "--gpu-memory-utilization", "0.95", code=1)
    assert any(r.startswith("CUDA graphs") for r in tight["reasons"]) and tight["breakdown"]["unused"] == 0
    assert {w["change"]: w["fits"] for w in tight["what_if"]}["--enforce-eager"]
    assert run(*args, "--gpu-memory-utilization", "0.95", "--enforce-eager")["fits"]


def test_v0_turns_chunked_prefill_on_above_32k():
    long = run("fit", "llama3.1-8b", "--gpu", "H100", "--engine", "vllm==0.6.5", "--json")
    short = run("fit", "llama3.1-8b", "--gpu", "H100", "--engine", "vllm==0.6.5", "--max-model-len", "16384", "--json")
    assert long["settings"]["max_num_batched_tokens"] == 2048 and short["settings"]["max_num_batched_tokens"] == 16384


def test_blackwell_captures_up_to_1024_from_0_28():
    b200 = run("fit", "llama3.1-8b", "--gpu", "B200", "--json")
    old = run("fit", "llama3.1-8b", "--gpu", "B200", "--engine", "vllm==0.27.0", "--json")
    assert b200["settings"]["cuda_graph_sizes"] == 83 and old["settings"]["cuda_graph_sizes"] == 51


@pytest.mark.parametrize("args,message", [
    (["fit", "llama3.1-8b", "--gpu", "H100", "--block-size", "7"], "does not start with --block-size 7 on CUDA"),
    (["fit", "llama3-8b", "--gpu", "L4", "--engine", "sglang", "--max-model-len", "-1"], "auto-fit) is vLLM's"),
    (["explain", "tests/fixtures/vllm_logs/v0_6_4_llama31_8b_rtx3090_20k.log", "--model", "llama3.1-8b", "-e",
      "vllm==0.12.0"], "V0 engine, which 0.11 removed"),
])
def test_inputs_that_cannot_go_together_exit_2(args, message):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert message in r.stderr


def test_errors_inside_files_name_the_file(tmp_path):
    budgets = tmp_path / "b.yaml"
    budgets.write_text("budgets:\n  - name: x\n    model: nosuch\n    require: {max_kv_bytes_per_token: 1MiB}\n")
    r = runner.invoke(app, ["check", str(budgets)])
    assert r.exit_code == 2 and f"{budgets}: budget 'x': unknown model 'nosuch'" in r.stderr
