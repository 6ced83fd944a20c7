"""Interleaved repeats, medians, spreads and paired ratios: how every suite measures.

A *group* is one comparison: a subject (autoseq) and its peers, each a
:class:`Contender` whose ``trial()`` does one timed run and returns a
:class:`Sample`. :func:`run_group` calls the contenders in rotating order,
repeat after repeat, so drift on a noisy machine (another engineer's test
run, CPU frequency) lands on every contender alike; the ratio of autoseq to
a peer is taken within each repeat and the median of those is the headline.
:func:`run_stepped` goes further for trials made of many equal parts (the
ORM insert groups): it interleaves the contenders' trials part by part.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar


class Unavailable(Exception):
    """A contender or a whole group cannot run here; the message says why."""


@dataclass
class Sample:
    """One timed trial: ``amount`` units of work in ``seconds``, plus counters."""

    amount: float
    seconds: float
    counters: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.amount / self.seconds if self.seconds > 0 else float("inf")


@dataclass
class Contender:
    """One thing measured in a group; ``trial`` runs once and is timed inside."""

    name: str
    trial: Callable[[], Sample]
    note: str = ""


@dataclass
class Series:
    """What one contender gave over all repeats (or why it could not run)."""

    name: str
    samples: list[Sample] = field(default_factory=list)
    unavailable: str | None = None
    note: str = ""

    def values(self, metric: str) -> list[float]:
        if metric == "rate":
            return [s.rate for s in self.samples]
        return [s.counters[metric] for s in self.samples if metric in s.counters]

    def median(self, metric: str = "rate") -> float | None:
        values = self.values(metric)
        return statistics.median(values) if values else None

    def spread(self, metric: str = "rate") -> tuple[float, float] | None:
        values = self.values(metric)
        return (min(values), max(values)) if values else None

    def counters(self) -> dict[str, float]:
        """Median of every counter the trials reported."""
        names = {key for sample in self.samples for key in sample.counters}
        return {key: statistics.median(self.values(key)) for key in sorted(names)}


@dataclass
class Group:
    """One comparison: ``subject`` against every other series, by ``metric``.

    ``higher_is_better`` is False for latencies; ratios are always stated as
    how many times better autoseq is (above 1 = autoseq wins).
    """

    suite: str
    title: str
    unit: str
    subject: str
    series: list[Series] = field(default_factory=list)
    metric: str = "rate"
    higher_is_better: bool = True
    unavailable: str | None = None
    notes: list[str] = field(default_factory=list)

    def get(self, name: str) -> Series | None:
        return next((s for s in self.series if s.name == name), None)

    def ratios(self, peer: str) -> list[float]:
        """autoseq vs ``peer`` within each repeat (above 1: autoseq is better)."""
        subject, other = self.get(self.subject), self.get(peer)
        if subject is None or other is None or subject.unavailable or other.unavailable:
            return []
        pairs = zip(subject.values(self.metric), other.values(self.metric), strict=False)
        if self.higher_is_better:
            return [a / b for a, b in pairs if b > 0]
        return [b / a for a, b in pairs if a > 0]

    def ratio(self, peer: str) -> tuple[float, float, float] | None:
        """Median and min..max of the paired ratios against ``peer``."""
        ratios = self.ratios(peer)
        if not ratios:
            return None
        return statistics.median(ratios), min(ratios), max(ratios)

    def view(self, title: str, unit: str, metric: str, *, higher_is_better: bool) -> Group:
        """The same trials judged by another ``metric`` (a counter, or ``"rate"``), as a group."""
        return Group(
            self.suite,
            title,
            unit,
            subject=self.subject,
            metric=metric,
            higher_is_better=higher_is_better,
            series=[Series(s.name, s.samples, s.unavailable, s.note) for s in self.series],
        )

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "suite": self.suite,
            "title": self.title,
            "unit": self.unit,
            "metric": self.metric,
            "higher_is_better": self.higher_is_better,
            "subject": self.subject,
            "unavailable": self.unavailable,
            "notes": self.notes,
            "series": [],
        }
        for series in self.series:
            entry: dict[str, Any] = {"name": series.name, "note": series.note}
            if series.unavailable:
                entry["unavailable"] = series.unavailable
            else:
                entry["median"] = series.median(self.metric)
                entry["spread"] = series.spread(self.metric)
                entry["samples"] = series.values(self.metric)
                entry["counters"] = series.counters()
                entry["trials"] = [
                    {"amount": t.amount, "seconds": t.seconds, "counters": t.counters}
                    for t in series.samples
                ]
                if series.name != self.subject:
                    ratio = self.ratio(series.name)
                    entry["autoseq_ratio"] = None if ratio is None else list(ratio)
            out["series"].append(entry)
        return out


def group_from_json(data: dict[str, Any]) -> Group:
    """Rebuild a :class:`Group` from :meth:`Group.as_json` (to redraw a saved run)."""
    group = Group(
        data["suite"],
        data["title"],
        data["unit"],
        data["subject"],
        metric=data["metric"],
        higher_is_better=data["higher_is_better"],
        unavailable=data["unavailable"],
        notes=list(data["notes"]),
    )
    for entry in data["series"]:
        samples = [
            Sample(t["amount"], t["seconds"], dict(t["counters"])) for t in entry.get("trials", [])
        ]
        group.series.append(
            Series(entry["name"], samples, entry.get("unavailable"), entry.get("note", ""))
        )
    return group


_C = TypeVar("_C", "Contender", "Stepped")


def set_aside(
    group: Group, live: list[_C], contender: _C, exc: Unavailable, log: Callable[[str], None]
) -> None:
    """Mark ``contender`` unavailable in ``group`` (``exc`` says why); drop it from ``live``."""
    series = group.get(contender.name)
    assert series is not None
    series.unavailable = str(exc)
    live.remove(contender)
    log(f"    {contender.name}: not available: {exc}")


def run_group(
    group: Group,
    contenders: list[Contender | tuple[str, str]],
    repeats: int,
    *,
    warmup: bool = True,
    log: Callable[[str], None] = print,
) -> Group:
    """Run ``contenders`` ``repeats`` times each, interleaved, into ``group``.

    A ``(name, reason)`` tuple stands for a contender that cannot run here;
    a trial raising :class:`Unavailable` marks its contender so and drops it.
    """
    live: list[Contender] = []
    for contender in contenders:
        if isinstance(contender, tuple):
            name, reason = contender
            group.series.append(Series(name, unavailable=reason))
            continue
        group.series.append(Series(contender.name, note=contender.note))
        live.append(contender)

    def attempt(contender: Contender) -> Sample | None:
        try:
            return contender.trial()
        except Unavailable as exc:
            set_aside(group, live, contender, exc, log)
            return None

    if warmup:
        for contender in list(live):
            attempt(contender)
    for repeat in range(repeats):
        # Rotate the order so no contender always runs first (cold) or last.
        shift = repeat % len(live) if live else 0
        for contender in live[shift:] + live[:shift]:
            # Collect, then freeze what is left (setup, earlier suites) out of
            # the trial's collections: each trial's GC cost is that of the
            # objects it makes, not of a heap whose size depends on what ran
            # before (see README, Method: "Garbage collection").
            gc.collect()
            gc.freeze()
            try:
                sample = attempt(contender)
            finally:
                gc.unfreeze()
            if sample is not None:
                series = group.get(contender.name)
                assert series is not None
                series.samples.append(sample)
    return group


@dataclass
class Steps:
    """One trial cut into ``count`` steps, each timed on its own (see :func:`run_stepped`).

    ``step(i)`` does the ``i``-th part of the work (timed); ``finish()`` runs
    untimed after the last step, checks the work and returns the trial's
    counters.
    """

    amount: float
    count: int
    step: Callable[[int], None]
    finish: Callable[[], dict[str, float]] = dict

    @classmethod
    def chunks(
        cls,
        amount: int,
        size: int,
        part: Callable[[int, int], None],
        finish: Callable[[], dict[str, float]] = dict,
    ) -> Steps:
        """``amount`` units in chunks of ``size``: step ``i`` runs ``part(start, stop)``."""

        def step(index: int) -> None:
            part(index * size, min(amount, (index + 1) * size))

        return cls(amount, -(-amount // size), step, finish)


@dataclass
class Stepped:
    """A contender of :func:`run_stepped`: ``start()`` prepares a trial (untimed) and cuts it."""

    name: str
    start: Callable[[], Steps]
    note: str = ""


def run_stepped(
    group: Group,
    contenders: list[Stepped],
    repeats: int,
    *,
    log: Callable[[str], None] = print,
) -> Group:
    """Like :func:`run_group`, with the contenders' trials interleaved step by step.

    Each repeat starts one trial per contender, then runs step 0 of every
    trial, step 1 of every trial, and so on, rotating the order at every
    step; a trial's time is the sum of its steps. The two sides of a ratio
    then run within about one step of each other, not one or more whole
    trials apart, so a slow stretch of the machine (the servers share its two
    cores) lands on both. On the twelve ORM insert groups (trials of 10
    chunks, or of 10 x 500 ``save()`` calls) it cut the standard deviation of
    the paired ratios to the caller-set floor from 1.9-9.8% (median 5.6%),
    whole trials in rotation, to 0.9-3.7% (median 2.4%), 11 repeats each.
    """
    live: list[Stepped] = []
    for contender in contenders:
        group.series.append(Series(contender.name, note=contender.note))
        live.append(contender)
    for repeat in range(repeats):
        # As in run_group: collect, then freeze the heap left by setup and
        # earlier suites out of the repeat's collections.
        gc.collect()
        gc.freeze()
        try:
            trials: list[tuple[Stepped, Steps]] = []
            for contender in list(live):
                try:
                    trials.append((contender, contender.start()))
                except Unavailable as exc:
                    set_aside(group, live, contender, exc, log)
            elapsed = [0.0] * len(trials)
            order = list(range(len(trials)))
            for index in range(max((steps.count for _, steps in trials), default=0)):
                shift = (repeat + index) % len(order)
                for position in order[shift:] + order[:shift]:
                    steps = trials[position][1]
                    if index < steps.count:
                        started = time.perf_counter()
                        steps.step(index)
                        elapsed[position] += time.perf_counter() - started
            for (contender, steps), seconds in zip(trials, elapsed, strict=True):
                counters = steps.finish()
                series = group.get(contender.name)
                assert series is not None
                series.samples.append(Sample(steps.amount, seconds, counters))
        finally:
            gc.unfreeze()
    return group


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """``with stopwatch() as elapsed: ...`` then ``elapsed[0]`` is the wall time in seconds."""
    out: list[float] = []
    started = time.perf_counter()
    try:
        yield out
    finally:
        out.append(time.perf_counter() - started)


def percentile(sorted_values: list[float], share: float) -> float:
    """The ``share`` (0..1) percentile of already sorted values (nearest rank)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    rank = max(0, min(len(sorted_values) - 1, math.ceil(share * len(sorted_values)) - 1))
    return sorted_values[rank]
