"""Gapless serials: each value taken in the caller's transaction, given back on rollback."""

from __future__ import annotations

import contextlib
import multiprocessing
import random
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from backends import unique_table
from sqlalchemy.orm import Session

from autoseq import (
    GaplessUnavailable,
    SequenceConfig,
    SequenceExhausted,
    Serial,
)
from autoseq.errors import InvalidCount
from autoseq.lock import MAX_MANY
from autoseq.stores import SQLStore
from autoseq.stores.sql import gapless


@pytest.fixture
def store(db_url: str) -> Iterator[SQLStore]:
    """A SQLStore on each SQL backend, its table dropped afterwards."""
    sql = SQLStore(db_url, table=unique_table())
    sql.create_table()
    yield sql
    sql.drop()
    sql.close()


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    """The application's own engine on the same database."""
    app = _engine(db_url)
    yield app
    app.dispose()


def _engine(url: str) -> sa.Engine:
    if url.startswith("sqlite"):
        return sa.create_engine(url, connect_args={"timeout": 60})
    return sa.create_engine(url)


def _numbers_table(name: str) -> sa.Table:
    return sa.Table(
        name,
        sa.MetaData(),
        sa.Column("serial", sa.String(40), primary_key=True),
        sa.Column("pid", sa.Integer),
    )


def test_a_rollback_gives_the_number_back(store: SQLStore, engine: sa.Engine) -> None:
    """A value taken in a rolled-back transaction is handed out again."""
    serial = Serial(store, "inv", "G{n:05d}", gapless=True)
    with engine.begin() as connection:
        assert serial.next(connection) == "G00001"
    with engine.connect() as connection:
        assert serial.next(connection) == "G00002"
        connection.rollback()
    with engine.begin() as connection:
        assert serial.next(connection) == "G00002"
        assert serial.next_many(2, connection) == ["G00003", "G00004"]
    # Gapless rows are never buffered: the row's current is the next value.
    with engine.connect() as connection:
        table = sa.table("sys_sequence", sa.column("name"), sa.column("current"))
        # On SQLite gapless rows live in the application's file, in <table>_gapless.
        sqlite = engine.dialect.name == "sqlite"
        table.name = gapless.sqlite_table(store).name if sqlite else store.table_name
        current = connection.execute(
            sa.select(table.c.current).where(table.c.name == "inv")
        ).scalar()
    assert current == 5


class _FormatCursor(contextlib.closing[Any]):
    """A DB-API cursor taking ``%s`` parameters everywhere, as Django's cursors do (sqlite3
    takes ``?``: converted as Django's SQLite cursor converts them)."""

    def __init__(self, cursor: Any, dialect: str) -> None:
        super().__init__(cursor)
        self.cursor, self.dialect = cursor, dialect

    def __enter__(self) -> Any:
        return self

    def execute(self, sql: str, args: Any) -> Any:
        if self.dialect == "sqlite":
            sql = re.sub(r"(?<!%)%s", "?", sql).replace("%%", "%")
        return self.cursor.execute(sql, args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cursor, name)


def test_a_dbapi_cursor_runs_the_same_take_in_its_own_transaction(
    store: SQLStore, engine: sa.Engine
) -> None:
    """The store's statements on a bare DB-API cursor (``cursor_run``, as autoseq_django runs
    them on Django's): values in that connection's transaction, a rollback gives them back,
    and the row's reads, restart and delete are the same statements."""
    dialect = "mysql" if engine.dialect.name == "mariadb" else engine.dialect.name
    raw = engine.raw_connection()
    try:
        run = gapless.cursor_run(lambda: _FormatCursor(raw.cursor(), dialect), dialect)
        table = gapless.gapless_table(store, dialect)
        config = SequenceConfig("dbapi")
        assert gapless.take_with(run, dialect, store, table, config, 1) == [1]
        assert gapless.take_with(run, dialect, store, table, config, 3) == [2, 3, 4]
        raw.rollback()
        assert gapless.take_with(run, dialect, store, table, config, 1) == [1]
        raw.commit()
        row = gapless.read_row(run, table, "dbapi")
        assert row is not None
        assert row["current"] == 2
        assert not gapless.restart_untouched_row(run, table, SequenceConfig("dbapi", start=50))
        assert gapless.read_row(run, table, "dbapi", delete=True) is not None
        gapless.create_row(run, table, SequenceConfig("dbapi", start=50))
        assert gapless.restart_untouched_row(run, table, SequenceConfig("dbapi", start=70))
        raw.commit()
        row = gapless.read_row(run, table, "dbapi")
        assert row is not None
        assert (row["start"], row["current"]) == (70, 70)
        raw.commit()
    finally:
        raw.close()


def test_a_session_is_the_transaction(store: SQLStore, engine: sa.Engine) -> None:
    """An ORM Session can be passed: its transaction holds the number."""
    serial = Serial(store, "s", "S{n}", gapless=True)
    with Session(engine) as session:
        assert serial.next(session) == "S1"
        session.rollback()
        assert serial.next(session) == "S1"
        session.commit()
    with Session(engine) as session, session.begin():
        assert serial.next(session) == "S2"


def test_gapless_periods_use_one_row_each(store: SQLStore, engine: sa.Engine) -> None:
    """A gapless yearly serial restarts at 1 in a new year, in its own row."""
    clock_now = [datetime(2026, 12, 31, 23, 0, tzinfo=UTC)]
    serial = Serial(
        store, "y", "INV-{date:%Y}-{n:04d}", period="year", gapless=True, clock=lambda: clock_now[0]
    )
    with engine.begin() as connection:
        assert serial.next(connection) == "INV-2026-0001"
        clock_now[0] = datetime(2027, 1, 1, 0, 0, tzinfo=UTC)
        assert serial.next(connection) == "INV-2027-0001"


def test_gapless_width_overflow_raises_and_cycle_wraps(store: SQLStore, engine: sa.Engine) -> None:
    """{n:01d} ends at 9: then SequenceExhausted, or with cycle=True back to start."""
    ending = Serial(store, "e", "E{n:01d}", start=8, gapless=True)
    cycling = Serial(store, "c", "C{n:01d}", start=8, gapless=True, cycle=True)
    with engine.begin() as connection:
        assert [ending.next(connection) for _ in range(2)] == ["E8", "E9"]
        assert [cycling.next(connection) for _ in range(3)] == ["C8", "C9", "C8"]
    with engine.begin() as connection, pytest.raises(SequenceExhausted):
        ending.next(connection)


def test_no_transaction_is_refused(store: SQLStore, engine: sa.Engine) -> None:
    """Without a connection, or in AUTOCOMMIT, a gapless value is refused, never taken."""
    serial = Serial(store, "r", "R{n}", gapless=True)
    with pytest.raises(GaplessUnavailable, match="pass the caller's transaction"):
        serial.next()
    auto = engine.execution_options(isolation_level="AUTOCOMMIT")
    with auto.connect() as connection, pytest.raises(GaplessUnavailable, match="AUTOCOMMIT"):
        serial.next(connection)


def test_a_connection_to_another_database_is_refused(
    store: SQLStore, tmp_path: Any, engine: sa.Engine
) -> None:
    """The caller's connection must reach the store's database."""
    other = sa.create_engine(f"sqlite:///{tmp_path / 'other.db'}")
    serial = Serial(store, "o", "O{n}", gapless=True)
    with other.begin() as connection:
        if store.dialect == "sqlite" and str(store.app_url) == str(other.url):
            pytest.skip("same file")
        with pytest.raises(GaplessUnavailable, match="use one database for both"):
            serial.next(connection)
    other.dispose()


def _gapless_writer(url: str, table: str, numbers: str, seed: int, count: int) -> None:
    store = SQLStore(url, table=table)
    engine = _engine(url)
    serial = Serial(store, "g", "G{n:06d}", gapless=True)
    data = _numbers_table(numbers)
    rng = random.Random(seed)
    import os

    for _ in range(count):
        with engine.connect() as connection:
            value = serial.next(connection)
            connection.execute(sa.insert(data).values(serial=value, pid=os.getpid()))
            if rng.random() < 0.3:
                connection.rollback()
            else:
                connection.commit()
    engine.dispose()
    store.close()


def test_six_processes_with_random_rollbacks_commit_exactly_one_to_k(
    store: SQLStore, engine: sa.Engine, db_url: str
) -> None:
    """6 processes, 30% of transactions rolled back: committed serials are exactly 1..K."""
    numbers = unique_table("numbers")
    data = _numbers_table(numbers)
    data.create(engine)
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(target=_gapless_writer, args=(db_url, store.table_name, numbers, seed, 25))
        for seed in range(6)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    with engine.connect() as connection:
        rows = connection.execute(sa.select(data.c.serial, data.c.pid)).all()
    data.drop(engine)
    counters = sorted(int(serial[1:]) for serial, _ in rows)
    assert 6 * 25 * 0.4 < len(counters) < 6 * 25
    assert counters == list(range(1, len(counters) + 1))
    assert len({pid for _, pid in rows}) == 6


def test_each_value_is_one_statement_on_the_callers_connection(
    store: SQLStore, engine: sa.Engine
) -> None:
    """Once the row exists, each gapless value costs the caller one statement, on every backend.

    MariaDB has no UPDATE ... RETURNING: the new current comes back through
    LAST_INSERT_ID(expr) in the UPDATE's own reply, not from a second read.
    """
    serial = Serial(store, "one", "O{n:04d}", gapless=True)
    statements: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    with engine.begin() as connection:
        assert serial.next(connection) == "O0001"  # creates the row
    sa.event.listen(engine, "before_cursor_execute", note)
    try:
        with engine.begin() as connection:
            assert [serial.next(connection) for _ in range(3)] == ["O0002", "O0003", "O0004"]
    finally:
        sa.event.remove(engine, "before_cursor_execute", note)
    assert len(statements) == 3, statements


def test_a_row_whose_step_changed_is_served_with_the_rows_step(
    store: SQLStore, engine: sa.Engine
) -> None:
    """The one-statement take assumes the configured step; a row edited to another step is
    still served by the row (its own step), one value or several at a time."""
    serial = Serial(store, "st", "S{n}", gapless=True)
    with engine.begin() as connection:
        assert serial.next(connection) == "S1"
    table = gapless.gapless_table(store, engine.dialect.name)
    with engine.begin() as connection:
        connection.execute(sa.update(table).where(table.c.name == "st").values(step=5, current=6))
    with engine.begin() as connection:
        assert serial.next(connection) == "S6"
        assert serial.next_many(2, connection) == ["S11", "S16"]
        assert serial.next(connection) == "S21"


def test_a_second_store_on_the_same_database_does_not_wait_on_the_callers_lock(
    store: SQLStore, engine: sa.Engine, db_url: str
) -> None:
    """A transaction holding a gapless row goes on through another store object of that database.

    A store made anew (Django builds one after a settings change, an
    application may build one per request) does not know the row exists;
    creating it again on the store's own connection would wait on the row
    lock the caller's transaction holds, that is on itself.
    """
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite gapless rows are created in the caller's transaction")
    config = SequenceConfig("again")
    other = SQLStore(db_url, table=store.table_name)
    taken: list[list[int]] = []
    errors: list[BaseException] = []
    connection = engine.connect()
    try:
        connection.begin()
        assert gapless.take(connection, store, config) == [1]

        def second() -> None:
            try:
                taken.append(gapless.take(connection, other, config))
            except BaseException as exc:  # reported below
                errors.append(exc)

        worker = threading.Thread(target=second, daemon=True)
        worker.start()
        worker.join(10)
        waited = worker.is_alive()
        if waited:
            connection.rollback()  # the lock goes: the worker can finish
            worker.join(30)
        assert not waited, "the second store waited on the caller's own row lock"
        assert not errors, errors
        assert taken == [[2]]
        connection.commit()
    finally:
        connection.close()
        other.close()


@pytest.mark.parametrize("count", [10**12, MAX_MANY + 1, -1, 2.0, True])
def test_a_count_out_of_bounds_is_refused_before_anything_is_written(
    store: SQLStore, engine: sa.Engine, count: Any
) -> None:
    """A gapless count outside 0..MAX_MANY (or 1..MAX_MANY for take) is InvalidCount; no row."""
    serial = Serial(store, "huge", "H{n}", gapless=True)
    config = SequenceConfig("huge-take", gapless=True)
    with engine.connect() as connection:
        with pytest.raises(InvalidCount):
            serial.next_many(count, connection)
        with pytest.raises(InvalidCount):
            gapless.take(connection, store, config, count)
        connection.rollback()
    assert store.read("huge") is None
    assert store.read("huge-take") is None
    with engine.begin() as connection:
        assert serial.next_many(2, connection) == ["H1", "H2"]


def test_a_gapless_row_with_a_flag_edited_by_hand_is_refused(
    store: SQLStore, engine: sa.Engine, sql_backend: str
) -> None:
    """cycle = 'false' (SQLite) or 2 (MariaDB) on a gapless row: the next take is refused."""
    from autoseq.errors import InvalidStoredRow

    if sql_backend == "postgres":
        pytest.skip("a PostgreSQL BOOLEAN column holds only true and false")
    serial = Serial(store, "edited", "E{n}", gapless=True)
    with engine.begin() as connection:
        taken = serial.next_many(3, connection)
    table = gapless.gapless_table(store, engine.dialect.name)
    literal = "'false'" if sql_backend == "sqlite" else "2"
    quote = engine.dialect.identifier_preparer.quote
    with engine.begin() as connection:
        connection.exec_driver_sql(f"UPDATE {quote(table.name)} SET {quote('cycle')} = {literal}")
    with engine.begin() as connection, pytest.raises(InvalidStoredRow, match="cycle must be"):
        taken.append(serial.next(connection))
    assert taken == ["E1", "E2", "E3"]


def test_set_while_threads_commit_gapless_numbers_moves_the_serial_without_a_repeat(
    store: SQLStore, engine: sa.Engine
) -> None:
    """4 threads commit gapless numbers while `set` moves the row: two unbroken runs, no repeat.

    On SQLite the row is in the application's file, which the store writes too.
    """
    from autoseq import maintenance

    numbers = sa.Table(
        unique_table("nums"), sa.MetaData(), sa.Column("n", sa.BigInteger, nullable=False)
    )
    numbers.create(engine)
    serial = Serial(store, "moved", "{n}", gapless=True)
    committed, moved = threading.Event(), threading.Event()

    def writer() -> None:
        for index in range(25):
            if index == 10:
                assert moved.wait(60)  # the rest after the set, however the threads ran
            with engine.begin() as connection:
                value = int(serial.next(connection))
                connection.execute(sa.insert(numbers).values(n=value))
            committed.set()
            time.sleep(0.002)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        assert committed.wait(30)
        maintenance.set_current(store, "moved", 1000)  # while writers are in their first ten
        moved.set()
        for thread in threads:
            thread.join(120)
        with engine.connect() as connection:
            values = sorted(connection.execute(sa.select(numbers.c.n)).scalars())
    finally:
        moved.set()
        numbers.drop(engine)
    assert len(values) == 100
    assert len(set(values)) == 100, "a gapless number was committed twice"
    before = [v for v in values if v < 1000]
    after = [v for v in values if v >= 1000]
    assert before == list(range(1, len(before) + 1))
    assert after == list(range(1000, 1000 + len(after)))
    assert len(after) >= 60  # every thread's last 15, at least
