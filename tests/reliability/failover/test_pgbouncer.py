"""PostgreSQL behind PgBouncer in transaction pooling mode: every reservation works, none twice."""

from __future__ import annotations

import multiprocessing
from collections import Counter

import psycopg
import pytest
import sqlalchemy as sa
from backends import unique_table

from autoseq import SequenceConfig
from autoseq.errors import AutoseqError
from autoseq.stores import SQLStore
from autoseq.stores.sql.workers import SQLWorkers

from .servers import PgBouncer

pytestmark = pytest.mark.postgres

PROCESSES = 6
RESERVATIONS = 150


def _reserve_many(url: str, table: str) -> tuple[list[tuple[int, int]], list[str]]:
    """In a child process: a store of its own reserving ``RESERVATIONS`` blocks of 10."""
    store = SQLStore(url, table=table, statement_timeout=20.0)
    blocks: list[tuple[int, int]] = []
    failures: list[str] = []
    for _ in range(RESERVATIONS):
        try:
            block = store.reserve("orders", 10)
        except AutoseqError as exc:
            failures.append(str(exc).splitlines()[0][:200])
            continue
        blocks.append((block.first, block.last))
    store.close()
    return blocks, failures


def test_processes_reserving_through_transaction_pooling_fail_none(pgbouncer: PgBouncer) -> None:
    """Processes reserving through PgBouncer (transaction pooling): 0 failures, 0 values twice."""
    table = unique_table("bouncer")
    setup = SQLStore(pgbouncer.url(), table=table)
    setup.create_table()
    setup.create(SequenceConfig("orders"))
    try:
        with multiprocessing.get_context("fork").Pool(PROCESSES) as pool:
            results = pool.starmap(_reserve_many, [(pgbouncer.url(), table)] * PROCESSES)
        failures = [text for _, failed in results for text in failed]
        values = Counter(
            value for blocks, _ in results for low, high in blocks for value in range(low, high + 1)
        )
        reservations = PROCESSES * RESERVATIONS
        print(f"pgbouncer: {reservations - len(failures)} of {reservations} reservations served")
        assert failures == [], f"{len(failures)} of {reservations} failed: {Counter(failures)}"
        assert sum(values.values()) == reservations * 10
        assert [value for value, n in values.items() if n > 1] == []
    finally:
        setup.drop()
        setup.close()


def test_leases_through_transaction_pooling(pgbouncer: PgBouncer) -> None:
    """Snowflake worker leases are taken, renewed and released through PgBouncer."""
    store = SQLStore(pgbouncer.url(), table=unique_table("bouncer"))
    workers = SQLWorkers(store)
    try:
        leases = [workers.acquire_worker("ids", f"owner-{n}", 8, 1_000, 60_000) for n in range(8)]
        assert sorted(lease.worker for lease in leases if lease is not None) == list(range(8))
        for now in range(2_000, 8_000, 1_000):
            leases = [workers.renew_worker(lease, now, 60_000, now) for lease in leases if lease]
            assert all(lease is not None for lease in leases)
        assert all(workers.release_worker(lease, 9_000) for lease in leases if lease)
    finally:
        workers.drop_table()
        store.close()


def test_store_takes_the_application_engines_connect_args(pgbouncer: PgBouncer) -> None:
    """SQLStore(engine) connects with the engine's connect_args (here an application_name)."""
    engine = sa.create_engine(
        pgbouncer.url(), connect_args={"application_name": "autoseq-app", "prepare_threshold": None}
    )
    store = SQLStore(engine, table=unique_table("bouncer"))
    try:
        with store.engine.connect() as connection:
            name = connection.exec_driver_sql("SHOW application_name").scalar()
        assert name == "autoseq-app"
    finally:
        store.close()
        engine.dispose()


@pytest.mark.parametrize("given", ["url", "engine"])
@pytest.mark.parametrize("value", ["None", "none", "0", "5"])
def test_prepare_threshold_in_the_url_is_understood(
    pgbouncer: PgBouncer, value: str, given: str
) -> None:
    """A URL's ?prepare_threshold=... (None or a number) works instead of raising TypeError."""
    table = unique_table("bouncer")
    url = pgbouncer.url(query=f"prepare_threshold={value}")
    store = SQLStore(url if given == "url" else sa.create_engine(url), table=table)
    try:
        store.create_table()
        store.create(SequenceConfig("orders"))
        blocks = [store.reserve("orders", 10) for _ in range(12)]
        assert [block.first for block in blocks] == list(range(1, 121, 10))
    finally:
        store.drop()
        store.close()


def test_store_sessions_leave_no_setting_on_shared_server_connections(
    pgbouncer: PgBouncer,
) -> None:
    """The store's settings are per transaction: a pooled server connection keeps none of them."""
    store = SQLStore(pgbouncer.url(), table=unique_table("bouncer"), synchronous_commit="local")
    try:
        store.create_table()
        store.create(SequenceConfig("orders"))
        for _ in range(20):
            store.reserve("orders", 10)
        # A plain client on the same few server connections sees the server's defaults.
        with psycopg.connect(pgbouncer.url().replace("+psycopg", ""), autocommit=True) as plain:
            for _ in range(8):
                assert plain.execute("SHOW synchronous_commit").fetchone() == ("on",)
                assert plain.execute("SHOW lock_timeout").fetchone() == ("0",)
    finally:
        store.drop()
        store.close()
