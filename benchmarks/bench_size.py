"""How fast is `kvplan size`, next to the cost of importing its own dependencies?

Run: python benchmarks/bench_size.py [runs]
Prints median wall times (ms) of:
  - python importing typer, rich, pydantic, yaml (the floor a CLI on these libraries pays),
  - `python -m kvplan size llama2-7b --batch 16` and the same with --json,
  - the in-process sizing call alone,
and the heavy modules (torch, transformers, matplotlib) `size` imports, which must be none.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time


def wall_ms(cmd: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    py = sys.executable
    floor = wall_ms([py, "-c", "import typer, rich.console, rich.table, yaml; from pydantic import BaseModel"], runs)
    typer_floor = wall_ms([py, "-c", "import typer, rich.console, rich.table, yaml; from pydantic import BaseModel\n"
                                     "app = typer.Typer()\n@app.command()\ndef f(x: int = 1): pass\n@app.command()\n"
                                     "def g(): pass\napp(['f'], standalone_mode=False)"], runs)
    size = wall_ms([py, "-m", "kvplan", "size", "llama2-7b", "--batch", "16"], runs)
    size_json = wall_ms([py, "-m", "kvplan", "size", "llama2-7b", "--batch", "16", "--json"], runs)

    from kvplan.core.engines import get_engine
    from kvplan.core.sizing import size_kv
    from kvplan.io.models import load_model

    spec = load_model("gemma3-27b")
    eng = get_engine("vllm")
    t0 = time.perf_counter()
    n = 1000
    for _ in range(n):
        size_kv(spec, eng, batch=64, seq_len=32768, tp=4, pp=2)
    per_call_us = (time.perf_counter() - t0) / n * 1e6

    imp = subprocess.run([py, "-X", "importtime", "-m", "kvplan", "size", "llama2-7b", "--batch", "16"],
                         capture_output=True, text=True).stderr
    heavy = sorted({line.rsplit("|", 1)[-1].strip() for line in imp.splitlines()
                    if line.rsplit("|", 1)[-1].strip().split(".")[0] in ("torch", "transformers", "matplotlib")})

    print(f"runs per figure:                       {runs}")
    print(f"import typer+rich+pydantic+yaml:       {floor:8.1f} ms")
    print(f"... and running an empty Typer command:{typer_floor:8.1f} ms")
    print(f"kvplan size llama2-7b --batch 16:      {size:8.1f} ms  ({size - floor:+.1f} ms over the floor)")
    print(f"kvplan size ... --json:                {size_json:8.1f} ms  ({size_json - floor:+.1f} ms over the floor)")
    print(f"size_kv(gemma3-27b, vllm, tp4 pp2):    {per_call_us:8.1f} us per call")
    print(f"heavy modules imported by size:        {heavy or 'none'}")


if __name__ == "__main__":
    main()
