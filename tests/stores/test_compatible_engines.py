"""PostgreSQL- and MySQL-compatible engines: recognised by what they support, conflicts retried.

None of CockroachDB, YugabyteDB or TiDB runs on this machine. What is proven
here: a dialect that speaks PostgreSQL under another name (registered below,
and CockroachDB's own when ``sqlalchemy-cockroachdb`` is importable) keeps
the one-statement reservation and the lock timeout, against the real local
PostgreSQL; and the conflict errors those engines document (SQLSTATE 40001;
TiDB's 8002, 8022, 8028, 9007) are retried, raised by the real driver's own
exception classes into a real reservation on MariaDB or PostgreSQL.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from backends import sql_url, unique_table
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

from autoseq import SequenceConfig
from autoseq.errors import ReservationConflict
from autoseq.stores import SQLStore


class LookalikeDialect(PGDialect_psycopg):
    """A PostgreSQL-compatible engine's dialect: PostgreSQL's, under its own name."""

    name = "lookalike"
    supports_statement_cache = True


registry.register("lookalike.psycopg", __name__, "LookalikeDialect")


@pytest.fixture
def lookalike() -> Iterator[SQLStore]:
    """A store on the local PostgreSQL through the look-alike dialect."""
    url = sa.engine.make_url(sql_url("postgres", "")).set(drivername="lookalike+psycopg")
    store = SQLStore(url, table=unique_table("alike"), statement_timeout=2.0)
    store.create_table()
    store.create(SequenceConfig("orders"))
    yield store
    store.drop()
    store.close()


@pytest.mark.postgres
def test_a_postgresql_compatible_dialect_keeps_the_one_statement_path(
    lookalike: SQLStore,
) -> None:
    """A dialect named otherwise that can UPDATE ... RETURNING reserves in one statement."""
    statements: list[str] = []
    sa.event.listen(lookalike.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    blocks = [lookalike.reserve("orders", 10) for _ in range(3)]
    assert [block.first for block in blocks] == [1, 11, 21]
    assert [s.split()[0] for s in statements] == ["UPDATE"] * 3
    assert "RETURNING" in statements[0]
    assert "set_config" in statements[0]  # the lock timeout rides in the statement


@pytest.mark.postgres
def test_a_postgresql_compatible_dialect_keeps_the_lock_timeout(lookalike: SQLStore) -> None:
    """A row held by a stuck transaction fails the wait cleanly within statement_timeout."""
    held = threading.Event()
    release = threading.Event()
    table = lookalike.table

    def hold() -> None:
        with lookalike.engine.begin() as connection:
            connection.execute(sa.select(table).where(table.c.name == "orders").with_for_update())
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        with pytest.raises(ReservationConflict, match="waiting too long on the row's lock"):
            lookalike.reserve("orders", 10)
    finally:
        release.set()
        holder.join(30)


def test_cockroachdb_dialect_is_recognised_by_its_capabilities() -> None:
    """CockroachDB's own dialect (sqlalchemy-cockroachdb) gets the one-statement path."""
    pytest.importorskip("sqlalchemy_cockroachdb", reason="sqlalchemy-cockroachdb not installed")
    store = SQLStore("cockroachdb+psycopg://root@127.0.0.1:1/db", table="sys_sequence")
    try:
        assert store.engine.dialect.name == "cockroachdb"
        statement = store._one_statement
        assert statement is not None
        text = str(statement.compile(dialect=store.engine.dialect))
        assert text.startswith("UPDATE")
        assert "RETURNING" in text
        assert "set_config" in text
    finally:
        store.close()


def _fail_first(engine: sa.Engine, error: BaseException, word: str) -> list[str]:
    """Make the first statement starting with ``word`` raise ``error`` from the driver."""
    raised: list[str] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def _raise(*args: Any) -> None:
        if not raised and args[2].lstrip().upper().startswith(word):
            raised.append(args[2])
            raise error

    return raised


@pytest.mark.mysql
@pytest.mark.parametrize(
    ("code", "message"),
    [
        (9007, "Write conflict, txnStartTS=1, conflictStartTS=2 [try again later]"),
        (8002, "[tikv:8002]can not retry select for update statement"),
        (8022, "Error: KV error safe to retry ... [try again later]"),
        (8028, "Information schema is changed during the execution of the statement"),
        (1213, "Deadlock found when trying to get lock; try restarting transaction"),
    ],
)
def test_tidb_conflicts_are_retried(code: int, message: str, tmp_path: Any) -> None:
    """A TiDB optimistic conflict (the driver's error with its code) mid-reservation is retried.

    The error is the engine's own driver's class (``dialect.loaded_dbapi``): in a
    full run Django's settings install PyMySQL as ``MySQLdb``, and a class from
    another import of the driver would not be the driver's error at all.
    """
    store = SQLStore(sql_url("mysql", tmp_path), table=unique_table("tidb"))
    store.create_table()
    store.create(SequenceConfig("orders"))
    try:
        driver = store.engine.dialect.loaded_dbapi
        raised = _fail_first(store.engine, driver.OperationalError(code, message), "UPDATE")
        block = store.reserve("orders", 10)
        assert raised, "the conflict was never raised"
        assert (block.first, block.last) == (1, 10)
        assert store.read("orders").next_value == 11  # type: ignore[union-attr]
    finally:
        store.drop()
        store.close()


@pytest.mark.postgres
@pytest.mark.parametrize("sqlstate", ["40001", "40P01", "55P03"])
def test_postgresql_family_conflicts_are_retried(sqlstate: str, tmp_path: Any) -> None:
    """SQLSTATE 40001 (CockroachDB's and YugabyteDB's "restart transaction") is retried."""
    import psycopg

    store = SQLStore(sql_url("postgres", tmp_path), table=unique_table("crdb"))
    store.create_table()
    store.create(SequenceConfig("orders"))
    try:
        error = psycopg.errors.lookup(sqlstate)("restart transaction: TransactionRetryError")
        raised = _fail_first(store.engine, error, "UPDATE")
        block = store.reserve("orders", 10)
        assert raised
        assert (block.first, block.last) == (1, 10)
    finally:
        store.drop()
        store.close()


def test_psycopg2_pgcode_is_read(tmp_path: Any) -> None:
    """psycopg2 (CockroachDB's default driver) carries the SQLSTATE as pgcode: retried too."""
    psycopg2 = pytest.importorskip("psycopg2", reason="psycopg2 not installed")
    from autoseq.stores.sql._statements import retryable

    class Retry(psycopg2.errors.SerializationFailure):  # type: ignore[misc,name-defined]
        pgcode = "40001"

    error = sa.exc.DBAPIError.instance("UPDATE", {}, Retry(), psycopg2.Error)
    assert retryable(error)
