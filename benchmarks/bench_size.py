"""How fast does `kvplan size` start, next to the cost of importing its own dependencies?

Run: python benchmarks/bench_size.py [rounds]

Prints median wall times (ms), measured in one run with the commands interleaved round by round (so a
busy machine slows every figure alike):
  - floor: python importing typer, rich (console, table), pydantic (BaseModel) and yaml;
  - typer floor: the same plus running an empty Typer command with `kvplan size`'s parameter types
    (typer >= 0.29 builds a pydantic TypeAdapter per parameter: a cost of the dependency, not of kvplan);
  - `kvplan size llama2-7b --batch 16`, text and --json, and `kvplan --version`;
and the ratio size / floor (the goal: at most 1.5), the in-process sizing call alone, and the heavy
modules (torch, transformers, matplotlib, huggingface_hub) `size` imports, which must be none.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

FLOOR = "import typer, rich.console, rich.table, yaml; from pydantic import BaseModel"
TYPER_FLOOR = FLOOR + """
from typing import Optional
app = typer.Typer()
@app.command()
def size(model: str, batch: int = 1, seq_len: Optional[int] = None, dtype: str = "auto", tp: int = 1, pp: int = 1,
         engine: str = "ideal", block_size: Optional[int] = None, as_json: bool = False,
         fetch: Optional[bool] = None, revision: Optional[str] = None): pass
@app.command()
def other(): pass
app(["size", "llama2-7b", "--batch", "16"], standalone_mode=False)
"""


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    py = sys.executable
    commands = {
        "import typer+rich+pydantic+yaml (floor)": [py, "-c", FLOOR],
        "... + an empty Typer command (typer floor)": [py, "-c", TYPER_FLOOR],
        "kvplan size llama2-7b --batch 16": [py, "-m", "kvplan", "size", "llama2-7b", "--batch", "16"],
        "kvplan size llama2-7b --batch 16 --json": [py, "-m", "kvplan", "size", "llama2-7b", "--batch", "16", "--json"],
        "kvplan --version": [py, "-m", "kvplan", "--version"],
    }
    # As installed: pip byte-compiles a package; an environment that forbids writing bytecode would make
    # every run compile kvplan's sources again, which no user pays. One warm-up round writes it.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    times: dict[str, list[float]] = {name: [] for name in commands}
    for round_ in range(rounds + 1):
        for name, cmd in commands.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, env=env)
            if round_:
                times[name].append((time.perf_counter() - t0) * 1000)
    median = {name: statistics.median(t) for name, t in times.items()}
    floor = median["import typer+rich+pydantic+yaml (floor)"]

    from kvplan.core.engines import get_engine
    from kvplan.core.sizing import size_kv
    from kvplan.io.models import load_model

    spec = load_model("gemma3-27b")
    eng = get_engine("vllm")
    n = 1000
    t0 = time.perf_counter()
    for _ in range(n):
        size_kv(spec, eng, batch=64, seq_len=32768, tp=4, pp=2)
    per_call_us = (time.perf_counter() - t0) / n * 1e6

    imp = subprocess.run([py, "-X", "importtime", "-m", "kvplan", "size", "llama2-7b", "--batch", "16"],
                         capture_output=True, text=True, env=env).stderr
    heavy = sorted({line.rsplit("|", 1)[-1].strip() for line in imp.splitlines()
                    if line.rsplit("|", 1)[-1].strip().split(".")[0] in ("torch", "transformers", "matplotlib",
                                                                             "huggingface_hub")})

    print(f"rounds (interleaved):                        {rounds}")
    for name, value in median.items():
        print(f"{name:<45}{value:8.1f} ms  ({value / floor:4.2f}x the floor)")
    print(f"{'size_kv(gemma3-27b, vllm, tp4 pp2)':<45}{per_call_us:8.1f} us per call")
    print(f"{'heavy modules imported by size':<45}{heavy or 'none'}")


if __name__ == "__main__":
    main()
