"""kvplan.app.explain.explain_log: the use case behind `kvplan explain`, called directly."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.app.explain import ExplainReport, explain_log
from kvplan.errors import InputError

LOGS = Path(__file__).parent.parent / "fixtures" / "vllm_logs"
RTX3090 = LOGS / "v0_6_4_llama31_8b_rtx3090_20k.log"


def test_a_log_is_predicted_and_replayed_with_the_release_asked_for():
    report = explain_log(RTX3090, model="llama3.1-8b", gpu="RTX-3090", engine="vllm==0.6.4")
    assert isinstance(report, ExplainReport)
    assert report.profile is not None and report.profile.version == "0.6.4" and not report.profile.rules.v1
    assert report.gpu is not None and report.gpu.name == "RTX-3090"
    blocks = {row.figure: row for row in report.rows}["KV blocks"]
    assert blocks.logged and blocks.predicted and blocks.replayed_low is not None
    assert blocks.replay_miss() is not None and blocks.replay_miss() <= 1  # within a block of the log's count
    assert "with the rules of vLLM 0.6.4" in report.notes[-1]


def test_flags_stand_in_for_what_the_log_says():
    report = explain_log(RTX3090, model="llama3.1-8b", gpu="RTX-3090", engine="vllm==0.6.4", max_model_len=8192,
                         max_num_batched_tokens=4096)
    assert report.log.max_seq_len == 8192 and report.log.max_num_batched_tokens == 4096
    assert "max_model_len 8192" in report.notes[-1]


def test_a_log_without_a_model_says_what_is_missing():
    report = explain_log(LOGS / "v1_0_8_llama31_8b_l40s.log")
    assert report.profile is None and report.notes[0].startswith("no prediction: the log names no model")
    assert all(row.predicted is None for row in report.rows)


def test_a_release_of_the_wrong_engine_generation_is_refused():
    with pytest.raises(InputError, match="V0 engine, which 0.11 removed"):
        explain_log(RTX3090, model="llama3.1-8b", gpu="RTX-3090", engine="vllm==0.11.0")


def test_a_data_parallel_start_is_predicted_as_one_of_its_engines(tmp_path):
    """A log's --data-parallel-size (and --enable-expert-parallel) go into the prediction: an MoE model's experts
    spread over every rank, so its engine holds fewer weights than at -dp 1 (the lines made up from the llm-d
    planner's dense -dp 2 start, whose engines never logged a KV line)."""
    base = ("INFO 04-22 01:41:28 [entrypoints/utils.py:233] non-default args: {{'model': 'Qwen/Qwen3-30B-A3B', "
            "'max_model_len': 8192, 'gpu_memory_utilization': 0.9{extra}}}\n"
            "INFO 04-22 01:41:29 [v1/engine/core.py:105] Initializing a V1 LLM engine (v0.19.0) with config: "
            "model='Qwen/Qwen3-30B-A3B', tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1\n")
    one, two = tmp_path / "one.log", tmp_path / "two.log"
    one.write_text(base.format(extra=""))
    two.write_text(base.format(extra=", 'data_parallel_size': 2, 'enable_expert_parallel': True"))
    a = explain_log(one, gpu="H100-80GB")
    b = explain_log(two, gpu="H100-80GB")
    assert "tp 1, dp 2 with expert parallel" in b.notes[-1] and ", dp " not in a.notes[-1]
    weights = {r.figure: r.predicted for r in a.rows}["weights"], {r.figure: r.predicted for r in b.rows}["weights"]
    assert weights[1] < weights[0]
