"""SGLang's memory rules, release by release: the default ``mem_fraction_static``.

The token budget itself is the same in every release read (0.4.0 to 0.5.10): rest = free memory after
loading weights - free memory before x (1 - mem_fraction_static), so the fraction applies to the memory
free at start, not the card's total (0.4.0: python/sglang/srt/model_executor/model_runner.py::
profile_max_num_token; 0.5.10: model_runner_kv_cache_mixin.py). Releases after 0.5.10 ship wheels only;
their rules are assumed unchanged. docs/engine-versions-research.md section 9 has each rule's lines.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.core.profiles import EngineProfile, chain

MiB = 1 << 20
GiB_MIB = 1024


@dataclass(frozen=True, kw_only=True)
class SGLangRules:
    # how the default mem_fraction_static is chosen: by_tp (0.4.0), by_tp_large (0.4.6), v047 (0.4.7),
    # by_class (0.4.8), reserve (0.5.3), reserve_piecewise (0.5.10: piecewise CUDA graphs on by default)
    default_fraction: str
    # --speculative-algorithm's share of the default reserve, MiB: (the EAGLE family, STANDALONE); NGRAM adds none
    spec_reserve_mib: tuple[int, int] = (0, 0)
    # the EAGLE family's token pools: "draft_extra" (the draft's pool = profiled + requests x steps + 100, 0.4.3),
    # "both_extra" (both pools = profiled + requests x (steps x topk + draft tokens) + 100, 0.4.6 to 0.5.6),
    # "target" (both pools = the profiled count, 0.5.7 on); the draft's KV and weights come out of the reserve
    spec_pool: str = "draft_extra"
    # the requests those pools provision for where --max-running-requests is unset: 48 (0.4.5 on: server_args.py
    # sets it for EAGLE), or 0: SGLang's own, min(max(profiled / context_len x 512, 2048), 4096) (0.4.3, 0.4.4:
    # model_runner.py::init_memory_pool)
    spec_requests: int = 48
    # --enable-dp-lm-head and --ep-num-redundant-experts exist (0.4.7 on; neither in 0.4.6's server_args.py)
    dp_lm_head: bool = False
    # an FP8 block-quantized MLA checkpoint's absorbed w_kc / w_vc copies kept in FP8 (0.4.6:
    # block_quant_to_tensor_quant, or DeepGEMM's batched matmul on Hopper); from 0.4.7 dequantized to bf16
    # (block_quant_dequant) unless SGL_USE_DEEPGEMM_BMM is set
    mla_absorbed_fp8: bool = False
    # releases that have them: --enable-deepep-moe (0.4.5; --moe-a2a-backend from 0.5) and EAGLE3 (0.4.5),
    # --moe-dense-tp-size (0.4.6) (server_args.py; none of them in 0.4.4's)
    deepep: bool = True
    eagle3: bool = True
    moe_dense_tp: bool = True


CHECKED_THROUGH = "0.5.10"


def _profiles() -> tuple[EngineProfile, ...]:
    src = "python/sglang/srt/server_args.py"
    return chain("sglang", "SGLang", [
        ("0.4.0", SGLangRules(default_fraction="by_tp", mla_absorbed_fp8=True, spec_requests=0, deepep=False,
                              eagle3=False, moe_dense_tp=False),
         (f"mem_fraction_static by tp: >= 16 0.79, >= 8 0.81, >= 4 0.85, >= 2 0.87, else 0.88 (0.4.0: {src})",
          "EAGLE: the draft's pool holds the profiled tokens + requests x steps + 100, requests SGLang's own "
          "min(max(tokens / context_len x 512, 2048), 4096) (0.4.3: "
          "python/sglang/srt/model_executor/model_runner.py::init_memory_pool)")),
        ("0.4.4", SGLangRules(default_fraction="by_tp", mla_absorbed_fp8=True, spec_requests=0, spec_pool="both_extra",
                              deepep=False, eagle3=False, moe_dense_tp=False),
         ("EAGLE: target and draft pools both hold the profiled tokens + requests x (steps x topk + draft tokens) + "
          "100 (0.4.4: python/sglang/srt/model_executor/model_runner.py::init_memory_pool)",)),
        ("0.4.5", SGLangRules(default_fraction="by_tp", mla_absorbed_fp8=True, spec_pool="both_extra",
                              moe_dense_tp=False),
         (f"EAGLE sets max_running_requests to 48 where it is unset (0.4.5: {src}::ServerArgs.__post_init__)",
          f"EAGLE3 and --enable-deepep-moe (whole experts, shared experts on each GPU) (0.4.5: {src})")),
        ("0.4.6", SGLangRules(default_fraction="by_tp_large", spec_pool="both_extra", mla_absorbed_fp8=True),
         (f"as 0.4.0 on GPUs up to 80 GiB; above, (memory - 13 GiB) / memory (0.4.6: {src})",
          f"--moe-dense-tp-size 1: the dense MLP layers whole on every GPU (0.4.6: {src})",
          "EAGLE: target and draft pools both hold the profiled tokens + max_running_requests x (steps x topk + "
          "draft tokens) + 100 (0.4.6: python/sglang/srt/model_executor/model_runner.py::init_memory_pool)")),
        ("0.4.7", SGLangRules(default_fraction="v047", spec_pool="both_extra", dp_lm_head=True),
         (f"by tp x pp up to 80 GiB, else 0.88; above 180,000 MiB 0.79; above 96 GiB a 48 GiB-based rule "
          f"(0.4.7: {src})",
          f"--enable-dp-lm-head (the LM head over the attention-TP group) and --ep-num-redundant-experts (0.4.7: "
          f"{src}::ServerArgs)",
          "an FP8 MLA checkpoint's absorbed w_kc / w_vc copies in bf16 (block_quant_dequant), FP8 before (0.4.7: "
          "python/sglang/srt/models/deepseek_v2.py::DeepseekV2ForCausalLM.post_load_weights)")),
        ("0.4.8", SGLangRules(default_fraction="by_class", spec_reserve_mib=(2048, 2048), spec_pool="both_extra",
                              dp_lm_head=True),
         (f"(memory - reserved) / memory, reserved by GPU memory class and tp x pp, 2 GiB more with speculative "
          f"decoding (0.4.8: {src})",)),
        ("0.5.3", SGLangRules(default_fraction="reserve", spec_reserve_mib=(2048, 6144), spec_pool="both_extra",
                              dp_lm_head=True),
         (f"reserved MiB = 512 + 1.5 x max(chunked_prefill_size, 2048) + 2 x cuda_graph_max_bs + tp x pp / 8 x "
          f"1024, at least 10 GiB above 60 GiB, then 2 GiB for an EAGLE draft, 6 for STANDALONE (0.5.3: "
          f"{src}::_handle_gpu_memory_settings)",)),
        ("0.5.7", SGLangRules(default_fraction="reserve", spec_reserve_mib=(2048, 6144), spec_pool="target",
                              dp_lm_head=True),
         ("EAGLE: both pools hold the profiled tokens, sized on the target's cell alone; the draft's pool and "
          "weights come out of the reserve (0.5.7: python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py; "
          "0.5.6: model_runner.py added requests x (steps x topk + draft tokens) + 100)",)),
        ("0.5.10", SGLangRules(default_fraction="reserve_piecewise", spec_reserve_mib=(4096, 6144), spec_pool="target",
                               dp_lm_head=True),
         (f"piecewise CUDA graphs on by default (opt-in up to 0.5.9): the reserve adds 8 MiB a piecewise capture size "
          f"up to chunked_prefill_size, 1.5 GiB for an MLA model, unless they are off (DP attention, pp > 1, a "
          f"multimodal or listed architecture); read through {CHECKED_THROUGH} (0.5.10: "
          f"{src}::_handle_gpu_memory_settings, _handle_piecewise_cuda_graph)",
          f"an EAGLE-family draft holds back 4 GiB (6 for STANDALONE) after the 10 GiB floor (0.5.10: {src})")),
    ])


SGLANG_PROFILES = _profiles()


def _by_tp(tp: int) -> float:
    for at_least, fraction in ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87)):
        if tp >= at_least:
            return fraction
    return 0.88


def default_fraction(rules: SGLangRules, memory_bytes: int, tp: int, pp: int, reserve_rule: "callable",  # type: ignore[valid-type]
                     dp_attention: int = 0, piecewise_mib: float = 0, spec_mib: float = 0) -> float:
    """The default mem_fraction_static of this release for a GPU of ``memory_bytes`` (total, as
    ``get_device_memory_capacity`` reports it); ``dp_attention``: the attention DP size (0: off), whose
    gathered buffers and graphs the release holds back from 0.4.8 (docs/research/dp-ep-dcp.md 1.4);
    ``piecewise_mib``: the piecewise CUDA graphs' reserve where they run (reserve_piecewise releases); ``spec_mib``:
    a speculative draft's (SGLangRules.spec_reserve_mib, from 0.4.8)."""
    mem_mib = memory_bytes / MiB
    if rules.default_fraction == "by_tp":
        return _by_tp(tp)
    if rules.default_fraction == "by_tp_large":
        return _by_tp(tp) if mem_mib <= 81920 else round((mem_mib - 13 * GiB_MIB) / mem_mib, 3)
    if rules.default_fraction == "v047":
        if mem_mib <= 81920:
            return _by_tp(tp * pp)
        if mem_mib > 180_000:
            return 0.79
        if mem_mib > 96 * GiB_MIB:
            f = 0.88
            return min(f + 48 * GiB_MIB * (1 - f) / mem_mib, (mem_mib - 18 * GiB_MIB) / mem_mib)
        return 0.88
    if rules.default_fraction == "by_class":
        size = tp * pp
        if mem_mib < 35 * GiB_MIB:
            reserved = (2.8 + size / 10) * GiB_MIB
        elif mem_mib < 90 * GiB_MIB:
            reserved = (9.5 + size / 2) * GiB_MIB
        elif mem_mib < 160 * GiB_MIB:
            reserved = (12 + size / 2) * GiB_MIB
        else:
            reserved = 32 * GiB_MIB
        if dp_attention:  # 0.4.8-0.5.2: 4096 MiB more (server_args.py::ServerArgs.__post_init__)
            reserved += 4096
        return round((mem_mib - reserved - spec_mib) / mem_mib, 3)
    return reserve_rule(memory_bytes, tp, pp, dp_attention,
                        piecewise_mib if rules.default_fraction == "reserve_piecewise" else 0, spec_mib)
