"""Engine profiles: releases resolve to the right rules, and each profile says what changed, with a source."""

from __future__ import annotations

import re

import pytest

from kvplan.core.profiles import Version, parse_engine, registry
from kvplan.core.engines.vllm.profiles import VLLM_PROFILES, batch_defaults, capture_sizes, for_log
from kvplan.core.gpus import GPUSpec
from kvplan.errors import InputError

GiB = 1 << 30


@pytest.mark.parametrize("text,parts", [("0.8.5.post1", (0, 8, 5)), ("0.7.3.dev233+gad5a35c2", (0, 7, 3)),
                                        ("0.8.2+cu124", (0, 8, 2)), ("v0.11.0", (0, 11)), ("1.0", (1,))])
def test_versions_read_like_pip_prints_them(text, parts):
    assert Version.parse(text).parts == parts


@pytest.mark.parametrize("asked,profile", [
    ("0.6.3", "0.6.2"), ("0.6.4", "0.6.4"), ("0.6.5", "0.6.5"), ("0.6.6", "0.6.6"), ("0.7.3", "0.7.0"),
    ("0.8.3", "0.8.0"), ("0.9.2", "0.9.1"),
    ("0.10.1", "0.10.0"), ("0.11.0", "0.11.0"), ("0.18.1", "0.18.0"), ("0.19.1", "0.19.0"), ("0.20.0", "0.20.0"),
    ("0.20.1", "0.20.1"), ("0.20.2", "0.20.2"), ("0.22.1", "0.20.2"), ("0.28.1", "0.28.0"), ("0.30.0", "0.30.0"), ("0.30.1", "0.30.0"),
    ("0.31.2", "0.31.0"), ("0.33.0", "0.32.0"),
])
def test_a_release_gets_the_newest_profile_at_or_below_it(asked, profile):
    choice = parse_engine(f"vllm=={asked}")
    assert choice.version == profile
    assert (choice.note is None) == (asked == profile)


def test_the_issue_turning_points_as_verified():
    def rules(v: str):
        return parse_engine(f"vllm=={v}").profile.rules

    assert rules("0.19.1").cuda_graphs == "estimated_not_subtracted" and rules("0.19.1").default_utilization == 0.9
    assert rules("0.20.0").cuda_graphs == "subtracted" and rules("0.20.0").default_utilization == 0.92
    assert rules("0.17.1").cuda_graphs == "after_kv"
    assert rules("0.20.0").capacity_log == "blocks_per_group" and rules("0.20.1").capacity_log == "concurrency_x_len"
    assert not rules("0.25.1").in_flight_admission and rules("0.26.0").in_flight_admission
    assert not rules("0.28.0").null_block_in_fit and rules("0.29.0").null_block_in_fit
    assert not rules("0.10.1").kv_cache_memory_bytes and rules("0.10.2").kv_cache_memory_bytes
    assert [rules(v).budget for v in ("0.6.3", "0.6.4", "0.6.5", "0.8.0", "0.9.1", "0.27.0")] == [
        "free_delta", "device_used", "components", "device_used", "components", "consumed"]


def test_no_version_is_the_newest_profile_and_says_so():
    choice = parse_engine("vllm")
    assert choice.profile is VLLM_PROFILES[-1]
    assert "newest" in choice.note and "--engine vllm==X.Y.Z" in choice.note


@pytest.mark.parametrize("text,message", [
    ("vllm==0.5.4", "older than the oldest profile"), ("tgi", "unknown engine 'tgi'"),
    ("ideal==1.0", "no releases to pin"), ("vllm==latest", "cannot read a release number"),
    ("vllm 0.11", "write NAME or NAME==VERSION"),
])
def test_bad_engine_pins_are_input_errors(text, message):
    with pytest.raises(InputError, match=message):
        parse_engine(text)


def test_a_release_newer_than_any_read_is_assumed_unchanged_and_said():
    choice = parse_engine("sglang==0.5.23")
    assert choice.version == "0.5.10" and "newer than 0.5.10" in choice.note


def test_every_profile_cites_its_source():
    for engine, profiles in registry().profiles.items():
        assert profiles, engine
        for p in profiles:
            assert p.changes, (engine, p.version)
            # a release number and a file (or module) named in each profile's changes
            assert any(re.search(r"\d+\.(\d+|x).*[a-z_]+(\.py|/)", c) for c in p.changes), (engine, p.version, p.changes)


def test_profiles_chain_without_gaps():
    for profiles in registry().profiles.values():
        for a, b in zip(profiles, profiles[1:]):
            assert a.until == b.since and a.since < b.since
        assert profiles[-1].until is None


@pytest.mark.parametrize("version,seqs,tokens,sizes", [
    ("0.6.5", 256, 4096, 35),     # V0: 1, 2, 4 and every 8 up to 256
    ("0.9.0", 1024, 8192, 67),    # 1, 2, 4, 8..512 step 8
    ("0.10.0", 256, 8192, 67),    # min(2 x 256, 512) = 512
    ("0.10.0", 64, 8192, 19),     # up to 128
    ("0.11.1", 256, 8192, 51),    # step 16 from 256 (3 + 31 + 17), as logged in 0.11+ with max_num_seqs 256
    ("0.11.1", 1024, 2048, 51),   # capped by max_num_batched_tokens only above 512
])
def test_captured_cuda_graph_sizes(version, seqs, tokens, sizes):
    rules = parse_engine(f"vllm=={version}").profile.rules
    assert len(capture_sizes(rules, max_num_seqs=seqs, max_num_batched_tokens=tokens)) == sizes


@pytest.mark.parametrize("version,gpu,memory_gib,expected", [
    ("0.8.0", "L40S", 44.5, (2048, 1024)), ("0.8.4", "L40S", 44.5, (2048, 256)), ("0.8.4", "H100-80GB", 79.2, (8192, 1024)),
    ("0.9.0", "A100-80GB", 79.2, (2048, 256)), ("0.9.0", "H100-80GB", 79.2, (8192, 1024)),
    ("0.28.0", "B200", 178.4, (16384, 1024)), ("0.27.0", "B200", 178.4, (8192, 1024)),
])
def test_batch_defaults_by_release_and_gpu(version, gpu, memory_gib, expected):
    rules = parse_engine(f"vllm=={version}").profile.rules
    spec = GPUSpec(name=gpu, memory_bytes=int(memory_gib * GiB))
    assert batch_defaults(rules, spec, 8192) == expected


def test_a_log_picks_its_release_and_a_v0_log_in_a_v1_era_gets_v0_rules():
    profile, note = for_log("0.8.2+cu124", "V0")
    assert profile.version == "0.8.0" and not profile.rules.v1 and profile.rules.cuda_graphs == "after_kv"
    assert note is None
    profile, note = for_log(None, "V1")
    assert profile is VLLM_PROFILES[-1] and "prints no vLLM version" in note


def test_engines_built_without_a_profile_follow_the_newest():
    """get_engine("hf") (no profile) and get_engine("hf", profile=newest) are the same rules: the class defaults
    cannot drift from the newest profile."""
    from kvplan.core.engines import get_engine

    for name in ("hf", "vllm", "sglang", "trtllm"):
        assert get_engine(name) == get_engine(name, profile=registry().newest(name)), name


@pytest.mark.parametrize("version,architectures,moe,hybrid,v2", [
    ("0.25.0", ("LlamaForCausalLM",), False, False, False),  # before 0.26 the plan reads no runner: V1 recorded
    ("0.26.0", ("Gemma3ForConditionalGeneration",), False, False, True),  # neither MoE nor hybrid
    ("0.26.0", ("GptOssForCausalLM",), True, False, False),  # a MoE off the list
    ("0.26.0", ("Qwen2MoeForCausalLM",), True, False, True),  # a MoE on DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES
    ("0.26.0", ("NemotronHForCausalLM",), False, True, False),  # hybrid (Mamba)
    ("0.27.0", ("KimiK3ForConditionalGeneration",), True, False, True),
    ("0.28.0", ("DeepseekV4ForCausalLM",), True, False, True),
    ("0.29.0", ("GptOssForCausalLM",), True, False, True),  # every model
    ("0.33.0", ("NemotronHForCausalLM",), False, True, True),
])
def test_the_v2_model_runner_by_release(version, architectures, moe, hybrid, v2):
    """vllm/config/vllm.py::VllmConfig.use_v2_model_runner, _is_default_v2_model_runner_model (0.26.0-0.28.0)."""
    rules = parse_engine(f"vllm=={version}").profile.rules
    assert rules.runs_v2(architectures=architectures, moe=moe, hybrid=hybrid) is v2


@pytest.mark.parametrize("pp,async_,v2,batches", [
    (1, False, True, 1), (1, True, False, 2), (1, True, True, 2), (2, True, False, 2), (2, True, True, 3),
    (4, False, True, 4), (4, True, True, 5),
])
def test_max_concurrent_batches(pp, async_, v2, batches):
    """vllm/config/vllm.py::VllmConfig.max_concurrent_batches (0.23.0 to 0.33.0)."""
    rules = parse_engine("vllm==0.33.0").profile.rules
    assert rules.max_concurrent_batches(pp=pp, async_scheduling=async_, v2_runner=v2) == batches
