"""How fast is the simulator? 10k and 100k ShareGPT-like requests against the four allocators.

Run: python benchmarks/bench_simulate.py [rate ...]
The workload is configs/workloads/vllm-paper-sharegpt.yaml (OPT-13B, 12 GiB pool) with the request
count and Poisson rate replaced. Prints seconds per allocator, the total in one process and with the
allocators spread over the machine's cores (what `kvplan simulate` does from 20k requests), and the
100k / 10k ratio (10 means linear in the number of requests).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

from kvplan.cli.simulate import run_all
from kvplan.core.sim.engine import simulate
from kvplan.core.sim.workload import Arrivals, LengthDist, synthetic_requests
from kvplan.io.models import configs_dir
from kvplan.io.workload import resolve_workload


def _one(args):
    requests, config, alloc = args
    t0 = time.perf_counter()
    result = simulate(requests, config, alloc)
    return alloc.name, time.perf_counter() - t0, result.preemptions


def run(count: int, rate: float) -> tuple[float, float]:
    base = resolve_workload(configs_dir() / "workloads" / "vllm-paper-sharegpt.yaml")
    requests = synthetic_requests(count=count, arrivals=Arrivals(process="poisson", rate=rate),
                                  prompt=LengthDist(dist="lognormal", mean=161, sigma=1.0),
                                  output=LengthDist(dist="lognormal", mean=338, sigma=1.0),
                                  seed=0, max_model_len=2048)
    w = dataclasses.replace(base, requests=requests)
    jobs = [(w.requests, w.config, a) for a in w.allocators]
    t0 = time.perf_counter()
    per = [_one(job) for job in jobs]
    serial = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_all(w, progress=False, points=0)  # what `kvplan simulate` does: forked workers, one per allocator
    parallel = time.perf_counter() - t0
    detail = ", ".join(f"{name} {sec:.2f}s ({pre:,} preemptions)" for name, sec, pre in per)
    print(f"{count:>7,} requests at {rate:g}/s: one process {serial:6.2f} s, {os.cpu_count()} cores {parallel:6.2f} s  [{detail}]")
    return serial, parallel


def main() -> None:
    rates = [float(x) for x in sys.argv[1:]] or [2.5, 20.0]
    for rate in rates:
        small, _ = run(10_000, rate)
        big, big_parallel = run(100_000, rate)
        print(f"  100k / 10k time ratio: {big / small:.1f} (10 = linear); 100k with all cores: {big_parallel:.2f} s")


if __name__ == "__main__":
    main()
