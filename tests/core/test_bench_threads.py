"""The threads benchmark's instruments (issue 34): what they count as a stall and as a call.

Its targets are judged on two readings: the longest stretch in which no
thread got a value (busy threads) and the slowest call (server threads).
These tests show each reading catches what it is for: a call that holds
the interpreter, a call that waits, and set-up that must not be timed.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time

from benchmarks.suites.threads import constant, threaded


def walk(values: int) -> float:
    """Hold the interpreter lock through one C-level walk of ``values``; its seconds."""
    started = time.perf_counter()
    collections.deque(itertools.islice(itertools.count(), values), maxlen=0)
    return time.perf_counter() - started


def test_a_call_that_holds_the_interpreter_is_a_pause_for_every_thread() -> None:
    """Busy threads: one call walking values in C (issue 34's bug) reads as a pause that long."""
    counter = itertools.count()
    held = threading.Event()
    walked = [0.0]

    def take() -> int:
        value = next(counter)
        if value == 50_000 and not held.is_set():
            held.set()
            walked[0] = walk(30_000_000)
        return value

    sample = threaded(take, 4, 200_000)
    assert walked[0] > 0.05, "the walk was too short to tell"
    assert sample.counters["longest pause ms"] >= walked[0] * 1e3 * 0.9


def test_a_call_that_waits_is_a_slow_call_of_its_own_thread() -> None:
    """Busy threads: a call waiting 80 ms (the interpreter let go) reads as a call that slow."""
    counter = itertools.count()

    def take() -> int:
        value = next(counter)
        if value == 1_000:
            time.sleep(0.08)
        return value

    sample = threaded(take, 4, 40_000)
    assert sample.counters["slowest call ms"] >= 80.0


def test_server_threads_time_the_call_and_not_the_io_before_it() -> None:
    """Server threads: 30 ms of I/O before each call is no part of the call's time."""
    sample = threaded(constant, 2, 20, pause=0.03, ordered=False)
    assert sample.counters["slowest call ms"] < 30.0


def test_a_phase_is_set_up_untimed_while_every_thread_waits() -> None:
    """Each phase's set-up runs with no call under way and is left out of the trial's time."""
    counter = itertools.count()
    guard = threading.Lock()
    under_way = [0]
    seen = []

    def take() -> int:
        with guard:
            under_way[0] += 1
        value = next(counter)
        with guard:
            under_way[0] -= 1
        return value

    def prepare() -> None:
        seen.append(under_way[0])
        time.sleep(0.3)

    sample = threaded(take, 3, 3_000, phases=[prepare, prepare])
    assert seen == [0, 0]
    assert sample.amount == 3_000
    assert sample.seconds < 0.3
