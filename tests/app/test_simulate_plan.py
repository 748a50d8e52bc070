"""The simulation plan (kvplan.app.simulate): which simulator a workload gets, and the vllm-v1 simulator's requests
from sessions, documents and traces; the file sections' parsing (kvplan.io.workload)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.errors import ConfigError
from kvplan.app.simulate import plan_simulation
from kvplan.app.simulation import EVENT, V1
from kvplan.io.traces import trace_format
from kvplan.io.workload import read_workload

TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
SERVING = "serving: {model: llama3.1-8b, kv_pool_tokens: 50000}\nstep_time: {model: constant, seconds: 0.01}\n"
SCHED = "scheduler: {max_model_len: 8192, max_num_batched_tokens: 2048}\n"


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    return path


def _v1(path: Path):
    """The vllm-v1 part of the plan, with the plan's notes."""
    plan = plan_simulation(path)
    assert plan.simulator == V1, plan.reason
    return _V1Plan(plan)


class _V1Plan:
    def __init__(self, plan):
        self.inputs, self.session_turns, self.notes = plan.v1.inputs, plan.v1.session_turns, plan.notes


def _trace(tmp_path: Path, name: str) -> Path:
    (tmp_path / name).write_text((TRACES / name).read_text())
    return _file(tmp_path, SERVING + SCHED + f"requests: {{trace: {name}}}\n")


def test_trace_formats_are_told_from_the_first_row():
    assert trace_format(TRACES / "mooncake_small.jsonl") == "mooncake"
    assert trace_format(TRACES / "conversation_small.jsonl") == "conversation"
    assert trace_format(TRACES / "azure_llm_2023_code_head200.csv") == "requests"


def test_mooncake_hash_ids_become_shared_512_token_segments(tmp_path):
    reqs = _v1(_trace(tmp_path, "mooncake_small.jsonl")).inputs.requests
    assert [r.prompt_len for r in reqs] == [1200, 1100, 600, 1150]  # input_length, as given
    assert [r.output[1] for r in reqs] == [20, 10, 5, 8]
    assert [r.arrival_ps for r in reqs] == [0, 500 * 10**9, 1500 * 10**9, 2000 * 10**9]  # ms -> ps
    a, b, c, d = (r.prompt for r in reqs)
    assert [n for _, n in a] == [512, 512, 176] and [n for _, n in c] == [512, 88]
    assert a[:2] == b[:2] == d[:2]  # hash ids 0 and 1: the same blocks
    assert a[2][0] != b[2][0] != d[2][0] and {s for s, _ in c}.isdisjoint({s for s, _ in a})


def test_conversation_turns_extend_their_history(tmp_path):
    v = _v1(_trace(tmp_path, "conversation_small.jsonl"))
    by_len = {r.prompt_len: r for r in v.inputs.requests}
    assert sorted(by_len) == [80, 90, 120, 150, 260]  # each row's input_tokens is its whole prompt
    a1, a2, b1, b2 = by_len[120], by_len[260], by_len[80], by_len[150]
    assert a2.prompt == (*a1.prompt, a1.output, (a2.prompt[-1][0], 100))  # history + answer + 100 new tokens
    assert b2.prompt == (*b1.prompt, b1.output, (b2.prompt[-1][0], 40))
    assert len(by_len[90].prompt) == 1  # shorter than its history (cut context): a new prompt
    assert any("cut" in n for n in v.notes)
    assert len(v.session_turns) == 2


def test_sessions_build_turns_on_the_previous_prompt_and_answer(tmp_path):
    path = _file(tmp_path, SERVING + SCHED + """requests:
  seed: 5
  arrival: {process: poisson, rate: 1}
  sessions:
    count: 3
    turns: {dist: constant, value: 4}
    think_time_s: {dist: constant, value: 7.5}
    system_prompt_tokens: 64
    message_tokens: {dist: uniform, low: 10, high: 50}
    output_tokens: {dist: constant, value: 20}
""")
    v = _v1(path)
    reqs = v.inputs.requests
    assert len(reqs) == 12 and len(v.session_turns) == 9
    system = reqs[0].prompt[0]
    assert system[1] == 64 and all(r.prompt[0] == system for r in reqs)
    for prev, cur in v.session_turns:
        p, c = reqs[prev], reqs[cur]
        assert c.prompt[:-1] == (*p.prompt, p.output)
        assert c.arrival_ps - p.arrival_ps == 7_500_000_000_000  # arrival + think time
    again = _v1(path).inputs.requests
    assert again == reqs  # seeded


def test_documents_are_shared_by_popularity(tmp_path):
    v = _v1(_file(tmp_path, SERVING + SCHED + """requests:
  count: 200
  seed: 2
  arrival: {process: poisson, rate: 5}
  output_tokens: {dist: constant, value: 10}
  documents:
    count: 10
    tokens: {dist: constant, value: 1000}
    popularity: 1.5
    question_tokens: {dist: constant, value: 30}
"""))
    docs = [r.prompt[0] for r in v.inputs.requests]
    assert all(n == 1000 for _, n in docs) and all(r.prompt[1][1] == 30 for r in v.inputs.requests)
    counts = sorted((docs.count(d) for d in set(docs)), reverse=True)
    assert len(counts) <= 10 and counts[0] > 200 / 10  # zipf: the first document is read more than its share


@pytest.mark.parametrize("text, match", [
    ("sessions: {count: 2, turns: {dist: constant, value: 2}, think_time_s: {dist: constant, value: 1}, "
     "message_tokens: {dist: constant, value: 5}, output_tokens: {dist: constant, value: 5}, bogus: 1}", "bogus"),
    ("sessions: {count: 2, turns: {dist: constant, value: 2}, think_time_s: {dist: constant, value: -1}, "
     "message_tokens: {dist: constant, value: 5}, output_tokens: {dist: constant, value: 5}}", "think_time_s"),
    ("sessions: {count: 0, turns: {dist: constant, value: 2}, think_time_s: {dist: constant, value: 1}, "
     "message_tokens: {dist: constant, value: 5}, output_tokens: {dist: constant, value: 5}}", "count"),
    ("documents: {count: 3, tokens: {dist: constant, value: 5}, question_tokens: {dist: constant, value: 5}, "
     "popularity: -1}", "popularity"),
])
def test_bad_sections_are_one_line_errors(tmp_path, text, match):
    path = _file(tmp_path, SERVING + "requests:\n  arrival: {process: all_at_once}\n  " + text + "\n")
    with pytest.raises(ConfigError, match=match) as exc:
        read_workload(path)
    assert "\n" not in str(exc.value).strip()


@pytest.mark.parametrize("offload, match", [
    ("{cpu_memory: 4GiB}", "bandwidth"),
    ("{cpu_memory: lots, bandwidth: 25GB/s}", "cpu_memory"),
    ("{cpu_memory: 4GiB, bandwidth: 0GB/s}", "bandwidth"),
    ("{cpu_memory: 4GiB, bandwidth: 25GB/s, pcie: 5}", "pcie"),
])
def test_bad_offload_is_rejected(tmp_path, offload, match):
    path = _file(tmp_path, SERVING + "requests: {count: 2, arrival: {process: all_at_once}, prompt_tokens: "
                 "{dist: constant, value: 5}, output_tokens: {dist: constant, value: 5}}\noffload: " + offload + "\n")
    with pytest.raises(ConfigError, match=match):
        read_workload(path)


def test_event_cannot_run_sessions_and_auto_takes_v1_on_v1_releases_event_on_v0(tmp_path):
    plain = _file(tmp_path, SERVING + "requests: {count: 2, arrival: {process: all_at_once}, prompt_tokens: "
                  "{dist: constant, value: 5}, output_tokens: {dist: constant, value: 5}}\n")
    assert plan_simulation(plain).simulator == V1
    assert plan_simulation(plain, engine="vllm==0.7.3").simulator == EVENT
    assert plan_simulation(plain, engine="vllm==0.8.0").simulator == V1
    assert plan_simulation(plain, engine="sglang").simulator == EVENT
    sessions = _file(tmp_path, SERVING + "scheduler: {model: event}\nrequests:\n  arrival: {process: all_at_once}\n"
                     "  sessions: {count: 2, turns: {dist: constant, value: 2}, think_time_s: {dist: constant, "
                     "value: 1}, message_tokens: {dist: constant, value: 5}, output_tokens: {dist: constant, "
                     "value: 5}}\n")
    with pytest.raises(ConfigError, match="event cannot simulate multi-turn"):
        plan_simulation(sessions)


@pytest.mark.parametrize("gpu, release, seqs, mnbt", [("H100-80GB", "0.33.0", 1024, 8192),
                                                       ("A100-40GB", "0.33.0", 256, 2048),
                                                       ("H100-80GB", "0.8.0", 1024, 8192)])
def test_v1_takes_the_servers_batch_limits_for_the_gpu_and_release(tmp_path, gpu, release, seqs, mnbt):
    from kvplan.core.engines.vllm.profiles import batch_defaults
    from kvplan.core.profiles import parse_engine
    from kvplan.io.gpus import get_gpu

    # vllm/engine/arg_utils.py: the OpenAI server's defaults when the command line gives none
    assert batch_defaults(parse_engine(f"vllm=={release}").profile.rules, get_gpu(gpu), 8192) == (mnbt, seqs)
    text = (f"serving: {{model: llama3.1-8b, gpu: {gpu}, engine: vllm=={release}}}\n"
            "requests: {count: 5, arrival: {process: poisson, rate: 1.0}, prompt_tokens: {dist: constant, value: 100}, "
            "output_tokens: {dist: constant, value: 10}}\nscheduler: {max_model_len: 8192}\n")
    plan = _v1(_file(tmp_path, text))
    assert (plan.inputs.scheduler.max_num_seqs, plan.inputs.scheduler.max_num_batched_tokens) == (seqs, mnbt)
    assert any(n.startswith(f"max_num_seqs {seqs}: the OpenAI server's default") for n in plan.notes)
    stated = _v1(_file(tmp_path, text.replace("max_model_len: 8192", "max_model_len: 8192, max_num_seqs: 64")))
    assert stated.inputs.scheduler.max_num_seqs == 64
    assert not any(n.startswith("max_num_seqs") for n in stated.notes)


def test_v1s_default_max_num_seqs_is_cut_to_the_token_budget(tmp_path):
    # vLLM 0.11+ (arg_utils.py): min(the GPU's default 1024, max_num_batched_tokens); it used to be refused here
    text = ("serving: {model: llama3.1-8b, gpu: H100-80GB, engine: vllm==0.33.0}\n"
            "requests: {count: 5, arrival: {process: poisson, rate: 1.0}, prompt_tokens: {dist: constant, value: 100}, "
            "output_tokens: {dist: constant, value: 10}}\nscheduler: {max_model_len: 4096, max_num_batched_tokens: 512}\n")
    assert _v1(_file(tmp_path, text)).inputs.scheduler.max_num_seqs == 512
