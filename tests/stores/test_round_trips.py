"""PostgreSQL: one round trip per reservation on a healthy connection, and a dead one replaced."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from backends import POSTGRES_URL, sql_url, unique_table
from reliability.faultproxy import FaultProxy

from autoseq import SequenceConfig
from autoseq.stores import SQLStore
from autoseq.stores.sql import _engine

pytestmark = pytest.mark.postgres


@pytest.fixture
def proxied() -> Iterator[tuple[FaultProxy, SQLStore]]:
    """A store reaching the local PostgreSQL through a proxy counting what it forwards."""
    url = sa.engine.make_url(sql_url("postgres", ""))
    proxy = FaultProxy(url.port or 5432)
    store = SQLStore(url.set(port=proxy.port), table=unique_table("trips"))
    store.create_table()
    store.create(SequenceConfig("orders"))
    yield proxy, store
    store.drop()
    store.close()
    proxy.close()


def test_a_reservation_is_one_round_trip(proxied: tuple[FaultProxy, SQLStore]) -> None:
    """Back-to-back reservations cost one request each: no ping, no SET, no BEGIN of their own."""
    proxy, store = proxied
    store.reserve("orders", 10)  # the connection is open and set up
    statements: list[str] = []
    sa.event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    before = proxy.chunks["up"]
    blocks = [store.reserve("orders", 10) for _ in range(40)]
    assert [block.first for block in blocks] == list(range(11, 411, 10))
    assert len(statements) == 40
    assert proxy.chunks["up"] - before == 40


def test_a_killed_connection_is_replaced_transparently(
    proxied: tuple[FaultProxy, SQLStore],
) -> None:
    """The server ends the store's connection: the next reservation still succeeds, in order."""
    _, store = proxied
    first = store.reserve("orders", 10)
    killed = _terminate(store)
    assert killed >= 1
    second = store.reserve("orders", 10)  # on the dead connection first, then a new one
    assert second.first == first.last + 1


def test_an_idle_dead_connection_is_replaced_for_every_operation(
    proxied: tuple[FaultProxy, SQLStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection that died while idle is pinged and replaced at checkout: reads work too."""
    monkeypatch.setattr(_engine, "IDLE_PING", 0.05)
    _, store = proxied
    store.reserve("orders", 10)
    assert _terminate(store) >= 1
    time.sleep(0.1)
    row = store.read("orders")
    assert row is not None
    assert row.next_value == 11


def _terminate(store: SQLStore) -> int:
    """End the server side of the connection ``store`` reuses; 1 if it was ended."""
    with store.engine.connect() as connection:
        pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
    with psycopg.connect(POSTGRES_URL.replace("+psycopg", ""), autocommit=True) as admin:
        row = admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
    return 1 if row and row[0] else 0
