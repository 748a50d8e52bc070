"""benchmarks/bench_real_starts.py: its log reader and failure classifier against figures read by hand from
real vLLM 0.19.0 logs (tests/fixtures/vllm_logs/llm-d-planner-v0.19.0/README.md says where they come from)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from kvplan.core.units import GiB

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / "tests" / "fixtures" / "vllm_logs" / "llm-d-planner-v0.19.0"


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_real_starts", REPO / "benchmarks" / "bench_real_starts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


bench = _load_bench()


def gib(text: str) -> int:
    return round(float(text) * GiB)


# Read by hand from each log: its non-default args line, the DEBUG "Memory profiling takes ..." line (the
# largest "Total non KV cache memory" of the ranks), "worker init memory snapshot: ... total_memory=",
# "worker requested memory", "torch.compile took", "Defaulting max_num_seqs to", the engine config's
# quantization=, and the lines kvplan.io.vllm_log reads ("Model loading took", "Available KV cache
# memory", "GPU KV cache size", "Estimated CUDA graph memory", "CUDA graph pool memory: X GiB (actual)").
STARTED = [
    ("meta-llama-llama-3-1-8b---h100-80gb--tp1pp1dp1--8192.log", dict(
        model="meta-llama/Llama-3.1-8B-Instruct", tp=None, max_model_len=8192, gmu=0.95, quantization=None,
        requested="75.23", non_kv="17.12", activation="1.89", non_torch="0.25", profile_weights="14.99", total="79.19",
        compile_s=10.84, max_num_seqs=1024, weights="14.99", kv_memory="58.11", kv_tokens=476_016,
        graph_estimate="0.84", graph_actual="0.91")),
    ("qwen-qwen2-5-72b-instruc--h100-80gb--tp2pp1dp1--8192.log", dict(
        model="Qwen/Qwen2.5-72B-Instruct", tp=2, max_model_len=8192, gmu=0.95, quantization=None,
        requested="75.23", non_kv="72.19", activation="2.29", non_torch="2.09", profile_weights="67.8", total="79.19",
        compile_s=26.78, max_num_seqs=1024, weights="67.8", kv_memory="3.04", kv_tokens=19_920,
        graph_estimate="1.63", graph_actual="1.61")),
]


@pytest.mark.parametrize(("name", "want"), STARTED, ids=[n for n, _ in STARTED])
def test_started_log_figures(name: str, want: dict) -> None:
    s = bench.read_start_log(LOGS / name)
    assert s.started and s.failure is None
    assert s.args["model"] == want["model"]
    assert s.args.get("tensor_parallel_size") == want["tp"]
    assert s.args["max_model_len"] == want["max_model_len"]
    assert s.args["gpu_memory_utilization"] == want["gmu"]
    assert s.quantization == want["quantization"]
    assert s.requested_bytes == gib(want["requested"])
    assert s.non_kv_bytes == gib(want["non_kv"])
    # the binding rank's KV memory is requested less its non-KV memory: rank 0's printed figure here
    assert abs(s.binding_kv_bytes - gib(want["kv_memory"])) <= 0.01 * GiB
    assert s.activation_bytes == gib(want["activation"])
    assert s.non_torch_bytes == gib(want["non_torch"])
    assert s.profile_weights_bytes == gib(want["profile_weights"])
    assert s.total_memory_bytes == gib(want["total"])
    assert s.compile_seconds == want["compile_s"]
    assert s.max_num_seqs == want["max_num_seqs"]
    # what kvplan.io.vllm_log reads, reused by the benchmark
    assert s.log.weights_bytes == gib(want["weights"])
    assert s.log.kv_cache_memory_bytes == gib(want["kv_memory"])
    assert s.log.kv_cache_tokens == want["kv_tokens"]
    assert s.log.cuda_graph_estimate_bytes == gib(want["graph_estimate"])
    assert s.log.cuda_graph_bytes == gib(want["graph_actual"])


def test_failed_logs_classified() -> None:
    oom = bench.read_start_log(LOGS / "openai-gpt-oss-20b--h100-80gb--tp1pp1dp1--8192.FAILED.log")
    assert not oom.started
    assert oom.failure == "memory after the pool (sampler warm-up / CUDA graph OOM)"
    assert oom.failure_line.startswith("RuntimeError: CUDA out of memory occurred when warming up sampler")
    assert oom.log.kv_cache_tokens == 1_277_184  # the pool was sized before the warm-up failed
    assert oom.quantization == "mxfp4"

    long = bench.read_start_log(LOGS / "microsoft-phi-2--h100-80gb--tp1pp1dp1--8192.FAILED.log")
    assert long.failure == "context longer than the model allows"
    assert "max_model_len (8192) is greater than the derived max_model_len" in long.failure_line
    assert long.args["max_model_len"] == 8192 and long.log.kv_cache_tokens is None


# One error line from each of the other FAILED logs of the llm-d-planner v0.19.0 set (copied as printed).
OTHER_FAILURES = [
    ("(Worker pid=485) ERROR 04-22 15:14:02 [v1/executor/multiproc_executor.py:857] ValueError: Free memory on "
     "device cuda:1 (60.87/79.19 GiB) on startup is less than desired GPU memory utilization (0.95, 75.23 GiB). "
     "Decrease GPU memory utilization or reduce GPU memory used by other processes.",
     "GPU memory already in use by another process"),
    ("(APIServer pid=1) requests.exceptions.HTTPError: 403 Client Error: Forbidden for url: "
     "https://huggingface.co/google/gemma-2-2b-it/resolve/main/config.json", "download failure"),
    ("(APIServer pid=1)   Value error, The checkpoint you are trying to load has model type `gemma4` but "
     "Transformers does not recognize this architecture.", "unsupported model"),
    ("(Worker_TP4 pid=446) ERROR 04-22 00:27:44 [v1/executor/multiproc_executor.py:857] AssertionError: 151936 "
     "is not divisible by 5", "parallel layout"),
    ("(Worker pid=1224) ERROR 04-22 01:41:58 [v1/executor/multiproc_executor.py:857] AssertionError: DP "
     "adjusted local rank 1 is out of bounds. ", "parallel layout"),
]


@pytest.mark.parametrize(("line", "cause"), OTHER_FAILURES)
def test_classify_failure_lines(line: str, cause: str) -> None:
    got, message = bench.classify_failure(["INFO 04-22 00:00:00 [x.py:1] starting", line], pool_made=False)
    assert got == cause
    assert message is not None and not message.startswith("(")  # the process prefix is dropped


def test_plain_oom_is_placed_by_the_pool() -> None:
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert bench.classify_failure([line], pool_made=True)[0].startswith("memory after the pool")
    assert bench.classify_failure([line], pool_made=False)[0].startswith("out of memory before the pool")
    assert bench.classify_failure(["INFO nothing wrong"], pool_made=False) == ("unclassified", None)


def _start(**args: object) -> object:
    return bench.StartLog(name="x", started=True, log=bench.VLLMLog(), args={"model": "m", **args})


def test_plan_states_the_flags() -> None:
    plan = bench.plan_for(_start(model="RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16", dtype="float16",
                                 tensor_parallel_size=2, max_model_len=4096))
    # bundled (llama3.1-8b-w4a16): its own quantization_config, which --dtype float16 leaves quantized
    assert plan.model == "RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16" and plan.weight_dtype == "auto"
    assert plan.kwargs["tp"] == 2 and plan.kwargs["max_model_len"] == 4096
    assert plan.kwargs["kv_cache_dtype"] == "fp16"  # vLLM's --dtype sets an auto KV cache's dtype
    assert plan.kwargs["gpu_memory_utilization"] == 0.9  # vLLM's default when the flag is left out
    fp32 = bench.plan_for(_start(dtype="float32", kv_cache_dtype="fp8"))
    assert fp32.weight_dtype == "fp32" and fp32.kwargs["kv_cache_dtype"] == "fp8"
    assert bench.plan_for(_start(quantization="fp8")).weight_dtype == "fp8"
    assert "data_parallel_size=2" in bench.plan_for(_start(data_parallel_size=2))
    assert "gptq" in bench.plan_for(_start(quantization="gptq"))


def test_a_quantized_checkpoint_kvplan_does_not_bundle_is_read_from_its_name() -> None:
    plan = bench.plan_for(_start(model="someone/Meta-Llama-3.1-8B-Instruct-quantized.w4a16"))
    assert plan.model == "someone/Meta-Llama-3.1-8B-Instruct" and plan.weight_dtype == "int4-g128"
    bundled = bench.plan_for(_start(model="RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic"))
    assert bundled.model == "RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic" and bundled.weight_dtype == "auto"
    # a float32 model dtype would widen the quantized checkpoint's embeddings and scales, which fit cannot state
    assert "float32" in bench.plan_for(_start(model="RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8",
                                              dtype="float32"))
