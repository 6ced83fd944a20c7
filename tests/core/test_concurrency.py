"""Real processes x threads on one sequence: SQLite (file), PostgreSQL, MariaDB.

4 processes x 4 threads x 5,000 values per case, with one block per round
trip (``batch=True``) and one value per round trip (``batch=False``). The
workers are *forked* on purpose, from a parent that has already served values
from a block of its own: rule 2 says no child may serve that block again, so
the parent's values (before and after the fork) join the duplicate check.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from backends import unique_table

from autoseq import BufferPolicy, SequenceConfig, SequenceRegistry
from autoseq.stores import MemoryStore
from autoseq.stores.sql import SQLStore
from autoseq.testing import FlakyStore

PROCESSES = 4
THREADS = 4
PER_THREAD = 5_000
# batch=False costs one round trip per value: the full size runs under -m slow
SHORT_PER_THREAD = 250
PARENT_VALUES = 1_000
FORK = multiprocessing.get_context("fork")


@pytest.fixture
def store(db_url: str) -> Iterator[SQLStore]:
    """A SQLStore on its own sequence table, dropped afterwards."""
    store = SQLStore(db_url, table=unique_table("conc"))
    store.create_table()
    yield store
    store.drop()
    store.close()


def _child(
    registry: SequenceRegistry,
    name: str,
    per_thread_count: int,
    barrier: Any,
    results: Any,
    inherited: int,
) -> None:
    """Runs in a forked process: THREADS threads take per_thread_count values each."""
    per_thread: list[list[int]] = [[] for _ in range(THREADS)]
    errors: list[str] = []

    def take(out: list[int]) -> None:
        try:
            for _ in range(per_thread_count):
                out.append(registry.next(name))
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=take, args=(out,)) for out in per_thread]
    barrier.wait()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # the counter came along with the fork: count only this child's own
    reservations = registry.store.reservations - inherited  # type: ignore[attr-defined]
    results.put((os.getpid(), per_thread, reservations, errors))


@pytest.mark.parametrize(
    ("batch", "per_thread"),
    [
        pytest.param(True, PER_THREAD, id="batch"),
        pytest.param(False, SHORT_PER_THREAD, id="no-batch-short"),
        pytest.param(False, PER_THREAD, id="no-batch", marks=pytest.mark.slow),
    ],
)
def test_processes_and_threads_never_share_a_value(
    store: SQLStore, sql_backend: str, batch: bool, per_thread: int
) -> None:
    """4 forked processes x 4 threads x 5,000 values: no duplicate, increasing per thread."""
    name = "orders"
    registry = SequenceRegistry(store)
    registry.register(SequenceConfig(name, batch=batch, batch_count=100))
    parent_count = PARENT_VALUES if batch else 100
    parent_before = [registry.next(name) for _ in range(parent_count)]

    barrier = FORK.Barrier(PROCESSES)
    results = FORK.Queue()
    workers = [
        FORK.Process(
            target=_child,
            args=(registry, name, per_thread, barrier, results, store.reservations),
        )
        for _ in range(PROCESSES)
    ]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    collected = [results.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    elapsed = time.perf_counter() - started
    parent_after = [registry.next(name) for _ in range(parent_count)]
    parent_reservations = store.reservations

    errors = [error for *_, errs in collected for error in errs]
    assert errors == []
    assert all(worker.exitcode == 0 for worker in workers)
    threads = [values for _, per_thread, _, _ in collected for values in per_thread]
    for values in threads:
        assert len(values) == per_thread
        assert all(a < b for a, b in itertools.pairwise(values)), "not increasing"
    everything = [v for values in threads for v in values] + parent_before + parent_after
    duplicates = len(everything) - len(set(everything))
    assert duplicates == 0
    assert min(parent_after) > max(parent_before)
    reservations = sum(r for _, _, r, _ in collected) + parent_reservations
    total = PROCESSES * THREADS * per_thread
    if not batch:
        assert reservations == total + 2 * parent_count  # one round trip per value
    else:
        assert reservations <= (total + 2 * parent_count) // 100 + 2 * PROCESSES + 2
    print(
        f"\n[concurrency] {sql_backend} {'batch' if batch else 'no-batch'}: "
        f"{total} values from {PROCESSES}x{THREADS}, duplicates {duplicates}, "
        f"reservations {reservations}, wall {elapsed:.2f}s, "
        f"{total / elapsed:,.0f} values/s"
    )
    registry.close(release=False)


def test_threads_of_one_process_are_served_fairly_without_batch() -> None:
    """batch=False: every thread gets its values; none waits while another keeps reserving."""
    store = FlakyStore(MemoryStore(), delay=0.002)
    registry = SequenceRegistry(store, policy=BufferPolicy(wait_timeout=0.2))
    registry.register(SequenceConfig("fair", batch=False))
    per_thread: list[list[int]] = [[] for _ in range(4)]
    errors: list[BaseException] = []

    def take(out: list[int]) -> None:
        try:
            for _ in range(100):
                out.append(registry.next("fair"))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=take, args=(out,)) for out in per_thread]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [len(values) for values in per_thread] == [100] * 4
    everything = sorted(v for values in per_thread for v in values)
    assert everything == list(range(1, 401))
    assert store.reservations == 400
