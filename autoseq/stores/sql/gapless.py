"""Gapless numbering: each value taken in the caller's transaction, as django-sequences does.

The ``sys_sequence`` row is updated on the caller's own connection, so the
row stays locked until the caller commits or rolls back: a rollback gives
the value back and committed values are consecutive. The price is that
writers of one sequence serialize on its row until they end their
transactions, which is why callers should take the value as late as they
can (the ORM integrations take it at insert).

PostgreSQL and SQLite take the values in one ``UPDATE ... RETURNING``;
MariaDB/MySQL (and any row the one statement cannot prove ordinary: a
cycle, the end of the range, a missing row) lock it with ``SELECT ... FOR
UPDATE`` and update it by version. On PostgreSQL and MariaDB the row is the
store's own table; on SQLite, whose store keeps its table in a companion
file, gapless rows live in a ``sys_sequence`` table of the application's
database, so that one commit covers the row and the value.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from autoseq.config import MAX_VALUE, SequenceConfig, utc_now
from autoseq.errors import (
    GaplessUnavailable,
    ReservationConflict,
    SequenceExhausted,
    SequenceNotFound,
    StoreUnavailable,
)
from autoseq.registry import opening_row
from autoseq.stores.base import check_count, check_many, plan_reservation
from autoseq.stores.capabilities import GaplessNumbering

if TYPE_CHECKING:
    from autoseq.stores.sql import SQLStore

#: The dialects (SQLAlchemy's names, Django's vendors) whose connections run gapless takes.
GAPLESS_DIALECTS = ("postgresql", "mysql", "sqlite")

_statements: dict[tuple[sa.Table, str], tuple[Any, bool]] = {}
_created: weakref.WeakKeyDictionary[SQLStore, set[str]] = weakref.WeakKeyDictionary()
_ddl: dict[sa.Table, Any] = {}


def check_store(store: object, name: str) -> SQLStore:
    """Return ``store`` if gapless numbering can run on it, else raise ``GaplessUnavailable``.

    A store qualifies when its gapless engine is this module (``SQLStore``
    and its subclasses), asked by capability so this module never imports
    the store it serves.
    """
    if isinstance(store, GaplessNumbering) and store.gapless_engine() is sys.modules[__name__]:
        return cast("SQLStore", store)
    raise GaplessUnavailable(
        f"sequence {name!r}: gapless=True needs a SQLStore, got {type(store).__name__}: "
        "a gapless value is taken in the caller's SQL transaction so a rollback gives it "
        "back, and this store has no such transaction; use gapless=False (blocks, gaps "
        "possible) or a SQL database"
    )


def connection_of(target: Any, name: str) -> Connection:
    """The SQLAlchemy ``Connection`` of ``target`` (a Connection or an ORM Session)."""
    if isinstance(target, Connection):
        connection = target
    elif target is not None and callable(getattr(target, "connection", None)):
        connection = target.connection()  # a Session: its transaction's connection
    else:
        raise GaplessUnavailable(
            f"sequence {name!r} is gapless: pass the caller's transaction, "
            "next(connection=session) or next(connection=conn) inside `with engine.begin()`; "
            f"got {target!r}"
        )
    if connection._is_autocommit_isolation():
        raise GaplessUnavailable(
            f"sequence {name!r} is gapless but the connection is in AUTOCOMMIT: the value "
            "would be committed alone and lost on a later failure; use a transaction"
        )
    return connection


def _same_database(store: SQLStore, connection: Connection) -> bool:
    mine, theirs = store.app_url, connection.engine.url
    if mine.get_backend_name() != theirs.get_backend_name():
        return False
    if mine.get_backend_name() == "sqlite":
        return _real(mine.database) == _real(theirs.database)
    return (mine.host, mine.port, mine.database) == (theirs.host, theirs.port, theirs.database)


def _real(database: str | None) -> str:
    if not database or database == ":memory:" or database.startswith("file:"):
        return database or ""
    return os.path.realpath(database)


def sqlite_table(store: SQLStore) -> sa.Table:
    """The gapless rows' table in the application's SQLite file: ``<table>_gapless``.

    The store's own table lives in the companion file, which a transaction
    of the application's file does not cover. The store reads and writes
    this table too (``SQLStore.gapless_table``), so commands see its rows.
    """
    return store.gapless_table


def _sqlite_ready(run: Run, table: sa.Table) -> None:
    """Make the gapless table in the caller's SQLite transaction.

    In the caller's transaction because it may already hold the file's write
    lock, which any other connection would wait for. SQLite lets DDL share a
    transaction, so a rollback undoes this too and the next take does it again.
    """
    statement = _ddl.get(table)
    if statement is None:
        statement = _ddl[table] = sa.schema.CreateTable(table, if_not_exists=True)
    run(statement, None)


def sqlite_table_missing(exc: BaseException) -> bool:
    """Whether ``exc`` says SQLite's gapless table is not there (no take has made it yet)."""
    return "no such table" in str(exc).lower()


def _missing_in_sqlite(exc: BaseException) -> bool:
    return sqlite_table_missing(exc) or "no such column" in str(exc).lower()


#: Runs one statement in the caller's transaction: ``(rows as mappings, rowcount,
#: lastrowid)``; ``lastrowid`` is the cursor's on MariaDB/MySQL, None elsewhere.
Run = Callable[[Any, "Mapping[str, Any] | None"], "tuple[list[Mapping[str, Any]], int, int | None]"]


def take(
    target: Any,
    store: SQLStore,
    config: SequenceConfig,
    count: int = 1,
    floor: Callable[[], int | None] | None = None,
) -> list[int]:
    """``count`` consecutive values of ``config``'s row, in ``target``'s transaction.

    ``target`` is a SQLAlchemy ``Connection`` or ``Session``. The row is
    created if missing (on SQLite in the caller's transaction, elsewhere
    committed on the store's own connection, which no caller's rollback can
    undo), then locked until the caller's transaction ends.
    """
    check_many(check_count(count, "take"), "take")
    connection = connection_of(target, config.name)
    if not _same_database(store, connection):
        raise GaplessUnavailable(
            f"sequence {config.name!r} is gapless: the connection is to "
            f"{connection.engine.url.render_as_string(hide_password=True)} but the store "
            f"keeps its rows in {store.app_url.render_as_string(hide_password=True)}; "
            "use one database for both"
        )

    dialect = connection.dialect.name
    mysql = dialect not in ("postgresql", "sqlite")

    def run(statement: Any, params: Mapping[str, Any] | None) -> tuple[list[Any], int, int | None]:
        result = connection.execute(statement, dict(params or {}))
        rows = list(result.mappings()) if result.returns_rows else []
        return rows, result.rowcount, result.lastrowid if mysql else None

    table = gapless_table(store, dialect)
    try:
        return take_with(run, dialect, store, table, config, count, floor)
    except DBAPIError as exc:
        raise StoreUnavailable(
            f"taking a gapless value of {config.name!r} failed: {type(exc).__name__}: "
            f"{str(exc.orig).strip().splitlines()[0] if exc.orig else exc}; roll the "
            "transaction back and retry it",
            name=config.name,
        ) from exc


def gapless_table(store: SQLStore, dialect: str) -> sa.Table:
    """The table gapless rows of ``store`` live in, on a connection of ``dialect``."""
    return sqlite_table(store) if dialect == "sqlite" else store.table


def take_with(
    run: Run,
    dialect: str,
    store: SQLStore,
    table: sa.Table,
    config: SequenceConfig,
    count: int,
    floor: Callable[[], int | None] | None = None,
) -> list[int]:
    """The statements of [`take`][autoseq.stores.sql.gapless.take], run by ``run`` in the caller's
    transaction.

    Shared by the SQLAlchemy path and ``autoseq_django``, which runs the
    same statements on Django's cursor. ``floor`` returns the largest key
    already stored (integer keys): a row created here starts past it.
    """
    check_many(check_count(count, "take"), "take")
    sqlite = dialect == "sqlite"
    if not sqlite:
        # Before the caller's connection touches the table: a locking read
        # of a missing row takes a gap lock on MariaDB, and the store's own
        # insert would then wait on the caller's transaction forever.
        # Only a missing row is created: inserting one that exists would
        # wait on its lock, which this very transaction may hold (a store
        # made anew does not know what an earlier one of the process took).
        known = _created.setdefault(store, set())
        if config.name not in known:
            if store.read(config.name) is None:
                store.create(config if floor is None else opening_row(config, floor()))
            known.add(config.name)
    try:
        # SQLite: a row the store's own table holds for the name (made by
        # `autoseq create`, or served in blocks before) is where a new
        # gapless row starts, as it would be the row itself on a server.
        seed = (lambda: store.read_own(config.name)) if sqlite else None
        return _take_with(run, dialect, table, config, count, sqlite, floor, seed)
    except SequenceNotFound:
        if not sqlite:
            # Deleted since this process created it: create it again next time.
            _created.get(store, set()).discard(config.name)
        raise


def _take_with(
    run: Run,
    dialect: str,
    table: sa.Table,
    config: SequenceConfig,
    count: int,
    sqlite: bool,
    floor: Callable[[], int | None] | None,
    seed: Callable[[], SequenceConfig | None] | None = None,
) -> list[int]:
    for _attempt in range(3):
        try:
            values = _update_returning(run, dialect, table, config, count)
        except Exception as exc:
            # SQLite: the table is made on first use, in the caller's
            # transaction (see _sqlite_ready); a failed statement leaves
            # SQLite's transaction as it was, so the take is simply retried.
            if not (sqlite and _missing_in_sqlite(exc)):
                raise
            _sqlite_ready(run, table)
            values = _update_returning(run, dialect, table, config, count)
        if values is None:
            values = _update_locked(run, table, config, count, sqlite, floor, seed)
        if values is not None:
            return values
    raise ReservationConflict(
        f"sequence {config.name!r}: the gapless row kept changing under its lock; is the "
        "isolation level one this database supports for gapless numbering "
        "(see docs/serials.md)?",
        name=config.name,
    )


def _guarded_statements(table: sa.Table, dialect: str) -> tuple[Any, bool]:
    """The one-statement update of an ordinary row, and whether it returns its row.

    Like the store's one-statement reservation it touches only a row it can
    prove ordinary (not cycling, ``current`` aligned within ``[start, end]``,
    ``count`` values left, no sum past 2**63). Each gapless value is a
    statement inside someone's transaction, holding the row's lock until
    that transaction ends, so the statement is the cheapest the server can
    run: constants written into the SQL, and the time stamp taken by the
    server (a time stamp sent as text is parsed on every call, which on
    PostgreSQL costs as much again as the rest of the statement).
    Anything else goes to `_update_locked`.

    PostgreSQL and SQLite return ``current`` and ``step`` from the
    ``UPDATE``. MariaDB/MySQL have no ``UPDATE ... RETURNING``: the new
    ``current`` goes through ``LAST_INSERT_ID(expr)``, which the server
    sends back in the statement's own reply (the cursor's ``lastrowid``),
    and ``step`` is guarded equal to the configuration's, so that one
    round trip does what ``UPDATE`` plus a locking read did.
    """
    key = (table, dialect)
    found = _statements.get(key)
    if found is None:
        c = table.c
        span = sa.bindparam("span", type_=sa.BigInteger)
        count = sa.bindparam("count", type_=sa.BigInteger)
        top = sa.literal_column(str(MAX_VALUE), sa.BigInteger) - c.step
        zero = sa.literal_column("0", sa.BigInteger)
        mysql = dialect not in ("postgresql", "sqlite")
        guards = [
            c.name == sa.bindparam("seq_name", type_=c.name.type),
            c.cycle == sa.false(),
            c.batch.in_([sa.true(), sa.false()]),  # a hand-edited flag goes to the refusing path
            c.step >= sa.literal_column("1", sa.BigInteger),
            c.start >= zero,
            c.current >= c.start,
            c.current <= c.end,
            c.current <= top,
            (c.current - c.start) % c.step == zero,
            (c.end - c.current) // c.step >= span,
            (top - c.current) // c.step >= span,
        ]
        after: Any = c.current + count * c.step
        if dialect == "postgresql":
            now: Any = sa.func.statement_timestamp()
        elif mysql:
            guards.append(c.step == sa.bindparam("seq_step", type_=sa.BigInteger))
            after = sa.func.last_insert_id(after, type_=sa.BigInteger)
            now = sa.func.utc_timestamp(6)
        else:
            # SQLite's CURRENT_TIMESTAMP has no fraction of a second; SQLite
            # parses the bound text as cheaply as its own.
            now = sa.bindparam("now", type_=c.updated_at.type)
        update = (
            sa.update(table)
            .where(*guards)
            .values(current=after, updated_at=now, version=c.version + 1)
        )
        returning = not mysql
        if dialect == "sqlite":
            returning = _sqlite_returns()
        found = _statements[key] = (
            (update.returning(c.current, c.step), True) if returning else (update, False)
        )
    return found


_single: dict[tuple[sa.Table, str], tuple[Any, bool]] = {}


def single_statement(table: sa.Table, dialect: str) -> tuple[Any, bool]:
    """The update taking one value of a row whose ``step`` is 1, and whether it returns its row.

    What `autoseq.stores.base.plan_reservation` does for such a row,
    in short hand-written SQL (it is parsed and planned on every call,
    inside the caller's transaction): with a step of 1 every ``current`` is
    aligned, and the value is ``current`` itself exactly when ``start <=
    current <= end`` and ``current < 2**63 - 1`` (the last value a step
    can pass), whether the row cycles or not. Any other row (exhausted,
    about to cycle, hand-edited, a flag that is not 0/1) matches nothing and
    goes to the locked path, which refuses what it cannot read.

    A caller running it directly (``autoseq_django``'s one-value take) does
    so only for a row [`row_known`][autoseq.stores.sql.gapless.row_known] vouches for, and
    goes to [`take_with`][autoseq.stores.sql.gapless.take_with] whenever it matches nothing.
    The new ``current`` comes back as the first column (PostgreSQL, SQLite) or, on MariaDB/MySQL, as
    the cursor's ``lastrowid``; the value taken is one less.
    """
    key = (table, dialect)
    found = _single.get(key)
    if found is None:
        from sqlalchemy.dialects import mysql, postgresql, sqlite

        module = {"postgresql": postgresql, "sqlite": sqlite}.get(dialect, mysql)
        preparer = module.dialect().identifier_preparer
        q = preparer.quote
        current, end, version = q("current"), q("end"), q("version")
        flags = "(false, true)" if dialect == "postgresql" else "(0, 1)"
        if dialect == "postgresql":
            after, now = f"{current} + 1", "statement_timestamp()"
        elif dialect == "sqlite":
            after, now = f"{current} + 1", ":now"
        else:
            after, now = f"LAST_INSERT_ID({current} + 1)", "UTC_TIMESTAMP(6)"
        # Identifiers only, quoted by the dialect (the table name was validated).
        sql = (
            f"UPDATE {preparer.format_table(table)} SET {current} = {after}, "  # noqa: S608
            f"{q('updated_at')} = {now}, {version} = {version} + 1 "
            f"WHERE {q('name')} = :seq_name AND {q('step')} = 1 AND {current} >= {q('start')} "
            f"AND {current} <= {end} AND {current} < {MAX_VALUE} "
            f"AND {q('cycle')} IN {flags} AND {q('batch')} IN {flags}"
        )
        returning = dialect == "postgresql" or (dialect == "sqlite" and _sqlite_returns())
        if returning:
            sql += f" RETURNING {current}"
        found = _single[key] = (sa.text(sql), returning)
    return found


def single_value(returning: bool, returned: Any, updated: int, last: Any) -> int | None:
    """The value [`single_statement`][autoseq.stores.sql.gapless.single_statement] took; None
    when it matched no row.

    ``returned`` is the first column of its row (None when no row came back),
    read where the statement returns its row; elsewhere ``updated`` (the
    row count) and ``last`` (the cursor's ``lastrowid``) tell. The value is
    one less than the new ``current``.
    """
    if returning:
        return None if returned is None else int(returned) - 1
    return int(last) - 1 if updated == 1 and last else None


def forget_row(store: SQLStore, name: str) -> None:
    """Forget row ``name`` of ``store`` (it was deleted): the next take creates it again."""
    _created.get(store, set()).discard(name)


def row_known(store: SQLStore, name: str) -> bool:
    """Whether this process created or found row ``name`` of ``store`` (a server store).

    Until it is, [`take_with`][autoseq.stores.sql.gapless.take_with] must run first: it
    creates a missing row outside the caller's transaction, before that transaction
    touches the table.
    """
    known = _created.get(store)
    return known is not None and name in known


def _sqlite_returns() -> bool:
    import sqlite3

    return sqlite3.sqlite_version_info >= (3, 35)


def _update_returning(
    run: Run, dialect: str, table: sa.Table, config: SequenceConfig, count: int
) -> list[int] | None:
    if count == 1 and config.step == 1:
        update, returning = single_statement(table, dialect)
        params: dict[str, Any] = {"seq_name": config.name}
        if dialect == "sqlite":
            params["now"] = utc_now()
        rows, updated, last = run(update, params)
        if not returning and dialect == "sqlite":  # pragma: no cover - SQLite before 3.35
            return None
        value = single_value(returning, rows[0]["current"] if rows else None, updated, last)
        return None if value is None else [value]
    update, returning = _guarded_statements(table, dialect)
    params = {"seq_name": config.name, "count": count, "span": count - 1}
    if dialect == "sqlite":
        params["now"] = utc_now()
    elif not returning:
        params["seq_step"] = config.step
    rows, updated, last = run(update, params)
    if returning:
        if not rows:
            return None
        step, after = int(rows[0]["step"]), int(rows[0]["current"])
    else:
        if updated != 1 or not last:
            return None
        step, after = config.step, int(last)
    return list(range(after - count * step, after, step))


class RowStatements(NamedTuple):
    """The statements on one gapless row, each naming it by the parameter ``seq_name``.

    Built once per table with bound parameters, so each is compiled once
    (SQLAlchemy's cache, or [`cursor_statement`][autoseq.stores.sql.gapless.cursor_statement]'s)
    however many values are taken. Shared by the takes here and by
    ``autoseq_django``'s django-sequences calls, which run them on Django's cursor.
    """

    #: The row as the caller's transaction sees it.
    select: Any
    #: ``SELECT ... FOR UPDATE``: the row, locked until the caller's transaction ends.
    lock: Any
    #: ``SELECT ... FOR UPDATE NOWAIT``: a row another transaction holds raises at once.
    lock_nowait: Any
    #: ``current`` written by version: ``seen_version``, ``new_current``, ``now``.
    update: Any
    #: An untouched row (version 0, current at start) given ``new_start``, ``new_end``,
    #: ``new_cycle``, compared and set on both.
    restart: Any
    #: The row removed.
    delete: Any


_rows: dict[sa.Table, RowStatements] = {}


def row_statements(table: sa.Table) -> RowStatements:
    """The [`RowStatements`][autoseq.stores.sql.gapless.RowStatements] of ``table``, built once."""
    found = _rows.get(table)
    if found is None:
        t = table
        where = t.c.name == sa.bindparam("seq_name")
        select = sa.select(t).where(where)
        update = (
            sa.update(t)
            .where(where, t.c.version == sa.bindparam("seen_version", type_=sa.BigInteger))
            .values(
                current=sa.bindparam("new_current", type_=sa.BigInteger),
                updated_at=sa.bindparam("now", type_=t.c.updated_at.type),
                version=t.c.version + 1,
            )
        )
        restart = (
            sa.update(t)
            .where(where, t.c.version == 0, t.c.current == t.c.start)
            .values(
                start=sa.bindparam("new_start", type_=sa.BigInteger),
                current=sa.bindparam("new_start", type_=sa.BigInteger),
                end=sa.bindparam("new_end", type_=sa.BigInteger),
                cycle=sa.bindparam("new_cycle", type_=sa.Boolean),
            )
        )
        found = _rows[t] = RowStatements(
            select=select,
            lock=select.with_for_update(),
            lock_nowait=select.with_for_update(nowait=True),
            update=update,
            restart=restart,
            delete=sa.delete(t).where(where),
        )
    return found


def read_row(
    run: Run, table: sa.Table, name: str, *, nowait: bool = False, delete: bool = False
) -> Mapping[str, Any] | None:
    """Row ``name`` of ``table`` as the caller's transaction sees it; None when missing.

    ``nowait`` locks it ``FOR UPDATE NOWAIT`` (only where the database has
    it); ``delete`` removes it, returning the removed row. A caller that
    deleted a row of a store tells it with
    [`forget_row`][autoseq.stores.sql.gapless.forget_row].
    """
    statements = row_statements(table)
    key = {"seq_name": name}
    rows, _count, _last = run(statements.lock_nowait if nowait else statements.select, key)
    if delete and rows:
        run(statements.delete, key)
    return rows[0] if rows else None


def restart_untouched_row(run: Run, table: sa.Table, config: SequenceConfig) -> bool:
    """Give row ``config.name`` ``config``'s start, end and cycle if nothing was ever taken
    from it (version 0, current at start); True when it was rewritten."""
    params = {
        "seq_name": config.name,
        "new_start": config.start,
        "new_end": config.end,
        "new_cycle": config.cycle,
    }
    _rows, updated, _last = run(row_statements(table).restart, params)
    return updated == 1


def create_row(
    run: Run, table: sa.Table, config: SequenceConfig, *, or_ignore: bool = False
) -> None:
    """Insert row ``config`` (version 0) in the caller's transaction.

    ``or_ignore`` (SQLite) leaves a row already there as it is.
    """
    insert = sa.insert(table)
    if or_ignore:
        insert = insert.prefix_with("OR IGNORE")
    run(insert.values(config.as_row() | {"updated_at": utc_now(), "version": 0}), None)


def _update_locked(
    run: Run,
    table: sa.Table,
    config: SequenceConfig,
    count: int,
    sqlite: bool,
    floor: Callable[[], int | None] | None = None,
    seed: Callable[[], SequenceConfig | None] | None = None,
) -> list[int] | None:
    statements = row_statements(table)
    name = {"seq_name": config.name}
    rows, _count, _last = run(statements.lock, name)
    if not rows:
        if not sqlite:
            raise SequenceNotFound(
                config.name, "its row was deleted while in use; roll back and retry"
            )
        base = (seed() if seed is not None else None) or config
        opening = opening_row(base, floor()) if floor is not None else base
        create_row(run, table, opening, or_ignore=True)
        rows, _count, _last = run(statements.lock, name)
        if not rows:  # pragma: no cover - the insert above is in this transaction
            raise SequenceNotFound(config.name, "it was deleted while being created")
    row = rows[0]
    block, new_current = plan_reservation(SequenceConfig.from_row(row), count)
    if block.count < count:
        raise SequenceExhausted(config.name, block.last + block.step, block.row.end)
    params = name | {"seen_version": row["version"], "new_current": new_current, "now": utc_now()}
    _rows, updated, _last = run(statements.update, params)
    if updated != 1:
        return None
    return list(block.values())


# Running the statements on a DB-API cursor ----------------------------------------
# For a caller whose transaction is on a connection SQLAlchemy does not own
# (``autoseq_django``: Django's cursor), so the statements above run there as
# they are, compiled once per dialect.

_dialects: dict[str, sa.engine.Dialect] = {}


class CursorStatement:
    """A statement compiled for a DB-API cursor (``format`` paramstyle) and how to order its
    values."""

    __slots__ = ("defaults", "order", "processors", "sql", "statement")

    def __init__(self, statement: Any, dialect: sa.engine.Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        self.statement = statement
        self.sql = str(compiled)
        self.order: tuple[str, ...] = tuple(getattr(compiled, "positiontup", None) or ())
        binds = getattr(compiled, "binds", {})  # DDL has none
        # Literals inside the statement (sa.literal, false()) carry their own values.
        self.defaults = {key: binds[key].value for key in self.order if key in binds}
        processors = getattr(compiled, "_bind_processors", {})
        self.processors = [processors.get(key) for key in self.order]

    def args(self, params: Mapping[str, Any] | None) -> list[Any]:
        """The values to pass the cursor with ``sql``, from the statement's named parameters."""
        values = {**self.defaults, **params} if params else self.defaults
        out = []
        for key, processor in zip(self.order, self.processors, strict=True):
            value = values[key]
            out.append(processor(value) if processor is not None and value is not None else value)
        return out


#: By (id, dialect), holding the statement so its id stays its own.
_compiled: dict[tuple[int, str], CursorStatement] = {}


def cursor_statement(statement: Any, dialect: str) -> CursorStatement:
    """``statement`` compiled for a DB-API cursor of ``dialect`` (one of ``GAPLESS_DIALECTS``).

    Kept once built, so a statement built once per table is compiled once.
    """
    prepared = _compiled.get((id(statement), dialect))
    if prepared is None or prepared.statement is not statement:
        compiler = _dialects.get(dialect)
        if compiler is None:
            from sqlalchemy.dialects import mysql, postgresql, sqlite

            module = {"postgresql": postgresql, "mysql": mysql, "sqlite": sqlite}[dialect]
            compiler = _dialects[dialect] = module.dialect(paramstyle="format")
        prepared = CursorStatement(statement, compiler)
        if len(_compiled) < 1000:  # statements built per call are not worth keeping
            _compiled[id(statement), dialect] = prepared
    return prepared


def cursor_run(cursor: Callable[[], Any], dialect: str) -> Run:
    """A ``Run`` (how this module executes a statement) on ``cursor()``, in that
    connection's transaction.

    ``cursor()`` opens a DB-API cursor that is its own context manager and takes
    ``%s`` parameters (the ``format`` paramstyle) on every database, as Django's
    cursors do; the lastrowid is read on MariaDB/MySQL only.
    """
    on_mysql = dialect == "mysql"

    def run(statement: Any, params: Mapping[str, Any] | None) -> tuple[list[Any], int, int | None]:
        prepared = cursor_statement(statement, dialect)
        with cursor() as opened:
            opened.execute(prepared.sql, prepared.args(params))
            description = opened.description
            rows: list[Mapping[str, Any]] = []
            if description:
                names = [column[0] for column in description]
                rows = [dict(zip(names, row, strict=True)) for row in opened.fetchall()]
            return rows, opened.rowcount, opened.lastrowid if on_mysql else None

    return run


def lock_order(names: Iterable[str]) -> list[str]:
    """The order in which one transaction takes several gapless sequences: by name.

    Two transactions that lock the same rows in one order wait for each
    other instead of deadlocking.
    """
    return sorted(set(names))


__all__ = [
    "GAPLESS_DIALECTS",
    "CursorStatement",
    "RowStatements",
    "check_store",
    "connection_of",
    "create_row",
    "cursor_run",
    "cursor_statement",
    "forget_row",
    "gapless_table",
    "lock_order",
    "read_row",
    "restart_untouched_row",
    "row_known",
    "row_statements",
    "single_statement",
    "single_value",
    "sqlite_table_missing",
    "take",
    "take_with",
]
