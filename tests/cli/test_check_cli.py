"""`kvplan check`: budgets as a CI gate."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.io.models import configs_dir

runner = CliRunner()
EXAMPLE = configs_dir() / "budgets" / "example.yaml"
TINY_WORKLOAD = """
serving: {model: opt-13b, kv_pool_tokens: 8192}
requests: {count: 60, arrival: {process: poisson, rate: 20}, prompt_tokens: {dist: constant, value: 100}, output_tokens: {dist: constant, value: 60}}
scheduler: {max_model_len: 2048}
step_time: {model: constant, seconds: 0.02}
"""

# The shape the issue asks for, verbatim (its numbers need not pass).
ISSUE_SHAPE = """
budgets:
  - name: chat-70b-prod
    model: llama3-70b
    gpu: H100-80GB
    tensor_parallel_size: 4
    max_model_len: 32768
    kv_cache_dtype: fp8
    require:
      min_max_concurrency: 32
      max_kv_bytes_per_token: 160KiB
  - name: chat-traffic
    workload: workloads/chat.yaml
    require:
      min_token_states_frac: 0.9
      max_rejected: 0
"""


def check(path: Path, *args: str, env: dict | None = None):
    return runner.invoke(app, ["check", str(path), *args], env=env)


def write(tmp_path: Path, text: str, name: str = "budgets.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_shipped_example_passes_with_its_json_contract():
    r = check(EXAMPLE, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["passed"] is True and len(out["results"]) >= 8
    for row in out["results"]:
        assert {"budget", "limit", "value", "threshold", "margin", "passed"} <= set(row)
        assert row["passed"] and row["margin"] >= 0


def test_the_issue_shape_parses_and_is_judged(tmp_path):
    (tmp_path / "workloads").mkdir()
    write(tmp_path / "workloads", TINY_WORKLOAD, "chat.yaml")
    r = check(write(tmp_path, ISSUE_SHAPE), "--json")
    assert r.exit_code in (0, 1), r.output
    rows = {(x["budget"], x["limit"]): x for x in json.loads(r.stdout)["results"]}
    assert rows[("chat-70b-prod", "max_kv_bytes_per_token")]["value"] == 80 * 8 * 128 * 2
    assert rows[("chat-70b-prod", "max_kv_bytes_per_token")]["threshold"] == 160 * 1024
    assert rows[("chat-traffic", "max_rejected")]["passed"] is True


def test_a_budget_broken_on_purpose_fails_with_exit_1(tmp_path):
    path = write(tmp_path, """
budgets:
  - name: too-tight
    model: llama3-70b
    require: {max_kv_bytes_per_token: 100KiB}
  - name: fine
    model: llama2-7b
    require: {max_kv_bytes_per_token: 512KiB}
""")
    r = check(path, "--json")
    assert r.exit_code == 1, r.output
    rows = {x["budget"]: x for x in json.loads(r.stdout)["results"]}
    assert rows["too-tight"]["passed"] is False and rows["too-tight"]["margin"] == 100 * 1024 - 327_680
    assert rows["fine"]["passed"] is True and rows["fine"]["margin"] == 0


def test_junit_xml_one_case_per_limit(tmp_path):
    out = tmp_path / "report.xml"
    path = write(tmp_path, """
budgets:
  - name: b
    model: llama2-7b
    gpu: A10G
    require: {max_kv_bytes_per_token: 256KiB, min_max_concurrency: 1}
""")
    r = check(path, "--junit-xml", str(out))
    assert r.exit_code == 1
    suite = ET.parse(out).getroot()
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["b: max_kv_bytes_per_token"].find("failure") is not None
    assert cases["b: min_max_concurrency"].find("failure") is None


def test_github_actions_annotations_and_summary(tmp_path):
    summary = tmp_path / "summary.md"
    path = write(tmp_path, "budgets:\n  - name: b\n    model: llama2-7b\n    require: {max_kv_bytes_per_token: 1KiB}\n")
    r = check(path, env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
    assert r.exit_code == 1
    assert "::error" not in r.stdout
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("::error ")]
    props, message = line[len("::error "):].split("::", 1)
    assert dict(p.split("=", 1) for p in props.split(",")) == {
        "file": str(path), "line": "4", "title": "kvplan budget b"}
    assert message.startswith("max_kv_bytes_per_token: 524,288 B per token > 1,024 B: llama2-7b stores fp16 KV")
    assert "| b | max_kv_bytes_per_token |" in summary.read_text() and "**FAIL**" in summary.read_text()


def test_json_is_pure_under_github_actions(tmp_path):
    path = write(tmp_path, "budgets:\n  - name: b\n    model: llama2-7b\n    require: {max_kv_bytes_per_token: 1KiB}\n")
    r = check(path, "--json", env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": ""})
    assert r.exit_code == 1, r.output
    out = json.loads(r.stdout)  # no annotation before the document
    assert out["passed"] is False and "::error" in r.stderr


def test_annotation_file_is_relative_to_the_workspace_and_line_is_the_name_without_a_key_line(tmp_path):
    (tmp_path / "capacity").mkdir()
    path = write(tmp_path / "capacity", "budgets:\n  - name: a\n    model: llama2-7b\n"
                                        "    require: {max_kv_bytes_per_token: 1MiB}\n"
                                        "  - model: llama2-7b\n    name: b\n    require:\n"
                                        "      max_kv_bytes_per_token: 1KiB\n      max_kv_bytes: 1KiB\n")
    r = check(path, env={"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(tmp_path), "GITHUB_STEP_SUMMARY": ""})
    assert r.exit_code == 1
    lines = [x for x in r.stderr.splitlines() if x.startswith("::error ")]
    assert [x.split("::")[1] for x in lines] == [
        "error file=capacity/budgets.yaml,line=8,title=kvplan budget b",
        "error file=capacity/budgets.yaml,line=9,title=kvplan budget b",
    ]


def test_a_newline_in_a_name_cannot_start_a_workflow_command(tmp_path):
    path = write(tmp_path, 'budgets:\n  - name: "x\\n::warning::pwned, y: 50%"\n    model: llama2-7b\n'
                           '    require: {max_kv_bytes_per_token: 1KiB}\n')
    for args in ((), ("--json",)):
        r = check(path, *args, env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": ""})
        assert r.exit_code == 1, r.output
        for line in (r.stdout + r.stderr).splitlines():
            assert not line.lstrip().startswith("::warning"), line
        (line,) = [x for x in r.stderr.splitlines() if x.startswith("::error")]
        assert "title=kvplan budget x%0A%3A%3Awarning%3A%3Apwned%2C y%3A 50%25::" in line


def test_annotation_escaping_follows_githubs_rules():
    from kvplan.cli.check import annotation, escape_data, escape_property

    assert escape_data("50%\r\n::x") == "50%25%0D%0A::x"
    assert escape_property("a:b,c%\n") == "a%3Ab%2Cc%25%0A"
    assert annotation("m\n", title="t,1", file="d/b.yaml", line=3) == "::error file=d/b.yaml,line=3,title=t%2C1::m%0A"
    assert "\x1b" not in escape_data("\x1b[31m")


def test_junit_xml_stays_valid_with_control_characters_in_a_name(tmp_path):
    out = tmp_path / "report.xml"
    path = write(tmp_path, 'budgets:\n  - name: "a\\x01\\x1b<&>\\"\\nb"\n    model: llama2-7b\n'
                           '    require: {max_kv_bytes_per_token: 1KiB}\n')
    r = check(path, "--junit-xml", str(out))
    assert r.exit_code == 1, r.output
    suite = ET.parse(out).getroot()  # raises on a character XML 1.0 forbids
    (case,) = suite.iter("testcase")
    assert case.get("classname") == 'a\\x01\\x1b<&>"\nb'
    failure = case.find("failure")
    assert failure is not None and "524,288 B per token > 1,024 B: llama2-7b" in failure.get("message")
    assert "\x1b" not in r.stdout


def test_a_failing_limit_says_why_with_numbers(tmp_path):
    # Llama 3.1 70B in bf16 (141 GB of weights) on one 24 GB A10G: no KV cache at all.
    out = tmp_path / "report.xml"
    summary = tmp_path / "summary.md"
    path = write(tmp_path, "budgets:\n  - name: wont-fit\n    model: llama3.1-70b\n    gpu: A10G\n"
                           "    max_model_len: 32768\n    require:\n      min_max_concurrency: 4\n"
                           "      max_model_len_must_fit: true\n")
    r = check(path, "--json", "--junit-xml", str(out),
              env={"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)})
    assert r.exit_code == 1, r.output
    rows = {x["limit"]: x for x in json.loads(r.stdout)["results"]}
    reason = rows["min_max_concurrency"]["reason"]
    assert rows["min_max_concurrency"]["value"] == 0 and reason.startswith("max concurrency 0.00 < 4: ")
    assert "no memory left for the KV cache" in reason
    assert "weights 131.45 GiB" in reason and "GiB" in reason.split("exceed")[1]  # with the 32 MiB RoPE cache
    must_fit = rows["max_model_len_must_fit"]["reason"]
    assert must_fit.startswith("max_model_len 32768 does not fit: no memory left for the KV cache")
    failure = next(c for c in ET.parse(out).getroot().iter("testcase") if c.get("name").endswith("concurrency"))
    assert failure.find("failure").get("message") == f"min_max_concurrency: {reason}"
    assert f"min_max_concurrency: {reason}" in r.stderr
    assert reason in summary.read_text()
    text = check(path)
    assert "no memory left for the KV cache" in text.stdout


def test_a_passing_limit_has_no_reason_and_a_tight_one_gets_fits_numbers(tmp_path):
    path = write(tmp_path, "budgets:\n  - name: b\n    model: llama2-7b\n    gpu: A10G\n    max_model_len: 4096\n"
                           "    require: {min_max_concurrency: 100, min_kv_cache_tokens: 1}\n")
    r = check(path, "--json")
    assert r.exit_code == 1, r.output
    rows = {x["limit"]: x for x in json.loads(r.stdout)["results"]}
    assert rows["min_kv_cache_tokens"]["passed"] and rows["min_kv_cache_tokens"]["reason"] == ""
    why = rows["min_max_concurrency"]["reason"]
    assert why.startswith(f"max concurrency {rows['min_max_concurrency']['value']:.2f} < 100: 100 requests of 4,096 "
                          "tokens need")


def test_the_table_keeps_every_name_and_digit_at_80_columns(tmp_path):
    long_name = "deepseek-v3-long-context-" + "x" * 40
    path = write(tmp_path, f"budgets:\n  - name: {long_name}\n    model: deepseek-v3\n    gpu: H200\n"
                           "    tensor_parallel_size: 8\n    require: {min_kv_cache_tokens: 123456789}\n")
    r = check(path, env={"COLUMNS": "80"})
    assert r.exit_code == 1, r.output
    assert long_name in r.stdout and "123,456,789" in r.stdout and "min_kv_cache_tokens" in r.stdout
    assert "…" not in r.stdout and max(len(x) for x in r.stdout.splitlines()) <= 80
    r = check(EXAMPLE, env={"COLUMNS": "80"})
    assert r.exit_code == 0 and "…" not in r.stdout and "deepseek-v3-long-context" in r.stdout
    assert "max_kv_bytes_per_token" in r.stdout and "160.00 KiB" in r.stdout


def test_check_help_covers_every_option():
    import typer

    params = typer.main.get_command(app).commands["check"].params
    options = [p for p in params if p.name != "budgets_file"]
    assert len(options) == 3
    for p in options:
        assert p.help and "default" in p.help, p.name


def test_baseline_shows_what_got_worse(tmp_path):
    before = write(tmp_path, "budgets:\n  - name: b\n    model: llama2-7b\n    max_model_len: 4096\n"
                             "    batch: 2\n    require: {max_kv_bytes: 8GiB}\n")
    r = check(before, "--json")
    (tmp_path / "prev.json").write_text(r.stdout)
    after = write(tmp_path, before.read_text().replace("batch: 2", "batch: 3"), "after.yaml")
    r = check(after, "--baseline", str(tmp_path / "prev.json"), "--json")
    assert r.exit_code == 0, r.output
    (change,) = json.loads(r.stdout)["baseline"]["changed"]
    assert change["worse"] is True and change["before"] == 4 * (1 << 30) and change["after"] == 6 * (1 << 30)
    r = check(after, "--baseline", str(tmp_path / "prev.json"))
    assert "worse" in r.stdout


@pytest.mark.parametrize(
    "text,message",
    [
        ("budgets:\n  - name: b\n    model: llama2-7b\n    require: {max_kv_bytes_per_tokn: 1KiB}\n",
         "line 4: budgets.0.require.max_kv_bytes_per_tokn: unknown key"),
        ("budgets:\n  - name: b\n    require: {max_kv_bytes_per_token: 1KiB}\n", "need a model"),
        ("budgets:\n  - name: b\n    model: llama2-7b\n    require: {max_rejected: 0}\n", "need a workload file"),
        ("budgets:\n  - name: b\n    model: llama2-7b\n    require: {min_max_concurrency: 2}\n", "need a gpu"),
        ("budgets:\n  - name: b\n    model: llama2-7b\n    require: {max_kv_bytes: lots}\n", "expected a size"),
        ("budgets: []\n", "budgets: List should have at least 1 item"),
        ("budgets:\n  - name: b\n    model: llama2-7b\n    require: {}\n", "require names no limit"),
    ],
)
def test_invalid_budget_files_exit_2(tmp_path, text, message):
    r = check(write(tmp_path, text))
    assert r.exit_code == 2, r.output
    assert message in r.stderr and "Traceback" not in r.output


def test_missing_baseline_exits_2(tmp_path):
    r = check(EXAMPLE, "--baseline", str(tmp_path / "nope.json"))
    assert r.exit_code == 2 and "no such baseline file" in r.stderr


def test_schema_budgets():
    r = runner.invoke(app, ["schema", "budgets"])
    assert r.exit_code == 0 and "require" in json.dumps(json.loads(r.stdout))
BIG = "9" * 309


@pytest.mark.parametrize("require,message", [
    (f"{{max_kv_bytes: {BIG}}}", "over kvplan's 1 PiB limit"),
    (f"{{max_kv_bytes_per_gpu: \"{BIG}GiB\"}}", "over kvplan's 1 PiB limit"),
    ("{max_kv_bytes_per_token: .nan}", "max_kv_bytes_per_token"),
    ("{min_max_concurrency: .inf}", "finite number"),
    ("{min_max_concurrency: .nan}", "min_max_concurrency"),
    ("{min_headroom_frac: .nan}", "min_headroom_frac"),
    (f"{{min_max_concurrency: {BIG}}}", "min_max_concurrency"),
    (f"{{min_kv_cache_tokens: {BIG}}}", "less than or equal to 9007199254740992"),
    (f"{{max_preemptions: {BIG}}}", "max_preemptions"),
])
def test_non_finite_and_huge_numbers_exit_2(tmp_path, require, message):
    r = check(write(tmp_path, f"budgets:\n  - name: b\n    model: llama2-7b\n    gpu: A10G\n    require: {require}\n"))
    assert r.exit_code == 2, r.output
    assert message in r.stderr and "line 5" in r.stderr and "Traceback" not in r.output


@pytest.mark.parametrize("field", [f"batch: {BIG}", f"max_model_len: {BIG}", f"seq_len: {BIG}",
                                   "gpu_memory_utilization: .nan", f"gpu_memory: \"{BIG}GiB\""])
def test_huge_deployment_settings_exit_2(tmp_path, field):
    r = check(write(tmp_path, f"budgets:\n  - name: b\n    model: llama2-7b\n    gpu: A10G\n    {field}\n"
                              "    require: {min_max_concurrency: 1, max_kv_bytes: 1GiB}\n"))
    assert r.exit_code == 2, r.output
    assert field.split(":")[0] in r.stderr and "Traceback" not in r.output


def test_schema_describes_every_property():
    r = runner.invoke(app, ["schema", "budgets"])
    schema = json.loads(r.stdout)
    models = [schema, *schema["$defs"].values()]
    props = [(m.get("title"), name, p) for m in models for name, p in m["properties"].items()]
    assert len(props) >= 27  # 1 + 15 budget fields + 11 limits
    missing = [(title, name) for title, name, p in props if not p.get("description")]
    assert not missing


def test_each_failing_limit_states_its_own_value_and_bound(tmp_path):
    # issue 19: a failing min_kv_cache_tokens printed the concurrency verdict ("... concurrent requests ...")
    # instead of its own numbers
    path = write(tmp_path, "budgets:\n  - name: b\n    model: deepseek-v3\n    gpu: H200\n    tensor_parallel_size: 8\n"
                           "    max_model_len: 131072\n    require:\n      min_kv_cache_tokens: 5000000\n"
                           "      min_max_concurrency: 100\n      min_headroom_frac: 0.9\n"
                           "      max_kv_bytes_per_token: 1KiB\n      max_kv_bytes: 1KiB\n"
                           "      max_kv_bytes_per_gpu: 1KiB\n")
    r = check(path, "--json")
    assert r.exit_code == 1, r.output
    rows = {x["limit"]: x for x in json.loads(r.stdout)["results"]}
    assert not any(row["passed"] for row in rows.values())
    tokens = rows["min_kv_cache_tokens"]
    assert tokens["reason"].startswith(f"{tokens['value']:,.0f} KV cache tokens < 5,000,000: ")
    assert "concurren" not in tokens["reason"]
    conc = rows["min_max_concurrency"]
    assert conc["reason"].startswith(f"max concurrency {conc['value']:.2f} < 100: ")
    head = rows["min_headroom_frac"]
    assert head["reason"].startswith(f"headroom {100 * head['value']:.1f}% < 90.0%: ")
    for key, what in (("max_kv_bytes_per_token", " per token"), ("max_kv_bytes", ""),
                      ("max_kv_bytes_per_gpu", " on one GPU")):
        value = f"{rows[key]['value']:,.0f} B"
        assert rows[key]["reason"].startswith(value) and f"{what} > 1,024 B: " in rows[key]["reason"], key
    text = check(path, env={"COLUMNS": "80"}).stdout
    assert f"b: min_kv_cache_tokens: {tokens['value']:,.0f} KV cache tokens < 5,000,000" in " ".join(text.split())


def test_failing_simulation_limits_state_their_own_numbers(tmp_path):
    write(tmp_path, TINY_WORKLOAD, "chat.yaml")
    path = write(tmp_path, "budgets:\n  - name: w\n    workload: chat.yaml\n    require:\n"
                           "      min_token_states_frac: 0.9999\n      min_completed: 1000\n")
    r = check(path, "--json")
    assert r.exit_code == 1, r.output
    rows = {x["limit"]: x for x in json.loads(r.stdout)["results"]}
    states, done = rows["min_token_states_frac"], rows["min_completed"]
    assert states["reason"].startswith(f"token states {100 * states['value']:.1f}% < 100.0%: ")
    assert done["reason"].startswith(f"{done['value']:,.0f} completed < 1,000: ")


def test_a_context_past_the_models_fails_max_model_len_must_fit_unless_allowed(tmp_path):
    budget = ("budgets:\n  - name: long\n    model: llama3.1-8b\n    gpu: H100-80GB\n    max_model_len: 200000\n{}"
              "    require: {{max_model_len_must_fit: true, min_kv_cache_tokens: 1}}\n")
    r = check(write(tmp_path, budget.format("")), "--json")
    assert r.exit_code == 1, r.output
    rows = {x["limit"]: x for x in json.loads(r.stdout)["results"]}
    must = rows["max_model_len_must_fit"]
    assert not must["passed"] and must["reason"].startswith("max_model_len 200000 does not fit: vLLM does not start")
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1" in must["reason"] and rows["min_kv_cache_tokens"]["passed"]
    r = check(write(tmp_path, budget.format("    allow_long_max_model_len: true\n")), "--json")
    assert r.exit_code == 0, r.output


def test_a_data_parallel_budget_counts_every_rank(tmp_path):
    """data_parallel_size: engines side by side (vLLM), each its own pool; the fit limits count all of them, as
    `kvplan fit -dp N` sums them in all_ranks."""
    text = ("budgets:\n  - name: dp\n    model: deepseek-v3\n    gpu: H200\n    data_parallel_size: 8\n"
            "    enable_expert_parallel: true\n    require:\n      min_max_concurrency: 1\n"
            "      min_kv_cache_tokens: 1\n")
    r = check(write(tmp_path, text), "--json")
    assert r.exit_code == 0, r.output
    rows = {x["limit"]: x["value"] for x in json.loads(r.stdout)["results"]}
    fit = runner.invoke(app, ["fit", "deepseek-v3", "--gpu", "H200", "-dp", "8", "--enable-expert-parallel", "--json"])
    whole = json.loads(fit.stdout)["all_ranks"]
    assert rows["min_kv_cache_tokens"] == whole["kv_cache_tokens"]
    assert rows["min_max_concurrency"] == whole["max_concurrency"] == 16  # 2.64 an engine: 2 whole, 8 engines


def test_a_decode_context_parallel_budget_spreads_each_sequence(tmp_path):
    """decode_context_parallel_size: each sequence's KV over that many tp ranks, so one GPU holds 1/dcp of it."""
    text = ("budgets:\n  - name: dcp\n    model: deepseek-v3\n    gpu: H200\n    tensor_parallel_size: 8\n"
            "    decode_context_parallel_size: {dcp}\n    batch: 4\n    require:\n      max_kv_bytes_per_gpu: 1TiB\n")
    rows = []
    for dcp in (1, 8):
        r = check(write(tmp_path, text.format(dcp=dcp)), "--json")
        assert r.exit_code == 0, r.output
        rows.append({x["limit"]: x["value"] for x in json.loads(r.stdout)["results"]})
    assert rows[1]["max_kv_bytes_per_gpu"] == -(-rows[0]["max_kv_bytes_per_gpu"] // 8)
    r = check(write(tmp_path, text.format(dcp=8).replace("gpu: H200", "gpu: H200\n    engine: sglang")))
    assert r.exit_code == 2 and "modelled for vLLM" in r.output
