"""How fast is `kvplan plan`'s memory search?

Run: python benchmarks/bench_plan.py

Prints, in-process (imports excluded), the median of 3 runs of each plan: its wall time, the `fit` calls it made
and the deployments (GPU type x engine x KV dtype x weights x tp x pp x dp x expert parallel) those calls decided,
per second; then a DeepSeek-V3 plan with its top 10 rows run through `simulate` with 10,000 requests (vLLM's
batch queue over pipeline stages, its load balancer over data-parallel engines). The targets (issue 24): at least 10,000 candidate configurations a second;
a whole plan for DeepSeek-V3 over 6 GPU types in at most 10 s without simulation, 60 s with the top 10 simulated
over 10,000 requests.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from kvplan.app.plan import plan_model, plan_with_traffic

TRAFFIC = """name: bench-plan-10k
serving: {model: deepseek-v3}
requests:
  count: 10000
  seed: 0
  arrival: {process: poisson, rate: 20.0}
  prompt_tokens: {dist: lognormal, mean: 1000, sigma: 0.8}
  output_tokens: {dist: lognormal, mean: 300, sigma: 0.6}
scheduler: {model: vllm-v1, max_model_len: 32768}
"""

CASES = [
    ("llama3.1-8b, every catalog GPU >= 40 GiB", dict(model="llama3.1-8b", max_model_len=32768, concurrency=64)),
    ("llama3.1-70b, every catalog GPU >= 40 GiB, KV auto and fp8",
     dict(model="llama3.1-70b", max_model_len=32768, concurrency=64, kv_cache_dtypes="auto,fp8")),
    ("deepseek-v3, 6 GPU types", dict(model="deepseek-v3", max_model_len=32768, concurrency=64,
                                      gpus="H100-80GB,H200,B200,A100-80GB,H20,MI300X")),
]


def main() -> None:
    plan_model("gpt2", max_model_len=1024, concurrency=1, gpus="H100-80GB")  # imports and catalogs loaded
    print(f"{'plan':58} {'wall s':>7} {'fits':>6} {'deployments':>11} {'fits/s':>8} {'deploy/s':>9}")
    for name, kwargs in CASES:
        times, report = [], None
        for _ in range(3):
            start = time.perf_counter()
            report = plan_model(**kwargs)  # type: ignore[arg-type]
            times.append(time.perf_counter() - start)
        assert report is not None
        wall = statistics.median(times)
        r = report.result
        print(f"{name:58} {wall:7.2f} {r.fits_evaluated:6,} {r.candidates:11,} {r.fits_evaluated / wall:8,.0f} "
              f"{r.candidates / wall:9,.0f}")
    for model, kwargs in (("deepseek-v3", CASES[2][1]),
                          ("llama3.1-70b", dict(model="llama3.1-70b", max_model_len=32768, concurrency=4,
                                                gpus="H100-80GB,H200,B200,A100-80GB,H20,MI300X", replicas=False,
                                                max_gpus=8))):
        with tempfile.TemporaryDirectory() as tmp:
            workload = Path(tmp) / "traffic.yaml"
            workload.write_text(TRAFFIC.replace("deepseek-v3", model))
            start = time.perf_counter()
            report = plan_model(**kwargs)  # type: ignore[arg-type]
            searched = time.perf_counter() - start
            report = plan_with_traffic(report, workload, top=10, bounds={})
            wall = time.perf_counter() - start
        ran = [s for s in report.simulated if not s.skipped]
        print(f"{model}, 6 GPU types, top 10 with 10,000 requests: {wall:.2f} s (search {searched:.2f} s); "
              f"{len(ran)} of {len(report.simulated)} rows simulated (the rest: not vLLM, or layer groups over "
              "pipeline stages)")


if __name__ == "__main__":
    main()
