"""``kvplan gpus``: the GPU catalog that ``--gpu`` names."""

from __future__ import annotations

from kvplan.app.catalog import gpu_catalog
from kvplan.cli.format import format_bytes, make_console, new_table, print_json, print_table
from kvplan.cli.options import JsonOption
from kvplan.cli.root import app

console = make_console()


@app.command()
def gpus(*, as_json: JsonOption = False) -> None:
    """The GPU catalog: memory as the driver reports it, bandwidth, dense throughput, SMs and compute capability."""
    catalog = gpu_catalog()
    if as_json:
        print_json({"gpus": [{"name": g.name, "aliases": list(g.aliases), "memory_bytes": g.memory_bytes,
                              "hbm_bandwidth_bytes_per_s": g.hbm_bandwidth_bytes_per_s,
                              "bf16_dense_tflops": g.bf16_dense_tflops, "fp8_dense_tflops": g.fp8_dense_tflops,
                              "sm_count": g.sm_count, "compute_capability": g.compute_capability,
                              "source": g.source} for g in catalog]})
        return
    table = new_table("name", "memory", "bandwidth", "bf16 TFLOP/s", "fp8 TFLOP/s", "SMs", "CC", numeric="*",
                      no_wrap=("name",),
                      title=f"{len(catalog)} GPUs (or --gpu-memory 24GiB for any other)")
    for g in catalog:
        table.add_row(g.name, format_bytes(g.memory_bytes), f"{g.hbm_bandwidth_bytes_per_s / 1e12:.2f} TB/s",
                      f"{g.bf16_dense_tflops:,g}" if g.bf16_dense_tflops else "-",
                      f"{g.fp8_dense_tflops:,g}" if g.fp8_dense_tflops else "-", str(g.sm_count),
                      f"{g.compute_capability:g}" if g.compute_capability else "-")
    print_table(console, table)
