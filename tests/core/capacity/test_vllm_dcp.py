"""vLLM's decode context parallelism (kvplan/core/engines/vllm/dcp.py): vLLM's own test expectations of the block
table, and `fit` with -dcp."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.core.engines.vllm.plan import Bucket, KVLayout
from kvplan.core.spec import LayerKind

runner = CliRunner()


def layout(block: int, dcp: int) -> KVLayout:
    return KVLayout(page_bytes=block * 576 * 2, group_size=1, dcp=dcp,
                    buckets=(Bucket(kind=LayerKind.FULL, window=0, block_size=block, num_layers=1, num_groups=1),))


@pytest.mark.parametrize(("block", "dcp", "max_model_len", "blocks"), [
    # vLLM 0.33.0 tests/v1/core/test_kv_cache_utils.py::test_uniform_type_spec_block_table_width_matches_layer_spec:
    # an MLA spec of block 16 at max_model_len 1024 has a block table 64 wide, 32 at dcp 2
    (16, 1, 1024, 64), (16, 2, 1024, 32),
    # ::test_dcp_target_allocates_replicated_draft_independently: the target at dcp 4 (blocks of 16 x 4 tokens) is
    # 16 wide at 1024; 65 tokens take 2 of its blocks
    (16, 4, 1024, 16), (16, 4, 65, 2),
    # tests/v1/worker/test_gpu_model_runner_v2.py::test_initialize_kv_cache_does_not_dcp_shard_mamba_block_table:
    # attention blocks of 1536 at dcp 8 over 1,048,576 tokens: cdiv(1,048,576, 12,288) = 86
    (1536, 8, 1_048_576, 86),
])
def test_a_request_takes_the_blocks_of_its_share_of_the_tokens(block, dcp, max_model_len, blocks):
    assert layout(block, dcp).blocks_per_request(max_model_len, 8192) == blocks


def _fit(*args: str) -> tuple[int, dict | str]:
    r = runner.invoke(app, ["fit", *args, "--json"])
    if r.exit_code == 2:
        return 2, r.output
    assert r.exit_code in (0, 1), r.output
    return r.exit_code, json.loads(r.stdout)


@pytest.mark.parametrize(("version", "rule"), [("0.10.2", "num_blocks x block_size x dcp 8"),
                                               ("0.11.1", "num_blocks // layer groups x block_size x dcp 8"),
                                               ("0.33.0", "int(max concurrency x max_model_len)")])
def test_deepseek_v3_at_tp_8_dcp_8_holds_each_token_once(version, rule):
    """Each rank's pool is the -tp 8 pool (the same blocks); the blocks hold 64 tokens on each of 8 ranks, and a
    request of 163,840 tokens needs cdiv(163,840, 64 x 8) = 320 of them; the log counts them by the release's rule."""
    base = ("deepseek-v3", "--gpu", "H200", "-tp", "8", "--engine", f"vllm=={version}")
    _, tp8 = _fit(*base)
    _, dcp8 = _fit(*base, "-dcp", "8")
    assert dcp8["num_blocks"] == tp8["num_blocks"] and dcp8["kv_cache_memory_bytes"] == tp8["kv_cache_memory_bytes"]
    assert dcp8["decode_context_parallel_size"] == 8 and dcp8["block_size"] == 64
    assert dcp8["kv_cache_tokens"] == 8 * tp8["kv_cache_tokens"]
    assert dcp8["max_concurrency"] == round(dcp8["num_blocks"] / 320, 4)
    assert dcp8["logged_capacity_rule"] == rule
    if version != "0.33.0":
        assert dcp8["logged_kv_cache_tokens"] == dcp8["num_blocks"] * 64 * 8


@pytest.mark.parametrize(("args", "says"), [
    (("deepseek-v3", "--gpu", "H200", "-tp", "8", "-dcp", "2", "--engine", "vllm==0.10.1"), "from 0.10.2"),
    (("deepseek-v3", "--gpu", "H200", "-tp", "8", "-dcp", "3"), "must divide the tensor parallel size 8"),
    (("llama3.1-70b", "--gpu", "H100-80GB", "-tp", "8", "-dcp", "2", "--engine", "vllm==0.11.0"), "GQA from 0.11.1"),
    (("llama3.1-70b", "--gpu", "H100-80GB", "-tp", "8", "-dcp", "2"), "exceeds the 8 KV heads"),
    (("gemma3-27b", "--gpu", "H100-80GB", "-tp", "2", "-dcp", "2"), "full attention and MLA only"),
    (("deepseek-v3", "--gpu", "H200", "-tp", "8", "-dcp", "2", "--engine", "sglang"), "modelled for vLLM"),
    # vllm#34795: 'DCP not support fp8 kvcache now'; vllm#46178: FlashMLA-sparse returns no decode LSE
    (("deepseek-v3", "--gpu", "H200", "-tp", "8", "-dcp", "8", "--kv-cache-dtype", "fp8", "--engine", "vllm==0.20.0"),
     "fp8 KV cache"),
    (("deepseek-v3.2", "--gpu", "H200", "-tp", "8", "-dcp", "2", "--engine", "vllm==0.29.0"), "sparse-MLA backend"),
    (("qwen3-32b", "--gpu", "H100-80GB", "-tp", "8", "-dcp", "2"), "use -tp 16 or more with -dcp 2"),
])
def test_decode_context_parallelism_is_refused_where_vllm_refuses_it(args, says):
    code, out = _fit(*args)
    assert code == 2 and says in out


def test_gqa_decode_context_parallelism_where_tp_exceeds_the_kv_heads():
    """Qwen3-30B-A3B has 4 KV heads: at tp 8 each KV head is held by 2 ranks, whose tokens dcp 2 splits."""
    base = ("qwen3-30b-a3b", "--gpu", "H100-80GB", "-tp", "8", "--max-model-len", "32768")
    _, tp8 = _fit(*base)
    _, dcp2 = _fit(*base, "-dcp", "2")
    assert dcp2["num_blocks"] == tp8["num_blocks"] and dcp2["kv_cache_tokens"] == 2 * tp8["kv_cache_tokens"]


@pytest.mark.parametrize("args", [("deepseek-v3", "--kv-cache-dtype", "fp8"), ("deepseek-v3.2",)])
def test_the_newest_rules_run_dcp_with_fp8_mla_and_sparse_mla(args):
    """vLLM 0.33.0 runs both (mla_attention.py::MLADCPManager; flashmla_sparse.py's fp8_ds_mla path)."""
    code, out = _fit(*args, "--gpu", "H200", "-tp", "8", "-dcp", "2")
    assert code in (0, 1) and out["decode_context_parallel_size"] == 2
