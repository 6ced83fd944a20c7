"""A fixed scenario of reservations, then what a scrape reads: run in a fresh process by
``test_metrics_scrape.py`` (``python metrics_scenario.py single|first|second``).

``single`` prints this process's scrape. ``first`` and ``second`` run with
``PROMETHEUS_MULTIPROC_DIR`` set, each a different share of the scenario, and write their
figures to that directory for the test to merge. The locks read a fake clock that moves
only while the store reserves, by a latency fixed per reservation, so every figure but
the ``_created`` times (wall clock) is the same from run to run.
"""

from __future__ import annotations

import gc
import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

import autoseq.lock
from autoseq import BufferPolicy, SequenceConfig, SequenceLock, SequenceRegistry, metrics
from autoseq.stores import MemoryStore
from autoseq.stores.base import Block

#: Store round trips of each sequence's reservations, in order: six buckets and past the last.
LATENCIES = {
    "alpha": [0.0003, 0.003, 0.07],
    "beta": [0.02, 3.0, 12.0],
    "gamma": [0.0007],
}


class Clock:
    """``time`` for `autoseq.lock`: a monotonic clock only the store moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


CLOCK = Clock()


class TimedStore(MemoryStore):
    """A MemoryStore whose reservations take the time `LATENCIES` says."""

    def reserve(self, name: str, count: int) -> Block:
        block = super().reserve(name, count)
        CLOCK.now += LATENCIES[name].pop(0)
        return block


def settled(lock: SequenceLock) -> None:
    """Wait until ``lock`` has no reservation in flight (a prefetch lands before going on)."""
    deadline = time.monotonic() + 30
    while lock.stats()["loading"]:
        assert time.monotonic() < deadline, "a prefetch never ended"
        time.sleep(0.001)


def serve(lock: SequenceLock, count: int) -> None:
    for _ in range(count):
        lock.next()
        settled(lock)


def run(part: str, scrape: Callable[[], object]) -> list[SequenceRegistry]:
    """The reservations of ``part``; the registries still open (their locks alive)."""
    store = TimedStore()
    prefetching = SequenceRegistry(store, policy=BufferPolicy(prefetch_at=0.5, max_batch_count=10))
    inline = SequenceRegistry(store, policy=BufferPolicy(prefetch=False, max_batch_count=10))
    alpha = prefetching.register(SequenceConfig("alpha", end=1000, batch_count=10))
    serve(alpha, 4)  # a caller's block, before its prefetch point
    if part != "first":
        beta = inline.register(SequenceConfig("beta", batch_count=10, cycle=True, end=25))
        serve(beta, 25)  # three callers' blocks, the last one past 10 seconds
    serve(alpha, 12 if part != "second" else 2)  # prefetches, after beta's first
    if part != "second":
        closing = SequenceRegistry(store, policy=BufferPolicy(prefetch=False, max_batch_count=10))
        gamma = closing.register(SequenceConfig("gamma", batch_count=10))
        serve(gamma, 4)
        scrape()  # what a lock served counts from the scrape that saw it
        gone = weakref.ref(gamma)
        closing.close()  # hands 6 values back
        del closing, gamma
        gc.collect()
        assert gone() is None, "the closed lock was not collected"
    return [prefetching, inline]


#: The registries left open: their locks live until exit (and then hand their tails back).
OPEN: list[SequenceRegistry] = []


def main(part: str) -> None:
    autoseq.lock.time = CLOCK  # type: ignore[assignment]
    if part == "single":
        target = CollectorRegistry()
        metrics.install(target)
        OPEN.extend(run(part, lambda: generate_latest(target)))
        print(generate_latest(target).decode(), end="")
    else:
        # Its thread would publish in an hour: the figures go out at the scrape and at exit.
        found = metrics.install(publish_interval=3600.0)
        OPEN.extend(run(part, found.publish))


if __name__ == "__main__":
    main(sys.argv[1])
