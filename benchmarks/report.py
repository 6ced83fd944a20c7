"""The table of ratios on stdout, and the raw results as JSON."""

from __future__ import annotations

import json
import os
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Group


def human(value: float | None, unit: str) -> str:
    """A figure short enough for a table cell."""
    if value is None:
        return "-"
    if unit == "µs":
        return f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"
    if abs(value) >= 1e6:
        return f"{value / 1e6:,.2f}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:,.1f}k"
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:,.2f}"


def _spread(group: Group, name: str) -> str:
    series = group.get(name)
    if series is None:
        return ""
    spread, median = series.spread(group.metric), series.median(group.metric)
    if spread is None or not median:
        return ""
    low, high = spread
    return f"{(low - median) / median * 100:+.0f}/{(high - median) / median * 100:+.0f}%"


def table(groups: list[Group]) -> str:
    """One block per group: each contender's median, spread and autoseq's ratio to it."""
    lines: list[str] = []
    for group in groups:
        better = "higher is better" if group.higher_is_better else "lower is better"
        lines.append("")
        lines.append(f"== {group.title}  [{group.unit}, {better}]")
        if group.unavailable:
            lines.append(f"   not available: {group.unavailable}")
            continue
        width = max([len(s.name) for s in group.series] + [10])
        lines.append(
            f"   {'contender'.ljust(width)}  {'median':>10}  {'spread':>11}  "
            f"{'autoseq ratio (min..max)':>26}"
        )
        for series in group.series:
            label = series.name.ljust(width)
            if series.unavailable:
                lines.append(f"   {label}  not available: {series.unavailable}")
                continue
            median = human(series.median(group.metric), group.unit)
            if series.name == group.subject:
                ratio_text = "(subject)"
            else:
                ratio = group.ratio(series.name)
                ratio_text = (
                    "-" if ratio is None else f"{ratio[0]:.2f}x ({ratio[1]:.2f}..{ratio[2]:.2f})"
                )
            lines.append(
                f"   {label}  {median:>10}  {_spread(group, series.name):>11}  {ratio_text:>26}"
            )
        for note in group.notes:
            lines.append(f"   note: {note}")
    return "\n".join(lines)


def markdown(groups: list[Group]) -> str:
    """The ratios as one Markdown table: a row per autoseq-vs-peer comparison."""
    lines = [
        "| comparison (unit) | autoseq | figure | peer | figure | autoseq ratio (min..max) |",
        "| --- | --- | ---: | --- | ---: | ---: |",
    ]
    for group in groups:
        title = f"{group.title} ({group.unit})"
        if group.unavailable:
            lines.append(f"| {title} | not available: {group.unavailable} | | | | |")
            continue
        subject = group.get(group.subject)
        if subject is None:
            continue
        first = True
        for series in group.series:
            if series.name == group.subject:
                continue
            head = (
                f"| {title} | {subject.name} | {human(subject.median(group.metric), group.unit)} "
                if first
                else "| | | "
            )
            first = False
            if series.unavailable:
                lines.append(f"{head}| {series.name} | not available: {series.unavailable} | |")
                continue
            ratio = group.ratio(series.name)
            ratio_text = (
                "-" if ratio is None else f"**{ratio[0]:.2f}x** ({ratio[1]:.2f}..{ratio[2]:.2f})"
            )
            theirs = human(series.median(group.metric), group.unit)
            lines.append(f"{head}| {series.name} | {theirs} | {ratio_text} |")
    return "\n".join(lines)


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, or None where /proc/loadavg is missing."""
    try:
        with open("/proc/loadavg") as loadavg:
            return [float(part) for part in loadavg.read().split()[:3]]
    except OSError:
        return None


class LoadLog:
    """The machine's load average when a run starts, and once a minute during it.

    A daemon thread wakes once every ``every`` seconds to read /proc/loadavg;
    :meth:`as_json` adds the load at the moment of saving.
    """

    def __init__(self, every: float = 60.0) -> None:
        self.at_start = load_average()
        self.each_minute: list[tuple[int, float]] = []  # (seconds into the run, 1-minute load)
        self._every = every
        self._began = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="benchmarks-load", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self._every):
            load = load_average()
            if load is not None:
                self.each_minute.append((round(time.monotonic() - self._began), load[0]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> str:
        """One line for the end of a run: the load at its start and while it ran."""
        start = (
            "unknown" if self.at_start is None else " / ".join(f"{x:.2f}" for x in self.at_start)
        )
        during = [load for _, load in self.each_minute]
        sampled = (
            f"; 1-minute load {min(during):.2f}..{max(during):.2f} each minute" if during else ""
        )
        return f"load average at the start {start}{sampled}"

    def as_json(self) -> dict[str, Any]:
        return {
            "loadavg_at_start": self.at_start,
            "loadavg_at_save": load_average(),
            "load_each_minute": [list(sample) for sample in self.each_minute],
        }


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def write_json(
    groups: list[Group],
    path: Path,
    *,
    quick: bool,
    checks: list[dict[str, Any]],
    started: float,
    load: LoadLog | None = None,
) -> None:
    """Everything measured, for later comparison (benchmarks/results/ is git-ignored)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "seconds": round(time.time() - started, 1),
        "mode": "quick" if quick else "full",
        "machine": {**machine(), **(load.as_json() if load else {})},
        "checks": checks,
        "groups": [group.as_json() for group in groups],
    }
    path.write_text(json.dumps(document, indent=1, default=str) + "\n")
