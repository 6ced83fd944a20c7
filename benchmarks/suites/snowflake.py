"""Snowflake ids: ``Snowflake.next()`` against the PyPI snowflake generators and the floor.

All run in memory on one thread: autoseq's generator on a ``MemoryStore``
(its lease is taken once, up front; the heartbeat runs beside), snowflake-id
(``SnowflakeGenerator``, no lock: not thread-safe, and it returns ``None``
instead of waiting when a millisecond's sequence is used up),
snowflake-id-toolkit (``TwitterSnowflakeIDGenerator``, a lock) and the
floor of every thread-safe counter (``threading.Lock`` + an int add).
Issue 15's target: autoseq >= 1.0x snowflake-id and snowflake-id-toolkit.
A second group runs four threads on one generator.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from autoseq.snowflake import Snowflake
from autoseq.stores import MemoryStore
from benchmarks.harness import Contender, Group, Sample, Unavailable, run_group, stopwatch
from benchmarks.servers import Context
from benchmarks.suites.hot_path import LockedCounter, calls


def _snowflake_id() -> Callable[[], object]:
    try:
        from snowflake import SnowflakeGenerator
    except ImportError as exc:
        raise Unavailable("snowflake-id is not installed (pip install 'autoseq[bench]')") from exc
    return SnowflakeGenerator(1).__next__


def _toolkit() -> Callable[[], object]:
    try:
        from snowflake_id_toolkit.twitter import TwitterSnowflakeIDGenerator
    except ImportError as exc:
        raise Unavailable("snowflake-id-toolkit is not installed") from exc
    return TwitterSnowflakeIDGenerator(node_id=1, epoch=1288834974657).generate_next_id


def _lazy(make: Callable[[], Callable[[], object]], n: int) -> Callable[[], Sample]:
    """A trial calling what ``make`` returns (made on the first trial, so a missing package
    marks only its contender unavailable)."""
    made: list[Callable[[], object]] = []

    def trial() -> Sample:
        if not made:
            made.append(make())
        return calls(made[0], n)

    return trial


def _threads(fn: Callable[[], object], threads: int, n: int) -> Sample:
    """``n`` calls of ``fn`` split over ``threads`` threads started together."""
    per = n // threads
    start = threading.Barrier(threads + 1)

    def work() -> None:
        start.wait()
        for _ in range(per):
            fn()

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for thread in pool:
        thread.start()
    with stopwatch() as elapsed:
        start.wait()
        for thread in pool:
            thread.join()
    return Sample(per * threads, elapsed[0])


def run(ctx: Context) -> list[Group]:
    n = ctx.n(1_000_000, 200_000)
    repeats = ctx.repeats * 2 + 1
    generator = Snowflake(MemoryStore(), name="bench")
    floor = LockedCounter()
    group = Group(
        "snowflake",
        "snowflake next() on one thread (memory store)",
        "values/s",
        subject="autoseq Snowflake.next()",
    )
    run_group(
        group,
        [
            Contender("autoseq Snowflake.next()", lambda: calls(generator.next, n)),
            Contender(
                "snowflake-id SnowflakeGenerator",
                _lazy(_snowflake_id, n),
                note="no lock; None when a millisecond's sequence is used up",
            ),
            Contender("snowflake-id-toolkit (twitter)", _lazy(_toolkit, n)),
            Contender("floor: threading.Lock + int += 1", lambda: calls(floor.next, n)),
        ],
        repeats,
        log=ctx.log,
    )
    group.notes.append(f"{n:,} calls per trial, {repeats} interleaved repeats")
    for peer in ("snowflake-id SnowflakeGenerator", "snowflake-id-toolkit (twitter)"):
        ratio = group.ratio(peer)
        if ratio is not None:
            ctx.check(
                f"Snowflake.next() >= 1.0x {peer}",
                ratio[0] >= 1.0,
                f"{ratio[0]:.2f}x (paired min {ratio[1]:.2f}, max {ratio[2]:.2f})",
                ratio=ratio[0],
            )

    threaded = Group(
        "snowflake",
        "snowflake next() from 4 threads on one generator",
        "values/s",
        subject="autoseq Snowflake.next()",
    )
    floor4 = LockedCounter()
    run_group(
        threaded,
        [
            Contender("autoseq Snowflake.next()", lambda: _threads(generator.next, 4, n)),
            Contender("snowflake-id-toolkit (twitter)", lambda: _threads(_toolkit_cached(), 4, n)),
            Contender("floor: threading.Lock + int += 1", lambda: _threads(floor4.next, 4, n)),
        ],
        repeats,
        log=ctx.log,
    )
    threaded.notes.append("snowflake-id is left out: it is not thread-safe")
    generator.close()
    return [group, threaded]


_toolkit_made: list[Callable[[], object]] = []


def _toolkit_cached() -> Callable[[], object]:
    if not _toolkit_made:
        _toolkit_made.append(_toolkit())
    return _toolkit_made[0]
