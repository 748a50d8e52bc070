"""`kvplan simulate` on the vllm-v1 simulator: sessions with and without prefix caching, a CPU tier,
long prompts (chunked prefill), a sliding-window model; the bundled workloads. Asserts on --json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.io.models import configs_dir

runner = CliRunner()
BLOCK = 16  # vLLM's block size for llama3.1-8b (full attention)


def run(path: Path, *args: str, code: int = 0) -> dict:
    r = runner.invoke(app, ["simulate", str(path), *args, "--json"])
    assert r.exit_code == code, r.output
    return json.loads(r.stdout) if code == 0 else {"output": r.output}


def write(tmp_path: Path, text: str, name: str = "w.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def sessions(pool_tokens: int, *, caching: bool = True, offload: str = "", turns: int = 3, count: int = 1,
             think: float = 1000.0, message: int = 100, output: int = 50, system: int = 0) -> str:
    return f"""
serving: {{model: llama3.1-8b, kv_pool_tokens: {pool_tokens}}}
requests:
  seed: 4
  arrival: {{process: poisson, rate: 2}}
  sessions:
    count: {count}
    turns: {{dist: constant, value: {turns}}}
    think_time_s: {{dist: constant, value: {think}}}
    system_prompt_tokens: {system}
    message_tokens: {{dist: constant, value: {message}}}
    output_tokens: {{dist: constant, value: {output}}}
sharing: {{prefix_caching: {str(caching).lower()}}}
scheduler: {{max_model_len: 8192, max_num_seqs: 64, max_num_batched_tokens: 2048}}
step_time: {{model: constant, seconds: 0.02}}
""" + (f"offload: {offload}\n" if offload else "")


def test_one_conversation_hits_the_full_blocks_of_its_history(tmp_path):
    """Turn k's prompt = turn k-1's prompt + answer + 100 new tokens. vLLM caches the full blocks of the
    tokens it computed: the prompt and all but the last answer token (that one was sampled, never fed
    back). Turn 2: 100 + 50 - 1 = 149 computed, 9 blocks = 144 tokens hit; turn 3: 250 + 49 = 299, 18 blocks."""
    out = run(write(tmp_path, sessions(100_000)))
    pc = out["prefix_cache"]
    assert out["scheduler_model"] == "vllm-v1" and out["allocators"]["paged-16"]["completed"] == 3
    assert pc["prompt_tokens"] == 100 + 250 + 400
    assert pc["gpu_hit_tokens"] == (149 // BLOCK + 299 // BLOCK) * BLOCK
    assert pc["hit_rate"] == pytest.approx(pc["gpu_hit_tokens"] / 750)
    assert pc["gpu_hit_tokens"] + pc["recomputed_tokens"] == 750 and pc["evictions"] == 0


def test_prefix_caching_raises_the_hit_rate_on_the_same_sessions(tmp_path):
    on = run(write(tmp_path, sessions(30_000, count=30, turns=4, think=5, system=300), "on.yaml"))
    off = run(write(tmp_path, sessions(30_000, count=30, turns=4, think=5, system=300, caching=False), "off.yaml"))
    assert on["requests"] == off["requests"] == 120
    assert off["prefix_cache"]["hit_rate"] == 0 and off["prefix_cache"]["gpu_hit_tokens"] == 0
    assert on["prefix_cache"]["hit_rate"] > 0.3  # history + system prompt are most of every later prompt
    # the same prompts: fewer tokens computed with the cache
    assert on["prefix_cache"]["recomputed_tokens"] < off["prefix_cache"]["recomputed_tokens"]
    assert on["prefix_cache"]["prompt_tokens"] == off["prefix_cache"]["prompt_tokens"]


def test_offload_gives_cpu_hits_when_the_gpu_evicts(tmp_path):
    # 40 conversations, 30 s apart per turn, in a pool of 20,000 tokens: the GPU cache evicts histories
    # before their next turn; a 4 GiB CPU tier keeps them
    base = dict(count=40, turns=4, think=30.0, message=200, output=100, system=300)
    gpu = run(write(tmp_path, sessions(20_000, **base), "gpu.yaml"))
    cpu = run(write(tmp_path, sessions(20_000, offload="{cpu_memory: 4GiB, bandwidth: 25GB/s}", **base), "cpu.yaml"))
    assert gpu["prefix_cache"]["evictions"] > 0 and "offload" not in gpu
    t, o = cpu["prefix_cache"], cpu["offload"]
    assert t["cpu_hit_tokens"] > 0 and t["hit_rate"] > gpu["prefix_cache"]["hit_rate"]
    assert t["recomputed_tokens"] < gpu["prefix_cache"]["recomputed_tokens"]
    assert o["bytes_from_cpu"] > 0 and o["bytes_to_cpu"] >= o["bytes_from_cpu"]
    assert o["load_seconds"] == pytest.approx(o["bytes_from_cpu"] / 25e9)  # bytes over the link's 25 GB/s
    assert o["cpu_bytes"] == 4 << 30


LONG = """
serving: {model: llama3.1-8b, kv_pool_tokens: 100000}
requests:
  count: 1
  arrival: {process: all_at_once}
  prompt_tokens: {dist: constant, value: 3000}
  output_tokens: {dist: constant, value: 10}
scheduler: {max_model_len: 8192, max_num_batched_tokens: 2048}
step_time: {model: constant, seconds: 0.01}
"""


def test_a_long_prompt_is_chunked_not_rejected(tmp_path):
    path = write(tmp_path, LONG)
    out = run(path)
    m = out["allocators"]["paged-16"]
    assert out["scheduler_model"] == "vllm-v1" and "V1 engine" in out["scheduler_model_reason"]
    assert m["completed"] == 1 and m["rejected"] == 0
    # 3,000 prompt tokens in chunks of 2,048: 2 prefill steps (the second samples the first token), 9 decodes
    assert out["steps"] == 2 + 9
    assert out["latency_steps"]["ttft"]["p50"] == 2
    event = run(path, "--scheduler-model", "event")
    assert event["scheduler_model"] == "event"
    assert event["allocators"]["paged-16"]["rejected_reasons"] == {"prompt_exceeds_max_num_batched_tokens": 1}


def test_a_sliding_window_model_runs_through_v1(tmp_path):
    out = run(write(tmp_path, """
serving: {model: gemma2-9b, kv_pool_tokens: 60000}
requests:
  count: 20
  seed: 1
  arrival: {process: poisson, rate: 4}
  prompt_tokens: {dist: uniform, low: 500, high: 6000}
  output_tokens: {dist: uniform, low: 10, high: 200}
scheduler: {max_model_len: 8192, max_num_batched_tokens: 4096}
step_time: {model: constant, seconds: 0.02}
"""))
    assert out["scheduler_model"] == "vllm-v1" and "sliding" in out["scheduler_model_reason"]  # named beside the release
    assert out["kv_cache_groups"] >= 2  # a full and a sliding-window group share the pool
    assert out["allocators"]["paged-16"]["completed"] == 20 == out["requests"]
    assert 0 < out["mean_kv_usage"] <= out["peak_kv_usage"] <= 1


def test_plain_traffic_on_a_v1_release_runs_vllms_own_scheduler(tmp_path):
    """Exact by default: a vLLM release whose engine is V1 is simulated with its V1 scheduler, plain traffic too."""
    out = run(write(tmp_path, LONG.replace("3000", "1000")))
    assert out["scheduler_model"] == "vllm-v1" and "V1 engine" in out["scheduler_model_reason"]


def test_a_v0_release_and_the_other_engines_stay_on_the_event_engine(tmp_path):
    path = write(tmp_path, LONG.replace("3000", "1000"))
    out = run(path, "--engine", "vllm==0.6.2")
    assert out["scheduler_model"] == "event" and "V0 release" in out["scheduler_model_reason"]
    assert any(n.startswith("simulator: event (auto") for n in out["notes"])
    long = run(write(tmp_path, LONG, "long.yaml"), "--engine", "vllm==0.6.2")
    assert long["scheduler_model"] == "vllm-v1"  # a prompt past the token budget needs chunked prefill
    assert "longer than max_num_batched_tokens" in long["scheduler_model_reason"]


@pytest.mark.parametrize("args, text, match", [
    (["--scheduler-model", "fast"], LONG, "auto, event or vllm-v1"),
    ([], LONG.replace("all_at_once}", "all_at_once}\n  sessions: {count: 1}"), "sessions"),
])
def test_bad_v1_inputs_exit_2_with_one_line(tmp_path, args, text, match):
    r = runner.invoke(app, ["simulate", str(write(tmp_path, text)), *args])
    assert r.exit_code == 2, r.output
    assert match in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("name", ["llama3.1-8b-multiturn-chat", "llama3.1-8b-multiturn-offload"])
def test_bundled_v1_workloads_run(name):
    out = run(configs_dir() / "workloads" / f"{name}.yaml")
    assert out["scheduler_model"] == "vllm-v1"
    m = out["allocators"]["paged-16"]
    assert m["completed"] + m["rejected"] == out["requests"]
    assert out["prefix_cache"]["hit_rate"] > 0
    if "offload" in name:
        assert out["prefix_cache"]["cpu_hit_tokens"] > 0 and out["offload"]["bytes_from_cpu"] > 0


def test_a_hybrid_linear_model_runs_through_v1_without_prefix_caching(tmp_path):
    out = run(write(tmp_path, """
serving: {model: qwen3-next-80b-a3b, kv_pool_bytes: 4GiB}
requests:
  count: 12
  seed: 1
  arrival: {process: poisson, rate: 4}
  prompt_tokens: {dist: uniform, low: 500, high: 6000}
  output_tokens: {dist: uniform, low: 10, high: 100}
scheduler: {max_model_len: 8192, max_num_batched_tokens: 4096}
step_time: {model: constant, seconds: 0.02}
"""))
    assert out["scheduler_model"] == "vllm-v1" and "linear" in out["scheduler_model_reason"]
    assert out["kv_cache_groups"] >= 2 and out["prefix_cache"]["enabled"] is False
    assert any("prefix caching is off" in n for n in out["notes"])
    assert out["allocators"][f"paged-{out['block_size']}"]["completed"] == 12


def test_async_scheduling_is_the_releases_default_and_can_be_turned_off(tmp_path):
    """vLLM 0.14.0 on schedules each batch before the previous one's output is back: a finished request
    frees its blocks a batch later, and with a 20 ms step, an arrival waits for the batch after next."""
    text = sessions(100_000, count=4)
    on = run(write(tmp_path, text))
    off = run(write(tmp_path, text.replace("max_num_batched_tokens: 2048}",
                                           "max_num_batched_tokens: 2048, async_scheduling: false}"), "off.yaml"))
    assert on["async_scheduling"] is True and off["async_scheduling"] is False
    assert any("async scheduling on" in n for n in on["notes"])
    assert not any("async scheduling" in n for n in off["notes"])
    assert on["latency_s"]["queue"]["p50"] > off["latency_s"]["queue"]["p50"]
    assert on["allocators"]["paged-16"]["completed"] == off["allocators"]["paged-16"]["completed"] == 12
    # the event engine models one batch in flight: asking it for async scheduling is an error
    plain = """
serving: {model: llama3.1-8b, kv_pool_tokens: 100000}
requests: {count: 10, arrival: {process: poisson, rate: 2}, prompt_tokens: {dist: constant, value: 100},
           output_tokens: {dist: constant, value: 10}}
scheduler: {model: event, async_scheduling: true}
"""
    assert "cannot simulate async scheduling" in run(write(tmp_path, plain, "bad.yaml"), code=2)["output"]


def test_plot_of_a_vllm_v1_run(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "v1.png"
    r = runner.invoke(app, ["simulate", str(write(tmp_path, sessions(2_000, count=3))), "--plot", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "plot written to" in r.output
    r = runner.invoke(app, ["simulate", str(write(tmp_path, sessions(2_000))), "--plot", str(tmp_path / "no" / "p.png")])
    assert r.exit_code == 2 and "does not exist" in r.output  # checked before the run


def test_per_step_clock_and_waiting(tmp_path):
    """A step-time model of 20 ms a step: the clock at each counted step starts at or after the previous
    step's end, and every request is running, waiting or done at each step."""
    from kvplan.app.simulate import plan_simulation, run_simulation

    path = write(tmp_path, sessions(2_000, count=3))
    run = run_simulation(plan_simulation(path), per_step=True)
    v, r = run.plan.v1, run.v1
    n = len(r.per_step_running)
    assert len(r.per_step_start_ps) == len(r.per_step_waiting) == n > 0
    gaps = [b - a for a, b in zip(r.per_step_start_ps, r.per_step_start_ps[1:])]
    assert min(gaps) >= 20 * 10**9  # 20 ms in picoseconds: a counted step lasts one step at least
    assert max(r.per_step_running[i] + r.per_step_waiting[i] for i in range(n)) <= len(v.inputs.requests)


@pytest.mark.parametrize("engine, says", [("sglang", "SGLang reserves"), ("trtllm", "TensorRT-LLM's scheduler"),
                                          ("vllm", None)])
def test_event_runs_say_whose_scheduling_they_follow(tmp_path, engine, says):
    text = f"""
serving: {{model: llama3.1-8b, gpu: H100-80GB, engine: {engine}}}
requests: {{count: 20, arrival: {{process: poisson, rate: 2}}, prompt_tokens: {{dist: constant, value: 100}},
           output_tokens: {{dist: constant, value: 10}}}}
"""
    out = run(write(tmp_path, text), "--scheduler-model", "event")  # vLLM's V1 releases run vllm-v1 by default
    assert out["scheduler_model"] == "event"
    notes = [n for n in out["notes"] if n.startswith("scheduling follows vLLM's rules")]
    assert (says in notes[0]) if says else not notes


def test_the_engine_release_picks_the_scheduler_rules_and_the_output_names_them(tmp_path):
    """20 prompts of 6,000 tokens into a 20,000-token pool, budget 2,048: before 0.19.0 vLLM admits a request
    when its first chunk fits, so three 6,200-token requests soon outgrow the pool and preempt; from 0.19.0 a
    request waits until its whole prompt fits (scheduler_reserve_full_isl) and nothing is preempted."""
    path = write(tmp_path, """
serving: {model: llama3.1-8b, kv_pool_tokens: 20000}
requests: {count: 20, arrival: {process: poisson, rate: 50}, prompt_tokens: {dist: constant, value: 6000},
           output_tokens: {dist: constant, value: 200}}
scheduler: {max_model_len: 8192, max_num_seqs: 16, max_num_batched_tokens: 2048, async_scheduling: false}
step_time: {model: constant, seconds: 0.02}
""")
    old, new = run(path, "--engine", "vllm==0.18.0"), run(path, "--engine", "vllm==0.19.1")
    assert old["allocators"]["paged-16"]["preemptions"] > 0 == new["allocators"]["paged-16"]["preemptions"]
    # 0.15.0's rules: 0.14.0's scheduler with 0.15.0's data-parallel balancer (one API server per engine)
    assert "scheduler: vLLM 0.15.0's rules (0.15.0 to before 0.19.0" in "\n".join(old["notes"])
    assert "scheduler: vLLM 0.19.0's rules (0.19.0 to before 0.20.0" in "\n".join(new["notes"])
    # the release asked for is named beside the profile that stands for it
    assert "vllm 0.19.1: the rules of the 0.19.0 profile" in "\n".join(new["notes"])
