"""The store contract on SQLStore: SQLite (file), PostgreSQL and MariaDB."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import pytest
import sqlalchemy as sa

from autoseq import SequenceConfig
from autoseq.stores import SQLStore
from autoseq.testing.contract import MaintenanceContract, StoreContract


def _closed(url: str, tmp_path: Any) -> str:
    """``url`` pointed where nothing answers: a closed port; SQLite: folders, not files."""
    if url.startswith("sqlite"):
        for name in ("broken.db", "broken.db.autoseq"):
            os.mkdir(os.path.join(tmp_path, name))
        return f"sqlite:///{tmp_path}/broken.db"
    return str(sa.make_url(url).set(host="127.0.0.1", port=1))


class TestSQLStore(StoreContract):
    @pytest.fixture
    def store(self, sql_store: Any) -> Any:
        return sql_store

    @pytest.fixture
    def unavailable_store(self, db_url: str, tmp_path: Any) -> Any:
        store = SQLStore(_closed(db_url, tmp_path), connect_timeout=1)
        yield store
        store.close()

    def forget_worker_leases(self, leases: Any) -> None:
        leases.drop_table()


class TestSQLMaintenance(MaintenanceContract):
    @pytest.fixture
    def store(self, sql_store: Any) -> Any:
        return sql_store

    def corrupt(self, store: Any, name: str, **fields: Any) -> None:
        if any(isinstance(value, float) for value in fields.values()):
            pytest.skip("a BIGINT column stores a whole float as an integer")
        with store.engine.begin() as connection:
            connection.execute(
                sa.update(store.table).where(store.table.c.name == name).values(**fields)
            )


def test_a_table_without_version_is_upgraded_in_place(db_url: str) -> None:
    """A sys_sequence made before versions gains the column; its rows read as version 0."""
    from backends import unique_table

    name = unique_table()
    old = SQLStore(db_url, table=name)
    engine = old.engine
    columns = [
        sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
        for c in old.table.columns
        if c.name != "version"
    ]
    legacy = sa.Table(name, sa.MetaData(), *columns)
    legacy.create(engine)
    try:
        with engine.begin() as connection:
            row = SequenceConfig("kept", current=41).as_row()
            del row["version"]
            connection.execute(sa.insert(legacy).values(row))
        store = SQLStore(db_url, table=name)
        row = store.read("kept")
        assert row is not None
        assert (row.current, row.version) == (41, 0)
        block = store.reserve("kept", 10)
        assert (block.first, block.version) == (41, 1)
        assert "version" in {c["name"] for c in sa.inspect(store.engine).get_columns(name)}
        store.close()
    finally:
        legacy.drop(engine)
        old.close()


def test_two_paths_to_one_sqlite_file_share_one_companion(tmp_path: Any) -> None:
    """A symlinked directory and the real one find the same companion: no value twice."""
    real = tmp_path / "releases" / "v1"
    real.mkdir(parents=True)
    link = tmp_path / "current"
    link.symlink_to(real, target_is_directory=True)
    a = SQLStore(f"sqlite:///{real / 'app.db'}")
    b = SQLStore(f"sqlite:///{link / 'app.db'}")
    try:
        a.create(SequenceConfig("orders"))
        b.create(SequenceConfig("orders"))
        seen = list(a.reserve("orders", 10).values()) + list(b.reserve("orders", 10).values())
        assert len(seen) == len(set(seen)) == 20
        assert a.url.database == b.url.database == str(real / "app.db") + ".autoseq"
    finally:
        a.close()
        b.close()


def _switch_new_files_to_wal(paths: list[str], barrier: Any, results: Any) -> None:
    import sqlite3

    from autoseq.stores.sql._engine import enable_wal

    failures = []
    for path in paths:
        connection = sqlite3.connect(path, timeout=30, isolation_level=None)
        barrier.wait()
        try:
            enable_wal(connection, 30)
            connection.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
        except sqlite3.Error as exc:  # reported to the test, which names it
            failures.append(f"{path}: {type(exc).__name__}: {exc}")
        finally:
            connection.close()
    results.put(failures)


def test_processes_switching_a_new_sqlite_file_to_wal_together_all_succeed(tmp_path: Any) -> None:
    """Six processes switch 20 new SQLite files to WAL in lockstep: no "database is locked".

    Two connections that both read the file and both ask for it to themselves
    are a deadlock SQLite breaks at once, busy timeout or not: the race that
    once failed a process opening a new companion file in CI.
    """
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    paths = [str(tmp_path / f"app{i}.db.autoseq") for i in range(20)]
    barrier, results = spawn.Barrier(6), spawn.Queue()
    workers = [
        spawn.Process(target=_switch_new_files_to_wal, args=(paths, barrier, results))
        for _ in range(6)
    ]
    for worker in workers:
        worker.start()
    failures = [failure for _ in workers for failure in results.get(timeout=120)]
    for worker in workers:
        worker.join(timeout=30)
    assert failures == []
    assert [worker.exitcode for worker in workers] == [0] * 6


def _statements(store: Any) -> list[str]:
    """Every SQL statement the store's engine sends from now on (first words, upper case)."""
    from sqlalchemy import event

    sent: list[str] = []

    @event.listens_for(store.engine, "before_cursor_execute")
    def _record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(" ".join(statement.split()).upper())

    return sent


def test_an_ordinary_reservation_is_one_statement(sql_store: Any, sql_backend: str) -> None:
    """PostgreSQL and SQLite reserve with one UPDATE ... RETURNING; MariaDB locks the row first."""
    from autoseq import SequenceConfig

    sql_store.create(SequenceConfig("one-statement", start=10, step=5))
    sent = _statements(sql_store)
    block = sql_store.reserve("one-statement", 100)
    sent = list(sent)
    assert (block.first, block.last, block.step, block.count) == (10, 505, 5, 100)
    assert block.row.current == 510
    assert sql_store.read("one-statement").current == 510
    data = [s for s in sent if not s.startswith(("SELECT 1", "BEGIN", "COMMIT"))]
    if sql_backend == "mysql":
        assert [s.split()[0] for s in data] == ["SELECT", "UPDATE"]
        assert "FOR UPDATE" in data[0]
    else:
        assert len(data) == 1, data
        assert data[0].startswith("UPDATE")
        assert "RETURNING" in data[0]


@pytest.mark.parametrize(
    ("config", "count", "expected"),
    [
        # the last values before end: a partial block
        ({"start": 1, "end": 30, "step": 10}, 5, (1, 21, 31)),
        # a cycling row never takes the one-statement path
        ({"start": 1, "end": 3, "cycle": True, "current": 3}, 2, (3, 3, 4)),
        # a negative start: the one-statement path stays off, the row lock serves it
        ({"start": -(2**62), "step": 2**61}, 3, (-(2**62), 0, 2**61)),
        # steps so large that count * step leaves BIGINT: only the values that fit
        ({"start": 0, "step": 2**61}, 10, (0, 2**62, 2**62 + 2**61)),
    ],
    ids=["partial-at-end", "cycle", "negative-start", "huge-step"],
)
def test_rows_the_one_statement_cannot_take_are_served_under_the_row_lock(
    sql_store: Any, config: dict[str, Any], count: int, expected: tuple[int, int, int]
) -> None:
    """Rows the UPDATE ... RETURNING cannot take still get exactly plan_reservation's block."""
    from autoseq import SequenceConfig
    from autoseq.stores.base import plan_reservation

    created = sql_store.create(SequenceConfig("edge", **config))
    planned, _ = plan_reservation(created, count)
    block = sql_store.reserve("edge", count)
    assert (block.first, block.last, block.step) == (planned.first, planned.last, planned.step)
    first, last, current = expected
    assert (block.first, block.last) == (first, last)
    assert sql_store.read("edge").current == current


def test_driver_errors_become_store_unavailable_saying_what_and_why() -> None:
    """An unreachable server: StoreUnavailable with the operation and the driver's reason."""
    import socket

    from autoseq import StoreUnavailable

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = SQLStore(f"postgresql+psycopg://postgres@127.0.0.1:{port}/x", statement_timeout=2)
    for operation, call in (
        ("upgrade_table", lambda: store.reserve("orders", 10)),
        ("create_table", store.create_table),
    ):
        with pytest.raises(StoreUnavailable, match=r"127\.0\.0\.1") as caught:
            call()
        assert caught.value.operation == operation
        assert caught.value.reason is not None
        assert caught.value.reason.startswith("OperationalError: ")
        assert caught.value.reason in str(caught.value)
        assert isinstance(caught.value.__cause__, sa.exc.OperationalError)
    store.close()


def test_a_column_dropped_by_another_connection_is_added_back(tmp_path: Any) -> None:
    """A pooled SQLite connection whose schema predates the drop still adds the column.

    SQLite checks ADD COLUMN against the connection's cached schema, so a
    connection that last saw ``version`` refuses it as a duplicate until the
    schema is read again (migration 0002 after a rollback to 0001 met this).
    """
    import sqlite3

    store = SQLStore(f"sqlite:///{tmp_path / 'app.db'}")
    store.create(SequenceConfig("kept", current=7))
    with contextlib.ExitStack() as stack:
        # Every pooled connection caches the schema: whichever one the
        # upgrade is lent last saw the column.
        for _ in range(store.engine.pool.size()):
            connection = stack.enter_context(store.engine.connect())
            connection.execute(sa.select(store.table.c.version)).all()
            connection.rollback()
    other = sqlite3.connect(store.engine.url.database or "", isolation_level=None)
    other.execute("ALTER TABLE sys_sequence DROP COLUMN version")
    other.close()
    store.create_table()
    row = store.read("kept")
    assert row is not None
    assert (row.current, row.version) == (7, 0)
    store.close()


#: Hand edits a flag column can hold, by backend (PostgreSQL's BOOLEAN holds none).
FLAG_EDITS = {"sqlite": ("'false'", "'no'", "2"), "mysql": ("2",), "postgres": ()}


def _edit_flag(store: Any, name: str, column: str, literal: str) -> None:
    """Write ``literal`` into a flag column as a person at a SQL prompt would."""
    quote = store.engine.dialect.identifier_preparer.quote
    with store.engine.begin() as connection:
        connection.exec_driver_sql(
            f"UPDATE {quote(store.table_name)} SET {quote(column)} = {literal} "
            f"WHERE {quote('name')} = '{name}'"
        )


def _flag_edits(sql_backend: str) -> tuple[str, ...]:
    if not FLAG_EDITS[sql_backend]:
        pytest.skip(f"a {sql_backend} BOOLEAN column holds only true and false")
    return FLAG_EDITS[sql_backend]


def test_a_cycle_flag_edited_to_text_is_refused_instead_of_wrapping(
    sql_store: Any, sql_backend: str
) -> None:
    """cycle edited to 'false', 'no' or 2: refused at the next reservation, no value twice."""
    from autoseq import SequenceRegistry
    from autoseq.errors import InvalidStoredRow

    for number, literal in enumerate(_flag_edits(sql_backend)):
        name = f"edited{number}"
        registry = SequenceRegistry(sql_store)
        lock = registry.register(SequenceConfig(name, end=100, batch_count=10))
        served = [lock.next() for _ in range(50)]
        _edit_flag(sql_store, name, "cycle", literal)
        refused: InvalidStoredRow | None = None
        try:
            for _ in range(100):
                served.append(lock.next())
        except InvalidStoredRow as exc:
            refused = exc
        registry.close()
        duplicates = len(served) - len(set(served))
        assert duplicates == 0, f"cycle = {literal}: {duplicates} values handed out twice"
        assert refused is not None
        assert f"row '{name}' is invalid: cycle must be" in str(refused)


@pytest.mark.parametrize("column", ["batch", "cycle"])
def test_a_flag_edited_by_hand_is_refused_before_any_write(
    sql_store: Any, sql_backend: str, column: str
) -> None:
    """A reservation of a row whose flag holds text or 2 raises InvalidStoredRow; the row stays."""
    from autoseq.errors import InvalidStoredRow

    for number, literal in enumerate(_flag_edits(sql_backend)):
        name = f"edited{number}"
        sql_store.create(SequenceConfig(name, current=41))
        _edit_flag(sql_store, name, column, literal)
        before = sql_store.read_raw(name)
        with pytest.raises(InvalidStoredRow, match=f"row '{name}' is invalid: {column} must be"):
            sql_store.reserve(name, 10)
        with pytest.raises(InvalidStoredRow):
            sql_store.read(name)
        assert sql_store.read_raw(name) == before, f"{column} = {literal}: the row was written"


@pytest.mark.mysql
def test_an_older_mariadb_table_is_upgraded_so_names_differing_in_case_are_two_rows(
    tmp_path: Any,
) -> None:
    """A table whose names fold case (older autoseq): the store makes them binary, once.

    Before, creating ``Orders`` beside ``orders`` returned the ``orders`` row
    and its start was silently ignored.
    """
    from backends import sql_url, unique_table

    from autoseq.stores.sql import sequence_table
    from autoseq.stores.sql.workers import SQLWorkers, worker_table

    url = sql_url("mysql", tmp_path)
    name = unique_table()
    engine = sa.create_engine(url)
    legacy = sa.MetaData()
    for table in (sequence_table(name, legacy), worker_table(f"{name}_worker", legacy)):
        table.c.name.type = sa.String(191)  # the server's default collation
    legacy.create_all(engine)
    try:
        with engine.begin() as connection:
            connection.execute(
                sa.insert(legacy.tables[name]).values(SequenceConfig("orders", start=1).as_row())
            )
        store = SQLStore(url, table=name)
        created = store.create(SequenceConfig("Orders", start=500))
        assert (created.name, created.start) == ("Orders", 500)
        assert [store.reserve(n, 1).first for n in ("orders", "Orders")] == [1, 500]
        SQLWorkers(store).create_table()
        with engine.connect() as connection:
            collations = connection.execute(
                sa.text(
                    "SELECT table_name, collation_name FROM information_schema.columns "
                    "WHERE table_schema = DATABASE() AND column_name = 'name' "
                    "AND table_name IN (:a, :b)"
                ),
                {"a": name, "b": f"{name}_worker"},
            ).all()
        assert sorted(collations) == [(name, "utf8mb4_bin"), (f"{name}_worker", "utf8mb4_bin")]
        store.close()
    finally:
        legacy.drop_all(engine)
        engine.dispose()


def test_first_use_while_the_caller_holds_the_application_file_exclusively(
    tmp_path: Any,
) -> None:
    """A registry's first read never waits out a caller holding app.db (a spilled transaction).

    The store looks for gapless rows in the application's file; a caller's
    transaction holding it exclusively would make that read wait for the
    caller, who waits for the value.
    """
    import sqlite3
    import time

    from autoseq import SequenceRegistry, Serial

    url = f"sqlite:///{tmp_path / 'app.db'}"
    store = SQLStore(url, sqlite_timeout=10)
    engine = sa.create_engine(url)
    with engine.begin() as connection:  # the application's file now holds a gapless row
        Serial(store, "invoices", "{n}", gapless=True).next(connection)
    engine.dispose()
    caller = sqlite3.connect(tmp_path / "app.db", isolation_level=None)
    caller.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        registry = SequenceRegistry(store)
        lock = registry.register(SequenceConfig("orders"), floor=lambda: None)
        served = [lock.next() for _ in range(3)]
        elapsed = time.monotonic() - started
    finally:
        caller.execute("ROLLBACK")
        caller.close()
    registry.close()
    store.close()
    assert served == [1, 2, 3]
    assert elapsed < 3, f"the first use waited {elapsed:.1f} s for the caller's lock"


def test_create_many_keeps_a_gapless_row_of_the_application_file(tmp_path: Any) -> None:
    """create_many, as create, returns a gapless row where it lives (the application's
    SQLite file) and never adds a second row for its name to the companion."""
    from autoseq import Serial

    url = f"sqlite:///{tmp_path / 'app.db'}"
    store = SQLStore(url)
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        assert Serial(store, "invoices", "{n}", gapless=True).next(connection) == "1"
    engine.dispose()
    rows = store.create_many([SequenceConfig("invoices", start=50), SequenceConfig("orders")])
    assert [(row.name, row.start, row.current) for row in rows] == [
        ("invoices", 1, 2),
        ("orders", 1, 1),
    ]
    assert rows[0] == store.create(SequenceConfig("invoices", start=50))
    assert store.read_own("invoices") is None
    assert store.read_own("orders") == rows[1]
    store.close()


def test_drop_table_is_a_deprecated_name_of_drop(tmp_path: Any) -> None:
    """`drop()` is every store's name; `drop_table()` still drops, with a warning."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    sa.create_engine(url).dispose()
    store = SQLStore(url)
    try:
        store.create(SequenceConfig("orders"))
        with pytest.warns(DeprecationWarning, match=r"drop_table\(\) is deprecated: call drop\(\)"):
            store.drop_table()
        assert not sa.inspect(store.engine).has_table(store.table_name)
        store.create(SequenceConfig("orders"))
        store.drop()
        assert not sa.inspect(store.engine).has_table(store.table_name)
    finally:
        store.close()
