"""The benchmark harness: the stepped runner (order, timing, refusals) and the load log.

The ORM insert groups (issue 16's ratios near 0.97x) rely on it: both sides of
a ratio must run step by step in turn, and each trial's time must be the sum of
its own steps only. Time here is a fake clock advanced by the steps.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import harness
from benchmarks.harness import (
    Contender,
    Group,
    Sample,
    Series,
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


def series(group: Group, *names: str) -> list[Series]:
    """The series of ``names`` in ``group``, each of which must be there."""
    found = [group.get(name) for name in names]
    missing = [name for name, one in zip(names, found, strict=True) if one is None]
    assert not missing, f"no series {missing} in {group.title}"
    return [one for one in found if one is not None]


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
    a, b = series(group, "a", "b")
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
    a, b = series(group, "a", "b")
    assert (a.samples[0].seconds, b.samples[0].seconds) == (1.0, 3.0)


@pytest.mark.parametrize("runner", ["run_stepped", "run_group"])
def test_a_contender_that_cannot_run_is_set_aside(clock: Clock, runner: str) -> None:
    lines: list[str] = []

    def refuse() -> Any:
        raise Unavailable("no server here")

    group = Group("t", runner, "rows/s", subject="a")
    if runner == "run_stepped":
        stepped = [contender("a", clock, [], 1.0), Stepped("gone", refuse)]
        run_stepped(group, stepped, repeats=3, log=lines.append)
    else:
        whole = [Contender("a", lambda: Sample(10, 1.0)), Contender("gone", refuse)]
        run_group(group, [*whole, ("absent", "why")], repeats=3, log=lines.append)
        (absent,) = series(group, "absent")
        assert absent.unavailable == "why"
    a, gone = series(group, "a", "gone")
    assert len(a.samples) == 3  # run_group's warm-up round is not kept
    assert gone.unavailable == "no server here"
    assert gone.samples == []
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


def test_chunks_cut_an_amount_into_whole_parts_and_a_short_last_one() -> None:
    parts: list[tuple[int, int]] = []
    steps = Steps.chunks(25, 10, lambda start, stop: parts.append((start, stop)))
    assert (steps.amount, steps.count) == (25, 3)
    for index in range(steps.count):
        steps.step(index)
    assert parts == [(0, 10), (10, 20), (20, 25)]
    assert steps.finish() == {}
