"""The vLLM scheduler request sets and the fixtures vLLM recorded for them are whole and agree with each other.

tests/fixtures/vllm_scheduler/: <name>.requests.json (written by tools/vllm_reference/make_request_sets.py) and
<name>.vllm-<version>.json (written by tools/vllm_reference/run.py driving vLLM's own Scheduler). No vLLM
here: these checks read JSON and kvplan's bundled model specs only, so a hand-edited or truncated fixture, a
request set regenerated without re-recording, or a harness bookkeeping slip fails in CI.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvplan.core.profiles import Version
from kvplan.core.spec import LayerKind
from kvplan.io.models import load_model

DIR = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_scheduler"
REQUEST_SETS = sorted(DIR.glob("*.requests.json"))
FIXTURES = sorted(DIR.glob("*.vllm-*.json"))
FIXTURE_NAME = re.compile(r"^(?P<set>.+)\.vllm-(?P<version>\d+\.\d+\.\d+)\.json$")
SCHEDULER_KEYS = {"block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "enable_prefix_caching",
                  "long_prefill_token_threshold", "max_num_partial_prefills", "async_scheduling"}
GROUP_KINDS = {"full", "sliding_window", "chunked_local", "mla", "mamba"}
MAX_FIXTURE_BYTES = 300 * 1024


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _prompt_len(r: dict) -> int:
    return sum(n for _, n in r["prompt"])


def _expand(rle: list[list[int]]) -> list[int]:
    return [v for v, n in rle for _ in range(n)]


def _request_set_of(fixture_path: Path) -> dict:
    m = FIXTURE_NAME.match(fixture_path.name)
    assert m, f"{fixture_path.name}: fixture names are <set>.vllm-<x.y.z>.json"
    return _load(DIR / f"{m['set']}.requests.json")


def test_there_are_request_sets_and_fixtures() -> None:
    assert len(REQUEST_SETS) >= 8
    assert FIXTURES


@pytest.mark.parametrize("path", REQUEST_SETS, ids=lambda p: p.name)
def test_request_set_parses(path: Path) -> None:
    rs = _load(path)
    assert rs["name"] == path.name.removesuffix(".requests.json")
    assert rs["description"]
    assert (rs["model"] is None) != (rs["model_config"] is None), "exactly one of model / model_config"
    if rs["model"]:
        load_model(rs["model"])
    assert rs["tp"] >= 1 and rs["num_gpu_blocks"] > 1
    s = rs["scheduler"]
    # pipeline parallelism's sets add their stages (and the V2 model runner where async)
    assert SCHEDULER_KEYS <= set(s) <= SCHEDULER_KEYS | {"pipeline_parallel_size", "v2_model_runner"}
    assert s["max_num_batched_tokens"] > 0 and s["max_num_seqs"] > 0 and s["block_size"] > 0
    assert 0 <= s["long_prefill_token_threshold"] <= s["max_model_len"]
    ids = [r["id"] for r in rs["requests"]]
    assert len(ids) == len(set(ids)), "request ids are unique"
    arrivals = [r["arrival_step"] for r in rs["requests"]]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 0, "requests are listed in arrival order"
    for r in rs["requests"]:
        assert r["prompt"] and all(seg > 0 and n > 0 for seg, n in r["prompt"])
        out_seg, out_len = r["output"]
        assert out_seg > 0 and out_len > 0
        assert _prompt_len(r) + out_len <= s["max_model_len"], f"request {r['id']} would be cut by max_model_len"


def test_request_sets_cover_what_the_issue_asks() -> None:
    sets = [_load(p) for p in REQUEST_SETS]
    long = [rs for rs in sets if any(_prompt_len(r) > rs["scheduler"]["max_num_batched_tokens"] for r in rs["requests"])]
    assert long, "a set with prompts longer than the token budget (chunked prefill)"
    assert any(rs["scheduler"]["enable_prefix_caching"] for rs in sets)
    assert any(rs["scheduler"]["long_prefill_token_threshold"] for rs in sets)
    multi_turn = [rs for rs in sets if any(len(r["prompt"]) >= 4 for r in rs["requests"])]
    assert multi_turn, "a multi-turn set (history + answer + new message segments)"
    kinds = {g["kind"] for fx in (_load(p) for p in FIXTURES) for g in fx["kv_cache"]["groups"]}
    assert {"full", "sliding_window", "mamba", "mla"} <= kinds


def test_multi_turn_prompts_extend_the_previous_turn() -> None:
    """Turn k's prompt is turn k-1's prompt + its output segment + a new message, so prefix caching can hit it."""
    rs = _load(DIR / "multi-turn-pc.requests.json")
    by_prefix = {tuple(map(tuple, r["prompt"])): r for r in rs["requests"]}
    followers = 0
    for r in rs["requests"]:
        prompt = [tuple(x) for x in r["prompt"]]
        if len(prompt) >= 4:
            prev = by_prefix.get(tuple(prompt[:-2]))
            assert prev is not None, f"request {r['id']}: no earlier turn is its prefix"
            assert prompt[-2] == tuple(prev["output"])
            assert prev["arrival_step"] < r["arrival_step"]
            followers += 1
    assert followers > 100


def test_every_request_set_has_a_fixture() -> None:
    recorded = {FIXTURE_NAME.match(p.name)["set"] for p in FIXTURES}
    assert recorded == {p.name.removesuffix(".requests.json") for p in REQUEST_SETS}


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_fixture_agrees_with_its_request_set(path: Path) -> None:
    assert path.stat().st_size <= MAX_FIXTURE_BYTES
    fx = _load(path)
    rs = _request_set_of(path)
    s = rs["scheduler"]
    m = fx["metrics"]
    assert fx["request_set"] == rs["name"]
    assert fx["vllm_version"] == FIXTURE_NAME.match(path.name)["version"]
    assert fx["config_set_by_harness"]["async_scheduling"] is s["async_scheduling"]  # as the set asked
    in_flight = fx["config_set_by_harness"]["max_in_flight_tokens"]  # VllmConfig.max_in_flight_tokens, 0.26.0+
    if Version.parse(fx["vllm_version"]) < Version.parse("0.26.0"):
        assert in_flight is None
    else:
        # VllmConfig.max_concurrent_batches: pp + 1 async on the V2 model runner, 2 async at pp 1, else pp
        pp, v2 = s.get("pipeline_parallel_size", 1), s.get("v2_model_runner", False)
        batches = (pp + 1 if v2 else 2) if s["async_scheduling"] else pp
        assert in_flight == s["max_num_batched_tokens"] * batches
        assert fx["config_set_by_harness"].get("batches_in_flight", batches) == batches

    # the pool and its groups: every cache-holding layer of the model is in exactly one group
    kv = fx["kv_cache"]
    assert kv["num_blocks"] == rs["num_gpu_blocks"]
    assert kv["groups"] and all(g["kind"] in GROUP_KINDS for g in kv["groups"])
    if rs["model"]:
        model = load_model(rs["model"])
        held = [layer for layer in model.layers if layer.kind is not LayerKind.NONE]
        assert sum(g["num_layers"] for g in kv["groups"]) == len(held)
        by_kind = {"full": LayerKind.FULL, "sliding_window": LayerKind.SLIDING, "chunked_local": LayerKind.CHUNKED,
                   "mla": LayerKind.MLA, "mamba": LayerKind.LINEAR}
        for kind, layer_kind in by_kind.items():
            assert sum(g["num_layers"] for g in kv["groups"] if g["kind"] == kind) == sum(
                1 for layer in held if layer.kind is layer_kind), kind
    attention_blocks = {g["block_size"] for g in kv["groups"] if g["kind"] != "mamba"}
    assert min(attention_blocks) >= s["block_size"] and all(b % s["block_size"] == 0 for b in attention_blocks)
    if fx["error"] is not None:  # vLLM itself failed partway (0.20.0 on a dry pool): the rest is incomplete
        assert fx["error"].startswith("vLLM raised ") and fx["metrics"]["steps"] > 0
        return

    # requests: the same ids, the same token counts
    reqs = {r["id"]: r for r in rs["requests"]}
    per = fx["per_request"]
    assert set(per) == set(reqs)
    assert m["prompt_tokens"] == sum(_prompt_len(r) for r in reqs.values())
    assert m["generated_tokens"] == sum(r["output"][1] for r in reqs.values())
    assert m["cached_tokens"] == sum(p["num_cached_tokens"] for p in per.values())
    assert m["prefix_hit_rate"] == pytest.approx(m["cached_tokens"] / m["prompt_tokens"])
    assert m["preemptions"] == sum(p["num_preemptions"] for p in per.values())
    if not s["enable_prefix_caching"]:
        assert m["cached_tokens"] == 0
    for rid, p in per.items():
        r = reqs[rid]
        assert r["arrival_step"] <= p["first_scheduled_step"] <= p["first_token_step"] <= p["finish_step"] <= m["last_step"]
        # a hit is whole blocks and never the whole prompt (vLLM recomputes at least the last token)
        assert p["num_cached_tokens"] % kv["hash_block_size"] == 0 and p["num_cached_tokens"] < _prompt_len(r)
        if p["num_preemptions"] == 0:
            # one step for each output token after the first, at least
            assert p["finish_step"] - p["first_token_step"] >= r["output"][1] - 1

    # tokens the model ran: each prompt token not found in the cache once, each output token but the last
    # once; preemption recomputes more
    floor = m["prompt_tokens"] - m["cached_tokens"] + m["generated_tokens"] - len(reqs)
    if m["preemptions"] == 0:
        assert m["scheduled_tokens"] == floor
    else:
        assert m["scheduled_tokens"] > floor - m["cached_tokens"]

    # per-step records, where kept, reproduce the summary metrics
    if "per_step" in fx:
        running = _expand(fx["per_step"]["running"])
        usage = _expand(fx["per_step"]["kv_usage_permille"])
        tokens = _expand(fx["per_step"]["scheduled_tokens"])
        assert len(running) == len(usage) == len(tokens) == m["steps"]
        assert sum(tokens) == m["scheduled_tokens"]
        assert max(tokens) <= s["max_num_batched_tokens"]
        assert max(running) == m["peak_running"] <= s["max_num_seqs"]
        assert sum(running) / len(running) == pytest.approx(m["mean_running"])
        assert sum(usage) / len(usage) / 1000 == pytest.approx(m["mean_kv_usage"], abs=5e-4)
    assert 0 < m["mean_running"] <= m["peak_running"] <= s["max_num_seqs"]
    assert 0 <= m["mean_kv_usage"] <= m["peak_kv_usage"] <= 1
