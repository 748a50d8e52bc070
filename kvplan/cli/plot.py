"""``--plot``: one picture of a run (``plot_run``): for either simulator a stacked memory timeline per allocator on
one time axis, and the time-averaged breakdown; for a vllm-v1 run whose pool holds Mamba state (not token slots),
the pool's usage and the requests running and waiting over simulated seconds."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvplan.app.report import AllocatorRow
    from kvplan.app.simulation import SimulationRun
    from kvplan.core.sim.v1 import V1Result

MAX_POINTS = 4000  # a line plot needs no more: longer runs are thinned evenly

_PARTS = (("token states", "#2e7d32"), ("reserved", "#f9a825"), ("internal frag", "#c62828"),
          ("external frag", "#6a1b9a"), ("free", "#bdbdbd"))


def plot_run(run: SimulationRun, path: Path, *, last_arrival_s: float | None) -> None:
    """The pool's split over time per allocator, whichever simulator ran; a vllm-v1 run whose pool is not split
    into token slots (Mamba state) shows vLLM's usage and the requests running and waiting instead."""
    from kvplan.app.report import allocator_rows, rank_rows

    rows = allocator_rows(run) if run.dp is None else rank_rows(run)  # data-parallel engines: a panel each
    results = list(run.event) if run.v1 is None else list(run.dp.ranks) if run.dp else [run.v1, *run.v1_others]
    if all(r.token_states_frac is not None for r in rows):
        plot_shares(rows, [r.timeline for r in results], path, title=run.plan.name, last_arrival_s=last_arrival_s)
    else:
        assert run.v1 is not None
        plot_v1(results[0], path, title=run.plan.name + (" (engine 0)" if run.dp else ""),
                last_arrival_s=last_arrival_s)


def plot_shares(rows: list[AllocatorRow], timelines: list[tuple], path: Path, *, title: str,
                last_arrival_s: float | None = None) -> None:
    """One panel per allocator: the pool's shares over simulated seconds (the clock at each sampled
    step), every panel on the same seconds axis so that the allocators' makespans compare at a glance;
    a dashed line marks the last arrival (the drain follows). A last panel: the shares averaged over
    the busy period, as the tables give them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(rows)
    fig, axes = plt.subplots(n + 1, 1, figsize=(9, 2.2 * (n + 1)), constrained_layout=True)
    end_s = max((t[-1][1] / 1e12 for t in timelines if t), default=0.0)
    for ax, r, timeline in zip(axes[:-1], rows, timelines):
        if timeline:
            seconds = [p[1] / 1e12 for p in timeline]
            total = [sum(p[2:]) or 1 for p in timeline]
            series = [[p[i] / t for p, t in zip(timeline, total)] for i in range(2, 7)]
            ax.stackplot(seconds, *series, colors=[c for _, c in _PARTS], labels=[name for name, _ in _PARTS])
        if last_arrival_s is not None:
            ax.axvline(last_arrival_s, color="black", linestyle="--", linewidth=0.8)
        ax.set_title(f"{r.allocator}: mean batch {r.mean_batch_size:.1f}, peak {r.peak_batch_size}, "
                     f"{r.throughput_tokens_per_s or 0:,.0f} tokens per busy second, done after "
                     f"{r.makespan_seconds or 0:,.0f} s", fontsize=9)
        ax.set_ylabel("share of pool")
        ax.set_ylim(0, 1)
        ax.set_xlim(0, end_s or 1)
        ax.set_xlabel("simulated seconds" + (" (dashed: last arrival)" if last_arrival_s is not None else ""))
    axes[0].legend(loc="upper right", fontsize=7, ncol=5)
    bar = axes[-1]
    names = [r.allocator for r in rows]
    left = [0.0] * n
    for (name, color), attr in zip(_PARTS, ("token_states_frac", "reserved_frac", "internal_frag_frac",
                                            "external_frag_frac", "free_frac")):
        values = [getattr(r, attr) for r in rows]
        bar.barh(names, values, left=left, color=color, label=name)
        left = [a + b for a, b in zip(left, values)]
    bar.set_xlim(0, 1)
    bar.set_title("time-averaged share of the KV pool (busy period)", fontsize=9)
    fig.suptitle(title)
    _save(fig, path)
    plt.close(fig)


def plot_v1(r: V1Result, path: Path, *, title: str, last_arrival_s: float | None = None) -> None:
    """Two panels on one seconds axis (the clock at each step that scheduled something; steps without a
    step-time model): the share of the pool's blocks that requests hold (vLLM's KV cache usage), then
    the requests running and waiting after each schedule(); a dashed line marks the last arrival."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(r.per_step_running)
    every = max(1, -(-n // MAX_POINTS))
    idx = range(0, n, every)
    timed = len(r.per_step_start_ps) == n and n > 0
    x = [r.per_step_start_ps[i] / 1e12 for i in idx] if timed else list(idx)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5), sharex=True, constrained_layout=True)
    top.fill_between(x, [r.per_step_kv_usage_permille[i] / 1000 for i in idx], color="#2e7d32", step="post",
                     label="blocks held by requests")
    top.set_ylim(0, 1)
    top.set_ylabel("share of pool")
    top.set_title(f"KV cache usage: mean {100 * r.mean_kv_usage:.1f}%; {r.preemptions:,} preemptions; prefix hit "
                  f"rate {100 * r.prefix_hit_rate:.1f}% (first scheduling)", fontsize=9)
    bottom.plot(x, [r.per_step_running[i] for i in idx], color="#1565c0", linewidth=0.8, label="running")
    if len(r.per_step_waiting) == n:
        bottom.plot(x, [r.per_step_waiting[i] for i in idx], color="#c62828", linewidth=0.8, label="waiting")
    bottom.set_ylabel("requests")
    bottom.set_title(f"mean running {r.mean_running:.1f}, peak {r.peak_running}", fontsize=9)
    bottom.legend(loc="upper right", fontsize=7)
    for ax in (top, bottom):
        if last_arrival_s is not None and timed:
            ax.axvline(last_arrival_s, color="black", linestyle="--", linewidth=0.8)
    bottom.set_xlabel(("simulated seconds" + (" (dashed: last arrival)" if last_arrival_s is not None else ""))
                      if timed else "step (no step-time model)")
    fig.suptitle(title)
    _save(fig, path)
    plt.close(fig)


def _save(fig: Any, path: Path) -> None:
    from kvplan.io.paths import os_error

    try:
        fig.savefig(path, dpi=80)
    except OSError as exc:
        raise os_error(path, exc, action="write") from None
