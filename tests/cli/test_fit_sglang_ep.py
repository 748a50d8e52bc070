"""SGLang's expert-parallel placements (--moe-a2a-backend, --moe-dense-tp-size, --enable-dp-lm-head,
--ep-num-redundant-experts) and its token cap (--max-total-tokens), against a public decode start."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.core.units import GiB

runner = CliRunner()

# shifangx/Scripts-SGLang, logs_gb200_blog2_fp4/2.fp4_wo-sbo_eplb/launch_server_decode_node_rank_0.log (commit
# 125544551e, 2025-11-22; lmsysorg/sglang:v0.5.5.post2 on GB200 NVL72, a decode server of 12 nodes). Its
# server_args line: model_path='nvidia/DeepSeek-R1-0528-FP4', quantization='modelopt_fp4', kv_cache_dtype='fp8_e4m3',
# mem_fraction_static=0.83, max_total_tokens=3122380, context_length=2176, page_size=64, tp_size=48, dp_size=48,
# enable_dp_attention=True, enable_dp_lm_head=True, ep_size=48, moe_a2a_backend='deepep', ep_num_redundant_experts=32,
# moe_dense_tp_size=1, disable_shared_experts_fusion=True. Each rank: 'Load weight end. type=DeepseekV3ForCausalLM,
# ... mem usage=35.97 GB.', 'KV Cache is allocated. #tokens: 3122368, KV size: 102.18 GB'; rank 0 'Load weight
# begin. avail mem=179.73 GB' and 'Load weight end ... avail mem=143.75 GB' (SGLang's GB are GiB).
FLAGS = ("nvidia/DeepSeek-R1-0528-FP4", "--gpu", "GB200", "--engine", "sglang==0.5.5", "-tp", "48", "-dp", "48",
         "--enable-dp-attention", "--enable-dp-lm-head", "--moe-a2a-backend", "deepep",
         "--ep-num-redundant-experts", "32", "--moe-dense-tp-size", "1", "--kv-cache-dtype", "fp8_e4m3",
         "--gpu-memory-utilization", "0.83", "--max-total-tokens", "3122380", "--max-model-len", "2176",
         "--block-size", "64")


def _fit(*args: str) -> dict:
    r = runner.invoke(app, ["fit", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _without(flag: str, takes_value: bool = True) -> tuple[str, ...]:
    i = FLAGS.index(flag)
    return FLAGS[:i] + FLAGS[i + 1 + takes_value:]


def test_deepseek_r1_fp4_decode_on_gb200_matches_the_public_start():
    out = _fit(*FLAGS)
    # the cap, floored to pages of 64 (model_runner.py::init_memory_pool): 3,122,380 // 64 x 64
    assert out["kv_cache_tokens"] == 3_122_368
    assert out["page_size_bytes"] == 64 * 61 * 576  # the fp8 MLA latent of 61 layers, whole on each rank
    assert out["all_ranks"]["kv_cache_tokens"] == 48 * 3_122_368
    # the memory holds more than the cap (the log's own figures: 143.75 - 179.73 x 0.17 GiB = 3,459,220 tokens)
    cap = next(n for n in out["notes"] if n.startswith("--max-total-tokens"))
    held = int(cap.split("would hold ")[1].split(" tokens")[0].replace(",", ""))
    assert held > 3_459_220 > 3_122_380
    assert abs(held / 3_459_220 - 1) < 0.03  # rank 0, which started with 2.45 GiB more in use than the others
    # weights against 'mem usage=35.97 GB' (+2.4%). A tensor-by-tensor count of 0.5.5.post2's loader for these flags
    # is 37,513,078,688 B live, with the w_kc / w_vc copies; the launch script also set
    # SGLANG_NVFP4_CKPT_FP8_GEMM_IN_ATTN=1, which loads each q_b_proj in FP8 with ue8m0 scales (37,453,824 B a layer
    # below bf16), and SGLang keeps an interleaved copy of each NVFP4 linear's scales (233,963,520 B here), which
    # kvplan leaves out: 39,563,798,432 B without the variable
    weights = out["breakdown"]["weights"]
    assert abs(weights - (37_513_078_688 + 61 * 37_453_824 - 233_963_520)) < 0.05 * GiB
    assert abs(weights / GiB / 35.97 - 1) < 0.03


def test_each_placement_flag_adds_what_it_replicates():
    """On one of 48 GPUs: the dense MLPs of layers 0-2 (3 x 3 x 7168 x 18432 NVFP4 parameters, 9/16 B each) whole
    rather than 1/48; the 58 shared experts (3 x 7168 x 2048 each) whole; the LM head (129280 x 7168 bf16) whole.
    The 32 redundant experts fill the 48 GPUs evenly: 288 / 48 = 6 a GPU, as 256 / 48 rounds up to."""
    full = _fit(*FLAGS)["breakdown"]["weights"]
    fp4 = 9 / 16
    dense = 3 * 3 * 7168 * 18432 * fp4
    shared = 58 * 3 * 7168 * 2048 * fp4
    head = 129280 * 7168 * 2
    for flag, replicated in (("--moe-dense-tp-size", dense), ("--enable-dp-lm-head", head)):
        less = _fit(*_without(flag, flag != "--enable-dp-lm-head"))["breakdown"]["weights"]
        assert abs((full - less) - replicated * 47 / 48) < 1e6, flag
    plain_ep = _fit(*_without("--moe-a2a-backend"), "--enable-expert-parallel")["breakdown"]["weights"]
    assert abs((full - plain_ep) - shared * 47 / 48) < 1e6  # DeepEP's shared experts whole on each GPU
    assert _fit(*_without("--ep-num-redundant-experts"))["breakdown"]["weights"] == full


def test_redundant_experts_that_do_not_divide_cost_a_gpu_one_more():
    """DeepSeek-V3's 256 experts over 8 GPUs: 32 a GPU; with 4 redundant copies 260 / 8 -> 33 on the most loaded."""
    base = ("deepseek-v3", "--gpu", "H200", "--engine", "sglang", "-tp", "8", "--moe-a2a-backend", "deepep")
    one = _fit(*base)["breakdown"]["weights"]
    more = _fit(*base, "--ep-num-redundant-experts", "4")["breakdown"]["weights"]
    expert = 3 * 7168 * 2048  # FP8 with a 128 x 128 block scale of 4 B
    assert more - one == pytest.approx(58 * expert * (1 + 4 / (128 * 128)), abs=1e3)


def test_a_cap_above_what_the_memory_holds_changes_nothing():
    base = ("deepseek-v3", "--gpu", "H200", "--engine", "sglang", "-tp", "8", "--max-model-len", "32768")
    free = _fit(*base)
    capped = _fit(*base, "--max-total-tokens", str(10 * free["kv_cache_tokens"]))
    assert capped["kv_cache_tokens"] == free["kv_cache_tokens"]
    assert capped["breakdown"] == free["breakdown"]
    low = _fit(*base, "--max-total-tokens", "100000")
    assert low["kv_cache_tokens"] == 100_000 // free["block_size"] * free["block_size"]
    assert low["breakdown"]["kv_cache"] == low["kv_cache_tokens"] * low["page_size_bytes"] // low["block_size"]
    assert low["breakdown"]["unused"] > free["breakdown"]["unused"]


@pytest.mark.parametrize(("args", "says"), [
    (("--engine", "vllm", "-tp", "8", "--moe-dense-tp-size", "1"), "are SGLang's"),
    (("--engine", "sglang", "-tp", "8", "--enable-dp-lm-head"), "needs --enable-dp-attention"),
    (("--engine", "sglang==0.4.6", "-tp", "8", "-dp", "8", "--enable-dp-attention", "--enable-dp-lm-head"),
     "from 0.4.7"),
    (("--engine", "sglang", "-tp", "8", "--moe-dense-tp-size", "2"), "takes 1 only"),
    (("--engine", "sglang", "-tp", "8", "--ep-num-redundant-experts", "8"), "add --enable-expert-parallel"),
    (("--engine", "sglang", "-tp", "8", "--moe-a2a-backend", "nccl"), "kvplan knows none"),
    (("--engine", "sglang", "-tp", "8", "--max-total-tokens", "0"), "must be >= 1"),
])
def test_placement_flags_are_refused_where_sglang_refuses_them(args, says):
    r = runner.invoke(app, ["fit", "deepseek-v3", "--gpu", "H200", *args])
    assert r.exit_code == 2 and says in r.output, r.output


def test_a2a_backend_needs_routed_experts():
    r = runner.invoke(app, ["fit", "llama3.1-8b", "--gpu", "H100-80GB", "--engine", "sglang", "--moe-a2a-backend",
                            "deepep"])
    assert r.exit_code == 2 and "no routed experts" in r.output


@pytest.mark.parametrize(("engine", "elt"), [("sglang==0.4.6", 1), ("sglang==0.4.7", 2), ("sglang==0.5.10", 2)])
def test_absorbed_mla_copies_weigh_on_each_gpu(engine, elt):
    """SGLang copies each MLA layer's kv_b_proj into w_kc [heads, 128, 512] and w_vc [heads, 512, 128] and keeps
    kv_b_proj (DeepseekV2ForCausalLM.post_load_weights): 61 x 128 heads x 512 x 256 elements at attention tp 1, in
    bf16 from 0.4.7 (block_quant_dequant), in FP8 before for DeepSeek-V3's FP8 checkpoint; at tp 8 an eighth."""
    from kvplan.core.capacity.common import FitRequest
    from kvplan.core.engines.sglang.budget import absorbed_mla_bytes
    from kvplan.core.profiles import parse_engine
    from kvplan.io.gpus import get_gpu
    from kvplan.io.models import load_model

    spec, choice = load_model("deepseek-v3"), parse_engine(engine)
    req = FitRequest(spec=spec, gpu=get_gpu("H200"), engine="sglang", profile=choice.profile, tp=8, dp=8,
                     dp_attention=True)
    assert absorbed_mla_bytes(req) == 61 * 128 * 512 * 256 * elt
    assert absorbed_mla_bytes(FitRequest(spec=spec, gpu=req.gpu, engine="sglang", profile=choice.profile,
                                         tp=8)) == 61 * 16 * 512 * 256 * elt
    assert absorbed_mla_bytes(FitRequest(spec=load_model("llama3.1-8b"), gpu=req.gpu, engine="sglang",
                                         profile=choice.profile)) == 0


def test_deepep_holds_whole_fp8_experts_at_any_tp():
    """DeepSeek-V3's FP8 experts would split to 64 wide over 32 GPUs (refused); DeepEP holds whole experts, so the
    FP8 block rule does not apply, and the JSON names the expert-parallel size."""
    out = _fit("deepseek-v3", "--gpu", "H200", "--engine", "sglang==0.5.5", "-tp", "32", "-dp", "32",
               "--enable-dp-attention", "--moe-a2a-backend", "deepep", "--max-model-len", "4096")
    assert out["expert_parallel_size"] == 32


def test_the_cap_applies_after_a_drafts_extra_tokens():
    """SGLang adds the draft's extra tokens to the profiled count, then caps both workers' pools
    (model_runner.py::init_memory_pool)."""
    out = _fit("deepseek-v3", "--gpu", "H200", "--engine", "sglang==0.5.5", "-tp", "8", "--speculative-algorithm",
               "NEXTN", "--max-total-tokens", "100000", "--max-model-len", "32768")
    assert out["kv_cache_tokens"] == out["settings"]["draft_pool_tokens"] == 100_000


def test_longcat_flash_absorbs_both_mla_blocks_of_a_layer():
    from kvplan.core.capacity.common import FitRequest
    from kvplan.core.engines.sglang.budget import absorbed_mla_bytes
    from kvplan.io.gpus import get_gpu
    from kvplan.io.models import load_model

    spec = load_model("longcat-flash")
    mla = [x for x in spec.layers if x.kind.value == "mla"]
    per = mla[0].num_heads * mla[0].kv_lora_rank * (mla[0].qk_nope_head_dim + mla[0].v_head_dim) * 2
    assert absorbed_mla_bytes(FitRequest(spec=spec, gpu=get_gpu("H200"), engine="sglang")) == len(mla) * per


@pytest.mark.parametrize(("args", "says"), [
    (("--engine", "sglang==0.4.4", "-tp", "8", "--moe-a2a-backend", "deepep"), "no --moe-a2a-backend (from 0.4.5)"),
    (("--engine", "sglang==0.4.5", "-tp", "8", "--moe-dense-tp-size", "1"), "no --moe-dense-tp-size (from 0.4.6)"),
    (("--engine", "sglang==0.4.6", "-tp", "8", "--enable-expert-parallel", "--ep-num-redundant-experts", "8"),
     "no --ep-num-redundant-experts (from 0.4.7)"),
    (("--engine", "sglang", "-tp", "8", "--max-total-tokens", "10", "--max-model-len", "4096"),
     "floors to no page"),
])
def test_placement_flags_by_release(args, says):
    r = runner.invoke(app, ["fit", "deepseek-v3.2", "--gpu", "H200", *args])
    assert r.exit_code in (1, 2) and says in r.output, r.output


def test_dense_tp_is_refused_where_sglang_ignores_it():
    r = runner.invoke(app, ["fit", "llama3-8b", "--gpu", "H200", "--engine", "sglang", "-tp", "8",
                            "--moe-dense-tp-size", "1"])
    assert r.exit_code == 2 and "does not read it" in r.output
