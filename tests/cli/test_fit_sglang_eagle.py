"""SGLang EAGLE with a draft checkpoint (--speculative-draft-model-path), against a public start."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.core.units import GiB

runner = CliRunner()

# SGLang's documentation notebook backend/speculative_decoding.ipynb as its CI executed it on 2025-02-14 (the v0.4.3
# release day; the sgl-project.github.io build of commit a302ba48, mirrored in Stars1233/sgl-project.github.io), one
# H100 80GB: `python3 -m sglang.launch_server --model meta-llama/Llama-2-7b-chat-hf --speculative-algo EAGLE
# --speculative-draft lmzheng/sglang-EAGLE-llama2-chat-7B --speculative-num-steps 5 --speculative-eagle-topk 8
# --speculative-num-draft-tokens 64 --mem-fraction 0.7 --cuda-graph-max-bs 32` (its server_args line: tp_size=1,
# max_running_requests=None, max_total_tokens=None, dtype='auto', kv_cache_dtype='auto'). Logged: 'Load weight begin.
# avail mem=78.81 GB', 'Load weight end. type=LlamaForCausalLM, dtype=torch.float16, avail mem=66.15 GB', 'KV Cache
# is allocated. K size: 21.25 GB, V size: 21.25 GB.', the draft's 'Load weight end. type=LlamaForCausalLMEagle' and
# 'KV Cache is allocated. K size: 0.82 GB, V size: 0.82 GB.', 'max_total_num_tokens=87056, ... context_len=4096'.
FLAGS = ("meta-llama/Llama-2-7b-chat-hf", "--gpu", "H100-80GB", "--engine", "sglang==0.4.3",
         "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "lmzheng/sglang-EAGLE-llama2-chat-7B",
         "--speculative-num-steps", "5", "--speculative-eagle-topk", "8", "--speculative-num-draft-tokens", "64",
         "--gpu-memory-utilization", "0.7")


def _fit(*args: str) -> dict:
    r = runner.invoke(app, ["fit", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_eagle_head_on_llama2_matches_the_public_start():
    out = _fit(*FLAGS)
    assert abs(out["kv_cache_tokens"] / 87_056 - 1) < 0.02  # +0.6%
    # the draft's pool: one layer of 32 x 128 fp16 keys and values a token, 'K size: 0.82 GB' (107,636 tokens from
    # the log's own 87,056: 0.8212 GiB); kvplan's 0.8253 carries the target's +0.6%
    draft = out["settings"]["draft_pool_tokens"]
    assert out["settings"]["draft_pool_bytes"] == draft * 2 * 4096 * 2
    assert abs(draft * 4096 * 2 / GiB / 0.82 - 1) < 0.02
    # 0.4.3 (model_runner.py::init_memory_pool): the draft's pool = profiled + requests x steps + 100, requests
    # min(max(87,594 / 4096 x 512, 2048), 4096) = 4096 where --max-running-requests is unset
    assert draft == out["kv_cache_tokens"] + 4096 * 5 + 100
    assert abs(out["breakdown"]["weights"] / GiB / (78.81 - 66.15) - 1) < 0.02
    assert out["breakdown"]["draft_weights"] > 0


def test_later_releases_grow_both_pools():
    """0.4.4 on: both pools hold profiled + requests x (steps x topk + draft tokens) + 100 (they share indices). With
    SGLang's own 4,096 requests that is 425,984 tokens more than the 0.3 reserve holds: 0.4.4 runs out of memory
    after the target's pool; 0.4.5 sets max_running_requests to 48 for EAGLE where it is unset (server_args.py)."""
    profiled = _fit(*FLAGS)["kv_cache_tokens"]
    r = runner.invoke(app, ["fit", *FLAGS[:4], "sglang==0.4.4", *FLAGS[5:], "--json"])
    out = json.loads(r.stdout)
    assert r.exit_code == 1 and out["settings"]["draft_pool_tokens"] == profiled + 4096 * (5 * 8 + 64) + 100
    assert any("runs out of memory after the target's pool" in x for x in out["reasons"])
    out = _fit(*FLAGS[:4], "sglang==0.4.5", *FLAGS[5:])
    assert out["kv_cache_tokens"] == out["settings"]["draft_pool_tokens"] == profiled + 48 * (5 * 8 + 64) + 100


@pytest.mark.parametrize(("args", "says"), [
    (("--speculative-algorithm", "NGRAM", "--speculative-draft-model-path", "lmzheng/sglang-EAGLE-llama2-chat-7B"),
     "goes with EAGLE or EAGLE3"),
    (("--speculative-algorithm", "EAGLE"), "--speculative-draft-model-path"),
    (("--speculative-draft-model-path", "lmzheng/sglang-EAGLE-llama2-chat-7B"), "go with --speculative-algorithm"),
])
def test_draft_checkpoint_flags_are_refused_where_they_do_not_apply(args, says):
    r = runner.invoke(app, ["fit", "llama2-7b", "--gpu", "H100-80GB", "--engine", "sglang==0.4.3", *args])
    assert r.exit_code == 2 and says in r.output, r.output


@pytest.mark.parametrize(("engine", "algorithm", "says"), [
    ("sglang==0.4.6", "EAGLE3", "loads an EAGLE-3 head"),  # an EAGLE-1 head under EAGLE3
    ("sglang==0.4.4", "EAGLE3", "no EAGLE3 (from 0.4.5)"),
])
def test_a_head_and_its_algorithm_must_agree(engine, algorithm, says):
    r = runner.invoke(app, ["fit", "llama2-7b", "--gpu", "H100-80GB", "--engine", engine, "--speculative-algorithm",
                            algorithm, "--speculative-draft-model-path", "lmzheng/sglang-EAGLE-llama2-chat-7B"])
    assert r.exit_code == 2 and says in r.output, r.output


def test_a_head_of_another_width_names_sglang():
    r = runner.invoke(app, ["fit", "deepseek-v3", "--gpu", "H200", "-tp", "8", "--engine", "sglang",
                            "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path",
                            "lmzheng/sglang-EAGLE-llama2-chat-7B"])
    assert r.exit_code == 2 and "SGLang shares" in r.output, r.output
