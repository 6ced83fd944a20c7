"""Rule 8 in one process: a block not above what it reserved is skipped; a failover drops blocks."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from autoseq import BufferPolicy, SequenceConfig, SequenceLock, metrics, signals
from autoseq.errors import InvalidSequenceConfig
from autoseq.stores import MemoryStore, RedisStore, SQLStore
from autoseq.stores.base import Block

NO_PREFETCH = BufferPolicy(prefetch=False, max_batch_count=100)
FIXED = BufferPolicy(max_batch_count=100)  # blocks of 100, prefetched


class FailingOverStore(MemoryStore):
    """A memory store whose next reservation comes from "another primary" that lost writes."""

    def __init__(self) -> None:
        super().__init__()
        self.lose_from: int | None = None

    def reserve(self, name: str, count: int) -> Block:
        if self.lose_from is None:
            return super().reserve(name, count)
        row = self.read(name)
        assert row is not None
        self.update(row.with_current(self.lose_from))  # the promoted replica's row
        self.lose_from = None
        return dataclasses.replace(super().reserve(name, count), failover=True)


def settle(lock: SequenceLock) -> None:
    """Wait until the lock's background reservation, if any, is done."""
    deadline = time.monotonic() + 10
    while lock.stats()["loading"] and time.monotonic() < deadline:
        time.sleep(0.001)


def take(lock: SequenceLock, n: int) -> list[int]:
    """``n`` values one by one (bulks would size the blocks up)."""
    return [lock.next() for _ in range(n)]


def lock_on(store: MemoryStore, **config: Any) -> SequenceLock:
    """A lock on a fresh row of ``store``, without prefetch (blocks in a known order)."""
    store.create(SequenceConfig("orders", batch_count=100, **config))
    return SequenceLock("orders", store, batch_count=100, policy=NO_PREFETCH)


def test_a_row_moved_back_is_skipped_not_served() -> None:
    """The row goes back below served values: the lock skips past them and never repeats one."""
    store = MemoryStore()
    lock = lock_on(store)
    went_back: list[dict[str, Any]] = []
    signals.row_went_back.connect(lambda _s, **kw: went_back.append(kw), weak=False)
    try:
        served = lock.next_many(250)  # three blocks: 1..300 reserved
        row = store.read("orders")
        assert row is not None
        store.update(row.with_current(101))  # a restore or failover lost two reservations
        served += lock.next_many(400)
    finally:
        signals.row_went_back.receivers.clear()
    assert len(served) == len(set(served)) == 650
    assert served[250:300] == list(range(251, 301))  # the rest of the block in hand
    assert min(served[300:]) > 300  # then above every value reserved, not from 101
    assert [(kw["first"], kw["high"]) for kw in went_back] == [(101, 300)]
    row = store.read("orders")
    assert row is not None
    assert row.current > max(served)


def test_a_cycling_row_wraps_without_the_fence() -> None:
    """A cycle wraps to start on purpose: the fence lets it serve start again."""
    store = MemoryStore()
    lock = lock_on(store, end=150, cycle=True)
    served = lock.next_many(300)
    assert served[:150] == list(range(1, 151)) == served[150:]


def test_a_failover_drops_buffered_blocks_and_is_signalled() -> None:
    """A block from another primary: values buffered from the old one are dropped, not served."""
    store = FailingOverStore()
    store.create(SequenceConfig("orders", batch_count=100))
    lock = SequenceLock("orders", store, batch_count=100, policy=FIXED)
    failovers: list[dict[str, Any]] = []
    signals.store_failover.connect(lambda _s, **kw: failovers.append(kw), weak=False)
    try:
        served = take(lock, 95)  # 101..200 prefetched
        settle(lock)
        store.lose_from = 1
        served += take(lock, 25)  # past 101..200's prefetch point: reserves on the new one
        settle(lock)
        served += take(lock, 100)
    finally:
        signals.store_failover.receivers.clear()
        lock.close(release=False)
    assert len(served) == len(set(served))
    assert [kw["first"] for kw in failovers] == [201]  # after the fence skipped 1..100
    assert served[:120] == list(range(1, 121))
    assert min(served[120:]) > 200  # the rest of 101..200 was dropped, not served


def test_fence_and_failover_are_counted_in_metrics() -> None:
    """The two new signals move autoseq_rows_went_back_total and autoseq_failovers_total."""
    registry = CollectorRegistry()
    collector = metrics.AutoseqMetrics(registry=registry)
    store = FailingOverStore()
    lock = lock_on(store)
    try:
        lock.next_many(150)
        store.lose_from = 1
        lock.next_many(100)
    finally:
        signals.row_went_back.disconnect(collector._on_went_back)
        signals.store_failover.disconnect(collector._on_failover)
    names = {
        sample.name: sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name in ("autoseq_rows_went_back_total", "autoseq_failovers_total")
    }
    assert names == {"autoseq_rows_went_back_total": 1.0, "autoseq_failovers_total": 1.0}


@pytest.mark.parametrize("level", ["sometimes", "ON", 1, ""])
def test_sql_store_refuses_an_unknown_synchronous_commit(level: object) -> None:
    """SQLStore(synchronous_commit=...) takes a known level or None, else InvalidSequenceConfig."""
    with pytest.raises(InvalidSequenceConfig, match="synchronous_commit"):
        SQLStore("sqlite://", synchronous_commit=level)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("option", "value"),
    [("replicas", -1), ("replicas", True), ("replicas", "1"), ("replica_timeout", 0)],
)
def test_redis_store_refuses_bad_replica_settings(option: str, value: object) -> None:
    """RedisStore(replicas=..., replica_timeout=...) refuses what cannot be waited for."""
    with pytest.raises(InvalidSequenceConfig, match=option):
        RedisStore("redis://127.0.0.1:1/0", **{option: value})
