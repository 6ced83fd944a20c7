"""PostgreSQL: the epoch record and the failover treatment, on the real server.

The machine's server cannot be failed over, so these tests write another
timeline into a store's epoch record, as a promoted standby carries the
old primary's: the next new connection of any store then meets "a new
primary" and treats it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from backends import drop_sql_store, sql_url, unique_table

from autoseq import SequenceConfig, signals
from autoseq.errors import InvalidSequenceConfig, SequenceExhausted
from autoseq.stores import SQLStore
from autoseq.stores.sql._epoch import (
    DEFAULT_SKIP_BLOCKS,
    LEASE_PUSH_CAP_MS,
    epoch_table_name,
    largest_block,
    margin,
)

pytestmark = pytest.mark.postgres


@pytest.fixture
def table(tmp_path: Any) -> Iterator[str]:
    """A fresh sequence table on the machine's PostgreSQL (its epoch record made)."""
    url = sql_url("postgres", tmp_path)
    name = unique_table("epoch")
    setup = SQLStore(url, table=name)
    setup.create_table()
    yield name
    drop_sql_store(setup)


def store_on(table: str, **options: Any) -> SQLStore:
    """A store of its own on ``table`` (new connections, as a new process has)."""
    return SQLStore(sql_url("postgres", ""), table=table, **options)


def epoch(store: SQLStore) -> tuple[str, str, int]:
    """(system identifier, timeline, treatments) as recorded for ``store``'s table."""
    record = epoch_table_name(store.table_name)
    with store.engine.connect() as connection:
        row = connection.exec_driver_sql(
            f"SELECT system_identifier, timeline, treatments FROM {record}"
        ).one()
    return row[0], row[1], row[2]


def pretend_the_rows_came_from_another_primary(store: SQLStore) -> None:
    """Write an older timeline into the record: the server now looks like a promoted standby."""
    with store.engine.begin() as connection:
        connection.exec_driver_sql(
            f"UPDATE {epoch_table_name(store.table_name)} SET timeline = '00000000'"
        )
    store.engine.dispose()  # its next connection is a new one


class Skips:
    """``failover_skipped`` signals received while inside."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self._guard = threading.Lock()

    def __call__(self, sender: Any, **kw: Any) -> None:
        with self._guard:
            self.seen.append({"sender": sender, **kw})

    def __enter__(self) -> Skips:
        signals.failover_skipped.connect(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        signals.failover_skipped.disconnect(self)


def test_create_table_records_the_primary_it_met(table: str) -> None:
    """The record holds the server's system identifier and current timeline, untreated."""
    store = store_on(table)
    try:
        system, timeline, treatments = epoch(store)
        assert store.replication is not None
        assert store.replication.primary == (system, timeline)
        assert treatments == 0
    finally:
        store.close()


def test_the_same_primary_skips_nothing(table: str) -> None:
    """Fresh stores on the recorded primary reserve on from where the row stands."""
    first, second = store_on(table), store_on(table)
    try:
        first.create(SequenceConfig("orders", batch_count=10))
        a = first.reserve("orders", 10)
        b = second.reserve("orders", 10)
        assert b.first == a.last + 1
        assert epoch(second)[2] == 0
    finally:
        first.close()
        second.close()


def test_racing_stores_treat_a_new_primary_exactly_once(table: str) -> None:
    """Eight stores meet the new primary at once: one moves the rows, each serves above them."""
    setup = store_on(table)
    setup.create(SequenceConfig("orders", batch_count=100))
    setup.create(SequenceConfig("invoices", batch_count=1, batch=False))
    before = setup.reserve("orders", 100)
    row = setup.read("orders")
    assert row is not None
    skip = margin(row, DEFAULT_SKIP_BLOCKS)
    pretend_the_rows_came_from_another_primary(setup)
    stores = [store_on(table) for _ in range(8)]
    start = threading.Barrier(len(stores))
    blocks: list[Any] = []
    guard = threading.Lock()

    def reserve(store: SQLStore) -> None:
        start.wait()
        block = store.reserve("orders", 100)
        with guard:
            blocks.append(block)

    try:
        with Skips() as skips:
            threads = [threading.Thread(target=reserve, args=(s,)) for s in stores]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
        assert len(blocks) == 8
        assert {s["name"] for s in skips.seen} == {"orders", "invoices"}
        assert len(skips.seen) == 2, skips.seen  # one treatment, one signal per row
        (orders,) = [s for s in skips.seen if s["name"] == "orders"]
        assert orders["skipped"] == skip
        assert not orders["short"]
        assert min(block.first for block in blocks) == before.last + 1 + skip
        final = setup.read("orders")
        assert final is not None
        assert final.next_value == before.last + 1 + skip + 8 * 100
        assert final.version == row.version + 1 + 8  # the treatment bumped it once
        invoices = setup.read("invoices")
        assert invoices is not None
        assert invoices.next_value == 1 + margin(invoices, DEFAULT_SKIP_BLOCKS)
        system, timeline, treatments = epoch(setup)
        assert treatments == 1
        assert stores[0].replication is not None
        assert (system, timeline) == stores[0].replication.primary
        # only the treating store's block says so: its lock drops what it buffered
        assert sum(block.failover for block in blocks) == 1
    finally:
        for store in stores:
            store.close()
        setup.close()


def test_a_range_too_short_for_the_margin_is_left_at_its_end_and_signalled(table: str) -> None:
    """A short range is moved to its end (not silently part way) and the signal says short."""
    setup = store_on(table)
    setup.create(SequenceConfig("serial", end=99_999, batch_count=100))
    setup.reserve("serial", 100)
    row = setup.read("serial")
    assert row is not None
    assert margin(row, 200) > row.values_left
    pretend_the_rows_came_from_another_primary(setup)
    store = store_on(table, failover_skip_blocks=200)
    try:
        with Skips() as skips, pytest.raises(SequenceExhausted):
            store.reserve("serial", 1)
        (skip,) = skips.seen
        assert skip["short"]
        assert skip["skipped"] == row.values_left
        assert skip["wanted"] == 200 * largest_block(row)
        assert skip["sender"] is store
    finally:
        store.close()
        setup.close()


def test_failover_skip_blocks_zero_moves_no_row_but_records_the_primary(table: str) -> None:
    """``failover_skip_blocks=0``: the rows stay, the record takes the new primary."""
    setup = store_on(table)
    setup.create(SequenceConfig("orders", batch_count=10))
    a = setup.reserve("orders", 10)
    pretend_the_rows_came_from_another_primary(setup)
    store = store_on(table, failover_skip_blocks=0)
    try:
        assert store.reserve("orders", 10).first == a.last + 1
        assert epoch(store)[2] == 1
    finally:
        store.close()
        setup.close()


def test_live_leases_are_kept_one_ttl_from_the_treatment(table: str) -> None:
    """A held lease expired a moment ago is pushed out; one long expired or released is not."""
    setup = store_on(table)
    leases = setup.worker_leases()
    now = int(time.time() * 1000)
    then = now - 60_000
    lately = leases.acquire_worker("ids", "holder", 8, then, 3_000)
    long_ago = leases.acquire_worker("ids", "gone", 8, then, 3_000)
    released = leases.acquire_worker("ids", "left", 8, then, 3_000)
    assert lately
    assert long_ago
    assert released
    long_ago = leases.renew_worker(long_ago, then, 3_000, then)  # expired 57 s ago
    lately = leases.renew_worker(lately, now - 4_000, 3_000, now - 4_000)  # expired 1 s ago
    assert lately
    assert long_ago
    assert leases.release_worker(released, then)
    pretend_the_rows_came_from_another_primary(setup)
    store = store_on(table)
    try:
        treated_at = int(time.time() * 1000)
        rows = {lease.worker: lease for lease in store.worker_leases().list_workers("ids")}
        kept = rows[lately.worker]
        assert treated_at + 3_000 - 100 <= kept.expires_ms <= int(time.time() * 1000) + 3_000
        assert rows[long_ago.worker].expires_ms == long_ago.expires_ms
        assert rows[released.worker].owner is None
        assert store.worker_leases().acquire_worker("ids", "fresh", 8, treated_at, 3_000)
        taken = store.worker_leases().list_workers("ids")
        assert [lease.worker for lease in taken if lease.owner == "fresh"] != [lately.worker]
    finally:
        store.close()
        setup.close()


def test_an_estimated_ttl_is_capped(table: str) -> None:
    """A lease whose holder never issued reads as a huge ttl: it is kept at most the cap."""
    setup = store_on(table)
    leases = setup.worker_leases()
    now = int(time.time() * 1000)
    assert leases.acquire_worker("ids", "idle", 8, now, 3_000)  # last_ms 0
    pretend_the_rows_came_from_another_primary(setup)
    store = store_on(table)
    try:
        (lease,) = store.worker_leases().list_workers("ids")
        assert lease.expires_ms <= int(time.time() * 1000) + LEASE_PUSH_CAP_MS
    finally:
        store.close()
        setup.close()


def test_a_table_without_a_record_gets_one_on_the_next_connection(table: str) -> None:
    """A deployment made before the record (or by a migration) gets it lazily, unskipped."""
    setup = store_on(table)
    setup.create(SequenceConfig("orders", batch_count=10))
    a = setup.reserve("orders", 10)
    with setup.engine.begin() as connection:
        connection.exec_driver_sql(f"DROP TABLE {epoch_table_name(table)}")
    store = store_on(table)
    try:
        assert store.reserve("orders", 10).first == a.last + 1
        assert epoch(store)[2] == 0
    finally:
        store.close()
        setup.close()


def test_no_record_before_any_table_exists(tmp_path: Any) -> None:
    """A store that never made a table leaves no record behind (nothing to protect)."""
    name = unique_table("epoch")
    store = SQLStore(sql_url("postgres", tmp_path), table=name)
    try:
        assert store.read("orders") is None
        assert not sa.inspect(store.engine).has_table(epoch_table_name(name))
    finally:
        store.close()


@pytest.mark.parametrize("value", [-1, 1.5, "16", True])
def test_failover_skip_blocks_must_be_a_whole_number(value: object) -> None:
    """A bad margin is refused with the setting's name and what to give."""
    with pytest.raises(InvalidSequenceConfig, match="failover_skip_blocks"):
        SQLStore("sqlite://", failover_skip_blocks=value)  # type: ignore[arg-type]


def test_a_treatment_is_counted_in_metrics(table: str) -> None:
    """autoseq_failover_skipped_values_total and autoseq_failover_short_total move, per store."""
    from prometheus_client import CollectorRegistry

    from autoseq import metrics

    setup = store_on(table)
    setup.create(SequenceConfig("orders", batch_count=10))
    setup.create(SequenceConfig("serial", end=99, batch_count=10))
    pretend_the_rows_came_from_another_primary(setup)
    registry = CollectorRegistry()
    collector = metrics.AutoseqMetrics(registry=registry)
    store = store_on(table)
    try:
        store.reserve("orders", 10)
    finally:
        signals.failover_skipped.disconnect(collector._on_failover_skipped)
        store.close()
        setup.close()
    found = {
        (sample.name, sample.labels["sequence"]): sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name.startswith("autoseq_failover_")
    }
    orders = setup.read("orders")
    assert orders is not None
    assert found[("autoseq_failover_skipped_values_total", "orders")] == margin(
        orders, DEFAULT_SKIP_BLOCKS
    )
    assert found[("autoseq_failover_skipped_values_total", "serial")] == 99
    assert found[("autoseq_failover_short_total", "serial")] == 1
    assert ("autoseq_failover_short_total", "orders") not in found
