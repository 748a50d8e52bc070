"""`kvplan simulate` and `kvplan schema` through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.io.models import configs_dir

runner = CliRunner()
PAPER = configs_dir() / "workloads" / "vllm-paper-sharegpt.yaml"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
AZURE_SAMPLE = FIXTURES / "traces" / "azure_llm_2023_code_head200.csv"
AZURE_FULL = Path(__file__).resolve().parents[3] / "shared" / "traces" / "azure_llm_2023_code.csv"
KEYS = {"token_states_frac", "reserved_frac", "internal_frag_frac", "external_frag_frac", "free_frac",
        "mean_batch_size", "peak_batch_size", "preemptions", "completed", "rejected", "makespan_steps"}


def simulate_json(path: Path, *args: str) -> dict:
    r = runner.invoke(app, ["simulate", str(path), *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def write(tmp_path: Path, text: str, name: str = "w.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def paper() -> dict:
    return simulate_json(PAPER)


def test_json_contract(paper):
    assert set(paper["allocators"]) == {"contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged-16"}
    for metrics in paper["allocators"].values():
        assert KEYS <= set(metrics)
        parts = sum(metrics[k] for k in ("token_states_frac", "reserved_frac", "internal_frag_frac",
                                         "external_frag_frac", "free_frac"))
        assert parts == pytest.approx(1.0)
        assert metrics["completed"] + metrics["rejected"] == paper["requests"]


def test_reproduces_the_vllm_paper(paper):
    a = paper["allocators"]
    assert paper["pool_slots"] == 12 * (1 << 30) // 819_200 == 15_728
    # contiguous-max reserves 2048 slots per request: at most 7 at once
    assert a["contiguous-max"]["peak_batch_size"] <= 7
    # contiguous allocation keeps only a minority of its memory in token states
    for name in ("contiguous-max", "contiguous-pow2", "contiguous-oracle"):
        assert a[name]["token_states_frac"] < 0.5
    # paged keeps more than 90% in token states and batches several times more requests
    assert a["paged-16"]["token_states_frac"] > 0.9
    assert a["paged-16"]["mean_batch_size"] > 3 * a["contiguous-max"]["mean_batch_size"]
    assert a["paged-16"]["external_frag_frac"] == 0


def test_latency_keys(paper):
    """Per-request latency by percentile: each request's queue <= TTFT <= e2e, so every percentile is too."""
    for name, m in paper["allocators"].items():
        lat = m["latency"]
        assert set(lat) == {"queue_s", "ttft_s", "e2e_s"}, name
        for key in lat:
            assert 0 <= lat[key]["p50"] <= lat[key]["p90"] <= lat[key]["p99"], (name, key)
        for p in ("p50", "p90", "p99"):
            assert lat["queue_s"][p] <= lat["ttft_s"][p] <= lat["e2e_s"][p], (name, p)
    # the paper workload is overloaded: the allocator that batches more keeps requests waiting less
    a = paper["allocators"]
    assert a["paged-16"]["latency"]["e2e_s"]["p50"] < a["contiguous-oracle"]["latency"]["e2e_s"]["p50"]


def test_buddy_placement_separates_the_papers_orca_baselines(paper):
    """Under the buddy placement the paper assumes, Orca (Pow2) reserves prompt + a power of two of the
    output, which the buddy rounds again: it batches fewer than Oracle and more than Max (its Fig. 13a
    ordering: Max 7.00 < Pow2 9.81 < Oracle 13.62 < vLLM 30.42 requests)."""
    a = paper["allocators"]
    batch = [a[n]["mean_batch_size"] for n in ("contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged-16")]
    assert batch == sorted(batch) and len(set(batch)) == 4
    assert a["contiguous-pow2"]["token_states_frac"] < a["contiguous-oracle"]["token_states_frac"]


def test_parallel_workers_give_the_serial_results(monkeypatch):
    """Forked workers (one per usable CPU) return what one process computes, in the allocators' order."""
    import dataclasses as dc

    import kvplan.app.parallel as parallel
    from kvplan.app.simulate import plan_simulation

    run = plan_simulation(PAPER).event
    q = run.requests
    run = dc.replace(run, requests=type(q)(q.arrival_ps[:600], q.prompt[:600], q.output[:600], q.n[:600]))
    serial = parallel.run_allocators(run, workers=1)
    monkeypatch.setattr(parallel, "PARALLEL_FROM_REQUESTS", 1)
    monkeypatch.setattr(parallel, "usable_cpus", lambda: 2)
    assert parallel.run_allocators(run) == serial


def test_first_fit_placement_separates_oracle_from_pow2(tmp_path):
    out = simulate_json(PAPER, "--placement", "first-fit", "-a", "contiguous-pow2", "-a", "contiguous-oracle")
    a = out["allocators"]
    assert a["contiguous-oracle"]["internal_frag_frac"] == 0  # exact reservations, no rounding
    assert a["contiguous-oracle"]["mean_batch_size"] > a["contiguous-pow2"]["mean_batch_size"]


@pytest.mark.parametrize("trace,limit", [(AZURE_SAMPLE, 200), (AZURE_FULL, 2000)])
def test_azure_trace_as_it_is(tmp_path, trace, limit):
    if not trace.is_file():
        pytest.skip(f"{trace} is not here (the workplace's shared/ folder)")
    path = write(tmp_path, f"""
serving: {{model: llama3-8b, gpu: H100-80GB, engine: vllm}}
requests: {{trace: {trace}, limit: {limit}}}
scheduler: {{max_model_len: 4096}}
allocators: [contiguous-max, paged-16]
""")
    out = simulate_json(path)
    for metrics in out["allocators"].values():
        assert metrics["completed"] + metrics["rejected"] == limit
        # prompts longer than max_model_len are rejected with their reason, never lost
        assert set(metrics["rejected_reasons"]) <= {"prompt_exceeds_max_model_len", "exceeds_max_model_len",
                                                    "larger_than_kv_pool"}
    assert out["allocators"]["paged-16"]["rejected"] > 0  # the code trace has prompts past 4096 tokens


def test_overload_still_finishes_and_reports_the_backlog(tmp_path):
    path = write(tmp_path, """
serving: {model: opt-13b, kv_pool_tokens: 4096}
requests:
  count: 300
  arrival: {process: all_at_once}
  prompt_tokens: {dist: constant, value: 500}
  output_tokens: {dist: uniform, low: 10, high: 400}
scheduler: {max_model_len: 2048, max_num_seqs: 64}
step_time: {model: constant, seconds: 0.02}
allocators: [contiguous-max, paged-16]
""")
    out = simulate_json(path)
    for metrics in out["allocators"].values():
        assert metrics["completed"] == 300 and metrics["peak_waiting"] >= 290
    r = runner.invoke(app, ["simulate", str(path)])
    assert "backlog" in r.stdout


def test_sharing_and_rejections(tmp_path):
    path = write(tmp_path, """
serving: {model: opt-13b, kv_pool_tokens: 4096}
requests:
  count: 50
  seed: 3
  arrival: {process: all_at_once}
  prompt_tokens: {dist: uniform, low: 266, high: 356}
  output_tokens: {dist: zipf, a: 1.1, low: 5, high: 200}
sharing: {shared_prefix_tokens: 256, parallel_sampling: 4}
scheduler: {max_model_len: 2048, model: event}
step_time: {model: constant, seconds: 0.02}
allocators: [contiguous-oracle, paged-16]
""")
    out = simulate_json(path)
    paged, contig = out["allocators"]["paged-16"], out["allocators"]["contiguous-oracle"]
    assert paged["completed"] == contig["completed"] == 50
    assert paged["mean_batch_size"] > contig["mean_batch_size"]  # shared blocks leave room for more
    assert not any("raised" in n for n in out["notes"])  # every prompt already holds the prefix


def test_shared_prefix_is_part_of_the_prompt(tmp_path):
    """A 300-token prompt with a 256-token prefix is 300 tokens (not 556); shorter prompts are raised."""
    text = """
serving: {model: opt-13b, kv_pool_tokens: 100000}
requests: {count: 10, arrival: {process: all_at_once}, prompt_tokens: {dist: constant, value: PROMPT}, output_tokens: {dist: constant, value: 10}}
sharing: {shared_prefix_tokens: 256}
scheduler: {max_model_len: 2048, model: event}
step_time: {model: constant, seconds: 0.01}
allocators: [contiguous-oracle]
"""
    long = simulate_json(write(tmp_path, text.replace("PROMPT", "300")))
    # contiguous-oracle reserves prompt + output: 10 x 310 slots in use at the last step
    assert long["allocators"]["contiguous-oracle"]["peak_batch_size"] == 10
    assert not any("raised" in n for n in long["notes"])
    short = simulate_json(write(tmp_path, text.replace("PROMPT", "100"), "short.yaml"))
    assert any(n.startswith("10 of 10 prompts were shorter than the 256-token shared prefix") for n in short["notes"])
    from kvplan.app.requests import plain_requests
    from kvplan.io.workload import load_workload_file

    for prompt, expected in ((300, 300), (100, 256)):
        path = write(tmp_path, text.replace("PROMPT", str(prompt)), f"p{prompt}.yaml")
        reqs = plain_requests(load_workload_file(path), path, max_model_len=2048, notes=[])
        assert {r.prompt for r in reqs} == {expected}


def test_pool_from_fit_is_fits_token_count(tmp_path):
    """One count of token slots: simulate's pool equals fit's kv_cache_tokens for the same deployment."""
    path = write(tmp_path, """
serving: {model: llama3-8b, gpu: H100-80GB, gpu_memory_utilization: 0.85}
requests: {count: 5, arrival: {process: poisson, rate: 5}, prompt_tokens: {dist: constant, value: 100}, output_tokens: {dist: constant, value: 50}}
scheduler: {max_model_len: 8192, max_num_seqs: 128}
allocators: [paged-16]
""")
    r = runner.invoke(app, ["fit", "llama3-8b", "--gpu", "H100-80GB", "--gpu-memory-utilization", "0.85",
                            "--max-model-len", "8192", "--max-num-seqs", "128", "--json"])
    assert r.exit_code == 0, r.output
    fit = json.loads(r.stdout)
    v1 = simulate_json(path)  # the default, vLLM's V1 scheduler: fit's blocks, the null block among them
    assert v1["scheduler_model"] == "vllm-v1" and v1["pool_blocks"] == fit["num_blocks"]
    assert v1["pool_bytes"] == fit["kv_cache_memory_bytes"]
    event = simulate_json(path, "--scheduler-model", "event")  # token slots: fit's count
    assert event["pool_slots"] == fit["kv_cache_tokens"] and event["pool_bytes"] == fit["kv_cache_memory_bytes"]


def test_throughput_per_busy_second_and_drain(tmp_path):
    """An unsaturated service: one request every 10 s, each done in 0.5 s. Throughput counts busy time only."""
    path = write(tmp_path, """
serving: {model: opt-13b, kv_pool_tokens: 8192}
requests: {trace: t.csv}
scheduler: {max_model_len: 2048, model: event}
step_time: {model: constant, seconds: 0.01}
allocators: [paged-16]
""")
    (tmp_path / "t.csv").write_text("arrival,prompt_tokens,output_tokens\n0,100,50\n10,100,50\n20,100,50\n")
    m = simulate_json(path)["allocators"]["paged-16"]
    # a request runs 51 steps: its admission (prefill) step, then 50 steps to reach 150 tokens
    assert m["busy_seconds"] == pytest.approx(3 * 51 * 0.01)
    assert m["drain_seconds"] == pytest.approx(51 * 0.01)
    assert m["throughput_tokens_per_s"] == pytest.approx(150 / 1.53)  # about 98 tok/s, not 150 / 20.51 s
    assert m["makespan_seconds"] == pytest.approx(20.51)


def test_seed_repeats_exactly(tmp_path):
    text = """
serving: {model: opt-13b, kv_pool_tokens: 8192}
requests: {count: 100, seed: 7, arrival: {process: gamma, rate: 3, cv: 3}, prompt_tokens: {dist: normal, mean: 200, std: 50}, output_tokens: {dist: lognormal, mean: 100}}
scheduler: {max_model_len: 2048}
step_time: {model: constant, seconds: 0.02}
allocators: [paged-16]
"""
    first = simulate_json(write(tmp_path, text))["allocators"]
    assert first == simulate_json(write(tmp_path, text, "again.yaml"))["allocators"]
    assert first != simulate_json(write(tmp_path, text.replace("seed: 7", "seed: 8"), "other.yaml"))["allocators"]


POOL = "serving: {model: opt-13b, kv_pool_tokens: 4096}\nscheduler: {max_model_len: 2048}\n"
LENGTHS = "prompt_tokens: {dist: constant, value: 5}, output_tokens: {dist: constant, value: 5}"


@pytest.mark.parametrize(
    "text,message",
    [
        ("serving: {model: opt-13b}\nrequests: {count: 5}\nbogus: 1\n", "line 3: bogus: unknown key"),
        ("serving: {model: opt-13b, kv_pool_tokens: 100}\nrequests:\n  count: 5\n  arrival: {process: poisson, rate: -3}\n",
         "line 4: requests.arrival.rate: Input should be greater than 0"),
        ("serving: {model: opt-13b, kv_pool_tokens: 100}\nrequests: {count: 5}\n", "missing: arrival, prompt_tokens"),
        ("serving: {model: opt-13b, kv_pool_tokens: 100}\nrequests: {trace: nope.csv}\n", "nope.csv: no such file"),
        ("serving: {model: opt-13b}\nrequests: {count: 1}\nallocators: [paged-x]\n", "unknown allocator 'paged-x'"),
        ("serving: {model: opt-13b\nrequests: 3\n", "not valid YAML"),
        # non-finite numbers: `gt=0` alone lets .inf through
        (f"{POOL}requests: {{count: 5, arrival: {{process: poisson, rate: .inf}}, {LENGTHS}}}\n", "requests.arrival.rate"),
        (f"{POOL}requests: {{count: 5, arrival: {{process: gamma, cv: .nan}}, {LENGTHS}}}\n", "requests.arrival.cv"),
        (f"{POOL}requests: {{count: 5, arrival: {{process: poisson}}, prompt_tokens: {{dist: lognormal, mean: .inf}}, "
         "output_tokens: {dist: constant, value: 5}}\n", "prompt_tokens.lognormal.mean"),
        (f"{POOL}requests: {{count: 5, arrival: {{process: poisson}}, prompt_tokens: {{dist: normal, mean: 5, std: .inf}}, "
         "output_tokens: {dist: constant, value: 5}}\n", "std"),
        (f"{POOL}requests: {{count: 5, arrival: {{process: poisson}}, prompt_tokens: {{dist: zipf, a: .inf, high: 9}}, "
         "output_tokens: {dist: constant, value: 5}}\n", ".a"),
        (f"{POOL}requests: {{trace: t.csv, time_scale: .inf}}\n", "requests.time_scale"),
        (f"{POOL}requests: {{count: 5, arrival: {{process: poisson}}, {LENGTHS}}}\nstep_time: {{model: constant, "
         "seconds: .inf}\n", "step_time.seconds"),
        # sizes as 309-digit numbers
        ("serving: {model: opt-13b, kv_pool_bytes: '" + "9" * 309 + "'}\nrequests: {count: 5}\n", "kv_pool_bytes"),
        ("serving: {model: opt-13b, kv_pool_bytes: " + "9" * 309 + "}\nrequests: {count: 5}\n", "kv_pool_bytes"),
        ("serving: {model: opt-13b, kv_pool_tokens: " + "9" * 309 + "}\nrequests: {count: 5}\n", "kv_pool_tokens"),
        (f"{POOL}requests: {{count: 5, arrival: {{process: poisson}}, prompt_tokens: {{dist: constant, value: "
         + "9" * 309 + "}, output_tokens: {dist: constant, value: 5}}\n", "value"),
        (f"{POOL}requests: {{count: 10000000, arrival: {{process: poisson}}, {LENGTHS}}}\n", "pass count: 1000000"),
        # a clock past 10^9 s (integer picoseconds stay exact, floats never overflow)
        (f"{POOL}requests: {{count: 5, arrival: {{process: poisson, rate: 1e-300}}, {LENGTHS}}}\n", "past the simulator's clock"),
        (f"{POOL}requests: {{count: 5, arrival: {{process: poisson}}, prompt_tokens: {{dist: zipf, high: 100000000}}, "
         "output_tokens: {dist: constant, value: 5}}\n", "zipf: high - low"),
        (f"{POOL}requests: {{count: 5, arrival: {{process: poisson}}, {LENGTHS}}}\nsharing: {{shared_prefix_tokens: 2048}}\n",
         "must be below max_model_len (2048)"),
    ],
)
def test_bad_workload_files_exit_2_with_file_key_line(tmp_path, text, message):
    (tmp_path / "t.csv").write_text("arrival,prompt_tokens,output_tokens\n0,10,5\n1e300,10,5\n")
    path = write(tmp_path, text)
    r = runner.invoke(app, ["simulate", str(path)])
    assert r.exit_code == 2, r.output
    assert message in r.stderr and str(path) in r.stderr and "Traceback" not in r.output


def test_bad_trace_row_gives_its_line(tmp_path):
    (tmp_path / "t.csv").write_text("arrival,prompt_tokens,output_tokens\n0.0,10,5\n0.5,ten,5\n")
    path = write(tmp_path, "serving: {model: opt-13b, kv_pool_tokens: 4096}\nrequests: {trace: t.csv}\n"
                           "scheduler: {max_model_len: 2048}\nstep_time: {model: constant, seconds: 0.01}\n")
    r = runner.invoke(app, ["simulate", str(path)])
    assert r.exit_code == 2 and "t.csv: line 3: cannot read" in r.stderr


def test_schema_workload():
    r = runner.invoke(app, ["schema", "workload"])
    assert r.exit_code == 0
    schema = json.loads(r.stdout)
    assert schema["additionalProperties"] is False and "serving" in schema["properties"]
    missing = [f"{where}.{key}" for where, obj in [("workload", schema), *schema["$defs"].items()]
               for key, prop in obj.get("properties", {}).items() if not prop.get("description")]
    assert not missing, missing
    assert "not added to it" in schema["$defs"]["Sharing"]["properties"]["shared_prefix_tokens"]["description"]


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "sim.png"
    path = write(tmp_path, """
serving: {model: opt-13b, kv_pool_tokens: 4096}
requests: {count: 40, arrival: {process: poisson, rate: 10}, prompt_tokens: {dist: constant, value: 100}, output_tokens: {dist: constant, value: 50}}
scheduler: {max_model_len: 2048}
step_time: {model: constant, seconds: 0.02}
""")
    r = runner.invoke(app, ["simulate", str(path), "--plot", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tables_keep_every_digit_at_80_columns():
    r = runner.invoke(app, ["simulate", str(PAPER)], terminal_width=80)
    assert r.exit_code == 0, r.output
    assert "…" not in r.stdout and max(len(line) for line in r.stdout.splitlines()) <= 80
    out = simulate_json(PAPER)
    for name, m in out["allocators"].items():
        for cell in (f"{100 * m['token_states_frac']:.1f}%", f"{100 * m['free_frac']:.1f}%",
                     f"{m['completed']:,}", f"{m['preemptions']:,}", f"{m['throughput_tokens_per_s']:,.0f}"):
            assert cell in r.stdout, (name, cell)
    assert f"KV pool {out['pool_slots']:,} token slots" in r.stdout  # a figure; the settings after it are as typed


# -- any workload the schema accepts finishes with every request accounted, or is refused (exit 2) ----
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_LENGTHS = st.one_of(
    st.builds(lambda v: {"dist": "constant", "value": v}, st.integers(1, 1000) | st.integers(1, 5000)),
    st.builds(lambda lo, span: {"dist": "uniform", "low": lo, "high": lo + span}, st.integers(1, 3000), st.integers(0, 3000)),
    st.builds(lambda m, sd: {"dist": "normal", "mean": m, "std": sd}, st.floats(0.5, 3000), st.floats(0, 2000)),
    st.builds(lambda m, sg: {"dist": "lognormal", "mean": m, "sigma": sg}, st.floats(0.5, 3000), st.floats(0.05, 4)),
    st.builds(lambda a, lo, span: {"dist": "zipf", "a": a, "low": lo, "high": lo + span}, st.floats(0.05, 20),
              st.integers(1, 2000), st.integers(0, 5000)),
)
_ARRIVALS = st.one_of(
    st.just({"process": "all_at_once"}),
    st.builds(lambda r: {"process": "poisson", "rate": r}, st.floats(0.001, 1e4)),
    st.builds(lambda r, cv: {"process": "gamma", "rate": r, "cv": cv}, st.floats(0.001, 1e4), st.floats(0.01, 100)),
)
_ALLOCATORS = ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged-1", "paged-16", "paged-256"]


@st.composite
def workload_dicts(draw):
    max_len = draw(st.integers(2, 4096) | st.sampled_from([256, 1024, 2048]))
    scale = draw(st.floats(0.05, 1) | st.floats(1, 8))  # the pool in units of max_model_len: below 1 many requests cannot fit
    serving = draw(st.one_of(
        st.just({"model": "opt-13b", "kv_pool_tokens": max(1, int(max_len * scale))}),
        st.builds(lambda b: {"model": "opt-13b", "gpu": "A100-40GB", "kv_pool_bytes": b}, st.sampled_from(
            ["1MiB", "1GiB", "6GiB", 819200 * 700])),
    ))
    scheduler = {"max_num_seqs": draw(st.integers(1, 64)), "preemption": draw(st.sampled_from(["recompute", "swap"])),
                 "max_model_len": max_len}
    if draw(st.booleans()):  # a budget below max_model_len: recomputed prefills outgrow it
        scheduler["max_num_batched_tokens"] = max(1, int(max_len * draw(st.floats(0.05, 2))))
    sharing = {"shared_prefix_tokens": draw(st.sampled_from([0, 0, 1, 16, 100, 600])),
               "prefix_caching": draw(st.booleans()), "parallel_sampling": draw(st.sampled_from([1, 1, 1, 2, 4])),
               "beam_width": draw(st.sampled_from([1, 1, 3]))}
    wl = {"serving": serving, "scheduler": scheduler, "sharing": sharing,
          "requests": {"count": draw(st.integers(1, 25)), "seed": draw(st.integers(0, 2**32)),
                       "arrival": draw(_ARRIVALS), "prompt_tokens": draw(_LENGTHS), "output_tokens": draw(_LENGTHS)},
          "allocators": draw(st.lists(st.sampled_from(_ALLOCATORS), min_size=1, max_size=3, unique=True)),
          "placement": draw(st.sampled_from(["buddy", "first-fit"]))}
    if "gpu" not in serving or draw(st.booleans()):
        wl["step_time"] = {"model": "constant", "seconds": draw(st.floats(1e-4, 10))}
    return wl


class _Hang(Exception):
    pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(wl=workload_dicts())
def test_any_accepted_workload_finishes_with_every_request_accounted(tmp_path, wl):
    import signal

    import yaml

    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(wl))

    def hang(*_):
        raise _Hang(f"no answer within 60 s: {wl}")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(60)  # a hang guard, not a timing assertion: each run takes milliseconds
    try:
        r = runner.invoke(app, ["simulate", str(path), "--json"])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert r.exit_code in (0, 2), (r.output, wl)
    assert "Traceback" not in r.output
    if r.exit_code == 2:
        assert str(path) in r.stderr, r.stderr  # refused with its file
        return
    out = json.loads(r.stdout)
    for name, m in out["allocators"].items():
        assert m["completed"] + m["rejected"] == out["requests"] == wl["requests"]["count"], (name, m)
        assert sum(m["rejected_reasons"].values()) == m["rejected"]


def test_the_documented_example_is_a_valid_workload(tmp_path):
    """docs/workloads.md's annotated example runs as written; the bundled examples run too."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "workloads.md").read_text()
    block = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    text = block.replace("count: 600", "count: 40")  # the shape, not the size, is under test
    out = simulate_json(write(tmp_path, text))
    assert out["workload"] == "my-chat" and set(out["allocators"]) == {
        "contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged-16"}
    long_chat = simulate_json(configs_dir() / "workloads" / "llama3.1-8b-long-chat.yaml")
    for m in long_chat["allocators"].values():
        assert m["completed"] + m["rejected"] == long_chat["requests"]


LIVELOCK = """
serving: {model: opt-13b, kv_pool_tokens: 1024}
requests:
  count: 2
  arrival: {process: all_at_once}
  prompt_tokens: {dist: constant, value: 200}
  output_tokens: {dist: constant, value: 700}
scheduler: {max_model_len: 2048, max_num_batched_tokens: 256, preemption: recompute}
step_time: {model: constant, seconds: 0.01}
allocators: [paged-16]
"""


def _invoke_guarded(args: list[str]):
    import signal

    def hang(*_):
        raise _Hang(f"no answer within 60 s: {args}")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(60)  # a hang guard, not a timing assertion: the run takes milliseconds
    try:
        return runner.invoke(app, args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_fuzzed_livelock_finishes_in_simulate_and_check(tmp_path):
    """Two requests, a preempted one grows past max_num_batched_tokens: once an endless loop."""
    path = write(tmp_path, LIVELOCK)
    r = _invoke_guarded(["simulate", str(path), "--json"])
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)["allocators"]["paged-16"]
    assert (m["completed"], m["rejected"]) == (2, 0) and m["preemptions"] >= 1
    budgets = write(tmp_path, f"""
budgets:
  - name: livelock
    workload: {path}
    require: {{max_rejected: 0}}
""", "budgets.yaml")
    r = _invoke_guarded(["check", str(budgets), "--json"])
    assert r.exit_code == 0, r.output
