"""vLLM startup log lines of each era parse into the budget's figures."""

from __future__ import annotations

from pathlib import Path

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


# A served 0.11.0 start as a user has it (hand-written in the format of vllm/entrypoints/openai/api_server.py and
# entrypoints/utils.py at 0.11.0; the engine's "Initializing a V1 LLM engine" line is not in it)
V0_11_SERVED = """\
INFO 11-12 06:23:18 [__init__.py:216] Automatically detected platform cuda.
(APIServer pid=1) INFO 11-12 06:23:21 [api_server.py:1839] vLLM API server version 0.11.0
(APIServer pid=1) INFO 11-12 06:23:21 [utils.py:233] non-default args: {'model_tag': 'Qwen/Qwen3-8B', 'model': 'Qwen/Qwen3-8B', 'max_model_len': 16384, 'tensor_parallel_size': 2, 'gpu_memory_utilization': 0.85, 'dtype': 'bfloat16', 'quantization': 'fp8', 'enable_prefix_caching': False}
(EngineCore_DP0 pid=300) INFO 11-12 06:24:02 [gpu_worker.py:298] Available KV cache memory: 20.5 GiB
(EngineCore_DP0 pid=300) INFO 11-12 06:24:02 [kv_cache_utils.py:1087] GPU KV cache size: 298,560 tokens
"""


def test_a_served_0_11_log_names_its_release_and_model():
    log = parse_vllm_log(V0_11_SERVED)
    assert (log.version, log.generation, log.model) == ("0.11.0", "V1", "Qwen/Qwen3-8B")  # 0.11 is V1 only
    assert log.max_seq_len == 16384 and log.tensor_parallel_size == 2 and log.gpu_memory_utilization == 0.85
    assert log.dtype == "bfloat16" and log.quantization == "fp8"
    assert log.pipeline_parallel_size is None and log.enforce_eager is None  # not in the args: not guessed


@pytest.mark.parametrize("line,version", [
    ("(APIServer pid=3100) INFO 10-10 14:03:22 [api_server.py:1839] vLLM API server version 0.11.0rc3", "0.11.0rc3"),
    ("(APIServer pid=1) INFO 01-23 15:48:29 [api_server.py:1842] vLLM API server version 0.11.0+582e4e37.nv25.11",
     "0.11.0+582e4e37.nv25.11"),
    ("INFO 10-16 05:05:46 api_server.py:523] vLLM API server version 0.6.3.post1", "0.6.3.post1"),
    ("(APIServer pid=1) INFO 04-22 00:03:35 [entrypoints/utils.py:299]  \u2584\u2584 \u2584\u2588 \u2588     \u2588     "
     "\u2588 \u2580\u2584\u2580 \u2588  version 0.19.0", "0.19.0"),
    ("(EngineCore pid=242) INFO 04-22 00:03:48 [v1/attention/backends/flash_attn.py:596] Using FlashAttention version 3",
     None),
])
def test_server_version_lines(line, version):
    assert parse_vllm_log(line).version == version


def test_the_engine_config_line_wins_over_the_args():
    text = ("INFO [utils.py:233] non-default args: {'model': 'a/b', 'max_model_len': 4096, 'tensor_parallel_size': 4}\n"
            "INFO [core.py:77] Initializing a V1 LLM engine (v0.10.1) with config: model='c/d', max_seq_len=2048, "
            "tensor_parallel_size=2, quantization=None\n")
    log = parse_vllm_log(text)
    assert (log.model, log.max_seq_len, log.tensor_parallel_size, log.version) == ("c/d", 2048, 2, "0.10.1")


def test_args_that_are_not_all_literals_are_read_key_by_key():
    # vLLM prints config objects in the dict (KVTransferConfig(...)): literal_eval refuses the whole, not the keys
    line = ("(APIServer pid=161) INFO 12-15 11:44:52 [utils.py:233] non-default args: {'port': 8100, 'model': "
            "'Qwen/Qwen3-8B', 'max_model_len': 10000, 'enforce_eager': True, 'block_size': 128, "
            "'max_num_batched_tokens': 4096, 'kv_transfer_config': KVTransferConfig(kv_connector='X', kv_role='kv_both')}")
    log = parse_vllm_log(line)
    assert (log.model, log.max_seq_len, log.enforce_eager, log.block_size, log.max_num_batched_tokens) == (
        "Qwen/Qwen3-8B", 10000, True, 128, 4096)


def test_args_of_the_wrong_type_are_not_read():
    log = parse_vllm_log("non-default args: {'model': 7, 'tensor_parallel_size': True, 'max_model_len': '8k', "
                         "'dtype': 'auto'}")
    assert (log.model, log.tensor_parallel_size, log.max_seq_len, log.dtype) == (None, None, None, None)
    with pytest.raises(ConfigError, match="line 1: args"):
        parse_vllm_log("non-default args: {'gpu_memory_utilization': 9.5}", "x.log")


def test_the_binding_rank_of_0_19s_profiling_lines():
    # two pipeline stages: the one with more non-KV memory has less KV memory, and the engine sizes every
    # rank's pool by it (the figures are made up; the format is vLLM 0.19.0's gpu_worker.py:435)
    text = "".join(
        f"(Worker_PP{r} pid={r}) DEBUG 04-22 01:04:01 [v1/worker/gpu_worker.py:435] Memory profiling takes 35.86 "
        f"seconds. Total non KV cache memory: {nk}GiB; torch peak memory increase: {a}GiB; non-torch forward increase "
        f"memory: {nt}GiB; weights memory: {w}GiB.\n"
        for r, nk, a, nt, w in ((0, "40.5", "1.5", "1.0", "38.0"), (1, "42.0", "2.5", "1.2", "38.3")))
    log = parse_vllm_log(text)
    assert log.non_kv_cache_bytes == round(42.0 * GiB) and log.activation_bytes == round(2.5 * GiB)
    assert log.non_torch_bytes == round(1.2 * GiB) and log.weights_bytes == round(38.3 * GiB)


@pytest.mark.parametrize("line,total", [
    ("DEBUG 04-22 00:03:47 [v1/worker/gpu_worker.py:284] worker init memory snapshot: torch_peak=0.0GiB, "
     "free_memory=78.68GiB, total_memory=79.19GiB, cuda_memory=0.51GiB", 79.19),
    ("DEBUG 04-22 00:04:24 [v1/worker/gpu_worker.py:661] Free memory on device (78.68/79.19 GiB) on startup. Desired "
     "GPU memory utilization is (0.95, 75.23 GiB).", 79.19),
    ("ERROR 04-22 15:14:02 [multiproc_executor.py:857] ValueError: Free memory on device cuda:1 (60.87/79.19 GiB) on "
     "startup is less than desired GPU memory utilization (0.95, 75.23 GiB).", 79.19),
])
def test_total_gpu_memory_lines(line, total):
    log = parse_vllm_log(line)
    assert log.total_gpu_memory_bytes == round(total * GiB) and log.total_gpu_memory_from is not None


def test_the_engines_block_count_and_not_the_profiling_override():
    text = ("INFO 04-22 00:04:19 [v1/core/kv_cache_utils.py:829] Overriding num_gpu_blocks=0 with "
            "num_gpu_blocks_override=512\n")
    assert parse_vllm_log(text).num_gpu_blocks is None
    text += ("(APIServer pid=1) DEBUG 04-22 00:04:25 [v1/metrics/loggers.py:273] Engine 000: vllm cache_config_info "
             "with initialization after num_gpu_blocks is: 29751\n")
    log = parse_vllm_log(text)
    assert log.num_gpu_blocks == 29751 and log.generation is None  # a V1 line: not taken for V0's "# GPU blocks"


REAL_0_19 = Path(__file__).parent.parent / "fixtures" / "vllm_logs" / "llm-d-planner-v0.19.0"
# Read by hand from the logs (line numbers in the files as shipped):
# - "version 0.19.0" (banner, line 21); "non-default args: {...}" (line 25);
# - "worker init memory snapshot: ... total_memory=79.19GiB" (Llama line 74, Qwen lines 137/139);
# - "worker requested memory: 75.23GiB" (Llama 75, Qwen 138/140);
# - "Memory profiling takes ... Total non KV cache memory: X; torch peak memory increase: X; non-torch forward
#   increase memory: X; weights memory: X" (Llama line 372: 17.12, 1.89, 0.25, 14.99; Qwen lines 810 and 815,
#   both ranks: 72.19, 2.29, 2.09, 67.8);
# - "Defaulting max_num_seqs to 1024"; "vllm cache_config_info with initialization after num_gpu_blocks is: N"
#   (Llama line 699: 29751; Qwen line 1468: 1245).
REAL_0_19_FIGURES = [
    ("meta-llama-llama-3-1-8b---h100-80gb--tp1pp1dp1--8192.log", dict(
        model="meta-llama/Llama-3.1-8B-Instruct", tp=1, total=79.19, requested=75.23, non_kv=17.12, activation=1.89,
        non_torch=0.25, weights=14.99, blocks=29751, max_num_seqs=1024)),
    ("qwen-qwen2-5-72b-instruc--h100-80gb--tp2pp1dp1--8192.log", dict(
        model="Qwen/Qwen2.5-72B-Instruct", tp=2, total=79.19, requested=75.23, non_kv=72.19, activation=2.29,
        non_torch=2.09, weights=67.8, blocks=1245, max_num_seqs=1024)),
]


@pytest.mark.parametrize("name,want", REAL_0_19_FIGURES, ids=[n for n, _ in REAL_0_19_FIGURES])
def test_real_0_19_logs(name, want):
    log = read_vllm_log(REAL_0_19 / name)
    assert (log.version, log.generation) == ("0.19.0", "V1")
    assert (log.model, log.tensor_parallel_size) == (want["model"], want["tp"])
    assert log.total_gpu_memory_bytes == round(want["total"] * GiB)
    assert log.requested_memory_bytes == round(want["requested"] * GiB)
    assert log.non_kv_cache_bytes == round(want["non_kv"] * GiB)
    assert log.activation_bytes == round(want["activation"] * GiB)
    assert log.non_torch_bytes == round(want["non_torch"] * GiB)
    assert log.weights_bytes == round(want["weights"] * GiB)
    assert log.num_gpu_blocks == want["blocks"] and log.max_num_seqs == want["max_num_seqs"]


@pytest.mark.parametrize("repeat", ["non-default args: {'model': 'x', ", "worker init memory snapshot: ",
                                    "\u2588  version ", "Free memory on device ("])
def test_served_log_patterns_parse_long_lines_in_linear_time(tmp_path, repeat):
    text = "INFO " + repeat * (600_000 // len(repeat)) + "\n"
    out = _parse_in_subprocess(text, tmp_path)
    assert out in ("[]", "['args']")


def test_data_parallel_flags_come_from_the_arguments_not_one_engines_line():
    """llm-d-planner's vLLM 0.19.0 start with --data-parallel-size 2 (../shared/vllm-logs, Apache-2.0): the API
    server's non-default args say 2; each DP rank's engine line says data_parallel_size=1 (a dense model's rank is
    an engine of its own), so the arguments are read for it, and expert parallelism and DCP with it."""
    path = (Path(__file__).resolve().parents[2].parent / "shared" / "vllm-logs" / "llm-d-planner-v0.19.0"
            / "meta-llama-llama-3-1-8b---h100-80gb--tp1pp1dp2--8192.FAILED.log")
    if not path.exists():
        pytest.skip(f"{path} is not here (the workplace's shared/ folder)")
    log = read_vllm_log(path)
    assert log.data_parallel_size == 2 and log.tensor_parallel_size == 1 and not log.enable_expert_parallel


def test_expert_parallel_and_dcp_arguments():
    """The same lines with the other flags as vLLM prints them in its non-default args (made up here: no public log
    of a DP + EP or DCP start states them, docs/research/dp-ep-dcp.md section 3.2)."""
    lines = [
        "INFO 01-01 00:00:00 [entrypoints/utils.py:233] non-default args: {'model': 'deepseek-ai/DeepSeek-V3', "
        "'tensor_parallel_size': 8, 'data_parallel_size': 2, 'enable_expert_parallel': True, "
        "'decode_context_parallel_size': 8}",
    ]
    log = parse_vllm_log("\n".join(lines))
    assert log.data_parallel_size == 2 and log.enable_expert_parallel is True
    assert log.decode_context_parallel_size == 8 and log.tensor_parallel_size == 8


def test_speculative_config_and_prefix_caching_from_the_args():
    log = read_vllm_log(Path(__file__).parents[1] / "fixtures" / "vllm_logs" / "v1_club3090_dual_qwen36_27b_mtp3.log")
    assert log.speculative_config == {"method": "mtp", "num_speculative_tokens": 3}
    assert log.enable_prefix_caching is True and log.kv_cache_dtype == "fp8_e5m2"
    assert (log.kv_cache_tokens, log.tensor_parallel_size, log.max_num_seqs) == (620_944, 2, 2)


def test_speculative_config_from_the_engine_line_and_args_that_are_not_all_literals():
    engine = ("(EngineCore pid=106) INFO 05-06 22:28:36 [core.py:109] Initializing a V1 LLM engine (v0.20.1) with config: "
              "model='~/m', speculative_config=SpeculativeConfig(method='mtp', model='~/m', num_spec_tokens=3), "
              "tokenizer='~/m', skip_tokenizer_init=False,")
    assert parse_vllm_log(engine).speculative_config == {"method": "mtp", "num_speculative_tokens": 3}
    args = ("INFO [utils.py:233] non-default args: {'model': 'a/b', 'kv_transfer_config': KVTransferConfig(x='y'), "
            "'speculative_config': {'method': 'ngram', 'num_speculative_tokens': 4, 'prompt_lookup_max': 3}}")
    assert parse_vllm_log(args).speculative_config == {"method": "ngram", "num_speculative_tokens": 4,
                                                        "prompt_lookup_max": 3}


def test_the_mamba_cache_mode_vllm_set():
    line = ("(EngineCore pid=1) INFO 06-18 05:11:27 [config.py:440] Mamba cache mode is set to 'align' for "
            "Qwen3_5ForConditionalGeneration by default when prefix caching is enabled")
    assert parse_vllm_log(line).mamba_cache_mode == "align"
