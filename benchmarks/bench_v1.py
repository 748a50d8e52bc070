"""How fast is the vLLM v1 scheduler simulator (kvplan/core/sim/v1)? Steps per second.

Run: python benchmarks/bench_v1.py [count]
- the largest request set with a recorded vLLM fixture in tests/fixtures/vllm_scheduler (if any);
- ShareGPT-like traffic (lognormal prompts of mean 161, outputs of mean 338 tokens, Poisson arrivals)
  on OPT-13B's 983-block pool (max_num_seqs 256, max_num_batched_tokens 2048), without and with prefix
  caching (50 shared system prompts), and a multi-turn chat (each turn's prompt = the history + a message).
Prints requests, steps, mean running, wall and CPU seconds, steps and request-steps per CPU second (the CPU
time, since the machine is shared: wall time follows the load).
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from kvplan.core.sim.v1 import FULL, CacheGroup, CacheLayout, SchedulerConfig, V1Inputs, V1Request, simulate_v1
from kvplan.core.sim.workload import Arrivals, LengthDist, synthetic_draws

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "vllm_scheduler"
POOL = CacheLayout(num_blocks=983, groups=(CacheGroup(kind=FULL, block_size=16),))


def report(name: str, inputs: V1Inputs) -> None:
    w0, c0 = time.perf_counter(), time.process_time()
    r = simulate_v1(inputs, per_step=False)  # as `kvplan simulate` runs it (per-step figures only for --plot)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    print(f"{name:30s} {len(inputs.requests):6d} req {r.schedule_calls:7d} steps  running {r.mean_running:5.1f}  "
          f"wall {wall:6.2f} s  CPU {cpu:6.2f} s  {r.schedule_calls / cpu:8.0f} steps/CPU-s  "
          f"{r.mean_running * r.steps / cpu:9.0f} request-steps/CPU-s")


def sharegpt(count: int, caching: bool) -> V1Inputs:
    draws = synthetic_draws(count=count, arrivals=Arrivals(process="poisson", rate=2.0),
                            prompt=LengthDist(dist="lognormal", mean=161, sigma=1.0),
                            output=LengthDist(dist="lognormal", mean=338, sigma=1.0), seed=0)
    reqs = []
    for i, (t, p, o) in enumerate(draws):
        p = max(1, min(p, 2047))
        o = max(1, min(o, 2048 - p))
        prompt = ((i % 50, 64), (10**6 + i, p)) if caching else ((10**6 + i, p),)
        reqs.append(V1Request(id=str(i), prompt=prompt, output=(2 * 10**6 + i, o), arrival_step=int(t * 30)))
    sched = SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=4096,
                            enable_prefix_caching=caching)
    return V1Inputs(requests=tuple(reqs), scheduler=sched, layout=POOL)


def multi_turn(sessions: int, turns: int) -> V1Inputs:
    rng = random.Random(0)
    reqs, seg = [], 0
    for s in range(sessions):
        history: list[tuple[int, int]] = [(0, 200)]  # a shared system prompt
        step = rng.randrange(0, 20 * sessions)
        for t in range(turns):
            seg += 2
            message, answer = (seg, rng.randint(20, 200)), (seg + 1, rng.randint(20, 300))
            prompt = (*history, message)
            if sum(n for _, n in prompt) + answer[1] >= 8192:
                break
            reqs.append(V1Request(id=f"{s}-{t}", prompt=prompt, output=answer, arrival_step=step))
            history = [*prompt, answer]
            step += answer[1] + rng.randint(50, 400)  # the answer's steps, then the user's think time
    sched = SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=8192,
                            enable_prefix_caching=True)
    return V1Inputs(requests=tuple(reqs), scheduler=sched, layout=POOL)


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    from kvplan.io.vllm_requests import read_request_set

    for path in sorted(FIXTURES.glob("*.requests.json")) if FIXTURES.is_dir() else []:
        report(path.name.removesuffix(".requests.json"), read_request_set(path))
    report("sharegpt", sharegpt(count, caching=False))
    report("sharegpt + 50 system prompts", sharegpt(count, caching=True))
    report("multi-turn chat", multi_turn(count // 8, 8))


if __name__ == "__main__":
    main()
