"""``--plot``: a stacked memory timeline per allocator on one time axis, and the time-averaged breakdown."""

from __future__ import annotations

from pathlib import Path

from kvplan.core.sim.model import SimResult

_PARTS = (("token states", "#2e7d32"), ("reserved", "#f9a825"), ("internal frag", "#c62828"),
          ("external frag", "#6a1b9a"), ("free", "#bdbdbd"))


def plot_simulation(results: list[SimResult], path: Path, *, title: str, last_arrival_s: float | None = None) -> None:
    """One panel per allocator: the pool's shares over simulated seconds (the clock at each sampled
    step), every panel on the same seconds axis so that the allocators' makespans compare at a glance;
    a dashed line marks the last arrival (the drain follows). A last panel: the shares averaged over
    the busy period, as the tables give them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    fig, axes = plt.subplots(n + 1, 1, figsize=(9, 2.2 * (n + 1)), constrained_layout=True)
    end_s = max((r.timeline[-1][1] / 1e12 for r in results if r.timeline), default=0.0)
    for ax, r in zip(axes[:-1], results):
        if r.timeline:
            seconds = [p[1] / 1e12 for p in r.timeline]
            total = [sum(p[2:]) or 1 for p in r.timeline]
            series = [[p[i] / t for p, t in zip(r.timeline, total)] for i in range(2, 7)]
            ax.stackplot(seconds, *series, colors=[c for _, c in _PARTS], labels=[name for name, _ in _PARTS])
        if last_arrival_s is not None:
            ax.axvline(last_arrival_s, color="black", linestyle="--", linewidth=0.8)
        ax.set_title(f"{r.allocator}: mean batch {r.mean_batch_size:.1f}, peak {r.peak_batch_size}, "
                     f"{r.throughput_tokens_per_s:,.0f} tokens per busy second, done after {r.makespan_seconds:,.0f} s",
                     fontsize=9)
        ax.set_ylabel("share of pool")
        ax.set_ylim(0, 1)
        ax.set_xlim(0, end_s or 1)
        ax.set_xlabel("simulated seconds" + (" (dashed: last arrival)" if last_arrival_s is not None else ""))
    axes[0].legend(loc="upper right", fontsize=7, ncol=5)
    bar = axes[-1]
    names = [r.allocator for r in results]
    left = [0.0] * n
    for (name, color), attr in zip(_PARTS, ("token_states_frac", "reserved_frac", "internal_frag_frac",
                                            "external_frag_frac", "free_frac")):
        values = [getattr(r, attr) for r in results]
        bar.barh(names, values, left=left, color=color, label=name)
        left = [a + b for a, b in zip(left, values)]
    bar.set_xlim(0, 1)
    bar.set_title("time-averaged share of the KV pool (busy period)", fontsize=9)
    fig.suptitle(title)
    fig.savefig(path, dpi=80)
    plt.close(fig)
