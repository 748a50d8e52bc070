"""vLLM's own KV-planning unit tests, as data (tests/fixtures/vllm_planning), run through kvplan.

Each case holds the inputs of one vLLM test (vllm-0.11.0 tests/v1/core/test_kv_cache_utils.py; vllm-0.33.0
test_kv_cache_planning.py, test_kv_cache_utils.py, test_swa_inflight_window_free.py) and only the values
that test asserts. The layers are built with kvplan's own spec types, planned with the rules of the
release's profile, and compared with ``expected`` as written: nothing here recomputes an expectation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvplan.core.engines.vllm.budget import (
    attention_page_bytes,
    check_layout_dtype,
    estimate_max_model_len,
    layout_from_groups,
    logged_kv_cache_tokens,
    max_concurrency,
    plan_vllm,
)
from kvplan.core.dtypes import get_dtype
from kvplan.core.profiles import parse_engine
from kvplan.core.spec import Layer, LayerKind, LinearLayer
from kvplan.errors import ConfigError
from tests.factories import make_attention

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_planning"
# What a sliding/chunked layer admits where a case does not say: none of those cases asserts a value that
# depends on it (their layers are full attention, or windows of 1 in a 16-token model).
UNSTATED_IN_FLIGHT = 8192


def load_cases() -> list:
    cases = []
    for path in sorted(FIXTURES.glob("vllm-*.json")):
        for case in json.loads(path.read_text(encoding="utf-8")):
            cases.append(pytest.param(case, id=f"{case['vllm_version']}:{case['test']}"))
    return cases


CASES = load_cases()


def test_every_fixture_case_is_collected():
    # 14 cases from 0.11.0 and 28 from 0.33.0: a case dropped from the files (or not read) fails here.
    versions = [c.values[0]["vllm_version"] for c in CASES]
    assert (versions.count("0.11.0"), versions.count("0.33.0")) == (14, 28)


def profile_of(case: dict):
    # 0.11.0 has its own profile; 0.33.0 resolves to the newest, 0.31.0.
    return parse_engine(f"vllm=={case['vllm_version']}").profile


def kv_dtype_of(spec: dict) -> str:
    return spec.get("kv_cache_dtype") or spec["dtype"]


def layer_of(spec: dict) -> Layer:
    """One vLLM KV-cache spec as a kvplan layer."""
    kind = spec["type"]
    if kind == "mamba":
        # MambaSpec shapes: conv state (kernel - 1, channels), SSM state; kvplan keeps kernel - 1 columns.
        (conv_width, channels), ssm = spec["shapes"]
        state = 1
        for dim in ssm:
            state *= dim
        return LinearLayer(family="mamba2", conv_channels=channels, conv_kernel=conv_width + 1, state_elems=state,
                           num_heads=1)
    heads, head = spec["num_kv_heads"], spec["head_size"]
    if kind == "full_attention":
        return make_attention(num_kv_heads=heads, head_dim=head)
    if kind == "sliding_window":
        return make_attention(num_kv_heads=heads, head_dim=head, kind=LayerKind.SLIDING, window=spec["sliding_window"])
    if kind == "chunked_local":
        return make_attention(num_kv_heads=heads, head_dim=head, kind=LayerKind.CHUNKED,
                              window=spec["attention_chunk_size"])
    raise AssertionError(f"no kvplan layer for vLLM spec type {kind!r}")


def layers_of(inputs: dict) -> list[Layer]:
    return [layer_of(spec) for spec in inputs["layers"] for _ in range(spec["count"])]


def model_dtype_of(inputs: dict) -> str:
    """The cases' states are in the layers' dtype (all layers of a case share it)."""
    specs = inputs["layers"] if "layers" in inputs else inputs.get("kv_cache_groups") or [inputs["spec"]]
    dtypes = {s.get("dtype") or s["dtypes"][0] for s in specs}
    assert len(dtypes) <= 1
    return dtypes.pop() if dtypes else "float32"


def block_size_of(inputs: dict) -> int | None:
    sizes = {s["block_size"] for s in inputs.get("layers", [])}
    return sizes.pop() if len(sizes) == 1 else None


def plan(case: dict, *, available: int | None = None, **kw):
    inputs = case["inputs"]
    auto = inputs.get("max_model_len_arg") == -1
    max_len = inputs["max_model_len_derived"] if auto else inputs["max_model_len"]
    args = dict(
        model_dtype=model_dtype_of(inputs),
        in_flight_tokens=inputs.get("max_in_flight_tokens") or inputs.get("max_num_batched_tokens")
        or UNSTATED_IN_FLIGHT,
        block_size=block_size_of(inputs), num_gpu_blocks_override=inputs.get("num_gpu_blocks_override"),
        disable_hybrid=inputs.get("disable_hybrid_kv_cache_manager", False), auto_fit=auto,
        mamba_cache_mode=next((s["mamba_cache_mode"] for s in inputs["layers"] if s["type"] == "mamba"), "none"),
        num_speculative_tokens=next((s["num_speculative_blocks"] for s in inputs["layers"] if s["type"] == "mamba"), 0))
    args.update(kw)
    return plan_vllm(layers_of(inputs), inputs["available_memory_bytes"] if available is None else available, max_len,
                     profile_of(case), **args)


def accepted(outcome: str) -> bool:
    """vLLM's outcome as a verdict: accepted, or refused at startup ("ValueError matching 'max seq len'",
    the error check_enough_kv_cache_memory raises)."""
    if outcome == "accepted":
        return True
    assert outcome == "ValueError matching 'max seq len'", outcome
    return False


@pytest.mark.parametrize("case", CASES)
def test_vllm_planning_case(case):
    inputs, expected = case["inputs"], case["expected"]
    profile = profile_of(case)
    checked = set()

    if "estimated_max_model_len" in expected:
        # vLLM's test calls estimate_max_model_len directly, on the whole memory (no null block).
        layout = plan(case).layout
        got = estimate_max_model_len(layout, inputs["available_memory_bytes"], inputs["max_model_len"],
                                     inputs["max_num_batched_tokens"])
        assert got == expected["estimated_max_model_len"]
        checked.add("estimated_max_model_len")

    if "max_concurrency" in expected:
        groups = inputs["kv_cache_groups"]
        layout = layout_from_groups([(layer_of(g), g["layers"]) for g in groups],
                                    kv_dtype=get_dtype(model_dtype_of(inputs)), block_size=groups[0]["block_size"])
        in_flight = inputs.get("max_in_flight_tokens") or inputs["max_num_batched_tokens"]
        conc = max_concurrency(layout, inputs["num_blocks"], inputs["max_model_len"], in_flight)
        assert conc == pytest.approx(expected["max_concurrency"])
        checked.add("max_concurrency")
        if "kv_cache_size_tokens" in expected:
            logged, _ = logged_kv_cache_tokens(profile.rules, inputs["num_blocks"], layout, conc,
                                               inputs["max_model_len"])
            assert logged == expected["kv_cache_size_tokens"]
            checked.add("kv_cache_size_tokens")

    if "max_admission_blocks_per_request" in expected:
        spec = inputs["spec"]
        p = plan_vllm([layer_of(spec)], 0, inputs["max_model_len"], profile, model_dtype=spec["dtype"],
                      in_flight_tokens=inputs["max_in_flight_tokens"], block_size=spec["block_size"])
        assert p.blocks_per_request == expected["max_admission_blocks_per_request"]
        checked.add("max_admission_blocks_per_request")

    if "page_size_bytes" in expected:
        spec = inputs["spec"]
        dtype = get_dtype(kv_dtype_of(spec))
        check_layout_dtype(profile.rules, dtype, profile.version)  # the release has the format
        page = attention_page_bytes(layer_of(spec), dtype, spec["block_size"],
                                    page_size_padded=spec.get("page_size_padded"))
        assert page == expected["page_size_bytes"]
        checked.add("page_size_bytes")

    if "num_blocks" in expected:
        p = plan(case)
        assert p.num_blocks == expected["num_blocks"]
        checked.add("num_blocks")
        if "num_kv_cache_groups" in expected:
            assert p.num_groups == expected["num_kv_cache_groups"]
            checked.add("num_kv_cache_groups")
        if "tensor_sizes_bytes" in expected:
            assert list(p.tensor_bytes) == expected["tensor_sizes_bytes"]
            checked.add("tensor_sizes_bytes")
        if "group_spec" in expected:
            # "full_attention with sliding_window=1 recorded": the sliding layer is planned as full attention.
            assert expected["group_spec"].startswith("full_attention")
            assert [b.kind for b in p.layout.buckets] == [LayerKind.FULL]
            checked.add("group_spec")

    if "error" in expected:
        assert plan(case).fits is accepted(expected["error"])
        checked.add("error")

    if "results" in expected:
        for available, outcome in zip(inputs["available_memory_bytes_cases"], expected["results"], strict=True):
            assert plan(case, available=available).fits is accepted(outcome)
        checked.add("results")

    if "max_model_len" in expected:
        p = plan(case)
        assert p.fits and p.max_model_len == expected["max_model_len"]
        checked.add("max_model_len")

    if "max_model_len_range" in expected:
        low, high = expected["max_model_len_range"]
        p = plan(case)
        assert p.fits and low <= p.max_model_len <= high
        checked.add("max_model_len_range")

    assert checked == set(expected), f"expected values no assertion covered: {set(expected) - checked}"


# The same cases under the releases around each rule they exercise: the rule, not a constant, decides.

def case_named(version: str, test: str) -> dict:
    return next(c.values[0] for c in CASES if c.values[0]["vllm_version"] == version and c.values[0]["test"] == test)


def with_version(case: dict, version: str) -> dict:
    return {**case, "vllm_version": version}


def test_the_null_block_rule_begins_at_0_29():
    exact = case_named("0.33.0", "null_block_reject_exact_fit_memory")
    assert plan(with_version(exact, "0.28.0")).fits  # 32 blocks of memory hold a 512-token request before 0.29
    assert not plan(with_version(exact, "0.29.0")).fits


def test_the_override_drives_the_fit_check_from_0_20_1():
    case = case_named("0.33.0", "check_enough_respects_override")
    assert plan(with_version(case, "0.20.0")).fits  # the memory is checked: 32 MiB hold 16384 tokens
    assert not plan(with_version(case, "0.20.1")).fits
    assert plan(with_version(case, "0.20.1")).num_blocks == plan(with_version(case, "0.20.0")).num_blocks == 32


def test_one_type_with_different_pages_is_one_group_from_0_11():
    case = case_named("0.11.0", "one_worker_uniform_type_different_head_sizes")
    before = plan(with_version(case, "0.10.2"))  # no UniformTypeKVCacheSpecs: pages unified, two groups
    assert before.num_groups == 2 and before.num_blocks == 1572864 // 32768


def test_auto_fit_needs_0_14():
    case = case_named("0.33.0", "auto_fit_reserves_null_block")
    assert plan(with_version(case, "0.14.0")).max_model_len == 1024  # no null block before 0.29: all 64 blocks
    with pytest.raises(ConfigError, match="auto-fit"):
        plan(with_version(case, "0.13.0"))


def test_mamba_align_mode_holds_one_more_block():
    case = case_named("0.33.0", "auto_fit_hybrid_mamba")
    none, align = plan(case), plan(case, mamba_cache_mode="align")
    mamba = [[b.state_blocks for b in p.layout.buckets if b.kind is LayerKind.LINEAR] for p in (none, align)]
    assert mamba == [[1 + 2], [2 + 2]]  # 1 (none) or 2 (align) + num_speculative_blocks 2
    assert (none.max_model_len, align.max_model_len) == (1024, 1024 - 16)  # one attention block fewer
    with pytest.raises(ConfigError, match="mamba-cache-mode"):
        plan(with_version(case, "0.14.0"), mamba_cache_mode="align")
