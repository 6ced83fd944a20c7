"""The benchmark harness: the stepped runner (order, timing, refusals) and the load log.

The ORM insert groups (issue 16's ratios near 0.97x) rely on it: both sides of
a ratio must run step by step in turn, and each trial's time must be the sum of
its own steps only. Time here is a fake clock advanced by the steps.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import harness
from benchmarks.harness import (
    Contender,
    Group,
    Sample,
    Stepped,
    Steps,
    Unavailable,
    run_group,
    run_stepped,
)
from benchmarks.report import LoadLog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(harness, "time", SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


def contender(
    name: str, clock: Clock, log: list[tuple[str, int]], cost: float, count: int = 3
) -> Stepped:
    """A contender whose every step takes ``cost`` seconds of the fake clock."""

    def start() -> Steps:
        log.append((name, -1))

        def step(index: int) -> None:
            log.append((name, index))
            clock.now += cost

        def finish() -> dict[str, float]:
            log.append((name, count))
            return {"steps": float(count)}

        return Steps(100, count, step, finish)

    return Stepped(name, start)


def test_steps_are_interleaved_in_rotating_order_and_timed_apiece(clock: Clock) -> None:
    log: list[tuple[str, int]] = []
    group = Group("t", "stepped", "rows/s", subject="a")
    run_stepped(
        group,
        [contender("a", clock, log, 1.0), contender("b", clock, log, 3.0)],
        repeats=2,
        log=lambda line: None,
    )
    timed = [entry for entry in log if 0 <= entry[1] < 3]
    # Every contender's step i runs before anyone's step i + 1.
    assert [index for _, index in timed] == [0, 0, 1, 1, 2, 2] * 2
    # The order rotates from step to step, and from repeat to repeat.
    assert [name for name, _ in timed] == list("abbaab") + list("baabba")
    a, b = group.get("a"), group.get("b")
    assert a is not None
    assert b is not None
    # A trial's time is its own steps' only, not the other's in between.
    assert [s.seconds for s in a.samples] == [3.0, 3.0]
    assert [s.seconds for s in b.samples] == [9.0, 9.0]
    assert [s.counters for s in a.samples] == [{"steps": 3.0}] * 2
    assert group.ratio("b") == pytest.approx((3.0, 3.0, 3.0))
    # start() runs before any step of the repeat, finish() after its last.
    first_repeat = log[: len(log) // 2]
    assert first_repeat[:2] == [("a", -1), ("b", -1)]
    assert first_repeat[-2:] == [("a", 3), ("b", 3)]


def test_trials_of_unequal_length_each_run_all_their_steps(clock: Clock) -> None:
    log: list[tuple[str, int]] = []
    group = Group("t", "stepped", "rows/s", subject="a")
    run_stepped(
        group,
        [contender("a", clock, log, 1.0, count=1), contender("b", clock, log, 1.0, count=3)],
        repeats=1,
        log=lambda line: None,
    )
    assert [entry for entry in log if entry[0] == "a" and 0 <= entry[1] < 1] == [("a", 0)]
    assert [entry[1] for entry in log if entry[0] == "b" and 0 <= entry[1] < 3] == [0, 1, 2]
    a, b = group.get("a"), group.get("b")
    assert a is not None
    assert b is not None
    assert (a.samples[0].seconds, b.samples[0].seconds) == (1.0, 3.0)


def test_a_contender_that_cannot_start_is_marked_and_dropped(clock: Clock) -> None:
    log: list[tuple[str, int]] = []
    lines: list[str] = []

    def refuse() -> Steps:
        raise Unavailable("no server here")

    group = Group("t", "stepped", "rows/s", subject="a")
    run_stepped(
        group,
        [contender("a", clock, log, 1.0), Stepped("gone", refuse)],
        repeats=3,
        log=lines.append,
    )
    gone, a = group.get("gone"), group.get("a")
    assert gone is not None
    assert a is not None
    assert gone.unavailable == "no server here"
    assert gone.samples == []
    assert len(a.samples) == 3
    assert lines == ["    gone: not available: no server here"]


@pytest.mark.skipif(not Path("/proc/loadavg").exists(), reason="needs Linux's /proc/loadavg")
def test_a_run_records_its_load_at_the_start_and_while_it_runs() -> None:
    """The load at the start is read when the run starts, not when its results are saved."""
    load = LoadLog(every=0.01)
    at_start = load.at_start
    deadline = time.monotonic() + 5
    while len(load.each_minute) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    load.stop()
    saved = load.as_json()
    assert at_start is not None
    assert len(at_start) == 3
    assert saved["loadavg_at_start"] == at_start
    assert len(saved["load_each_minute"]) >= 2
    assert "load average at the start" in load.summary()


def test_run_group_sets_aside_a_contender_that_cannot_run() -> None:
    lines: list[str] = []

    def refuse() -> Sample:
        raise Unavailable("not installed")

    group = Group("t", "whole trials", "rows/s", subject="a")
    run_group(
        group,
        [Contender("a", lambda: Sample(10, 1.0)), Contender("gone", refuse), ("absent", "why")],
        repeats=2,
        log=lines.append,
    )
    a, gone, absent = group.get("a"), group.get("gone"), group.get("absent")
    assert a is not None
    assert gone is not None
    assert absent is not None
    assert len(a.samples) == 2  # the warm-up round is not kept
    assert gone.unavailable == "not installed"
    assert absent.unavailable == "why"
    assert lines == ["    gone: not available: not installed"]
