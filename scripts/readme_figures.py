"""The README's numbers, generated: sample outputs, published figures, accuracy and simulation tables.

Each generated block sits in README.md (or a doc named in DOC_BLOCKS) between ``<!-- generated: NAME -->``
and ``<!-- end: NAME -->``.

    python scripts/readme_figures.py            # check: exit 1 and show what differs
    python scripts/readme_figures.py --write    # rewrite the blocks
    python scripts/readme_figures.py --write --timings   # also rerun the benchmarks (minutes)

Timings are machine-dependent: they are rewritten only with --timings and never checked. Every other
block is deterministic, and tests/test_readme.py checks it, so the README cannot go stale silently.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's kvplan (the blocks run `python -m kvplan` from ROOT too)
README = ROOT / "README.md"
LOGS = ROOT / "tests" / "fixtures" / "vllm_logs"
CONFIGS = ROOT / "tests" / "fixtures" / "configs"
GiB = 1 << 30


def kvplan(*args: str) -> str:
    """A command's text output as a CI log shows it: 80 columns, not a terminal."""
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb", "NO_COLOR": "1"}
    r = subprocess.run([sys.executable, "-m", "kvplan", *args], capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode not in (0, 1):
        raise SystemExit(f"kvplan {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return "\n".join(line.rstrip() for line in r.stdout.splitlines())


def kvplan_json(*args: str) -> dict:
    return json.loads(kvplan(*args, "--json"))


def size_sample() -> str:
    return "```\n$ kvplan size llama2-7b --batch 16\n" + kvplan("size", "llama2-7b", "--batch", "16") + "\n```"


def published() -> str:
    def bpt(model: str, *args: str) -> int:
        return kvplan_json("size", model, "--seq-len", "1", *args)["bytes_per_token"]

    llama = kvplan_json("size", "llama2-7b", "--seq-len", "4096")
    gpt3 = [kvplan_json("size", "gpt3-175b", "--batch", str(b), "--seq-len", "4096")["total_bytes"] / GiB
            for b in (4, 16, 64)]
    rows = [
        ("Llama-2-7B fp16", f"{llama['bytes_per_token']:,} B/token; {llama['total_bytes'] / GiB:g} GiB at 4,096 tokens",
         "0.5 MiB/token"),
        ("OPT-13B fp16", f"{bpt('opt-13b'):,} B/token", "800 KB/token (vLLM paper)"),
        ("Llama-3.1-405B bf16", f"{bpt('llama3.1-405b'):,} B/token", ""),
        ("Qwen2.5-72B bf16", f"{bpt('qwen2.5-72b'):,} B/token", ""),
        ("DeepSeek-V3 bf16 MLA latent", f"{bpt('deepseek-v3'):,} B/token", "(512 + 64) x 61 x 2"),
        ("DeepSeek-V3.2 bf16 latent + indexer key", f"{bpt('deepseek-v3.2'):,} B/token", "(512 + 64 + 128) x 61 x 2"),
        ("DeepSeek-V4-Pro bf16, 1M tokens",
         f"{kvplan_json('size', 'deepseek-v4-pro', '--seq-len', str(1 << 20))['total_bytes'] / GiB:.2f} GiB a sequence",
         "9.62 GiB (DeepSeek V4 release)"),
        ("GPT-3 175B fp16, 4,096 tokens", f"{' / '.join(f'{g:,.0f}' for g in gpt3)} GiB at batch 4 / 16 / 64",
         '75.5 / 302 / 1,208 "GB"'),
    ]
    rows += [(f"{m['name']} {m['dtype']}", f"{m['bytes_per_token']:,} B/token; {_params(m)}", _cited(m))
             for m in bundled_models() if m["published"] or _read_by_family_module(m)]
    return "\n".join(["| model | kvplan | published |", "|---|---|---|",
                      *(f"| {m} | {k} | {p} |" for m, k, p in rows)])


def bundled_models() -> list[dict]:
    """`kvplan models --json`: every file of configs/models/, with its parameter count and cited figures."""
    return kvplan_json("models")["models"]


def _read_by_family_module(model: dict) -> bool:
    """Architectures the generic config reader cannot describe (kvplan/io/families): the newer families,
    whose rows the published-figures table shows whether or not their file cites a figure."""
    from kvplan.io.families import family_module

    return family_module(model["model_type"]) is not None


def _params(model: dict) -> str:
    if model["params"] is None:
        return "parameters not counted"
    # the published figures are language models' (the cited sources say so): a counted vision tower is left out
    lm = model["language_model_params"]
    text = f"{lm / 1e9:,.2f}B {'language-model ' if lm != model['params'] else ''}parameters"
    if model["published"]:
        text += f" ({100 * (lm / model['published']['params'] - 1):+.2f}%)"
    return text


def _cited(model: dict) -> str:
    return model["published"]["source"].replace("|", "/") if model["published"] else ""


def models_table() -> str:
    """The bundled models: hub id, layers by kind, KV bytes per token in the model's dtype, parameters as
    `fit` counts them. One row per file of configs/models/, so a new file adds its row."""
    out = ["| model | hub id | layers | KV/token | parameters |", "|---|---|---|---|---|"]
    for m in bundled_models():
        hub = next((a for a in m["aliases"] if "/" in a), "")
        params = f"{m['params'] / 1e9:,.2f}B" if m["params"] is not None else "-"
        out.append(f"| `{m['name']}` | {hub} | {m['layers']}: {m['attention']} | {m['bytes_per_token']:,} B "
                   f"({m['dtype']}) | {params} |")
    return "\n".join(out)


def engines_gemma() -> str:
    totals = {e: kvplan_json("size", "gemma3-27b", "--batch", "8", "--seq-len", "30001", "--engine", e)["total_bytes"]
              / GiB for e in ("ideal", "hf", "sglang", "vllm", "trtllm")}
    same = [e for e in ("ideal", "hf", "sglang") if round(totals[e], 3) == round(totals["ideal"], 3)]
    return (f"Gemma-3-27B, 8 sequences of 30,001 tokens: {'/'.join(same)} {totals['ideal']:.3f} GiB, "
            f"vLLM {totals['vllm']:.3f} GiB (block\nrounding and a sliding window that frees whole blocks only), "
            f"TensorRT-LLM {totals['trtllm']:.3f} GiB"
            + ("." if "sglang" in same else f",\nSGLang {totals['sglang']:.3f} GiB (Gemma 3 is not on its hybrid "
                                             "sliding-window list: every layer holds all tokens)."))


def gpt3_misprint() -> str:
    example = "configs/examples/gpt3-175b-d12888.json"
    gib = [kvplan_json("size", example, "--batch", str(b), "--seq-len", "4096")["total_bytes"] / GiB
           for b in (4, 16, 64)]
    return (f"`kvplan size {example} --batch 4 --seq-len 4096` gives {gib[0]:.2f} GiB\n"
            f"({gib[1]:,.1f} at batch 16, {gib[2]:,.1f} at batch 64).")


# Shipped logs with what `explain` needs that the log does not say (tests/cli/test_explain_cli.py).
EXPLAIN_CASES = [
    # (log, what, vLLM release (as logged, or from SOURCES.md), explain's flags, the figure replayed)
    ("v0_6_4_llama31_8b_rtx3090_20k.log", "Llama-3.1-8B, RTX 3090", "0.6.4 (V0)",
     ["--model", "llama3.1-8b", "--gpu", "RTX-3090", "--engine", "vllm==0.6.4"], "KV blocks"),
    ("v0_7_1_qwen25_32b_l40s_tp2.log", "Qwen2.5-32B tp2, L40S", "0.7.1 (V0)",
     ["--model", str(CONFIGS / "qwen2.5-32b.json")], "KV blocks"),
    ("v0_8_2_opt125m_fp32_16gb_windows.log", "OPT-125m fp32, 16 GiB", "0.8.2 (V0)",
     ["--model", str(CONFIGS / "opt-125m.json")], "KV blocks"),
    ("v0_h100_small_model_cudagraph.log", "Qwen3-0.6B, H100", ">= 0.8.4 (V0)",
     ["--model", str(CONFIGS / "qwen3-0.6b.json"), "--engine", "vllm==0.8.4"], "KV blocks"),
    ("v1_0_9_mistral_small31_24b_tp2.log", "Mistral-Small-24B tp2, L40S", "0.9.2.dev (V1)",
     ["--model", str(CONFIGS / "mistral-small-3.1-24b.json"), "--gpu", "L40S", "-tp", "2", "--engine", "vllm==0.9.2"],
     "KV cache tokens"),
    ("v1_0_21_qwen3_8b_a5000_cg_subtracted.log", "Qwen3-8B, RTX A5000", "0.21.0 (V1, graphs subtracted)",
     ["--model", "qwen3-8b", "--gpu-memory", "23.99GiB", "--engine", "vllm==0.21.0", "--max-num-batched-tokens",
      "8192"], "KV cache tokens"),
]


def explain_accuracy() -> str:
    out = ["| log | vLLM | logged | from the log's KV memory | KV memory logged | kvplan from model, GPU, settings |",
           "|---|---|---|---|---|---|"]
    for log, what, release, args, figure in EXPLAIN_CASES:
        data = kvplan_json("explain", str(LOGS / log), *args)
        rows = {r["figure"]: r for r in data["rows"]}
        fig, kv = rows[figure], rows["KV cache memory"]
        kv_pred = (f"{kv['predicted'] / GiB:.2f} GiB ({100 * kv['predicted_error_frac']:+.1f}%)"
                   if kv["predicted"] is not None and kv["logged"] else "-")
        out.append(f"| {what} | {release} | {fig['logged']:,.0f} {figure.split()[-1]} | "
                   f"{fig['replayed']:,.0f} ({100 * fig['replayed_error_frac']:+.2f}%) | "
                   f"{(kv['logged'] or 0) / GiB:.2f} GiB | {kv_pred} |")
    return "\n".join(out)


# Kwon et al., SOSP 2023 (arXiv 2309.06180): Figure 2's token-state shares (text: "only 20.4% - 38.2% of
# the KV cache memory is used to store the actual token states") and Figure 13(a)'s average batched
# requests, OPT-13B on ShareGPT (text: vLLM batches 2.2x Orca (Oracle) and 4.3x Orca (Max)).
PAPER_FIG2_TOKEN_STATES = {"contiguous-max": 20.4, "contiguous-pow2": 26.8, "contiguous-oracle": 38.2, "paged-16": 96.3}
PAPER_FIG13A_BATCH = {"contiguous-max": 7.00, "contiguous-pow2": 9.81, "contiguous-oracle": 13.62, "paged-16": 30.42}


def simulate_paper() -> str:
    """The vLLM-paper reproduction table: each allocator's shares and batch next to the paper's, under the
    buddy placement the paper assumed, and first-fit for the contiguous reservations that it does not round."""
    buddy = kvplan_json("simulate", "vllm-paper-sharegpt")["allocators"]
    first_fit = kvplan_json("simulate", "vllm-paper-sharegpt", "-a", "contiguous-pow2", "-a", "contiguous-oracle",
                            "--placement", "first-fit")["allocators"]
    rows = [(f"{name} (buddy)" if name.startswith("contiguous") else name, name, r) for name, r in buddy.items()]
    rows += [(f"{name} (first-fit)", name, r) for name, r in first_fit.items()]
    out = ["| allocator | token states | paper (Fig. 2) | reserved | internal frag | external frag | free | mean batch "
           "| paper (Fig. 13a) | tokens/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, name, r in rows:
        pct = [f"{100 * r[k]:.1f}%" for k in ("reserved_frac", "internal_frag_frac", "external_frag_frac",
                                              "free_frac")]
        out.append(f"| {label} | {100 * r['token_states_frac']:.1f}% | {PAPER_FIG2_TOKEN_STATES[name]}% | "
                   f"{' | '.join(pct)} | {r['mean_batch_size']:.2f} | {PAPER_FIG13A_BATCH[name]:.2f} | "
                   f"{r['throughput_tokens_per_s']:,.0f} |")
    return "\n".join(out)


def validation_cpu() -> str:
    report = json.loads((ROOT / "docs" / "validation" / "cpu" / "validation.json").read_text(encoding="utf-8"))
    cases = report["cases"]
    kv = [c for c in cases if c["component"].startswith("kv")]
    weights = [c for c in cases if c["component"].startswith("weights")]
    kv_exact = sum(c["error_bytes"] == 0 for c in kv)
    worst_w = max((abs(c["error_frac"]) for c in weights), default=0.0)
    return (f"**Agreement so far (CPU, [docs/validation/](docs/validation/README.md))**: KV cache exact to the byte\n"
            f"in {kv_exact} of {len(kv)} cases, weights within {100 * worst_w:.3f}% "
            f"({len(weights)} cases, {len({c['model'] for c in cases})} models).")


def validation_gpu() -> str:
    """The newest GPU report in docs/validation/gpu/ (named <gpu>-<date>.json)."""
    reports = sorted((ROOT / "docs" / "validation" / "gpu").glob("*-*.json"), key=lambda p: p.stem.split("-", 1)[1])
    if not reports:
        raise SystemExit("no GPU validation report in docs/validation/gpu/")
    report = json.loads(reports[-1].read_text(encoding="utf-8"))
    cases = [c for c in report["cases"] if not c["scaled"] and not c.get("missing")]
    kv = [c for c in cases if c["component"] == "kv_cache"]
    prefill = [c for c in cases if c["component"] == "prefill_peak"]
    in_band = sum(abs(c["error_bytes"]) <= c["band_bytes"] for c in prefill)
    device = report["device"]
    return (f"**On a GPU ({device['name']}, torch {device['torch']}, transformers {device['transformers']}: "
            f"[docs/validation/gpu/](docs/validation/gpu/README.md))**:\nthe KV cache of a real `generate()`, read "
            f"from the caching allocator, exact to the byte in {sum(c['error_bytes'] == 0 for c in kv)} of {len(kv)} "
            f"cases ({len({c['model'] for c in kv})} models, one of each attention family); prefill peaks inside the "
            f"activation band in {in_band} of {len(prefill)}.")


def engine_profiles() -> str:
    """docs/engines.md's profile tables, from the registry itself (kvplan engines --json)."""
    data = kvplan_json("engines")["engines"]
    out = []
    for name, engine in data.items():
        out += [f"### {name}: {len(engine['profiles'])} profiles, sources read through {engine['checked_through']}", "",
                "| from | up to (not incl.) | what changed, and where |", "|---|---|---|"]
        for p in engine["profiles"]:
            changes = "<br>".join(c.replace("|", "/") for c in p["changes"])
            out.append(f"| {p['version']} | {p['until'] or 'newest'} | {changes} |")
        out.append("")
    return "\n".join(out).rstrip()


PLAN_DENSE = ("plan", "llama3.1-70b", "--max-model-len", "32k", "--concurrency", "64", "--engine", "vllm==0.20.0",
              "--gpus", "L40S,A100-80GB,H100-80GB,H200", "--price", "L40S=0.90,A100-80GB=1.30,H100-80GB=3.00,H200=4.00",
              "--top", "5")
PLAN_MOE = ("plan", "deepseek-v3", "--max-model-len", "32k", "--concurrency", "64", "--engine", "vllm==0.20.0",
            "--gpus", "H100-80GB,H200,B200", "--top", "5")


def plan_examples() -> str:
    """`kvplan plan` for a dense and an MoE model, as a CI log shows them."""
    return "\n\n".join("```\n$ kvplan " + " ".join(a if " " not in a else repr(a) for a in args) + "\n"
                       + kvplan(*args) + "\n```" for args in (PLAN_DENSE, PLAN_MOE))


def _this_checkout() -> dict[str, str]:
    """The environment for a benchmark script: this checkout's kvplan first on the path (a script's own
    folder, not the checkout, starts sys.path, and an installed kvplan may be another checkout's)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}


def timings_size() -> str:
    out = subprocess.run([sys.executable, "benchmarks/bench_size.py"], capture_output=True, text=True, cwd=ROOT,
                         check=True, env=_this_checkout()).stdout
    return "```\n$ python benchmarks/bench_size.py\n" + out.rstrip() + "\n```"


BLOCKS: dict[str, Callable[[], str]] = {
    "size-sample": size_sample,
    "models": models_table,
    "published": published,
    "engines-gemma": engines_gemma,
    "gpt3-misprint": gpt3_misprint,
    "explain-accuracy": explain_accuracy,
    "validation-cpu": validation_cpu,
    "validation-gpu": validation_gpu,
    "plan-examples": plan_examples,
    "simulate-paper": simulate_paper,
}
def timings_simulate() -> str:
    out = subprocess.run([sys.executable, "benchmarks/bench_simulate.py"], capture_output=True, text=True, cwd=ROOT,
                         check=True, env=_this_checkout()).stdout
    return "```\n$ python benchmarks/bench_simulate.py\n" + out.rstrip() + "\n```"


TIMINGS: dict[str, Callable[[], str]] = {"timings-size": timings_size, "timings-simulate": timings_simulate}
# Blocks in other documents: name -> (file, generator); checked and written like the README's.
DOC_BLOCKS: dict[str, tuple[Path, Callable[[], str]]] = {
    "engine-profiles": (ROOT / "docs" / "engines.md", engine_profiles),
    "simulate-figure2": (ROOT / "docs" / "workloads.md", simulate_paper),
}


def _pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- generated: {re.escape(name)} -->\n)(.*?)(\n<!-- end: {re.escape(name)} -->)", re.S)


def current(text: str, name: str) -> str | None:
    m = _pattern(name).search(text)
    return m.group(2) if m else None


def _update(path: Path, blocks: dict[str, Callable[[], str]], write: bool, only: list[str]) -> list[str]:
    text = path.read_text(encoding="utf-8")
    stale = []
    for name, make in blocks.items():
        if only and name not in only:
            continue
        have = current(text, name)
        if have is None:
            print(f"{path.name} has no block {name!r} (<!-- generated: {name} --> ... <!-- end: {name} -->)")
            stale.append(name)
            continue
        want = make()
        if want != have:
            stale.append(name)
            if write:
                text = _pattern(name).sub(lambda m: m.group(1) + want + m.group(3), text)
            else:
                print(f"--- {path.name} {name}: has\n{have}\n+++ generated\n{want}\n")
    if write:
        path.write_text(text, encoding="utf-8")
    return stale


def main(argv: list[str]) -> int:
    write, with_timings = "--write" in argv, "--timings" in argv
    only = [a for a in argv if not a.startswith("--")]
    stale = _update(README, {**BLOCKS, **(TIMINGS if with_timings else {})}, write, only)
    by_file: dict[Path, dict[str, Callable[[], str]]] = {}
    for name, (path, make) in DOC_BLOCKS.items():
        by_file.setdefault(path, {})[name] = make
    for path, blocks in by_file.items():
        stale += _update(path, blocks, write, only)
    if write:
        print(f"rewrote {len(stale)} block(s): {', '.join(stale) or 'none'}")
        return 0
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
