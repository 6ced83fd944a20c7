"""One PNG that reads at a glance: ratios against peers, hot path, tail, scaling, round trips."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from benchmarks.harness import Group

AUTOSEQ = "#1f77b4"
PEER = "#b0b0b0"
FLOOR = "#ff7f0e"
WIN = "#2ca02c"
LOSE = "#d62728"


def _usable(groups: list[Group], suite: str) -> list[Group]:
    return [g for g in groups if g.suite == suite and not g.unavailable and g.series]


def _empty(ax: Axes, title: str, why: str) -> None:
    ax.set_title(title, loc="left", fontweight="bold")
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.set_axis_off()


def ratios_panel(ax: Axes, groups: list[Group]) -> None:
    """Every autoseq-vs-peer ratio of the per-value and ORM groups, log scale."""
    title = "autoseq vs each peer, same server, same run (x times; >1 = autoseq faster)"
    rows: list[tuple[str, float, float, float]] = []
    for group in _usable(groups, "per_value") + _usable(groups, "orm"):
        where = group.title if group.suite == "orm" else re.sub(r"^.*?, ", "", group.title)
        for series in group.series:
            if series.name == group.subject or series.unavailable:
                continue
            ratio = group.ratio(series.name)
            if ratio:
                rows.append((f"{series.name}  [{where}]", *ratio))
    if not rows:
        _empty(ax, title, "no peer comparisons in this run")
        return
    rows.reverse()
    labels = [row[0] for row in rows]
    medians = [row[1] for row in rows]
    errors = [[row[1] - row[2] for row in rows], [row[3] - row[1] for row in rows]]
    colors = [WIN if m >= 1 else LOSE for m in medians]
    # Bars grow from 1x: right when autoseq wins, left when it loses.
    widths = [m - 1 for m in medians]
    ax.barh(labels, widths, left=1, xerr=errors, color=colors, alpha=0.8, capsize=2)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    for y, row in enumerate(rows):
        median = row[1]
        text = f"{median:.2f}x" if median < 10 else f"{median:,.0f}x"
        win = median >= 1
        ax.text(
            max(row[3], 1) * 1.15 if win else min(row[2], 1) / 1.15,
            y,
            text,
            va="center",
            ha="left" if win else "right",
            fontsize=10,
            fontweight="bold",
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
        )
    ax.set_xlim(min(min(row[2] for row in rows), 1) / 4, max(row[3] for row in rows) * 4)
    ax.tick_params(axis="y", labelsize=9)
    ax.set_title(title, loc="left", fontweight="bold")
    ax.set_xlabel("autoseq ÷ peer (median of paired repeats; whiskers: min..max)")


def hot_path_panel(ax: Axes, groups: list[Group]) -> None:
    title = "Hot path: next() on one thread, full buffer"
    usable = _usable(groups, "hot_path")
    if not usable:
        _empty(ax, title, "not run")
        return
    group = usable[0]
    series = [s for s in group.series if not s.unavailable]
    names = [s.name for s in series]
    rates = [(s.median() or 0) / 1e6 for s in series]
    colors = [
        AUTOSEQ if s.name.startswith("autoseq") else FLOOR if "floor" in s.name else PEER
        for s in series
    ]
    ax.barh(names[::-1], rates[::-1], color=colors[::-1])
    floor = next((s for s in series if "floor" in s.name), None)
    for y, (name, rate) in enumerate(zip(names[::-1], rates[::-1], strict=True)):
        label = f" {rate:.2f}M/s"
        if floor is not None and name != floor.name:
            ratio = group.ratio(floor.name) if name == group.subject else None
            if ratio:
                label += f"  = {ratio[0]:.2f}x floor (target 2.5x)"
        ax.text(rate, y, label, va="center", fontsize=8)
    ax.set_xlim(0, max(rates) * 1.6)
    ax.set_xlabel("million values/s")
    ax.tick_params(axis="y", labelsize=8)
    ax.set_title(title, loc="left", fontweight="bold")


def tail_panel(ax: Axes, groups: list[Group]) -> None:
    title = "Tail latency of next(), 20 ms store"
    usable = _usable(groups, "tail_latency")
    if not usable:
        _empty(ax, title, "not run")
        return
    group = usable[0]
    metrics = ["p50 µs", "p99 µs", "p99.9 µs", "max µs"]
    width = 0.38
    for i, series in enumerate(s for s in group.series if not s.unavailable):
        values = [series.median(m) or 0 for m in metrics]
        xs = [x + (i - 0.5) * width for x in range(len(metrics))]
        color = AUTOSEQ if "double" in series.name else PEER
        ax.bar(xs, values, width, label=series.name, color=color)
        for x, value in zip(xs, values, strict=True):
            ax.text(
                x,
                value,
                f"{value:,.0f}" if value >= 10 else f"{value:.1f}",
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.axhline(200, color=LOSE, linestyle="--", linewidth=1, label="target p99.9 < 200 µs")
    ax.set_xticks(range(len(metrics)), [m.split()[0] for m in metrics])
    ax.set_yscale("log")
    ax.set_ylabel("µs (log)")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title, loc="left", fontweight="bold")


def scaling_panel(ax: Axes, groups: list[Group]) -> None:
    title = "Scaling: one sequence, N processes (total values/s)"
    usable = _usable(groups, "scaling")
    if not usable:
        _empty(ax, title, "not run")
        return
    lines: dict[str, list[tuple[int, float]]] = {}
    for group in usable:
        where = group.title.rsplit(", ", 1)[-1]
        for series in group.series:
            if series.unavailable or not series.samples:
                continue
            processes = int(series.samples[0].counters.get("processes", 0))
            kind = re.sub(r" x\d+$", "", series.name)
            lines.setdefault(f"{kind} ({where})", []).append((processes, series.median() or 0))
    for label, points in lines.items():
        points.sort()
        style = "-o" if label.startswith("autoseq") else "--s"
        ax.plot([p for p, _ in points], [v for _, v in points], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
    ax.set_yscale("log")
    ax.set_xlabel("processes (machine has 2 cores)")
    ax.set_ylabel("values/s, all processes (log)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    ax.set_title(title, loc="left", fontweight="bold")


def round_trips_panel(ax: Axes, groups: list[Group]) -> None:
    title = "Server calls per 100,000 values"
    bars: dict[str, float] = {}
    for group in _usable(groups, "round_trips"):
        if "memory" not in group.title:
            continue
        for series in group.series:
            value = series.median("reservations")
            if value is not None:
                bars[series.name.replace("autoseq ", "autoseq ")] = value
    for group in _usable(groups, "per_value"):
        if "PostgreSQL" not in group.title and "MongoDB" not in group.title:
            continue
        for series in group.series:
            if series.name == group.subject or series.unavailable:
                continue
            value = series.median("server calls per 100k values")
            if value:
                bars[series.name] = value
    if not bars:
        _empty(ax, title, "not run")
        return
    names = list(bars)[::-1]
    values = [bars[name] for name in names]
    colors = [AUTOSEQ if name.startswith("autoseq") else PEER for name in names]
    ax.barh(names, values, color=colors)
    for y, value in enumerate(values):
        ax.text(value, y, f" {value:,.0f}", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(0.5, max(values) * 8)
    ax.set_xlabel("server calls per 100k values (log)")
    ax.tick_params(axis="y", labelsize=8)
    ax.set_title(title, loc="left", fontweight="bold")


def draw(groups: list[Group], path: Path, *, mode: str) -> None:
    """Write the chart to ``path``."""
    fig = plt.figure(figsize=(17, 19), layout="constrained")
    grid = fig.add_gridspec(3, 2, height_ratios=[1.5, 1, 1])
    ratios_panel(fig.add_subplot(grid[0, :]), groups)
    hot_path_panel(fig.add_subplot(grid[1, 0]), groups)
    tail_panel(fig.add_subplot(grid[1, 1]), groups)
    scaling_panel(fig.add_subplot(grid[2, 0]), groups)
    round_trips_panel(fig.add_subplot(grid[2, 1]), groups)
    fig.suptitle(
        f"autoseq benchmarks ({mode} run; 2-core shared machine: medians of interleaved repeats)",
        fontsize=14,
        fontweight="bold",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
