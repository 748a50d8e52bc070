"""How fast is `kvplan simulate` on its default path: a plain vLLM workload, vLLM's own V1 scheduler (vllm-v1)?

Run: python benchmarks/bench_default_path.py [count ...]   (default: 20000 100000)

The workload is the vLLM paper's ShareGPT-like traffic (configs/workloads/vllm-paper-sharegpt.yaml: OPT-13B on an
A100-40GB with a 12 GiB pool, lognormal prompts of mean 161 and outputs of mean 338 tokens, sigma 1, Poisson
arrivals) written as a user would write it for today's vLLM: no scheduler section, so `auto` runs the newest
vLLM release's scheduler with its async default, and no allocators, so vLLM's paged pool alone. The arrival rate
is 2 requests a second (the paper's 20 saturates one A100 and only measures a queue that never drains).
For each count, in a fresh process: the wall and CPU seconds of planning (reading the file, drawing the requests,
planning the pool) and of the run (the simulation), the run's steps, and the process's peak resident memory
(imports included), against the targets of issue 20: 100,000 requests in at most 5 s; 1,000,000 in at most 60 s
and 500 MB.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGETS = {100_000: (5.0, None), 1_000_000: (60.0, 500)}  # requests: (seconds, MB)

WORKLOAD = """\
name: sharegpt-default-path
serving: {{model: opt-13b, gpu: A100-40GB, engine: vllm, kv_pool_bytes: 12GiB}}
requests:
  count: {count}
  seed: 0
  arrival: {{process: poisson, rate: 2.0}}
  prompt_tokens: {{dist: lognormal, mean: 161, sigma: 1.0}}
  output_tokens: {{dist: lognormal, mean: 338, sigma: 1.0}}
"""


def measure(count: int, folder: Path) -> None:
    from kvplan.app.simulate import plan_simulation, run_simulation

    path = folder / f"sharegpt-{count}.yaml"
    path.write_text(WORKLOAD.format(count=count))
    w0, c0 = time.perf_counter(), time.process_time()
    plan = plan_simulation(path)
    w1, c1 = time.perf_counter(), time.process_time()
    run = run_simulation(plan)
    w2, c2 = time.perf_counter(), time.process_time()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    r = run.v1
    print(f"{count:>9,} requests  {plan.simulator}  async {plan.v1.inputs.scheduler.async_scheduling}  "
          f"steps {r.steps:>9,}  running {r.mean_running:6.1f}  preemptions {r.preemptions:>6,}")
    print(f"{'':>19}plan {w1 - w0:6.2f} s wall {c1 - c0:6.2f} s CPU   run {w2 - w1:7.2f} s wall {c2 - c1:7.2f} s CPU   "
          f"total {w2 - w0:7.2f} s   peak RSS {peak:7.1f} MiB   "
          f"{r.steps / max(c2 - c1, 1e-9):9,.0f} steps/CPU-s", flush=True)
    if count in TARGETS:
        seconds, mb = TARGETS[count]
        met = w2 - w0 <= seconds and (mb is None or peak <= mb)
        print(f"{'':>19}target: {seconds:.0f} s{f' and {mb} MB' if mb else ''}: {'met' if met else 'NOT met'}", flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        with tempfile.TemporaryDirectory() as tmp:
            measure(int(sys.argv[2]), Path(tmp))
        return
    for count in [int(a) for a in sys.argv[1:]] or [20_000, 100_000]:
        subprocess.run([sys.executable, __file__, "--one", str(count)], check=True)  # a fresh process: its own peak


if __name__ == "__main__":
    main()
