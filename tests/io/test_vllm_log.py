"""vLLM startup log lines of each era parse into the budget's figures."""

from __future__ import annotations

import pytest

from kvplan.errors import ConfigError
from kvplan.io.vllm_log import parse_vllm_log, read_vllm_log

GiB = 1 << 30

V0_065 = """\
INFO 12-01 08:00:00 llm_engine.py:237] Initializing an LLM engine (v0.6.5) with config: model='meta-llama/Llama-2-7b-hf', speculative_config=None, tokenizer='meta-llama/Llama-2-7b-hf', dtype=torch.float16, max_seq_len=4096, download_dir=None, tensor_parallel_size=1, pipeline_parallel_size=1, disable_custom_all_reduce=False, quantization=None, enforce_eager=False, kv_cache_dtype=auto, seed=0
INFO 12-01 08:00:09 model_runner.py:1099] Loading model weights took 12.5523 GB
INFO 12-01 08:00:11 worker.py:241] Memory profiling takes 1.62 seconds
INFO 12-01 08:00:11 worker.py:241] the current vLLM instance can use total_gpu_memory (79.15GiB) x gpu_memory_utilization (0.90) = 71.24GiB
INFO 12-01 08:00:11 worker.py:241] model weights take 12.55GiB; non_torch_memory takes 0.25GiB; PyTorch activation peak memory takes 1.23GiB; the rest of the memory reserved for KV Cache is 57.21GiB.
INFO 12-01 08:00:11 distributed_gpu_executor.py:57] # GPU blocks: 7322, # CPU blocks: 512
INFO 12-01 08:00:11 distributed_gpu_executor.py:61] Maximum concurrency for 4096 tokens per request: 28.60x
"""

V0_063 = ("INFO 10-20 12:00:00 worker.py:232] Memory profiling results: total_gpu_memory=79.15GiB "
          "initial_memory_usage=13.17GiB peak_torch_memory=14.30GiB memory_usage_post_profile=13.31GiB "
          "non_torch_memory=0.75GiB kv_cache_size=56.18GiB gpu_memory_utilization=0.90\n")

V1 = """\
INFO 05-01 10:00:00 [core.py:58] Initializing a V1 LLM engine (v0.9.1) with config: model='Qwen/Qwen2.5-7B-Instruct', dtype=torch.bfloat16, max_seq_len=32768, tensor_parallel_size=2, pipeline_parallel_size=1, enforce_eager=True, kv_cache_dtype=fp8
INFO 05-01 10:00:10 [gpu_model_runner.py:1329] Model loading took 7.1557 GiB memory and 3.2 seconds
INFO 05-01 10:00:15 [gpu_worker.py:191] Available KV cache memory: 62.5 GiB
INFO 05-01 10:00:15 [kv_cache_utils.py:634] GPU KV cache size: 2,340,096 tokens
INFO 05-01 10:00:15 [kv_cache_utils.py:637] Maximum concurrency for 32,768 tokens per request: 71.41x
INFO 05-01 10:00:30 [gpu_model_runner.py:1686] Graph capturing finished in 15 secs, took 0.52 GiB
"""


def test_v0_three_line_profile():
    log = parse_vllm_log(V0_065)
    assert (log.generation, log.version, log.model, log.dtype) == ("V0", "0.6.5", "meta-llama/Llama-2-7b-hf", "float16")
    assert log.max_seq_len == 4096 and log.tensor_parallel_size == 1 and log.enforce_eager is False
    assert log.total_gpu_memory_bytes == round(79.15 * GiB) and log.gpu_memory_utilization == 0.9
    assert log.weights_bytes == round(12.55 * GiB)  # the profile line wins over the load line
    assert (log.non_torch_bytes, log.activation_bytes, log.kv_cache_memory_bytes) == (
        round(0.25 * GiB), round(1.23 * GiB), round(57.21 * GiB))
    assert log.num_gpu_blocks == 7322 and log.max_concurrency == 28.6 and log.concurrency_tokens == 4096


def test_v0_one_line_results():
    log = parse_vllm_log(V0_063)
    assert log.kv_cache_memory_bytes == round(56.18 * GiB) and log.non_torch_bytes == round(0.75 * GiB)
    assert log.gpu_memory_utilization == 0.9


def test_v1_lines():
    log = parse_vllm_log(V1)
    assert log.generation == "V1" and log.tensor_parallel_size == 2 and log.kv_cache_dtype == "fp8"
    assert log.enforce_eager is True and log.weights_bytes == round(7.1557 * GiB)
    assert log.kv_cache_memory_bytes == round(62.5 * GiB) and log.kv_cache_tokens == 2_340_096
    assert log.max_concurrency == 71.41 and log.concurrency_tokens == 32768
    assert log.cuda_graph_bytes == round(0.52 * GiB)


def test_unrecognisable_log_is_a_clear_error(tmp_path):
    path = tmp_path / "x.log"
    path.write_text("hello\nworld\n")
    with pytest.raises(ConfigError, match="no vLLM memory lines found"):
        read_vllm_log(path)
    with pytest.raises(ConfigError, match="no such file"):
        read_vllm_log(tmp_path / "missing.log")


def _parse_in_subprocess(text: str, tmp_path) -> str:
    """Parse in a child with a generous hang guard: a super-linear pattern takes minutes here."""
    import subprocess
    import sys

    path = tmp_path / "long.log"
    path.write_text(text)
    code = ("import sys; from pathlib import Path; from kvplan.io.vllm_log import parse_vllm_lines; "
            "from kvplan.io.yamlio import iter_lines; "
            "print(sorted(parse_vllm_lines(iter_lines(Path(sys.argv[1]))).matched))")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.mark.parametrize("repeat", [
    "Memory profiling results: total_gpu_memory=1GiB peak_torch_memory=1GiB ",
    "Initializing a V1 LLM engine (v",
    "model weights take 1GiB; non_torch_memory takes ",
])
def test_long_repeated_lines_parse_in_linear_time(tmp_path, repeat):
    # one 600 KB line; the old `.*?` pattern took 8-13 s at 21 KB and grew cubically
    text = "INFO " + repeat * (600_000 // len(repeat)) + "\n"
    assert _parse_in_subprocess(text, tmp_path) == "[]"


def test_v0_results_fields_in_any_order():
    line = ("Memory profiling results: gpu_memory_utilization=0.90 kv_cache_size=56.18GiB total_gpu_memory=79.15GiB "
            "peak_torch_memory=14.30GiB non_torch_memory=0.75GiB")
    log = parse_vllm_log(line)
    assert log.total_gpu_memory_bytes == round(79.15 * GiB) and log.gpu_memory_utilization == 0.90


@pytest.mark.parametrize("line", [
    "Available KV cache memory: " + "9" * 400 + " GiB",
    "GPU KV cache size: 99999999999999999999999999 tokens",
    "Initializing a V1 LLM engine (v0.9.1) with config: model='m', max_seq_len=" + "9" * 5000,
])
def test_absurd_figures_are_a_clear_error_with_the_line(line):
    with pytest.raises(ConfigError, match="line 2: .* out of range"):
        parse_vllm_log("INFO start\n" + line + "\n", "x.log")


def test_log_is_streamed_not_read_whole(tmp_path):
    path = tmp_path / "bin.log"
    path.write_bytes(V1.encode() + b"\xff\x00 garbage\n")
    with pytest.raises(ConfigError, match=r"line 7: not UTF-8 text"):
        read_vllm_log(path)


NEW_LINES = """\
(EngineCore_DP0 pid=181642) [Stage-0] INFO 02-02 18:25:03 [gpu_worker.py:358] Available KV cache memory: 100.43 GiB
\u2502 INFO 03-21 20:15:46 [executor_base.py:111] # cuda blocks: 7191, # CPU blocks: 512
(Worker_TP1 pid=448) INFO 08-14 14:07:20 [gpu_model_runner.py:6681] Profiling CUDA graph memory: PIECEWISE=16 (largest=16)
(Worker_TP1 pid=448) INFO 08-14 14:07:22 [gpu_model_runner.py:6806] Estimated CUDA graph memory: 0.36 GiB total
(Worker_TP0 pid=447) INFO 08-14 14:07:22 [gpu_worker.py:578] CUDA graph memory profiling is enabled (default since v0.21.0). The current --gpu-memory-utilization=0.8200 is equivalent to --gpu-memory-utilization=0.8048 without CUDA graph memory profiling.
"""


def test_prefixed_lines_and_cuda_graph_estimate():
    log = parse_vllm_log(NEW_LINES)
    assert log.kv_cache_memory_bytes == round(100.43 * GiB) and log.num_gpu_blocks == 7191
    assert log.cuda_graph_estimate_bytes == round(0.36 * GiB) and log.cuda_graph_sizes == 16
    assert log.gpu_memory_utilization == 0.82 and log.gpu_memory_utilization_without_graphs == 0.8048


@pytest.mark.parametrize("line,attr,value", [
    ("INFO 05-26 [gpu_worker.py:621] CUDA graph pool memory: 0.11 GiB (actual), 0.14 GiB (estimated), difference: 0.03 "
     "GiB (25.0%).", "cuda_graph_estimate_bytes", round(0.14 * GiB)),
    ("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|\u2588\u2588\u2588| 19/19 [00:00<00:00, 26.06it/s]",
     "cuda_graph_sizes", 19),
    ("Capturing CUDA graph shapes: 100%|\u2588\u2588\u2588\u2588| 35/35 [00:16<00:00,  2.18it/s]", "cuda_graph_sizes", 35),
    ("Capturing CUDA graphs (decode, FULL): 100%|\u2588\u2588| 11/11 [00:00<00:00, 29.99it/s]", "cuda_graph_sizes", None),
    ("INFO [gpu_worker.py:490] In v0.19, CUDA graph memory profiling will be enabled by default. To try it now, set "
     "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 and increase --gpu-memory-utilization from 0.7000 to 0.7021 to "
     "maintain", "gpu_memory_utilization", 0.7),
    ("[Stage-2] INFO 02-02 18:25:01 [vllm.py:765] Cudagraph is disabled under eager mode", "enforce_eager", True),
])
def test_newer_lines(line, attr, value):
    assert getattr(parse_vllm_log(line), attr) == value


def test_utilization_out_of_range_is_a_clear_error():
    with pytest.raises(ConfigError, match="line 1: util_equivalent"):
        parse_vllm_log("--gpu-memory-utilization=7.5 is equivalent to --gpu-memory-utilization=0.8 without it", "x.log")


@pytest.mark.parametrize("repeat", ["Capturing CUDA graphs (a, PIECEWISE): 100%|", "is equivalent to --gpu-memory-utilization"])
def test_new_patterns_parse_long_lines_in_linear_time(tmp_path, repeat):
    text = "INFO " + repeat * (600_000 // len(repeat)) + "\n"
    assert _parse_in_subprocess(text, tmp_path) == "[]"
