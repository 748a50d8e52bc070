"""kvplan's vllm-v1 simulator beside vLLM's own scheduler loop, on the same requests.

Run: python benchmarks/bench_vs_vllm.py [--count N]
Needs vLLM installed as tools/vllm_reference/README.md says: KVPLAN_VLLM_PYTHON names that venv's python (default
/work/venvs/vllm033/bin/python); KVPLAN_VLLM_PATH, if set, goes first on its PYTHONPATH (an unpacked sdist tree).

Request sets (the format of tests/fixtures/vllm_scheduler/README.md), each run sync and async (vLLM's default):
- sharegpt-poisson: the default path's traffic (benchmarks/bench_default_path.py) in steps: N (default 2,000)
  ShareGPT-like requests (lognormal prompts of mean 161, outputs of mean 338, sigma 1) arriving one every E steps
  on average (Poisson; default 15, busier than the default path's 24: 2,416,545 steps over its 100,000 requests),
  OPT-13B's 983-block pool, prefix caching on (V1's default);
- sharegpt-opt13b: the recorded fixture, 500 ShareGPT-like requests all at step 0 into that pool, prefix caching
  off: a queue that never drains and a preemption every eight steps, where the loop goes step by step (reported;
  not the traffic of the target).
vLLM's time is its loop alone (tools/vllm_reference/run.py --no-per-step: loop_seconds: arrivals, schedule(), the
fake model runner, update_from_output; not the import or the scheduler's construction); kvplan's is simulate_v1's
run alone (the requests' columns read first, each request's state made as it arrives; per_step=False, as `kvplan
simulate` runs without --plot), the best of three. Both print their steps and preemptions; a line where they
differ says MISMATCH.
Target (issue 20): kvplan at least 100x faster than vLLM on the default path's traffic (sharegpt-poisson, async).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "vllm_scheduler"
TARGET = 100.0


def poisson_set(count: int, every: float = 15.0) -> dict:
    rs = json.loads((FIXTURES / "sharegpt-opt13b.requests.json").read_text())
    rng = random.Random(20_000)
    reqs, t, seg = [], 0.0, 5_000_000
    for i in range(count):
        t += rng.expovariate(1 / every)
        mu = math.log(161) - 0.5
        p = min(max(1, round(rng.lognormvariate(mu, 1.0))), 2047)
        o = max(1, min(max(1, round(rng.lognormvariate(math.log(338) - 0.5, 1.0))), 2048 - p))
        reqs.append({"id": str(i), "arrival_step": int(t), "prompt": [[seg + 2 * i, p]], "output": [seg + 2 * i + 1, o]})
    rs.update(name="sharegpt-poisson", requests=reqs, description=f"{count} ShareGPT-like requests, Poisson arrivals")
    rs["scheduler"] = {**rs["scheduler"], "enable_prefix_caching": True}
    return rs


def vllm_loop(path: Path) -> tuple[float, int, int]:
    py = os.environ.get("KVPLAN_VLLM_PYTHON", "/work/venvs/vllm033/bin/python")
    env = dict(os.environ)
    extra = [os.environ["KVPLAN_VLLM_PATH"]] if os.environ.get("KVPLAN_VLLM_PATH") else []
    env["PYTHONPATH"] = os.pathsep.join([*extra, str(REPO), env.get("PYTHONPATH", "")])
    out = subprocess.run([py, str(REPO / "tools/vllm_reference/run.py"), str(path), "--print-only", "--no-per-step"],
                         capture_output=True, text=True, env=env, check=True).stdout
    m = re.search(r"steps (\d+) .*preemptions (\d+) .*loop ([\d.]+) s", out)
    if not m:
        raise SystemExit(f"vLLM's harness printed no timing:\n{out}")
    return float(m.group(3)), int(m.group(1)), int(m.group(2))


def kvplan_loop(path: Path) -> tuple[float, int, int]:
    from kvplan.core.sim.v1.scheduler import _Sim
    from kvplan.io.vllm_requests import read_request_set

    inputs = read_request_set(path)
    best, result = math.inf, None
    for _ in range(3):
        sim = _Sim(inputs, False)
        sim.fast, sim.timeline_points, sim.per_step = True, 0, False
        t0 = time.perf_counter()
        result = sim.run()
        best = min(best, time.perf_counter() - t0)
    return best, result.steps, result.preemptions  # type: ignore[union-attr]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=2000, help="requests in the Poisson set")
    ap.add_argument("--every", type=float, default=15.0, help="mean steps between the Poisson set's arrivals")
    args = ap.parse_args()
    sets = [poisson_set(args.count, args.every), json.loads((FIXTURES / "sharegpt-opt13b.requests.json").read_text())]
    with tempfile.TemporaryDirectory() as tmp:
        for rs in sets:
            for async_ in (True, False):
                rs["scheduler"] = {**rs["scheduler"], "async_scheduling": async_}
                path = Path(tmp) / f"{rs['name']}-{async_}.requests.json"
                path.write_text(json.dumps(rs))
                v_s, v_steps, v_pre = vllm_loop(path)
                k_s, k_steps, k_pre = kvplan_loop(path)
                ratio = v_s / k_s
                target = rs["name"] == "sharegpt-poisson" and async_
                verdict = f"{'met' if ratio >= TARGET else 'NOT met'} ({TARGET:.0f}x)" if target else "(no target)"
                if (v_steps, v_pre) != (k_steps, k_pre):
                    verdict = "MISMATCH: not the same run"
                print(f"{rs['name']:17s} {'async' if async_ else 'sync ':5s} {len(rs['requests']):6,} requests  "
                      f"vLLM {v_s:7.3f} s ({v_steps:,} steps, {v_pre:,} preemptions)  kvplan {k_s:7.4f} s "
                      f"({k_steps:,} steps, {k_pre:,} preemptions)  {ratio:6.1f}x  {verdict}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
