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


class Held(FlakyStore):
    """A FlakyStore whose reservations wait for ``gate`` and are recorded, one by one
    (``reserve``) or together (``reserve_many``)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.gate = threading.Event()
        self.gate.set()
        self.alone: list[str] = []
        self.together: list[list[tuple[str, int]]] = []

    def reserve(self, name: str, count: int) -> Any:
        self.alone.append(name)
        assert self.gate.wait(5)
        return super().reserve(name, count)

    def reserve_many(self, requests: list[tuple[str, int]]) -> Any:
        self.together.append(list(requests))
        assert self.gate.wait(5)
        return super().reserve_many(requests)


def held_wave(pool: PrefetchPool, store: Held, count: int) -> list[Any]:
    """``count`` locks on ``store``, each past its second block's prefetch point while the
    pool's only worker is held in the first one's reservation: ``count - 1`` queued."""
    pool.resize(1)
    registry = SequenceRegistry(store, policy=BufferPolicy(max_batch_count=10))
    locks = [registry.register(SequenceConfig(f"w{i:03d}", batch_count=10)) for i in range(count)]
    assert [lock.next() for lock in locks] == [1] * count
    deadline = time.monotonic() + 5
    while not all(lock.stats()["next_block_left"] == 10 for lock in locks):
        assert time.monotonic() < deadline, "second blocks not prefetched"
        time.sleep(0.001)
    store.gate.clear()
    store.alone.clear()
    store.together.clear()
    assert [locks[0].next() for _ in range(11)] == list(range(2, 13))
    while not locks[0].stats()["loading"] or pool.queued():
        assert time.monotonic() < deadline, "the worker never took the first prefetch"
        time.sleep(0.001)
    for lock in locks[1:]:
        assert [lock.next() for _ in range(11)] == list(range(2, 13))
    assert pool.queued() == count - 1
    return locks


def test_a_wave_of_prefetches_on_one_store_is_one_round_trip(pool: PrefetchPool) -> None:
    """300 sequences past their prefetch points at once (the pool's one worker held): the
    299 queued prefetches go in one reserve_many, each with its own lock's count, and every
    sequence then serves on from memory, in order, with no value twice."""
    store = Held(MemoryStore())
    locks = held_wave(pool, store, 300)
    store.gate.set()
    deadline = time.monotonic() + 5
    while pool.queued() or any(lock.stats()["loading"] for lock in locks):
        assert time.monotonic() < deadline, "the wave never arrived"
        time.sleep(0.001)
    assert store.alone == ["w000"]
    assert [sorted(batch) for batch in store.together] == [
        sorted((lock.name, 10) for lock in locks[1:])
    ]
    waits = sum(lock.stats()["caller_waits"] for lock in locks)
    served = {lock.name: [lock.next() for _ in range(18)] for lock in locks}
    assert all(values == list(range(13, 31)) for values in served.values())
    assert sum(lock.stats()["caller_waits"] for lock in locks) == waits
    for lock in locks:
        lock.close()


def test_a_row_left_out_of_a_wave_is_reserved_alone(pool: PrefetchPool) -> None:
    """A sequence whose row reserve_many leaves out (None: its end is near) gets its block
    from reserve, on the same worker; the others' blocks came together."""
    memory = MemoryStore()
    store = Held(memory)
    locks = held_wave(pool, store, 5)
    real = store.reserve_many

    def leave_out_w003(requests: list[tuple[str, int]]) -> Any:
        blocks = real([item for item in requests if item[0] != "w003"])
        out = iter(blocks)
        return [None if name == "w003" else next(out) for name, _ in requests]

    store.reserve_many = leave_out_w003  # type: ignore[method-assign]
    store.gate.set()
    deadline = time.monotonic() + 5
    while pool.queued() or any(lock.stats()["loading"] for lock in locks):
        assert time.monotonic() < deadline, "the wave never arrived"
        time.sleep(0.001)
    assert store.alone == ["w000", "w003"]
    assert {lock.name: [lock.next() for _ in range(18)] for lock in locks} == {
        lock.name: list(range(13, 31)) for lock in locks
    }
    for lock in locks:
        lock.close()


def test_a_wave_whose_round_trip_fails_is_each_locks_failure(pool: PrefetchPool) -> None:
    """The store down during a wave's reserve_many: every lock of it reports prefetch_failed
    naming itself, serves what it holds, then reserves again once the store is back; no
    value is lost to the failure nor served twice."""
    from autoseq import signals

    store = Held(MemoryStore())
    locks = held_wave(pool, store, 6)
    failed: list[tuple[str, str]] = []

    def record(_sender: Any, name: str, error: Exception) -> None:
        failed.append((name, str(error)))

    signals.prefetch_failed.connect(record)
    try:
        store.down = True
        store.gate.set()
        deadline = time.monotonic() + 5
        while len(failed) < 6:
            assert time.monotonic() < deadline, f"failures reported: {failed}"
            time.sleep(0.001)
    finally:
        signals.prefetch_failed.disconnect(record)
    # w000 failed alone (its own reserve); the other five together, each named
    assert sorted(name for name, _ in failed) == [lock.name for lock in locks]
    assert all(f"sequence {name!r}" in error for name, error in failed)
    store.down = False
    time.sleep(0.2)  # each lock's back-off after its one failure (retry_initial, 0.05 s)
    served = {lock.name: [lock.next() for _ in range(28)] for lock in locks}
    assert all(values == list(range(13, 41)) for values in served.values())
    for lock in locks:
        lock.close()


def test_the_prefetch_point_checks_the_stores_capability_once_per_class(
    pool: PrefetchPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether a store reserves many rows at once is found once per store class, not on the
    caller's thread at every prefetch point: the runtime Protocol check takes tens of
    microseconds there (issue 5's p99.9, a 20 ms store, went from 108-114 us to 160-174 us
    when each prefetch made it)."""
    from autoseq import lock as lock_module
    from autoseq.stores.capabilities import ReservesMany

    checks: list[object] = []

    class Counting(type):
        def __instancecheck__(cls, instance: object) -> bool:
            checks.append(instance)
            return isinstance(instance, ReservesMany)

    class CountingReservesMany(metaclass=Counting):
        pass

    monkeypatch.setattr(lock_module, "ReservesMany", CountingReservesMany)
    monkeypatch.setattr(lock_module, "_RESERVES_MANY", {})
    store = FlakyStore(MemoryStore())
    lock = SequenceRegistry(store, policy=BufferPolicy(max_batch_count=10)).register(
        SequenceConfig("checked", batch_count=10)
    )
    values = [lock.next() for _ in range(200)]
    assert values == list(range(1, 201))
    assert store.reservations >= 15  # prefetches were made
    assert len(checks) == 1
    lock.close()
