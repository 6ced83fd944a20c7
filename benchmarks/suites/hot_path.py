"""Hot path: ``next()`` on one thread against the floor (a bare lock and an int add).

The floor is the least any thread-safe counter can cost in CPython: take a
``threading.Lock``, add one to an int, return it. ``itertools.count`` is
faster still because it takes no lock (the GIL makes it safe only as long as
nobody needs more than one statement under the lock), so it bounds what any
Python-level API could reach. Issue 2 asked autoseq >= 0.8x the floor; issue 16 asks 2.5x.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from autoseq import BufferPolicy, SequenceConfig, SequenceLock, SequenceRegistry
from autoseq.stores import MemoryStore
from benchmarks.harness import Contender, Group, Sample, run_group, stopwatch
from benchmarks.servers import Context


class LockedCounter:
    """The floor: a bare ``threading.Lock`` plus integer increment."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0

    def next(self) -> int:
        with self._lock:
            self._value += 1
            return self._value


def calls(fn: Callable[[], object], n: int) -> Sample:
    """``n`` calls of ``fn`` in a bare loop, timed."""
    loop = itertools.repeat(None, n)
    with stopwatch() as elapsed:
        for _ in loop:
            fn()
    return Sample(n, elapsed[0])


def _full_buffer_lock(name: str, block: int) -> SequenceLock:
    store = MemoryStore()
    store.create(SequenceConfig(name, batch_count=block))
    return SequenceLock(name, store, batch_count=block)


def run(ctx: Context) -> list[Group]:
    n = ctx.n(1_000_000, 200_000)
    repeats = ctx.repeats * 2 + 1  # cheap, and the headline: more repeats, tighter median
    groups = []

    # Full buffer: one block far larger than a whole run, so every call is
    # the fast path except one per block (the prefetch hand-off).
    lock = _full_buffer_lock("hot", block=n * (repeats + 2) * 4)
    floor = LockedCounter()
    counter = itertools.count(1)
    registry = SequenceRegistry(MemoryStore())
    registry.register(SequenceConfig("hot_reg", batch_count=n * (repeats + 2) * 4))
    group = Group(
        "hot_path",
        "next() on one thread, full buffer (memory store)",
        "values/s",
        subject="autoseq SequenceLock.next()",
    )
    run_group(
        group,
        [
            Contender("autoseq SequenceLock.next()", lambda: calls(lock.next, n)),
            Contender("floor: threading.Lock + int += 1", lambda: calls(floor.next, n)),
            Contender("itertools.count (no lock)", lambda: calls(counter.__next__, n)),
            Contender(
                "autoseq SequenceRegistry.next(name)",
                lambda: calls(lambda: registry.next("hot_reg"), n),
                note="name lookup + next(); includes a lambda call",
            ),
        ],
        repeats,
        log=ctx.log,
    )
    group.notes.append(f"{n:,} calls per trial, {repeats} interleaved repeats")
    groups.append(group)
    lock.close(release=False)
    registry.close(release=False)

    # Default settings: blocks of 100 growing adaptively, reserved from the
    # memory store in the background: what the hot path costs with real
    # block switches in it.
    default_lock = _full_buffer_lock("hot_default", block=100)
    fixed_lock = SequenceLock(
        "hot_fixed",
        default_lock.store,
        batch_count=100,
        policy=BufferPolicy(max_batch_count=100),
    )
    default_lock.store.create(SequenceConfig("hot_fixed", batch_count=100))
    floor2 = LockedCounter()
    group = Group(
        "hot_path",
        "next() on one thread, default block 100 (memory store)",
        "values/s",
        subject="autoseq next(), adaptive blocks",
    )
    run_group(
        group,
        [
            Contender("autoseq next(), adaptive blocks", lambda: calls(default_lock.next, n)),
            Contender("autoseq next(), fixed block 100", lambda: calls(fixed_lock.next, n)),
            Contender("floor: threading.Lock + int += 1", lambda: calls(floor2.next, n)),
        ],
        repeats,
        log=ctx.log,
    )
    group.notes.append("block switches and background reservations included")
    groups.append(group)
    default_lock.close(release=False)
    fixed_lock.close(release=False)
    return groups
