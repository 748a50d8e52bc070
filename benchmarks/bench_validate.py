"""Where the time of `kvplan validate MODEL --device cpu --layers N` goes.

Run: python benchmarks/bench_validate.py [MODEL] [LAYERS]   (default: llama3.1-8b 2, issue 19's case)

Prints seconds, each figure measured on the code path `kvplan validate` runs (kvplan.validate.run.run_case,
with timers wrapped around its steps, not a copy of them):
  - the command end to end, as a subprocess (`python -m kvplan validate ... --json`): what a user waits;
  - in one process: importing torch and transformers; resolving the model; the memory check; building
    the model (module construction and its parameters' storages; transformers' weight initialisation,
    `init_weights`; torch's own per-module initialisation, `reset_parameters`; and in run.py, what it does
    after building); measuring the weights; the prefill and each decode forward pass; measuring the cache;
and the parameters that were built, by module: the embedding and the LM head hold most of a 2-layer
slice of a large-vocabulary model.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Callable, Iterator

TIMES: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)


@contextmanager
def timed(name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        TIMES[name] += time.perf_counter() - t0
        CALLS[name] += 1


def wrap(owner: Any, attr: str, name: str) -> None:
    """Time every call of ``owner.attr`` under ``name`` (the first call into it only, when it recurses)."""
    original: Callable[..., Any] = getattr(owner, attr)
    depth = [0]

    def timed_call(*args: Any, **kwargs: Any) -> Any:
        if depth[0]:
            return original(*args, **kwargs)
        depth[0] += 1
        try:
            with timed(name):
                return original(*args, **kwargs)
        finally:
            depth[0] -= 1

    setattr(owner, attr, timed_call)


def end_to_end(model: str, layers: int) -> float:
    cmd = [sys.executable, "-m", "kvplan", "validate", model, "--device", "cpu", "--layers", str(layers), "--json"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()[-500:]}")
    return wall


ORDER = ("import torch", "import transformers (AutoModelForCausalLM, DynamicCache)", "resolve the model (kvplan)",
         "memory check (kvplan's predictions, before building)", "build the model (hf_cache.build_model)",
         "  of which transformers' init_weights (random init, tying)",
         "  of which torch's reset_parameters (Linear, Embedding)",
         "after building: tie the weights, zero them (run.py)", "measure the weights (parameter storages)",
         "prefill + decode + cache measurement", "prefill forward", "decode forwards",
         "measure the cache (its storages)", "run_case (all of the measurement)")


def in_process(model: str, layers: int) -> dict[str, Any]:
    for name in ORDER:  # every step is printed, 0.00 s where a step no longer runs
        TIMES[name] = 0.0
    with timed("import torch"):
        import torch
    with timed("import transformers (AutoModelForCausalLM, DynamicCache)"):
        from transformers import AutoModelForCausalLM, DynamicCache  # noqa: F401
        from transformers.modeling_utils import PreTrainedModel

    import kvplan.validate.hf_cache as hf_cache
    import kvplan.validate.run as run
    from kvplan.io.models import resolve_model

    torch.set_num_threads(os.cpu_count() or 1)
    wrap(run, "check_memory", "memory check (kvplan's predictions, before building)")
    wrap(hf_cache, "build_model", "build the model (hf_cache.build_model)")
    wrap(PreTrainedModel, "init_weights", "  of which transformers' init_weights (random init, tying)")
    for cls in (torch.nn.Linear, torch.nn.Embedding):
        wrap(cls, "reset_parameters", "  of which torch's reset_parameters (Linear, Embedding)")
    if hasattr(run, "_tied_and_zeroed"):
        wrap(run, "_tied_and_zeroed", "after building: tie the weights, zero them (run.py)")
    wrap(run, "_weights_bytes", "measure the weights (parameter storages)")
    wrap(hf_cache, "cache_storage_bytes", "measure the cache (its storages)")
    built: dict[str, Any] = {}
    original_measure = hf_cache.measure_decode

    def measure(model_: Any, **kw: Any) -> Any:
        calls = [0]
        forward = model_.forward

        def counted(*a: Any, **k: Any) -> Any:
            calls[0] += 1
            with timed("prefill forward" if calls[0] == 1 else "decode forwards"):
                return forward(*a, **k)

        model_.forward = counted
        built["model"] = model_
        try:
            with timed("prefill + decode + cache measurement"):
                return original_measure(model_, **kw)
        finally:
            model_.forward = forward

    hf_cache.measure_decode = measure  # run_case imports it from hf_cache when it runs
    with timed("resolve the model (kvplan)"):
        spec = resolve_model(model).spec
    with timed("run_case (all of the measurement)"):
        results = run.run_case(run.Case(model=model, layers=layers, device="cpu"), spec)
    params: dict[str, int] = defaultdict(int)
    seen: set[int] = set()
    for name, p in built["model"].named_parameters():
        if p.untyped_storage().data_ptr() in seen:
            continue
        seen.add(p.untyped_storage().data_ptr())
        kind = ("embedding" if "embed" in name else "LM head" if "lm_head" in name
                else "decoder layers" if ".layers." in name else "other")
        params[kind] += p.numel()
    return {"results": results, "params": dict(params)}


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "llama3.1-8b"
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    print(f"kvplan validate {model} --device cpu --layers {layers}  ({os.cpu_count()} CPUs)")
    wall = end_to_end(model, layers)
    print(f"{'end to end (subprocess, --json)':60s} {wall:8.2f} s")
    t0 = time.perf_counter()
    out = in_process(model, layers)
    total = time.perf_counter() - t0
    for name, seconds in TIMES.items():
        calls = f" ({CALLS[name]} calls)" if CALLS[name] > 1 else ""
        print(f"{name + calls:60s} {seconds:8.2f} s")
    print(f"{'in-process total':60s} {total:8.2f} s")
    print("parameters built: " + ", ".join(f"{k} {v / 1e6:,.0f}M" for k, v in sorted(out["params"].items())))
    for r in out["results"]:
        if not r.scaled:
            print(f"  {r.component}: predicted {r.predicted_bytes:,} B, measured {r.measured_bytes:,} B")


if __name__ == "__main__":
    main()
