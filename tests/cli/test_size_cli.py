"""`kvplan size`, `models`, `show` through the real CLI, asserting on JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from kvplan.cli import app

runner = CliRunner()
GiB = 1 << 30


def run_json(*args: str) -> dict:
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_size_llama2_7b_contract():
    out = run_json("size", "llama2-7b", "--batch", "16", "--seq-len", "4096")
    for key in ("model", "engine", "kv_cache_dtype", "batch", "seq_len", "bytes_per_token", "total_bytes",
                "per_gpu_bytes", "layers"):
        assert key in out
    assert out["model"] == "llama2-7b" and out["engine"] == "ideal" and out["kv_cache_dtype"] == "fp16"
    assert out["bytes_per_token"] == 524_288
    assert out["total_bytes"] == 16 * 2 * GiB == out["per_gpu_bytes"]
    assert out["layers"] == [
        {"kind": "full", "description": "full MHA 32x128", "count": 32, "layer_indices": list(range(32)),
         "tokens_held": 4096, "bytes_per_token": 524_288, "bytes_per_sequence": 2 * GiB, "bytes": 32 * GiB,
         "per_gpu_bytes": 32 * GiB, "formula": "2 x 32 layers x 32 kv_heads x 128 head_dim x 2 B"}
    ]


def test_default_seq_len_is_the_model_max_and_says_so():
    out = run_json("size", "llama2-7b")
    assert out["seq_len"] == 4096 and out["seq_len_is_model_max"] is True
    r = runner.invoke(app, ["size", "llama2-7b"])
    assert "max context" in r.stdout


def test_size_vllm_fp8_tp4_from_config_path(tmp_path):
    cfg = dict(model_type="llama", hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
               num_key_value_heads=8, max_position_embeddings=131072, torch_dtype="bfloat16")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    out = run_json("size", str(path), "--batch", "8", "--seq-len", "32768", "--kv-cache-dtype", "fp8",
                   "--tensor-parallel-size", "4", "--engine", "vllm")
    assert out["kv_cache_dtype"] == "fp8_e4m3" and out["block_size"] == 16
    assert out["bytes_per_token"] == 80 * 2 * 8 * 128  # fp8: one byte
    assert out["total_bytes"] == 8 * 32768 * 80 * 2 * 8 * 128
    assert out["per_gpu_bytes"] * 4 == out["total_bytes"]


def test_short_flags_tp_pp():
    out = run_json("size", "deepseek-v3", "-tp", "8", "-pp", "2", "--seq-len", "1024", "--engine", "vllm")
    assert out["num_gpus"] == 16
    assert out["per_gpu_bytes"] == 31 * 1024 * 1152  # 61 layers -> stages of 30 and 31; latent on every rank


def test_engines_differ_for_gemma2_window():
    ideal = run_json("size", "gemma2-9b", "--seq-len", "8000")
    vllm = run_json("size", "gemma2-9b", "--seq-len", "8000", "--engine", "vllm")
    hf = run_json("size", "gemma2-9b", "--seq-len", "8000", "--engine", "hf")
    assert ideal["bytes_per_token"] == vllm["bytes_per_token"] == 344_064
    kinds = {g["kind"]: g["tokens_held"] for g in ideal["layers"]}
    assert kinds == {"sliding": 4096, "full": 8000}
    assert vllm["total_bytes"] >= ideal["total_bytes"] == hf["total_bytes"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["size", "no-such-model-xyz"], "unknown model"),
        (["size", "llama2-7b", "--batch", "0"], "batch must be between 1"),
        (["size", "llama2-7b", "--seq-len", "-5"], "--seq-len must be positive"),
        (["size", "llama2-7b", "--kv-cache-dtype", "fp5"], "unknown dtype"),
        (["size", "llama2-7b", "--engine", "tgi"], "unknown engine"),
        (["size", "llama2-7b", "-tp", "3", "--engine", "vllm"], "cannot be split evenly"),
        (["size", "llama2-7b", "--block-size", "16"], "applies to paged engines"),
        (["size", "./missing/config.json"], "no such file"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_no_traceback(args, message):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert message in r.stderr
    assert "Traceback" not in r.output
    assert r.stderr.count("\n") == 1


def test_malformed_config_names_file_and_key(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}))
    r = runner.invoke(app, ["size", str(path)])
    assert r.exit_code == 2
    assert str(path) in r.stderr and "num_hidden_layers" in r.stderr


def test_usage_error_exits_2():
    r = runner.invoke(app, ["size", "llama2-7b", "--batch", "many"])
    assert r.exit_code == 2


def test_models_lists_bundled_with_sources():
    out = run_json("models")
    names = {m["name"]: m for m in out["models"]}
    assert {"llama2-7b", "deepseek-v3", "qwen3-next-80b-a3b", "gpt-oss-120b"} <= set(names)
    assert names["opt-13b"]["bytes_per_token"] == 819_200
    assert all(m["source"] for m in out["models"])


def test_show_deepseek_v3_gives_latent_and_expanded():
    out = run_json("show", "deepseek-v3")
    (group,) = out["groups"]
    assert group["kind"] == "mla" and len(group["layers"]) == 61
    assert group["latent_bytes_per_token"] == 1152
    assert group["expanded_bytes_per_token"] == 128 * (192 + 128) * 2
    assert any("num_key_value_heads 128 ignored" in n for n in out["notes"])


def test_show_hybrid_linear_model():
    out = run_json("show", "qwen3-next-80b-a3b")
    kinds = {g["kind"]: len(g["layers"]) for g in out["groups"]}
    assert kinds == {"linear": 36, "full": 12}


def test_python_dash_m_works_like_the_script():
    r = subprocess.run([sys.executable, "-m", "kvplan", "size", "opt-13b", "--seq-len", "1", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["bytes_per_token"] == 819_200
    bad = subprocess.run([sys.executable, "-m", "kvplan", "size", "nope"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_size_does_not_import_torch_or_transformers():
    code = ("import sys, json; from typer.testing import CliRunner; from kvplan.cli import app;"
            "r = CliRunner().invoke(app, ['size', 'llama2-7b', '--json']); assert r.exit_code == 0;"
            "print(json.dumps([m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []


def test_vllm_mla_uses_flashmla_blocks_unless_told():
    out = run_json("size", "deepseek-v3", "--engine", "vllm", "--seq-len", "100")
    assert out["block_size"] == 64 and any("64-token blocks" in n for n in out["notes"])
    assert out["layers"][0]["tokens_held"] == 128
    out = run_json("size", "deepseek-v3", "--engine", "vllm", "--seq-len", "100", "--block-size", "16")
    assert out["block_size"] == 16 and out["layers"][0]["tokens_held"] == 112
