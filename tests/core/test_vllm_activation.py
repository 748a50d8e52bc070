"""vLLM V1's profile-run activation (kvplan/core/engines/vllm/activation.py): hand-worked from the source, and held
to real vLLM 0.19.0 starts on H100 SXM (the llm-d-planner logs' DEBUG "torch peak memory increase", excerpts in
tests/fixtures/vllm_logs/llm-d-planner-v0.19.0 with their licence)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.app.fit import fit_model
from kvplan.core.engines.vllm.activation import (ACTIVATION_BAND_MEASURED, ACTIVATION_BAND_UNMEASURED, Sampler,
                                                encoder_items, profile_run)
from kvplan.core.engines.vllm.profiles import VLLM_PROFILES, v0_variant
from kvplan.core.profiles import Version
from kvplan.io.gpus import get_gpu
from kvplan.io.models import load_model
from kvplan.io.vllm_log import read_vllm_log

MiB, GiB = 1 << 20, 1 << 30
LOGS = Path(__file__).parent.parent / "fixtures" / "vllm_logs" / "llm-d-planner-v0.19.0"
H100 = get_gpu("H100-80GB")


def _rules(version: str):
    return next(p for p in VLLM_PROFILES if p.covers(Version.parse(version))).rules


def test_llama_8b_sampler_phase_by_hand():
    # Llama-3.1-8B, vLLM 0.19.0 on H100 SXM (132 SMs), 8192 tokens, 1024 requests, bf16:
    # logits 1024 x 128256 x (2 bf16 + 4 fp32 copy + 4 probs + 4 noise) + Triton buffer 132 x 128256 x 4
    # + held hidden states (8192 + 2 x 1024) x 4096 x 2; cuBLAS workspace 32 MiB
    run = profile_run(load_model("llama3.1-8b"), tokens=8192, max_num_seqs=1024, tp=1, act_bytes=2, gpu=H100,
                      sampler=Sampler.TRITON, moe_workspace=True)
    assert run.sampler == 1024 * 128256 * 14 + 132 * 128256 * 4 + (8192 + 2048) * 4096 * 2
    assert run.held == 32 * MiB
    # forward: gate/up and activation 3 x 14336 + four hidden tensors, a token
    assert run.forward == 8192 * (3 * 14336 + 4 * 4096) * 2
    assert run.peak == run.held + run.sampler  # the sampler phase is the larger
    assert abs(run.peak / GiB - 1.89) < 0.02  # the log: 1.89 GiB


def test_mixtral_moe_workspace_by_hand():
    # Mixtral-8x7B at tp 2: Triton experts' workspace tokens x top-k x (max(I, H) + max(2I, H)), I = 14336 / 2
    run = profile_run(load_model("mixtral-8x7b"), tokens=8192, max_num_seqs=1024, tp=2, act_bytes=2, gpu=H100,
                      sampler=Sampler.TRITON, moe_workspace=True)
    assert run.held - 32 * MiB == 8192 * 2 * (7168 + 14336) * 2 == 672 * MiB
    before = profile_run(load_model("mixtral-8x7b"), tokens=8192, max_num_seqs=1024, tp=2, act_bytes=2, gpu=H100,
                         sampler=Sampler.SORT, moe_workspace=False)
    assert before.held == 32 * MiB and before.forward > 672 * MiB  # before 0.13 it is freed after each layer


def test_rules_follow_the_release():
    assert _rules("0.16.0").sampler is Sampler.SORT and _rules("0.17.0").sampler is Sampler.TRITON
    assert not _rules("0.12.0").moe_workspace and _rules("0.13.0").moe_workspace
    assert _rules("0.7.3").sampler is Sampler.NONE
    v0 = v0_variant(next(p for p in VLLM_PROFILES if p.covers(Version.parse("0.9.2"))))
    assert v0.rules.sampler is Sampler.NONE and not v0.rules.moe_workspace


def test_sort_sampler_peaks_higher_than_triton():
    spec = load_model("qwen2.5-7b-instruct")
    sort, triton = (profile_run(spec, tokens=8192, max_num_seqs=1024, tp=1, act_bytes=2, gpu=H100, sampler=s,
                                moe_workspace=True) for s in (Sampler.SORT, Sampler.TRITON))
    # sorted values, int64 indices, two masks, the softmax and the scatter: 22 bytes; Triton in place: 8 + buffer
    assert sort.sampler - triton.sampler == 1024 * 152064 * 14 - 132 * 152064 * 4


def test_float32_model_needs_no_copy():
    spec = load_model("llama3.1-8b")
    fp32 = profile_run(spec, tokens=8192, max_num_seqs=1024, tp=1, act_bytes=4, gpu=H100, sampler=Sampler.TRITON,
                       moe_workspace=True)
    # logits.to(float32) returns the logits themselves: 4 + 4 + 4 bytes an element
    assert fp32.sampler == 1024 * 128256 * 12 + 132 * 128256 * 4 + (8192 + 2048) * 4096 * 4


# (excerpt, bundled model) of the 0.19.0 starts: dense (the sampler phase, or the forward phase for small
# vocabularies: CodeLlama, Granite), tp 1-4, pp 2-4, MoE with the Triton experts' workspace and gpt-oss's MXFP4
STARTS = [
    ("meta-llama-llama-3-1-8b---h100-80gb--tp1pp1dp1--8192.log", "llama3.1-8b"),
    ("meta-llama-llama-3-1-8b---h100-80gb--tp4pp1dp1--8192.excerpt.log", "llama3.1-8b"),
    ("meta-llama-llama-3-1-8b---h100-80gb--tp1pp2dp1--8192.excerpt.log", "llama3.1-8b"),
    ("meta-llama-llama-3-1-8b---h100-80gb--tp1pp4dp1--8192.excerpt.log", "llama3.1-8b"),
    ("qwen-qwen2-5-72b-instruc--h100-80gb--tp2pp1dp1--8192.log", "qwen2.5-72b-instruct"),
    ("fp8dyn-llama-3-3-70b--h100-80gb--tp2pp1dp1--8192.excerpt.log", "llama3.1-70b"),
    ("codellama-codellama-7b-h--h100-80gb--tp1pp1dp1--8192.excerpt.log", "codellama-7b"),
    ("ibm-granite-granite-3-3---h100-80gb--tp1pp1dp1--8192.excerpt.log", "granite-3.3-8b"),
    ("google-gemma-2-2b-it--h100-80gb--tp1pp1dp1--8192.excerpt.log", "gemma2-2b"),
    ("google-gemma-2-27b-it--h100-80gb--tp1pp1dp1--8192.excerpt.log", "gemma2-27b"),
    ("microsoft-phi-4--h100-80gb--tp1pp1dp1--8192.excerpt.log", "phi-4"),
    ("qwen-qwen3-8b--h100-80gb--tp1pp1dp1--8192.excerpt.log", "qwen3-8b"),
    ("mistralai-mixtral-8x7b-i--h100-80gb--tp2pp1dp1--8192.excerpt.log", "mixtral-8x7b"),
    ("qwen-qwen3-30b-a3b--h100-80gb--tp1pp1dp1--8192.excerpt.log", "qwen3-30b-a3b"),
    ("qwen-qwen1-5-moe-a2-7b--h100-80gb--tp1pp1dp1--8192.excerpt.log", "qwen1.5-moe-a2.7b"),
    ("deepseek-ai-deepseek-v2---h100-80gb--tp1pp1dp1--8192.excerpt.log", "deepseek-v2-lite"),
    ("openai-gpt-oss-20b--h100-80gb--tp2pp1dp1--8192.excerpt.log", "gpt-oss-20b"),
    # multimodal: the encoder profile's dummy images held through the run (SigLIP, Llama 4's tiles, Pixtral)
    ("google-gemma-3-12b-it--h100-80gb--tp1pp1dp1--8192.excerpt.log", "gemma3-12b"),
    ("meta-llama-llama-4-scout--h100-80gb--tp4pp1dp1--8192.excerpt.log", "llama4-scout"),
    ("mistralai-mistral-small---h100-80gb--tp1pp1dp1--8192.excerpt.log", "mistral-small-3.1-24b"),
]


@pytest.mark.parametrize("name,model", STARTS, ids=[s[0].split("--")[0] + "-" + s[0].split("--")[2] for s in STARTS])
def test_activation_of_real_starts_within_the_measured_band(name, model):
    log = read_vllm_log(LOGS / name)
    assert log.activation_bytes and log.max_seq_len, name  # the excerpt carries the figure and the flags
    report = fit_model(model, gpu="H100-80GB", engine="vllm==0.19.0", tp=log.tensor_parallel_size or 1,
                       pp=log.pipeline_parallel_size or 1, max_model_len=log.max_seq_len,
                       gpu_memory_utilization=log.gpu_memory_utilization or 0.9)
    result = report.result
    assert result.settings["activation_band"] == ACTIVATION_BAND_MEASURED
    error = result.breakdown.activation / log.activation_bytes - 1
    assert abs(error) <= ACTIVATION_BAND_MEASURED, (name, result.breakdown.activation / GiB, error)


def test_band_widens_where_no_start_measures_the_release():
    def band(engine: str) -> float:
        return fit_model("llama3.1-8b", gpu="H100-80GB", engine=engine, max_model_len=8192).result.settings[
            "activation_band"]

    assert band("vllm==0.19.0") == ACTIVATION_BAND_MEASURED
    assert band("vllm==0.16.0") == ACTIVATION_BAND_UNMEASURED  # the PyTorch sort sampler: source only
    assert band("vllm==0.33.0") == ACTIVATION_BAND_UNMEASURED  # the V2 model runner's own sampler


@pytest.mark.parametrize("model,items", [("gemma3-12b", 32), ("llama4-scout", 3), ("mistral-small-3.1-24b", 2)])
def test_encoder_profile_items_match_the_logs(model, items):
    # each log: "Encoder cache will be initialized with a budget of 8192 tokens, and profiled with N image items of
    # the maximum feature size" (Gemma 3: 8192 // 256; Llama 4: 8192 // (17 tiles x 144 + 19); Pixtral: 8192 // 55^2)
    spec = load_model(model)
    assert encoder_items(spec, tokens=8192, max_num_seqs=1024, max_model_len=8192) == items
    assert encoder_items(load_model("llama3.1-8b"), tokens=8192, max_num_seqs=1024, max_model_len=8192) == 0


def test_gemma3_encoder_profile_by_hand():
    # 32 dummy images held: pixel values 3 x 896 x 896 and 256 embeddings of the text width 3,840, in bf16:
    # 32 x (2,408,448 + 983,040) x 2 = 217,055,232 bytes (207 MiB) beside the text model's profile run
    spec = load_model("gemma3-12b")
    base = dict(tokens=8192, max_num_seqs=1024, tp=1, act_bytes=2, gpu=H100, sampler=Sampler.TRITON, moe_workspace=True)
    assert profile_run(spec, mm_items=32, **base).held - profile_run(spec, **base).held == 217_055_232
