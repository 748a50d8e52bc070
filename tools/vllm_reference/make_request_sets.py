"""Write the request sets of tests/fixtures/vllm_scheduler/ deterministically (one seed per set).

Plain Python (random.Random), no vLLM and no kvplan needed: `python tools/vllm_reference/make_request_sets.py`.
The format is the one in tests/fixtures/vllm_scheduler/README.md: a prompt is a list of [segment_id, tokens]
and two prompts share a prefix exactly when they start with the same segments; the output is one segment the
fake model runner emits token by token.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "vllm_scheduler"


def sched(*, block_size=16, max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=2048,
          enable_prefix_caching=False, long_prefill_token_threshold=0) -> dict:
    return {"block_size": block_size, "max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
            "max_model_len": max_model_len, "enable_prefix_caching": enable_prefix_caching,
            "long_prefill_token_threshold": long_prefill_token_threshold, "max_num_partial_prefills": 1,
            "async_scheduling": False}


class Segments:
    """Hands out fresh segment ids; a set's segments never collide with another set's (offset per set)."""

    def __init__(self, base: int):
        self.next = base

    def new(self) -> int:
        self.next += 1
        return self.next


def lognormal(rng: random.Random, mean: float, sigma: float) -> int:
    """A lognormal draw whose distribution mean is `mean` (as kvplan's LengthDist 'lognormal' reads it)."""
    mu = math.log(mean) - sigma * sigma / 2
    return max(1, round(rng.lognormvariate(mu, sigma)))


def zipf_picker(rng: random.Random, n: int, a: float):
    weights = [1 / (k ** a) for k in range(1, n + 1)]
    return lambda: rng.choices(range(n), weights=weights)[0]


def request_set(name, description, model, num_gpu_blocks, scheduler, requests, **extra) -> dict:
    return {"name": name, "description": description, "model": model, "model_config": None, "tp": 1,
            "kv_cache_dtype": "auto", "num_gpu_blocks": num_gpu_blocks, "scheduler": scheduler,
            "requests": requests, **extra}


def req(i, arrival, prompt, output) -> dict:
    return {"id": str(i), "arrival_step": arrival, "prompt": [[s, n] for s, n in prompt], "output": list(output)}


# ----------------------------------------------------------------------------------------------------------


def sharegpt_opt13b() -> dict:
    """The issue's set: 500 ShareGPT-like requests at once, OPT-13B, 983 blocks of 16."""
    rng = random.Random(11_001)
    seg = Segments(1_000_000)
    max_len = 2048
    out = []
    for i in range(500):
        # configs/workloads/vllm-paper-sharegpt.yaml: lognormal lengths, means 161 (prompt) and 338 (output), sigma 1
        p = min(lognormal(rng, 161, 1.0), max_len - 1)
        o = max(1, min(lognormal(rng, 338, 1.0), max_len - p))
        out.append(req(i, 0, [(seg.new(), p)], (seg.new(), o)))
    return request_set(
        "sharegpt-opt13b",
        "The issue's ShareGPT-like workload: 500 requests arriving at once, lognormal lengths (means 161 in, 338 out, "
        "sigma 1, as configs/workloads/vllm-paper-sharegpt.yaml), OPT-13B, 983 blocks of 16, max_num_seqs 256, "
        "max_num_batched_tokens 2048. Exercises admission, recompute preemption of the last-admitted request, "
        "decode-dominated steps under a full pool.",
        "opt-13b", 983, sched(max_model_len=max_len), out)


def long_prompts() -> dict:
    rng = random.Random(11_002)
    seg = Segments(2_000_000)
    out = []
    arrival = 0
    for i in range(100):
        if rng.random() < 0.6:
            p = rng.randint(3000, 12000)
        else:
            p = rng.randint(100, 1500)
        o = rng.randint(20, 400)
        out.append(req(i, arrival, [(seg.new(), p)], (seg.new(), o)))
        arrival += rng.randint(0, 12)
    return request_set(
        "long-prompts",
        "Chunked prefill: 60% of 100 prompts are 3,000-12,000 tokens against max_num_batched_tokens 2048 "
        "(max_model_len 16384), mixed with short ones, arriving a few steps apart. Llama-3.1-8B, 3000 blocks "
        "of 16 (48k tokens). Exercises prefill chunks sharing the token budget with decodes, the whole-sequence "
        "admission gate (scheduler_reserve_full_isl) and preemption mid-prefill.",
        "llama3.1-8b", 3000, sched(max_model_len=16384), out)


def gemma_sliding() -> dict:
    rng = random.Random(11_003)
    seg = Segments(3_000_000)
    out = []
    arrival = 0
    for i in range(150):
        p = rng.randint(300, 6000)
        o = rng.randint(50, 700)
        out.append(req(i, arrival, [(seg.new(), p)], (seg.new(), o)))
        arrival += rng.randint(0, 6)
    return request_set(
        "gemma3-sliding",
        "Gemma 3 27B: 52 sliding-window layers (window 1024) and 10 full-attention layers, one shared block pool "
        "(vLLM's hybrid KV cache manager: groups of 10 layers, 1 full + 6 sliding, every group drawing blocks "
        "from one pool). 150 prompts of 300-6,000 tokens (most beyond the window), outputs 50-700, "
        "max_model_len 8192, 12000 blocks. Exercises freeing of blocks behind the window during chunked "
        "prefill and decode, and the sliding admission cap.",
        "gemma3-27b", 12000, sched(max_model_len=8192), out)


def qwen3_next_hybrid() -> dict:
    rng = random.Random(11_004)
    seg = Segments(4_000_000)
    out = []
    arrival = 0
    for i in range(200):
        p = min(lognormal(rng, 1200, 0.9), 7000)
        o = min(lognormal(rng, 300, 0.8), 1000)
        out.append(req(i, arrival, [(seg.new(), p)], (seg.new(), o)))
        arrival += rng.randint(0, 4)
    return request_set(
        "qwen3-next-hybrid",
        "Qwen3-Next-80B-A3B: 12 full-attention layers and 36 gated-delta-net layers with one fixed state per "
        "request (MambaSpec), prefix caching off (Mamba cache mode 'none'). vLLM grows the attention block so "
        "one attention page holds one Mamba state (block size 544 here) and pads the Mamba page; every request "
        "holds one block in each Mamba group plus its attention blocks. 200 requests (prompt mean 1200, output "
        "mean 300), 400 blocks.",
        "qwen3-next-80b-a3b", 400, sched(max_model_len=8192), out)


def _multi_turn(seed: int, base: int) -> list[dict]:
    rng = random.Random(seed)
    seg = Segments(base)
    system = seg.new()  # one system prompt shared by every session
    out = []
    k = 0
    start = 0
    for _session in range(60):
        turns = rng.randint(3, 8)
        prompt = [(system, 200)]
        t = start
        for _turn in range(turns):
            msg = (seg.new(), rng.randint(20, 400))
            prompt = prompt + [msg]
            o = rng.randint(30, 350)
            out_seg = (seg.new(), o)
            out.append(req(k, t, prompt, out_seg))
            k += 1
            # the user reads the answer and types: the next turn arrives after the answer is likely done
            # (one token a step) plus a think time
            t += o + rng.randint(30, 300)
            prompt = prompt + [out_seg]
        start += rng.randint(5, 40)
    out.sort(key=lambda r: (r["arrival_step"], int(r["id"])))
    for i, r in enumerate(out):
        r["id"] = str(i)
    return out


def multi_turn(prefix_caching: bool) -> dict:
    reqs = _multi_turn(11_005, 5_000_000)
    name = "multi-turn-pc" if prefix_caching else "multi-turn-nopc"
    return request_set(
        name,
        "Multi-turn chat: 60 sessions of 3-8 turns sharing one 200-token system prompt; turn k's prompt is turn "
        "k-1's prompt + its answer + a new message (20-400 tokens), the next turn arrives after the answer "
        "(output length in steps) plus a think time of 30-300 steps. Llama-3.1-8B, 1500 blocks of 16, "
        "max_model_len 8192, prefix caching " + ("ON: cached blocks of earlier turns, answers included, are "
                                                 "found again unless LRU evicted them" if prefix_caching else
                                                 "OFF: the same requests as multi-turn-pc, every turn recomputes "
                                                 "its history") + ".",
        "llama3.1-8b", 1500, sched(max_model_len=8192, enable_prefix_caching=prefix_caching), reqs)


def shared_docs() -> dict:
    rng = random.Random(11_006)
    seg = Segments(6_000_000)
    docs = [(seg.new(), rng.randint(800, 4000)) for _ in range(20)]
    pick = zipf_picker(rng, len(docs), 1.1)
    out = []
    arrival = 0
    for i in range(300):
        d = docs[pick()]
        q = (seg.new(), rng.randint(20, 200))
        o = rng.randint(20, 300)
        out.append(req(i, arrival, [d, q], (seg.new(), o)))
        arrival += rng.randint(0, 5)
    return request_set(
        "shared-docs",
        "RAG-style shared documents: 20 documents of 800-4,000 tokens with Zipf(1.1) popularity, each request "
        "= one document + a 20-200-token question, 300 requests a few steps apart, prefix caching on, "
        "Llama-3.1-8B with 1200 blocks of 16 (19k tokens: about 8 documents' worth), so unreferenced document "
        "blocks are evicted LRU and the less popular documents are recomputed.",
        "llama3.1-8b", 1200, sched(max_model_len=8192, enable_prefix_caching=True), out)


def long_prefill_threshold() -> dict:
    rng = random.Random(11_007)
    seg = Segments(7_000_000)
    out = []
    arrival = 0
    for i in range(200):
        p = rng.randint(1000, 6000) if rng.random() < 0.35 else lognormal(rng, 200, 0.8)
        o = lognormal(rng, 200, 0.8)
        out.append(req(i, arrival, [(seg.new(), min(p, 7000))], (seg.new(), min(o, 1000))))
        arrival += rng.randint(0, 6)
    return request_set(
        "long-prefill-threshold",
        "long_prefill_token_threshold 512 with max_num_batched_tokens 2048: 35% prompts of 1,000-6,000 tokens "
        "among short chat prompts, arriving a few steps apart; each prefill chunk is capped at 512 tokens while "
        "more than one request is in the system (so several prefills share a step), and at the budget when a "
        "request is alone. Llama-3.1-8B, 2000 blocks of 16, max_model_len 8192.",
        "llama3.1-8b", 2000, sched(max_model_len=8192, long_prefill_token_threshold=512), out)


def mla_deepseek() -> dict:
    rng = random.Random(11_008)
    seg = Segments(8_000_000)
    out = []
    arrival = 0
    for i in range(250):
        p = min(lognormal(rng, 600, 1.0), 3500)
        o = min(lognormal(rng, 250, 0.9), 4096 - p)
        out.append(req(i, arrival, [(seg.new(), p)], (seg.new(), max(1, o))))
        arrival += rng.randint(0, 2)
    return request_set(
        "deepseek-v3-mla",
        "DeepSeek-V3 multi-head latent attention: one MLA group of 61 layers (576 latent values a token), block "
        "size 64 (FlashMLA's), a small pool of 300 blocks (19k tokens) so preemption is frequent; 250 requests "
        "(prompt mean 600, output mean 250), max_model_len 4096.",
        "deepseek-v3", 300, sched(block_size=64, max_model_len=4096), out)


SETS = {
    "sharegpt-opt13b": sharegpt_opt13b,
    "long-prompts": long_prompts,
    "gemma3-sliding": gemma_sliding,
    "qwen3-next-hybrid": qwen3_next_hybrid,
    "multi-turn-pc": lambda: multi_turn(True),
    "multi-turn-nopc": lambda: multi_turn(False),
    "shared-docs": shared_docs,
    "long-prefill-threshold": long_prefill_threshold,
    "deepseek-v3-mla": mla_deepseek,
}


def sliding_dry_pool() -> dict:
    # A two-layer Mistral-style model whose layers all slide (window 32), so the pool can be tiny: 5 usable
    # blocks of 16, a budget of 16 tokens (the sliding admission cap is cdiv(31 + 16, 16) + 1 = 4 blocks).
    config = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
              "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
              "num_hidden_layers": 2, "sliding_window": 32, "max_position_embeddings": 32768,
              "vocab_size": 32000, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}
    out = [req(0, 0, [(5_000_001, 80)], (5_000_002, 60)), req(1, 5, [(5_000_003, 2)], (5_000_004, 60))]
    rs = request_set(
        "sliding-dry-pool",
        "Two requests on a model whose two layers all use a 32-token sliding window, 5 usable blocks of 16, "
        "budget 16: each request holds 3 blocks most of the time, so the pool runs dry when the first needs a "
        "new block past the sliding admission cap (4 blocks). vLLM 0.20.2+ preempts the second; 0.20.0-0.20.1 "
        "count the capped table as needing nothing in every allocation and BlockPool.get_new_blocks raises.",
        None, 6, sched(max_num_seqs=2, max_num_batched_tokens=16, max_model_len=256), out)
    rs["model_config"] = config
    return rs


SETS["sliding-dry-pool"] = sliding_dry_pool


def sliding_prefix_cache() -> dict:
    # Gemma 2 style, cut to one sliding-window (64) and one full-attention layer: two KV cache groups of 16-token
    # blocks in one pool. Documents shared by several questions, prefix caching on, a pool of about four
    # documents: which freed blocks are reused first (the free-queue order) decides what stays cached.
    config = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "head_dim": 256, "hidden_size": 3584,
              "intermediate_size": 14336, "max_position_embeddings": 8192, "num_attention_heads": 16,
              "num_hidden_layers": 2, "num_key_value_heads": 8, "query_pre_attn_scalar": 256, "sliding_window": 64,
              "sliding_window_size": 64, "torch_dtype": "bfloat16", "vocab_size": 256000}
    rng = random.Random(11_011)
    seg = Segments(6_000_000)
    docs = [(seg.new(), rng.randint(100, 300)) for _ in range(12)]
    pick = zipf_picker(rng, len(docs), 1.0)
    out = []
    arrival = 0
    for i in range(160):
        doc = docs[pick()]
        out.append(req(i, arrival, [doc, (seg.new(), rng.randint(5, 60))], (seg.new(), rng.randint(5, 60))))
        arrival += rng.randint(0, 4)
    rs = request_set(
        "sliding-prefix-cache",
        "Prefix caching with a sliding-window group: a 2-layer Gemma 2 style model (inline model_config; one "
        "sliding-window layer of 64 tokens, one full-attention layer: two KV cache groups in one pool), 12 documents "
        "of 100-300 tokens (Zipf 1.0 popularity) each followed by a question of 5-60 tokens, outputs 5-60, "
        "200 blocks of 16. Exercises the free-queue order of unhashed blocks (appended before 0.23.0, sliding "
        "groups' prepended in 0.23.0, all groups' from 0.24.0) and, from 0.29.0, checkpoint-only caching of the "
        "sliding group, which kvplan does not model.",
        None, 200, sched(max_num_seqs=32, max_num_batched_tokens=512, max_model_len=1024,
                         enable_prefix_caching=True), out)
    rs["model_config"] = config
    return rs


SETS["sliding-prefix-cache"] = sliding_prefix_cache


def async_variant(name: str):
    """The same requests with async scheduling on (vLLM's default since 0.14.0): two batches in flight."""
    def make() -> dict:
        rs = SETS[name]()
        rs["name"] = f"{name}-async"
        rs["description"] += " Async scheduling on: each batch is scheduled before the previous one's output."
        rs["scheduler"]["async_scheduling"] = True
        return rs
    return make


for _name in ("sharegpt-opt13b", "long-prompts", "gemma3-sliding", "qwen3-next-hybrid", "multi-turn-pc"):
    SETS[f"{_name}-async"] = async_variant(_name)


def pipeline_variant(name: str, pp: int, *, v2_async: bool = False):
    """The same requests under pipeline parallelism with ``pp`` stages: the synchronous scheduler with pp batches in
    flight (the V1 model runner, which runs no async scheduling with pp), or ``v2_async``: async scheduling on the
    V2 model runner, pp + 1 batches in flight and a request's decodes pp steps apart (vllm/config/vllm.py::
    VllmConfig.max_concurrent_batches; v1/core/sched/async_scheduler.py::AsyncScheduler.decode_stagger)."""
    def make() -> dict:
        rs = SETS[name]()
        rs["name"] = f"{name}-pp{pp}" + ("-async-v2" if v2_async else "")
        rs["description"] += (f" Pipeline parallel {pp}: " + (
            f"async scheduling on the V2 model runner, {pp + 1} batches in flight, a request's decodes {pp} steps "
            "apart." if v2_async else f"{pp} batches in flight, the synchronous scheduler (a request whose output "
            "is in flight is not scheduled again)."))
        rs["scheduler"]["pipeline_parallel_size"] = pp
        if v2_async:
            rs["scheduler"]["async_scheduling"] = True
            rs["scheduler"]["v2_model_runner"] = True
        return rs
    return make


for _name, _pp, _v2 in (("sharegpt-opt13b", 2, False), ("sharegpt-opt13b", 4, False), ("long-prompts", 4, False),
                        ("multi-turn-pc", 2, False), ("sharegpt-opt13b", 2, True), ("long-prompts", 4, True),
                        ("multi-turn-pc", 3, True), ("gemma3-sliding", 3, False), ("gemma3-sliding", 3, True)):
    _set = pipeline_variant(_name, _pp, v2_async=_v2)
    SETS[_set()["name"]] = _set


def dump(rs: dict) -> str:
    """One request a line: diffs stay readable and the files small."""
    head = {k: v for k, v in rs.items() if k != "requests"}
    lines = json.dumps(head, indent=1)[:-2] + ',\n "requests": [\n'
    lines += ",\n".join("  " + json.dumps(r, separators=(",", ":")) for r in rs["requests"])
    return lines + "\n ]\n}\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"sets to write (default all): {', '.join(SETS)}")
    args = ap.parse_args(argv)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name in args.names or SETS:
        rs = SETS[name]()
        assert rs["name"] == name
        text = dump(rs)
        json.loads(text)
        (FIXTURES / f"{name}.requests.json").write_text(text)
        print(f"{name}: {len(rs['requests'])} requests, {sum(n for r in rs['requests'] for _, n in r['prompt'])} "
              f"prompt tokens, {sum(r['output'][1] for r in rs['requests'])} output tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
