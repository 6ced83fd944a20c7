"""Round trips: reservations per 100,000 values, counted at the store.

Each trial takes a fresh sequence, draws 100,000 values one way, and reads
the store's own ``reservations`` counter; the ``block_reserved`` signal is
counted beside it and must agree. Also checks issue 2's bound: a bulk of N
values costs at most ceil(N / block) + 1 reservations, from any state.

Then reservations per second: one thread calling ``next()`` at full speed
on a memory store, counted after a warm-up, with the default ceiling of
block sizes and with Leaf's 1,000,000 (the default before issue 16), side by
side. Issue 16's target: at most a few reservations per second.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from autoseq import BufferPolicy, SequenceConfig, SequenceLock, signals
from autoseq.pacing import DEFAULT_MAX_BATCH_COUNT
from autoseq.stores import MemoryStore, SQLStore
from benchmarks.harness import Contender, Group, Sample, Unavailable, run_group, stopwatch
from benchmarks.servers import BACKEND_LABELS, Context, unique_name

VALUES = 100_000
FIXED = BufferPolicy(max_batch_count=100)


@contextmanager
def open_store(ctx: Context, backend: str) -> Iterator[Any]:
    """A store with its own fresh table (dropped afterwards), or the memory store."""
    if backend == "memory":
        yield MemoryStore()
        return
    store = SQLStore(ctx.sql_url(backend), table=unique_name("rt"))
    store.create_table()
    try:
        yield store
    finally:
        store.drop()
        store.close()


def settle(lock: SequenceLock, timeout: float = 10.0) -> None:
    """Wait until no background reservation is in flight."""
    deadline = time.monotonic() + timeout
    while lock.stats()["loading"] and time.monotonic() < deadline:
        time.sleep(0.001)


class SignalCounter:
    """Counts ``block_reserved`` for one sequence name."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0
        signals.block_reserved.connect(self._on_reserved)

    def _on_reserved(self, _sender: object, **kwargs: object) -> None:
        if kwargs.get("name") == self.name:
            self.count += 1

    def close(self) -> None:
        signals.block_reserved.disconnect(self._on_reserved)


def draw(
    store: Any,
    values: int,
    take: Callable[[SequenceLock, int], None],
    *,
    batch: bool = True,
    policy: BufferPolicy | None = None,
) -> Sample:
    """Draw ``values`` from a fresh sequence with ``take``; count reservations two ways."""
    name = unique_name("seq")
    store.create(SequenceConfig(name, batch=batch, batch_count=100))
    lock = SequenceLock(name, store, batch=batch, batch_count=100, policy=policy)
    counter = SignalCounter(name)
    before = store.reservations
    try:
        with stopwatch() as elapsed:
            take(lock, values)
        settle(lock)
        at_store = store.reservations - before
    finally:
        counter.close()
        lock.close(release=False)
    scale = VALUES / values
    return Sample(
        values,
        elapsed[0],
        {"reservations": at_store * scale, "block_reserved signals": counter.count * scale},
    )


def one_by_one(lock: SequenceLock, n: int) -> None:
    for _ in range(n):
        lock.next()


def in_bulks(size: int) -> Callable[[SequenceLock, int], None]:
    def take(lock: SequenceLock, n: int) -> None:
        for _ in range(n // size):
            lock.next_many(size)

    return take


def reservations_group(ctx: Context, backend: str) -> Group:
    label = "memory" if backend == "memory" else BACKEND_LABELS[backend]
    group = Group(
        "round_trips",
        f"reservations per 100,000 values, {label} store",
        "reservations",
        subject="autoseq next(), block 100 adaptive",
        metric="reservations",
        higher_is_better=False,
    )
    try:
        with open_store(ctx, backend) as store:
            # batch=False costs one round trip per value; on a server that is
            # 100,000 round trips, so it is measured on 2,000 and scaled.
            unbatched = VALUES if backend == "memory" else ctx.n(2_000, 500)
            run_group(
                group,
                [
                    Contender(
                        "autoseq next(), block 100 adaptive",
                        lambda: draw(store, VALUES, one_by_one),
                    ),
                    Contender(
                        "autoseq next(), block 100 fixed",
                        lambda: draw(store, VALUES, one_by_one, policy=FIXED),
                    ),
                    Contender(
                        "autoseq next_many(1000) x 100",
                        lambda: draw(store, VALUES, in_bulks(1000), policy=FIXED),
                    ),
                    Contender(
                        "autoseq next_many(100000) x 1",
                        lambda: draw(store, VALUES, in_bulks(VALUES), policy=FIXED),
                    ),
                    Contender(
                        "autoseq batch=False (one per value)",
                        lambda: draw(store, unbatched, one_by_one, batch=False),
                        note="" if unbatched == VALUES else f"measured on {unbatched:,}, scaled",
                    ),
                ],
                repeats=1,
                warmup=False,
                log=ctx.log,
            )
            bulk_bound(ctx, store, label)
        disagree = [
            s.name
            for s in group.series
            if s.samples
            and s.counters().get("reservations") != s.counters().get("block_reserved signals")
        ]
        ctx.check(
            f"reservations counted at the store = block_reserved signals ({label})",
            not disagree,
            "agree" if not disagree else f"differ for {', '.join(disagree)}",
        )
    except Unavailable as exc:
        group.unavailable = str(exc)
    return group


def bulk_bound(ctx: Context, store: Any, label: str) -> None:
    """Issue 2: next_many(N) costs at most ceil(N / block) + 1 reservations, from any state."""
    worst: tuple[int, str] = (-(10**9), "")
    cases = 0
    problems: list[str] = []
    sizes = (1, 50, 100, 101, 999, 1000, 1001, 12_345, 100_000)
    for block in (100, 1000):
        states = (("fresh", 0), ("partly used", block // 20), ("past prefetch", block // 2))
        for state, used in states:
            for n in sizes:
                name = unique_name("bulk")
                store.create(SequenceConfig(name, batch_count=block))
                lock = SequenceLock(name, store, batch_count=block)
                try:
                    taken = [lock.next() for _ in range(used)]
                    settle(lock)
                    before = store.reservations
                    values = lock.next_many(n)
                    settle(lock)
                    cost = store.reservations - before
                finally:
                    lock.close(release=False)
                cases += 1
                bound = math.ceil(n / block) + 1
                if cost - bound > worst[0]:
                    worst = (cost - bound, f"N={n:,} block={block} {state}: {cost} reservations")
                if cost > bound:
                    problems.append(f"N={n} block={block} {state}: {cost} > {bound}")
                if len(set(values) | set(taken)) != n + used or values != sorted(values):
                    problems.append(f"N={n} block={block} {state}: values repeat or out of order")
    ctx.check(
        f"issue 2: bulk of N costs <= ceil(N/block)+1 reservations ({label})",
        not problems,
        f"{cases} cases, tightest: {worst[1]}, "
        + (f"{-worst[0]} under the bound" if worst[0] < 0 else "at the bound")
        + (f"; FAILED: {'; '.join(problems[:5])}" if problems else ""),
        cases=cases,
        problems=problems,
    )


def full_speed(seconds: float, warmup: float, policy: BufferPolicy | None = None) -> Sample:
    """``next()`` in a bare loop for ``warmup`` + ``seconds``; reservations in the last part."""
    store = MemoryStore()
    name = unique_name("fast")
    store.create(SequenceConfig(name))
    lock = SequenceLock(name, store, policy=policy)
    take = lock.next
    clock = time.perf_counter
    try:
        started = clock()
        while clock() - started < warmup:
            for _ in itertools.repeat(None, 100_000):
                take()
        before, values, since = store.reservations, 0, clock()
        while clock() - since < seconds:
            for _ in itertools.repeat(None, 100_000):
                take()
            values += 100_000
        elapsed = clock() - since
        settle(lock)
        reservations = store.reservations - before
        size = lock.stats()["block_size"]
    finally:
        lock.close(release=False)
    return Sample(
        values,
        elapsed,
        {"reservations/s": reservations / elapsed, "block size": size},
    )


def full_speed_group(ctx: Context) -> Group:
    seconds, warmup = ctx.n(3.0, 1.0), ctx.n(2.0, 0.5)
    subject = f"autoseq next(), default ceiling {DEFAULT_MAX_BATCH_COUNT:,}"
    before = "autoseq next(), ceiling 1,000,000 (Leaf's; the default before)"
    group = Group(
        "round_trips",
        "reservations per second, one thread at full speed after warm-up (memory store)",
        "reservations/s",
        subject=subject,
        metric="reservations/s",
        higher_is_better=False,
    )
    run_group(
        group,
        [
            Contender(subject, lambda: full_speed(seconds, warmup)),
            Contender(
                before,
                lambda: full_speed(seconds, warmup, BufferPolicy(max_batch_count=1_000_000)),
            ),
        ],
        repeats=ctx.n(3, 2),
        warmup=False,
        log=ctx.log,
    )
    group.notes.append(
        f"counted over {seconds:g} s after {warmup:g} s of warm-up; block_seconds=2.0"
    )
    mine = group.get(subject)
    if mine is not None and mine.samples:
        worst = max(mine.values("reservations/s"))
        ctx.check(
            "issue 16: one process at full speed makes at most 3 reservations/s after warm-up",
            worst <= 3.0,
            f"{mine.median('reservations/s'):.2f}/s (worst {worst:.2f}) at "
            f"{mine.median():,.0f} values/s; with the 1,000,000 ceiling "
            f"{(group.get(before) or mine).median('reservations/s'):.2f}/s",
        )
    return group


def run(ctx: Context) -> list[Group]:
    backends = ("memory", "sqlite", "postgres", "mysql")
    return [reservations_group(ctx, backend) for backend in backends] + [full_speed_group(ctx)]
