"""Thousands of sequences in one process share its reservation budget (issue 34, `autoseq.pacing`).

Real stores and real threads: reservations run on the shared prefetch pool and
on callers' threads at once.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from backends import sql_url, unique_table

from autoseq import SequenceConfig, SequenceRegistry
from autoseq.config import utc_now
from autoseq.pacing import (
    DEFAULT_RESERVATIONS_PER_SECOND,
    ReservationBudget,
    configure,
    shared_budget,
)
from autoseq.stores import SQLStore

SEQUENCES = 2_000
#: Seconds of round-robin after the first value of each sequence, not counted: the ramp,
#: in which blocks grow to their size (with the budget: about 20 s of values each).
RAMP = 6.0
#: Seconds of round-robin counted, after the ramp.
SECONDS = 8.0


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def many(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLStore]:
    """A SQL store holding SEQUENCES rows, inserted in one statement."""
    import sqlalchemy as sa

    store = SQLStore(sql_url(request.param, tmp_path), table=unique_table("many"))
    store.create_table()
    stamp = {"updated_at": utc_now(), "version": 0}
    rows = [SequenceConfig(f"s{i:05d}").as_row() | stamp for i in range(SEQUENCES)]
    with store.engine.begin() as connection:
        connection.execute(sa.insert(store.table), rows)
    yield store
    store.drop()
    store.close()


def serve(store: SQLStore) -> tuple[int, int]:
    """(values served, reservations made) in SECONDS of round-robin after RAMP seconds of it.

    Each value must be above the sequence's previous one: a value served
    twice, or from a block below one already served, fails.
    """
    registry = SequenceRegistry(store)
    registry.load()
    locks = [registry.get(f"s{i:05d}") for i in range(SEQUENCES)]
    last = [lock.next() for lock in locks]

    def round_robin(seconds: float) -> int:
        served = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for index, lock in enumerate(locks):
                value = lock.next()
                assert value > last[index], f"{lock.name}: {value} after {last[index]}"
                last[index] = value
            served += SEQUENCES
        return served

    try:
        round_robin(RAMP)
        first = sum(lock.stats()["reservations"] for lock in locks)
        served = round_robin(SECONDS)
        return served, sum(lock.stats()["reservations"] for lock in locks) - first
    finally:
        registry.close_locks()


def test_thousands_of_sequences_round_robin_make_far_fewer_reservations(many: SQLStore) -> None:
    """2,000 sequences round-robin, past the ramp: per value served, a third of the
    reservations or fewer than with blocks sized per sequence (the budget lifted), and no
    value twice."""
    try:
        configure(reservations_per_second=1e9)  # never binds: each sequence sized alone
        alone_values, alone = serve(many)
    finally:
        configure(reservations_per_second=DEFAULT_RESERVATIONS_PER_SECOND)
    configure().reset()
    shared_values, shared = serve(many)
    # Blocks last 2 s with the budget lifted, 20 s (2,000 / 100 a second) with it: about
    # 4 reservations a sequence in the window against at most 1. Measured, with another
    # test run loading the machine: 6.1-9.1x fewer per value (SQLite and PostgreSQL; 1,000-
    # 1,600 reservations against 7,700-8,700). Counted from the first values instead, the
    # ramp's reservations dominate: 2.2-2.6x, too near any bound to test.
    assert shared * alone_values <= alone * shared_values / 3, (
        f"budget: {shared_values:,} values in {shared:,} reservations; "
        f"lifted: {alone_values:,} in {alone:,}"
    )


def test_the_budget_counts_every_sequence_once_from_many_threads() -> None:
    """8 threads counting 1,000 sequences each at once: 8,000 active, none lost or doubled."""
    budget = ReservationBudget(100.0, window=3600.0)
    start = threading.Barrier(8)

    def count() -> None:
        start.wait()
        for _ in range(1_000):
            counted_in = 0
            for at in (1.0, 2.0):  # the second is the same period: not counted again
                counted_in = budget.reserved(counted_in, at=at)

    threads = [threading.Thread(target=count) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert budget.active() == 8_000
    assert budget.seconds == pytest.approx(80.0)


def test_a_forked_child_counts_no_sequence_of_its_parent() -> None:
    """After fork() the budget is fresh and its lock usable, even if a parent thread held it."""
    budget = shared_budget()
    for _ in range(500):
        budget.reserved(0, at=time.monotonic())
    assert budget.active() == 500
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with budget._guard:  # a reservation being counted at the instant of the fork
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            signal.alarm(10)  # a lock still held would hang it: killed, the test fails
            fresh = budget.active() == 0 and budget.seconds == 0.0
            counted = budget.reserved(0, at=time.monotonic()) and budget.active() == 1
            os._exit(0 if fresh and counted else 1)
    finally:
        release.set()
        holder.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert budget.active() == 500  # the parent's count is its own
