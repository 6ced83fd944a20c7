"""The shared prefetch pool: a few threads for every sequence, serving through a thread limit."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from autoseq import BufferPolicy, SequenceConfig, SequenceRegistry, prefetch
from autoseq.errors import InvalidSequenceConfig
from autoseq.prefetch import MAX_WORKERS, PrefetchPool
from autoseq.stores import MemoryStore
from autoseq.testing import FlakyStore


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> PrefetchPool:
    """A fresh shared pool of 4 workers for the test."""
    fresh = PrefetchPool(4)
    monkeypatch.setattr(prefetch, "_shared", fresh)
    return fresh


@pytest.fixture
def thread_limit(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """While the event is set, starting a thread fails as under a process thread limit."""
    limited = threading.Event()
    start = threading.Thread.start

    def limited_start(self: threading.Thread) -> None:
        if limited.is_set():
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", limited_start)
    yield limited
    limited.clear()


def serve_round_robin(
    locks: list[Any], rounds: int, per_turn: int, taken: dict[str, list[int]]
) -> Counter[str]:
    """Take ``per_turn`` values of each lock in turn, ``rounds`` times; errors by type name."""
    errors: Counter[str] = Counter()
    for _ in range(rounds):
        for lock in locks:
            for _ in range(per_turn):
                try:
                    taken[lock.name].append(lock.next())
                except Exception as exc:  # counted: the test's figure
                    errors[type(exc).__name__] += 1
    return errors


def test_a_failed_thread_start_never_stops_serving(
    pool: PrefetchPool, thread_limit: threading.Event
) -> None:
    """Under a thread limit callers reserve inline: no error, no value lost, none twice, no wedge.

    Issue 34: 600 sequences in a container allowing 300 threads gave 301
    ``can't start new thread`` errors, and once the limit lifted the
    affected sequences raised ``StoreUnavailable: no block arrived``.
    """
    registry = SequenceRegistry(MemoryStore(), policy=BufferPolicy(wait_timeout=1.0))
    locks = [registry.register(SequenceConfig(f"limit{i}", batch_count=10)) for i in range(200)]
    taken: dict[str, list[int]] = {lock.name: [] for lock in locks}
    thread_limit.set()
    during = serve_round_robin(locks, rounds=3, per_turn=12, taken=taken)
    thread_limit.clear()
    after = serve_round_robin(locks, rounds=3, per_turn=12, taken=taken)
    registry.close()
    assert dict(during) == {}, f"while the limit held: {dict(during)}"
    assert dict(after) == {}, f"after the limit lifted: {dict(after)}"
    for name, values in taken.items():
        assert values == list(range(1, 73)), f"{name}: values lost or repeated"
    assert pool.threads() >= 1  # once the limit lifted, prefetching went back to the pool


def test_a_thread_start_failing_with_workers_alive_still_prefetches(
    pool: PrefetchPool, thread_limit: threading.Event
) -> None:
    """With a worker up and no more able to start, every prefetch still runs on the ones up."""
    registry = SequenceRegistry(MemoryStore())
    first = registry.register(SequenceConfig("alive0", batch_count=10))
    for _ in range(12):
        first.next()
    deadline = time.monotonic() + 5
    while pool.threads() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    workers = pool.threads()
    thread_limit.set()
    locks = [registry.register(SequenceConfig(f"alive{i}", batch_count=10)) for i in range(1, 50)]
    taken: dict[str, list[int]] = {lock.name: [] for lock in locks}
    errors = serve_round_robin(locks, rounds=1, per_turn=9, taken=taken)
    time.sleep(0.2)  # the prefetches queued meanwhile run on the worker(s) up
    errors += serve_round_robin(locks, rounds=1, per_turn=9, taken=taken)
    stats = registry.stats()
    registry.close()
    assert dict(errors) == {}
    assert pool.threads() == workers
    # Each waited for its first block only; the pool brought every later one.
    assert [stats[lock.name]["caller_waits"] for lock in locks] == [1] * len(locks)
    assert all(stats[lock.name]["reservations"] >= 2 for lock in locks)
    assert all(values == list(range(1, 19)) for values in taken.values())


def test_threads_alive_stay_within_the_pool_for_1000_sequences(pool: PrefetchPool) -> None:
    """Serving 1,000 sequences past their prefetch points starts at most the pool's threads."""
    before = threading.active_count()
    registry = SequenceRegistry(MemoryStore())
    locks = [registry.register(SequenceConfig(f"many{i}", batch_count=10)) for i in range(1000)]
    taken: dict[str, list[int]] = {lock.name: [] for lock in locks}
    errors = serve_round_robin(locks, rounds=3, per_turn=10, taken=taken)
    started = threading.active_count() - before
    registry.close()
    assert dict(errors) == {}
    assert started <= pool.workers <= MAX_WORKERS, f"{started} threads for 1,000 sequences"
    assert 1 <= pool.threads() <= pool.workers
    assert all(values == list(range(1, 31)) for values in taken.values())


def test_a_slow_store_holds_only_its_worker(pool: PrefetchPool) -> None:
    """A sequence whose store hangs busies one worker; another's callers reserve inline meanwhile.

    With one worker held, the other sequence's prefetch waits in the queue;
    a caller whose block runs out takes it back and waits only on its own
    store's round trip (20 ms here), never on the hung store (2 s).
    """
    pool.resize(1)
    slow_store = FlakyStore(MemoryStore(), delay=0.0)
    slow = SequenceRegistry(slow_store).register(SequenceConfig("slow", batch_count=10))
    for _ in range(5):
        slow.next()
    slow_store.delay = 2.0
    while not slow.stats()["loading"]:
        slow.next()
    time.sleep(0.05)  # the only worker is now inside the hung reservation
    fast = SequenceRegistry(
        FlakyStore(MemoryStore(), delay=0.02), policy=BufferPolicy(max_batch_count=10)
    ).register(SequenceConfig("fast", batch_count=10))
    slowest = 0.0
    values = []
    for _ in range(100):
        started = time.perf_counter()
        values.append(fast.next())
        slowest = max(slowest, time.perf_counter() - started)
    waited = time.monotonic()
    fast.close()
    closing = time.monotonic() - waited
    slow.close()
    assert values == list(range(1, 101))
    assert slowest < 0.5, f"the slowest call took {slowest:.3f}s: it waited on the hung store"
    assert closing < 0.5, f"close() waited {closing:.3f}s for a prefetch still queued"
    assert fast.stats()["reservations"] == 10  # all inline: its queued prefetches never ran


def test_pool_size_is_bounded() -> None:
    """A pool of 0 or more than 8 threads is refused with the range to use."""
    for workers in (0, MAX_WORKERS + 1):
        with pytest.raises(InvalidSequenceConfig, match="use 1 to 8"):
            PrefetchPool(workers)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_prefetches_on_its_own_pool(pool: PrefetchPool) -> None:
    """After fork the child's prefetches run on threads of its own, started there."""
    registry = SequenceRegistry(MemoryStore())
    lock = registry.register(SequenceConfig("forkpool", batch_count=10))
    for _ in range(30):
        lock.next()
    assert pool.threads() >= 1
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read)
        try:
            threads_at_fork = pool.threads()
            values = []
            for _ in range(40):
                values.append(lock.next())
                time.sleep(0.002)  # let the prefetch land
            report = {
                "at_fork": threads_at_fork,
                "after": pool.threads(),
                "waits": lock.stats()["caller_waits"],
                "values": values,
            }
            os.write(write, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        report = json.loads(pipe.read())
    os.waitpid(pid, 0)
    registry.close()
    assert report["at_fork"] == 0
    assert report["after"] >= 1
    assert report["waits"] <= 2  # the first block after fork, and no more
    assert report["values"] == sorted(set(report["values"]))


def test_configure_resizes_the_shared_pool(pool: PrefetchPool) -> None:
    """configure(workers=1) after 4 workers started: the extra ones end once idle."""
    done = threading.Event()
    gate = threading.Event()
    for _ in range(4):
        assert pool.submit(gate.wait)
    deadline = time.monotonic() + 5
    while pool.threads() < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.threads() == 4
    assert prefetch.configure(workers=1) is pool
    gate.set()
    assert pool.submit(done.set)
    assert done.wait(5)
    while pool.threads() > 1 and time.monotonic() < deadline + 5:
        time.sleep(0.01)
    assert pool.threads() == 1
