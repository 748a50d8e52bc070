"""`kvplan fit --speculative-config`: vLLM's MTP drafter in the KV cache and the weights, its own budget line, and a
real start reproduced.

Worked examples: docs/research/spec-decode-lora.md, 1.6 (bytes a token with the MTP layer, from the models' configs
and vLLM's rule that a draft attention layer is an ordinary KV-cache layer). The real start: noonghunna/club-3090
issue #642 (vLLM on 2 x RTX 3090, Qwen3.6-27B AutoRound int4, the project's "dual" configuration):
"Available KV cache memory: 11.05 GiB", "GPU KV cache size: 623,873 tokens", "Maximum concurrency for 262,144
tokens per request: 2.38x"; its flags as the same configuration's logs print them (issues #91, #295:
tensor_parallel_size 2, kv_cache_dtype fp8_e5m2, max_model_len 262144, max_num_batched_tokens 8192,
max_num_seqs 2, enable_prefix_caching True, speculative_config {'method': 'mtp', 'num_speculative_tokens': 3}).
Qwen3.6-27B has Qwen3.5-27B's architecture (16 full-attention and 48 Gated DeltaNet layers).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli import app

runner = CliRunner()
MTP1 = '{"method": "mtp", "num_speculative_tokens": 1}'


def _fit(*args: str) -> dict:
    r = runner.invoke(app, ["fit", *args, "--json"])
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("model, per_token, draft", [
    ("deepseek-v3", 70_272, 1_152),  # 61 + 1 MLA latents of (512 + 64) x 2 B: 71,424 B a token
    ("glm4.7", 376_832, 4_096),  # 92 + 1 layers of 8 KV heads x 128 x 2 x 2 B: 380,928
    ("qwen3-next-80b-a3b", 24_576, 2_048),  # 12 + 1 full-attention layers of 2 heads x 256: 26,624
])
def test_the_mtp_layer_adds_one_layer_of_kv_a_token(model, per_token, draft):
    out = _fit(model, "--gpu", "H200", "-tp", "8", "--max-model-len", "8k", "--speculative-config", MTP1)
    s = out["speculative"]
    assert (s["method"], s["num_speculative_tokens"], s["draft_kv_layers"]) == ("mtp", 1, 1)
    # one GPU of tp 8: MLA latents are whole on every rank; GQA heads split, 2 KV heads replicated to 8 ranks
    tp8 = {"deepseek-v3": (per_token, draft), "glm4.7": (per_token // 8, draft // 8),
           "qwen3-next-80b-a3b": (per_token // 2, draft // 2)}[model]
    assert (s["model_kv_bytes_per_token"], s["draft_kv_bytes_per_token"]) == tp8
    plain = _fit(model, "--gpu", "H200", "-tp", "8", "--max-model-len", "8k")
    assert plain["speculative"] is None and plain["breakdown"]["draft_weights"] == 0
    # the drafter's weights are a line of their own, and the KV memory gives way to them
    assert out["breakdown"]["draft_weights"] == s["draft_weights_bytes"] > 0
    assert out["breakdown"]["weights"] == plain["breakdown"]["weights"]
    assert plain["kv_cache_memory_bytes"] - out["kv_cache_memory_bytes"] == out["breakdown"]["draft_weights"]
    assert out["kv_cache_tokens"] < plain["kv_cache_tokens"]


def test_before_0_16_deepseeks_mtp_layer_loads_its_own_lm_head():
    args = ["deepseek-v3", "--gpu", "H200", "-tp", "8", "--max-model-len", "8k", "--speculative-config", MTP1]
    old = _fit(*args, "--engine", "vllm==0.14.0")["breakdown"]["draft_weights"]
    new = _fit(*args, "--engine", "vllm==0.16.0")["breakdown"]["draft_weights"]
    assert old - new == 129_280 * 7_168 * 2 // 8  # vocab x hidden in bf16, split over tp 8


def test_a_hybrid_models_groups_are_padded_as_vllm_warns():
    """The MTP layer is a 17th full-attention layer: the group size becomes 17 and the 48 GDN layers fill 3 groups
    of 17, the warning vLLM prints (club-3090 #104 and #434, vllm#49011: 'Add 3 padding layers, may waste at most
    6.25% KV cache memory'). Without the drafter 48 is a multiple of 16: no warning."""
    args = ["qwen3.5-27b", "--gpu-memory", "24GiB", "-tp", "2", "--kv-cache-dtype", "fp8_e5m2",
            "--max-model-len", "262144", "--kv-cache-memory-bytes", "11GiB"]
    warned = [n for n in _fit(*args, "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}')["notes"]
              if "padding layers" in n]
    assert len(warned) == 1 and '"Add 3 padding layers, may waste at most 6.25% KV cache memory"' in warned[0]
    assert not [n for n in _fit(*args)["notes"] if "padding layers" in n]


def test_a_real_mtp_start_is_reproduced_from_its_kv_memory():
    args = ["qwen3.5-27b", "--engine", "vllm==0.20.1", "--gpu-memory", "24GiB", "-tp", "2",
            "--kv-cache-dtype", "fp8_e5m2", "--max-model-len", "262144", "--max-num-seqs", "2",
            "--max-num-batched-tokens", "8192", "--kv-cache-memory-bytes", "11.05GiB",
            "--mamba-cache-mode", "align"]  # vLLM sets align where prefix caching is on (models/config.py)
    logged = 623_873
    out = _fit(*args, "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}')
    assert abs(out["logged_kv_cache_tokens"] - logged) / logged < 0.01  # -0.35%
    without = _fit(*args)["logged_kv_cache_tokens"]
    assert (without - logged) / logged > 0.10  # the drafter is what closes the gap (+13.5% without it)


@pytest.mark.parametrize("value, match", [
    ("mtp", "takes a JSON object"),
    ('{"method": "mtp"}', "needs num_speculative_tokens"),
    ('{"num_speculative_tokens": 2}', "needs a method"),
    ('{"method": "mtp", "num_speculative_tokens": 1, "colour": "red"}', "colour is not vLLM's"),
    ('{"method": "mtp", "num_speculative_tokens": 1, "draft_tensor_parallel_size": 1}', "not count yet"),
    ('{"method": "mtp", "num_speculative_tokens": 1, "quantization": "fp8"}', "not count yet"),
    ('{"method": "eagle3", "num_speculative_tokens": 3, "model": "x"}', "unknown model 'x'"),
    ('{"method": "dflash", "num_speculative_tokens": 3}', "not modelled yet"),
])
def test_a_config_kvplan_cannot_plan_is_exit_2_with_why(value, match):
    r = runner.invoke(app, ["fit", "deepseek-v3", "--gpu", "H200", "-tp", "8", "--speculative-config", value])
    assert r.exit_code == 2 and match in r.output and "Traceback" not in r.output


def test_other_engines_say_it_is_vllms():
    r = runner.invoke(app, ["fit", "deepseek-v3", "--engine", "sglang", "--gpu", "H200", "-tp", "8",
                            "--speculative-config", MTP1])
    assert r.exit_code == 2 and "is vLLM's" in r.output


def test_the_text_report_has_a_draft_weights_line():
    r = runner.invoke(app, ["fit", "deepseek-v3", "--gpu", "H200", "-tp", "8", "--max-model-len", "8k",
                            "--speculative-config", MTP1], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert "draft weights" in r.output and "1 MTP layer in the KV cache" in r.output


def test_size_counts_the_drafters_layers():
    args = ["size", "deepseek-v3", "--seq-len", "1k", "--json"]
    plain = json.loads(runner.invoke(app, args).stdout)
    r = runner.invoke(app, [*args, "--speculative-config", MTP1])
    drafted = json.loads(r.stdout)
    assert (plain["bytes_per_token"], drafted["bytes_per_token"]) == (70_272, 71_424)
    assert any("1 MTP layer" in n for n in drafted["notes"])
    hf = runner.invoke(app, ["size", "deepseek-v3", "--engine", "hf", "--speculative-config", MTP1])
    assert hf.exit_code == 2 and "not modelled with this drafter" in hf.output


def test_before_0_16_glms_mtp_layer_loads_its_own_lm_head_too():
    args = ["glm4.7", "--gpu", "H200", "-tp", "8", "--max-model-len", "8k", "--speculative-config", MTP1]
    old = _fit(*args, "--engine", "vllm==0.14.0")["breakdown"]["draft_weights"]
    new = _fit(*args, "--engine", "vllm==0.16.0")["breakdown"]["draft_weights"]
    assert old - new == 151_552 * 5_120 * 2 // 8  # glm4_moe_mtp.py's shared_head.head, split over tp 8


def test_measured_weights_hold_the_drafter_already():
    args = ["qwen3.5-27b", "--gpu", "H100-80GB", "--max-model-len", "32k", "--weights-memory", "52GiB"]
    out = _fit(*args, "--speculative-config", MTP1)
    assert out["breakdown"]["draft_weights"] == 0  # in the measured weights, as vLLM logs them
    assert out["kv_cache_memory_bytes"] == _fit(*args)["kv_cache_memory_bytes"]


def test_size_json_names_the_drafter_and_trtllm_is_refused():
    r = runner.invoke(app, ["size", "deepseek-v3", "--seq-len", "1k", "--speculative-config", MTP1, "--json"])
    assert json.loads(r.stdout)["speculative"] == {"method": "mtp", "num_speculative_tokens": 1, "draft_kv_layers": 1}
    r = runner.invoke(app, ["size", "deepseek-v3", "--engine", "trtllm", "--speculative-config", MTP1])
    assert r.exit_code == 2 and "not modelled with this drafter" in r.output


def test_an_eagle3_head_in_the_kv_cache_and_the_weights():
    """Llama-3.1-8B + an EAGLE-3 head of one layer: 131,072 + 4,096 B a token (docs/research 1.6)."""
    from pathlib import Path

    head = Path(__file__).parent.parent / "fixtures" / "configs" / "eagle3-head-llama3.1-8b.json"
    cfg = json.dumps({"method": "eagle3", "model": str(head), "num_speculative_tokens": 3})
    out = _fit("llama3.1-8b", "--gpu", "H100-80GB", "--speculative-config", cfg)
    s = out["speculative"]
    assert (s["model_kv_bytes_per_token"], s["draft_kv_bytes_per_token"]) == (131_072, 4_096)
    assert out["breakdown"]["draft_weights"] == s["draft_weights_bytes"] > 800_000_000  # ~0.42B parameters in bf16
    sized = json.loads(runner.invoke(app, ["size", "llama3.1-8b", "--seq-len", "1", "--speculative-config", cfg,
                                           "--json"]).stdout)
    assert sized["bytes_per_token"] == 135_168  # 131,072 x (1 + 1/32)
    tp2 = _fit("llama3.1-8b", "--gpu", "H100-80GB", "-tp", "2", "--speculative-config", cfg)
    whole = 2 * (4 * 4096 + 3 * 4096 * 4096) + 8 * 32_000  # fc and the norms, d2t: on every rank
    assert tp2["breakdown"]["draft_weights"] - whole == pytest.approx((out["breakdown"]["draft_weights"] - whole) / 2,
                                                                      abs=2)


@pytest.mark.parametrize("method, why", [
    ("'dflash'", "not modelled yet"),  # a method kvplan does not model (club-3090 #95 and #46 ran dflash)
    ("'eagle3', 'model': '/models/no-such-head'", "no-such-head"),  # a head's config kvplan cannot read here
])
def test_explain_predicts_without_a_drafter_it_cannot_count_and_says_why(tmp_path, method, why):
    from pathlib import Path

    fixture = Path(__file__).parent.parent / "fixtures" / "vllm_logs" / "v1_club3090_dual_qwen36_27b_mtp3.log"
    log = tmp_path / "drafter.log"
    log.write_text(fixture.read_text().replace("'method': 'mtp'", f"'method': {method}"))
    r = runner.invoke(app, ["explain", str(log), "--model", "qwen3.5-27b", "--gpu", "RTX-3090", "--engine",
                            "vllm==0.20.1", "--weight-dtype", "int4-g128", "--json"])
    assert r.exit_code == 0, r.output
    note = next(n for n in json.loads(r.stdout)["notes"] if "speculative_config" in n)
    assert "left out of the prediction" in note and why in note
