"""`kvplan fit --engine sglang --speculative-algorithm`: SGLang's draft pool and reserve by release
(docs/research/spec-decode-lora.md, section 2: 0.4.6 and 0.5.6 model_runner.py::init_memory_pool, 0.5.7
model_runner_kv_cache_mixin.py, server_args.py's reserve in 0.4.9, 0.5.6 and 0.5.10; read again for this test in
0.5.6, 0.5.7 and 0.5.10)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli import app

runner = CliRunner()
MiB = 1 << 20
H200_MIB = 143_156  # the catalog's H200 (torch's total), the memory the default fraction divides


def _fit(release: str, *args: str) -> dict:
    r = runner.invoke(app, ["fit", "deepseek-v3", "--engine", f"sglang=={release}", "--gpu", "H200", "-tp", "8",
                            *args, "--json"])
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize("release, extra", [
    ("0.4.6", 48 * (3 * 1 + 4) + 100),  # both pools: profiled + max_running_requests (48) x (steps x topk + drafts)
    ("0.5.3", 48 * (3 * 1 + 4) + 100),
    ("0.5.7", 0),  # from 0.5.7 both pools hold the profiled count
    ("0.5.10", 0),
])
def test_the_pools_by_release(release, extra):
    out = _fit(release, "--speculative-algorithm", "NEXTN", "--gpu-memory-utilization", "0.85")
    plain = _fit(release, "--gpu-memory-utilization", "0.85")
    assert out["kv_cache_tokens"] == plain["kv_cache_tokens"] + extra  # the target's pool, as SGLang logs it
    assert out["settings"]["draft_pool_tokens"] == out["kv_cache_tokens"]
    draft_bytes = out["settings"]["draft_pool_tokens"] * 1152  # one MLA latent (512 + 64) x 2 B, whole on each rank
    target_extra = extra * 61 * 1152
    assert out["settings"]["draft_pool_bytes"] == draft_bytes + target_extra
    # the draft's weights are a line of their own; at a given fraction the target's budget does not pay for them
    assert out["breakdown"]["draft_weights"] > 0 and out["kv_cache_memory_bytes"] == plain["kv_cache_memory_bytes"]


@pytest.mark.parametrize("release, mib", [("0.4.6", 0), ("0.4.8", 2048), ("0.5.3", 2048),
                                          ("0.5.10", 4096 - 1536)])  # 0.5.10: no piecewise graphs (1.5 GiB, MLA)
def test_the_default_fraction_holds_back_the_draft(release, mib):
    out = _fit(release, "--speculative-algorithm", "NEXTN")["settings"]["mem_fraction_static"]
    plain = _fit(release)["settings"]["mem_fraction_static"]
    assert out == pytest.approx(plain - mib / H200_MIB, abs=0.0011)  # both rounded to 3 places


def test_ngram_has_no_draft_and_no_reserve_but_no_piecewise_graphs_either():
    """0.5.10's _handle_piecewise_cuda_graph turns them off for any speculative algorithm (server_args.py)."""
    out = _fit("0.5.10", "--speculative-algorithm", "NGRAM")
    plain = _fit("0.5.10")["settings"]["mem_fraction_static"]
    assert out["settings"]["mem_fraction_static"] == pytest.approx(plain + 1536 / H200_MIB, abs=0.0011)
    assert "draft_pool_tokens" not in out["settings"] and out["breakdown"]["draft_weights"] == 0


def test_sglang_0_5_14_is_refused_and_an_unpinned_release_says_which_rules():
    r = runner.invoke(app, ["fit", "deepseek-v3", "--engine", "sglang==0.5.14", "--gpu", "H200", "-tp", "8",
                            "--speculative-algorithm", "NEXTN"])
    assert r.exit_code == 2 and "counts the draft in the static budget" in r.output
    notes = _fit_any("--engine", "sglang", "--speculative-algorithm", "NEXTN")["notes"]
    assert any("0.5.14 and later count the draft" in n for n in notes)


def _fit_any(*args: str) -> dict:
    r = runner.invoke(app, ["fit", "deepseek-v3", "--gpu", "H200", "-tp", "8", *args, "--json"])
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


def test_a_draft_the_reserve_cannot_hold_does_not_fit():
    out = _fit("0.5.10", "--speculative-algorithm", "NEXTN", "--gpu-memory-utilization", "0.99")
    assert not out["fits"] and "SGLang runs out of memory after the target's pool" in out["reasons"][0]
    assert _fit("0.5.10", "--gpu-memory-utilization", "0.99")["fits"]


@pytest.mark.parametrize("args, match", [
    (["--speculative-algorithm", "EAGLE3"], "not counted yet"),
    (["--speculative-algorithm", "MEDUSA"], "SGLang's are"),
    (["--speculative-num-steps", "3"], "go with --speculative-algorithm"),
    (["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "0"], "must be at least 1"),
    (["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'], "SGLang takes --speculative-algorithm"),
])
def test_what_cannot_be_planned_is_exit_2(args, match):
    r = runner.invoke(app, ["fit", "deepseek-v3", "--engine", "sglang", "--gpu", "H200", "-tp", "8", *args])
    assert r.exit_code == 2 and match in r.output and "Traceback" not in r.output


def test_vllm_refuses_sglangs_flag():
    r = runner.invoke(app, ["fit", "deepseek-v3", "--gpu", "H200", "-tp", "8", "--speculative-algorithm", "NEXTN"])
    assert r.exit_code == 2 and "vLLM takes --speculative-config" in r.output
