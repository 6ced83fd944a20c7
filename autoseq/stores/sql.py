"""``SQLStore``: ``sys_sequence`` on SQLAlchemy Core (SQLite, PostgreSQL, MariaDB/MySQL).

A reservation is one short transaction on the store's own engine: lock the
row (``SELECT ... FOR UPDATE``; ``BEGIN IMMEDIATE`` on SQLite), compute the
block, ``UPDATE ... WHERE current = <read value>`` and commit, all before a
value is handed out. The ``current`` guard makes it a compare-and-set too,
so a database that ignores ``FOR UPDATE`` still cannot hand out a range twice.

SQLite allows one writer per database file. If ``sys_sequence`` lived in the
application's file, a reservation needed while the application's own
transaction holds the write lock would wait for that transaction, which waits
for the value: a deadlock. So on SQLite the table lives in a companion file,
``<database>.autoseq`` beside it (``ATTACH`` it to query it), and an
in-memory database gets a private in-memory one.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import re
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine, RowMapping, make_url
from sqlalchemy.engine.url import URL
from sqlalchemy.exc import DBAPIError, IntegrityError, NoSuchTableError, SQLAlchemyError
from sqlalchemy.pool import QueuePool

from autoseq import _hooks
from autoseq.config import MAX_VALUE, NAME_MAX_LENGTH, SequenceConfig, validate_name
from autoseq.errors import (
    InvalidSequenceConfig,
    ReservationConflict,
    SequenceNotFound,
    StoreUnavailable,
)
from autoseq.stores._errors import translating, unavailable
from autoseq.stores.base import Block, check_count, plan_reservation, reset_after_fork

log = logging.getLogger("autoseq")

_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
SIDECAR_SUFFIX = ".autoseq"


def validate_table_name(table: object) -> str:
    """Return ``table`` if it is a plain identifier, else raise ``InvalidSequenceConfig``."""
    if not isinstance(table, str) or not _TABLE_NAME.match(table):
        raise InvalidSequenceConfig(
            f"table name {table!r} is not a plain identifier; use letters, digits "
            "and underscores (at most 63, not starting with a digit)"
        )
    return table


def sequence_table(name: str = "sys_sequence", metadata: sa.MetaData | None = None) -> sa.Table:
    """The ``sys_sequence`` table as SQLAlchemy Core sees it (the schema every store shares)."""
    return sa.Table(
        validate_table_name(name),
        metadata if metadata is not None else sa.MetaData(),
        sa.Column("name", sa.String(NAME_MAX_LENGTH), primary_key=True),
        sa.Column("start", sa.BigInteger, nullable=False),
        sa.Column("end", sa.BigInteger, nullable=False),
        sa.Column("step", sa.BigInteger, nullable=False),
        sa.Column("current", sa.BigInteger, nullable=False),
        sa.Column("batch", sa.Boolean, nullable=False),
        sa.Column("batch_count", sa.Integer, nullable=False),
        sa.Column("cycle", sa.Boolean, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("version", sa.BigInteger, nullable=False, server_default="0"),
    )


#: The sync driver a store uses where the application's URL names an asyncio
#: one: a reservation is a short blocking round trip, made mostly by the
#: prefetch thread, so it needs no event loop. Driver-specific query options
#: do not carry over; give ``SQLStore`` a sync URL of your own for those.
SYNC_DRIVERS = {
    "aiosqlite": "pysqlite",
    "asyncpg": "psycopg",
    "psycopg_async": "psycopg",
    "aiomysql": "pymysql",
    "asyncmy": "pymysql",
}


#: The extra of autoseq that installs each sync driver a store may need.
DRIVER_EXTRAS = {"psycopg": "postgres", "psycopg2": "postgres", "pymysql": "mysql"}


class MissingDriver(InvalidSequenceConfig):
    """The sync driver the store needs for a database URL is not installed."""


def check_driver(app_url: URL | str) -> None:
    """Raise ``MissingDriver`` unless the store for ``app_url`` can import its driver.

    An application on an asyncio driver (asyncpg) reserves through the sync
    one (psycopg), which it may never have installed; better said at
    ``install()`` than as a bare ``ModuleNotFoundError`` at the first commit.
    """
    url, _ = store_url(make_url(app_url))
    try:
        url.get_dialect().import_dbapi()
    except ImportError as exc:
        driver = url.get_driver_name()
        extra = DRIVER_EXTRAS.get(driver)
        hint = f"pip install 'autoseq[{extra}]'" if extra else f"install the {driver} package"
        via = (
            f" (autoseq reserves through {driver}, the sync driver for "
            f"{make_url(app_url).get_driver_name()})"
            if url.drivername != make_url(app_url).drivername
            else ""
        )
        raise MissingDriver(
            f"the sequence store for {url.render_as_string(hide_password=True)} needs the "
            f"{driver} driver{via}, which is not installed ({exc}); {hint}, or give "
            "install() a store=SQLStore(<a sync URL>)"
        ) from exc


def store_url(url: URL) -> tuple[URL, bool]:
    """Where the store keeps its table for an application URL; True when private memory.

    An asyncio driver is swapped for its sync counterpart (``SYNC_DRIVERS``).
    """
    sync_driver = SYNC_DRIVERS.get(url.get_driver_name())
    if sync_driver is not None:
        url = url.set(drivername=f"{url.get_backend_name()}+{sync_driver}")
    if url.get_backend_name() != "sqlite":
        return url, False
    database = url.database or ""
    in_memory = "mode=memory" in database or url.query.get("mode") == "memory"
    if database.endswith(SIDECAR_SUFFIX):
        # A companion named by its owner; in memory, a shared-cache name that
        # the application's own connections can attach.
        return url, in_memory
    if database in ("", ":memory:") or in_memory:
        return make_url("sqlite://"), True
    if not database.startswith("file:"):
        # Two paths to one file (a symlinked release directory) must find
        # one companion, or each would hand out the same keys.
        database = os.path.realpath(database)
    return url.set(database=database + SIDECAR_SUFFIX), False


class SQLStore:
    """A :class:`~autoseq.stores.SequenceStore` on any SQLAlchemy Core database.

    ``engine_or_url`` names the application's database; the store opens its
    own small engine on it, so a reservation never uses (or waits for) one of
    the application's connections or transactions. ``max_retries`` bounds
    conflict and deadlock retries; ``connect_timeout`` (seconds) bounds how
    long an unreachable server may take to fail; ``statement_timeout``
    (seconds) bounds how long a server that stopped answering on an open
    connection can hold an operation, and how long a reservation retries;
    half of it bounds each wait for a row another transaction holds locked.
    """

    def __init__(
        self,
        engine_or_url: Engine | URL | str,
        table: str = "sys_sequence",
        *,
        max_retries: int = 30,
        connect_timeout: float = 5.0,
        sqlite_timeout: float = 30.0,
        statement_timeout: float = 10.0,
    ) -> None:
        self.table_name = validate_table_name(table)
        engine_or_url = getattr(engine_or_url, "sync_engine", engine_or_url)  # an AsyncEngine
        if isinstance(engine_or_url, Engine):
            app_url = engine_or_url.url
        elif isinstance(engine_or_url, (str, URL)):
            app_url = make_url(engine_or_url)
        else:
            raise InvalidSequenceConfig(
                f"SQLStore needs an Engine or a database URL, got {type(engine_or_url).__name__}"
            )
        self.app_url = app_url
        self.url, private_memory = store_url(app_url)
        check_driver(app_url)
        self.max_retries = max_retries
        self.statement_timeout = statement_timeout
        self.reservations = 0
        self.table = sequence_table(self.table_name)
        self.dialect = self.url.get_backend_name()
        self._table_ready = False
        self._version_ready = False
        self._sockets: weakref.WeakSet[Any] = weakref.WeakSet()
        self._watchdog = False
        self._timers = _Watchdog(statement_timeout, self._shut_sockets)
        self._gate = _ForkGate(sqlite_timeout + 1.0)
        if self.dialect == "sqlite" and not private_memory:
            _gated.add(self)
        self.engine = self._make_engine(private_memory, connect_timeout, sqlite_timeout)
        self._one_statement = _one_statement_reservation(self.table, self.engine)
        reset_after_fork(self)

    # engine ---------------------------------------------------------------

    def _make_engine(
        self, private_memory: bool, connect_timeout: float, sqlite_timeout: float
    ) -> Engine:
        kwargs: dict[str, Any] = {"pool_pre_ping": True}
        if self.dialect == "sqlite":
            kwargs = {"connect_args": {"timeout": sqlite_timeout, "check_same_thread": False}}
            if private_memory:
                # The database lives only as long as its one connection, and
                # that connection must serve one thread at a time, or a
                # prefetch worker's transaction interleaves with a caller's:
                # a pool of exactly one, lent out in turn.
                kwargs.update(poolclass=QueuePool, pool_size=1, max_overflow=0, pool_timeout=60)
        else:
            kwargs.update(pool_size=2, max_overflow=8, pool_recycle=3600)
            driver = self.url.get_driver_name()
            if driver in ("psycopg", "psycopg2", "pymysql", "mysqldb", "mariadbconnector"):
                kwargs["connect_args"] = {"connect_timeout": max(1, int(connect_timeout))}
            if driver in ("pymysql", "mysqldb", "mariadbconnector"):
                timeout = max(1, int(self.statement_timeout))
                lock_wait = max(1, int(self.statement_timeout / 2))
                kwargs["connect_args"].update(
                    read_timeout=timeout,
                    write_timeout=timeout,
                    init_command=f"SET SESSION innodb_lock_wait_timeout = {lock_wait}",
                )
            else:
                # No client-side read timeout in libpq: see _deadline().
                self._watchdog = True
        engine = sa.create_engine(self.url, **kwargs)
        if self.dialect == "sqlite":
            self._sqlite_immediate(engine, private_memory, sqlite_timeout)
        elif self._watchdog:
            event.listen(engine, "connect", self._on_connect)
        return engine

    def _on_connect(self, dbapi_connection: Any, _record: Any) -> None:
        self._sockets.add(dbapi_connection)
        if self.dialect == "postgresql":
            # A row held by a stuck transaction fails the wait cleanly
            # (retried, then ReservationConflict). A session setting, not a
            # startup option, so poolers that refuse options still connect.
            autocommit = dbapi_connection.autocommit
            dbapi_connection.autocommit = True
            cursor = dbapi_connection.cursor()
            cursor.execute(f"SET lock_timeout = {max(1, int(self.statement_timeout * 500))}")
            cursor.close()
            dbapi_connection.autocommit = autocommit

    @staticmethod
    def _sqlite_immediate(engine: Engine, private_memory: bool, sqlite_timeout: float) -> None:
        # pysqlite's own transaction handling begins lazily (and deferred);
        # take the write lock up front so two reservations serialize instead
        # of failing on a lock upgrade.
        @event.listens_for(engine, "connect")
        def _connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None
            if not private_memory:
                _enable_wal(dbapi_connection, sqlite_timeout)

        @event.listens_for(engine, "begin")
        def _begin(connection: Connection) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

    @contextmanager
    def _deadline(self) -> Iterator[None]:
        """Bound the operation inside to ``statement_timeout`` on drivers without a read timeout.

        A server (or a middlebox) that stops answering on an established
        connection would block libpq forever, pre-ping included. When the
        operation overruns, every socket of this store's own pool is shut
        down: the blocked driver wakes with a disconnect and the caller gets
        ``StoreUnavailable``. The pool is private to the store, so only its
        own operations, all equally stuck, are affected.
        """
        if not self._watchdog:
            yield
            return
        token = self._timers.arm()
        try:
            yield
        except DBAPIError as exc:
            if self._timers.fired(token):
                exc.autoseq_stalled = True  # type: ignore[attr-defined]  # read by _translate
            raise
        finally:
            self._timers.disarm(token)

    def _shut_sockets(self) -> None:
        for dbapi_connection in list(self._sockets):
            # a connection closed already has nothing to wake
            with (
                suppress(Exception),
                socket.socket(fileno=os.dup(dbapi_connection.fileno())) as sock,
            ):
                sock.shutdown(socket.SHUT_RDWR)

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        with self._gate.passage(), self._deadline(), self.engine.begin() as connection:
            yield connection

    @contextmanager
    def _connection(self) -> Iterator[Connection]:
        with self._gate.passage(), self._deadline(), self.engine.connect() as connection:
            yield connection

    def _translate(
        self, exc: BaseException, operation: str, what: str, name: str | None
    ) -> StoreUnavailable:
        stalled = (
            f" (no answer within statement_timeout={self.statement_timeout}s)"
            if getattr(exc, "autoseq_stalled", False)
            else ""
        )
        target = self.url.render_as_string(hide_password=True)
        return unavailable(
            exc, operation=operation, what=what, where=f"on {target}", name=name, note=stalled
        )

    def _errors(
        self,
        operation: str,
        what: str,
        name: str | None = None,
        catch: type[BaseException] | tuple[type[BaseException], ...] = DBAPIError,
    ) -> AbstractContextManager[None]:
        """Turn a driver error raised inside into ``StoreUnavailable`` saying ``what`` failed."""
        return translating(catch, self._translate, operation, what, name)

    # table ----------------------------------------------------------------

    def create_table(self) -> None:
        """Create ``sys_sequence`` unless it exists, or add ``version`` to an older one.

        Safe when processes race.
        """
        try:
            with self._gate.passage(), self._deadline():
                self.table.create(self.engine, checkfirst=True)
        except SQLAlchemyError as exc:
            try:
                with self._deadline():
                    exists = sa.inspect(self.engine).has_table(self.table_name)
            except SQLAlchemyError:
                exists = False
            if not exists:
                raise self._translate(
                    exc, "create_table", "creating the sequence table", None
                ) from exc
        self._table_ready = True
        self._version_ready = False  # look again: a migration may have just dropped it
        self._ensure_version_column()

    def drop_table(self) -> None:
        """Drop ``sys_sequence`` (tests, ``autoseq`` maintenance)."""
        self.table.drop(self.engine, checkfirst=True)
        self._table_ready = False

    def _ensure_table(self) -> None:
        if not self._table_ready:
            self.create_table()

    def _ensure_version_column(self) -> None:
        """Add ``version`` to a table made before it existed (once per store)."""
        if self._version_ready:
            return
        with self._errors("upgrade_table", "upgrading the sequence table", catch=SQLAlchemyError):
            with self._deadline():
                inspector = sa.inspect(self.engine)
                if not inspector.has_table(self.table_name):
                    return
                columns = {column["name"] for column in inspector.get_columns(self.table_name)}
            if "version" not in columns:
                quoted = self.engine.dialect.identifier_preparer.quote(self.table_name)
                try:
                    with self._transaction() as connection:
                        connection.exec_driver_sql(
                            f"ALTER TABLE {quoted} ADD COLUMN version BIGINT NOT NULL DEFAULT 0"
                        )
                    log.info("added the version column to %s", self.table_name)
                except DBAPIError:
                    # Another process added it first; anything else shows up
                    # as a missing column on the next statement.
                    with self._deadline():
                        columns = {
                            c["name"] for c in sa.inspect(self.engine).get_columns(self.table_name)
                        }
                    if "version" not in columns:
                        raise
        self._version_ready = True

    # rows -----------------------------------------------------------------

    def create(self, config: SequenceConfig) -> SequenceConfig:
        self._ensure_table()
        row = config.as_row() | {"updated_at": _now(), "version": 0}
        with self._errors("create", f"creating sequence {config.name!r}", config.name):
            try:
                with self._transaction() as connection:
                    connection.execute(sa.insert(self.table).values(row))
            except IntegrityError:
                pass  # another process created it first: the stored row wins
        stored = self.read(config.name)
        if stored is None:  # pragma: no cover - deleted between insert and read
            raise SequenceNotFound(config.name, "it was deleted while being created")
        return stored

    def read(self, name: str) -> SequenceConfig | None:
        row = self.read_raw(name)
        return None if row is None else SequenceConfig.from_row(row)

    def read_raw(self, name: str) -> dict[str, Any] | None:
        """The stored row as the driver returns it, unvalidated (for repairs)."""
        validate_name(name)
        statement = sa.select(self.table).where(self.table.c.name == name)
        rows = self._select(statement, f"reading sequence {name!r}", name)
        return dict(rows[0]) if rows else None

    def read_all(self) -> list[SequenceConfig]:
        statement = sa.select(self.table).order_by(self.table.c.name)
        return [
            SequenceConfig.from_row(row) for row in self._select(statement, "reading sequences")
        ]

    def _select(
        self, statement: sa.Select[Any], what: str, name: str | None = None
    ) -> Sequence[RowMapping]:
        """The rows ``statement`` reads; none while the table does not exist yet."""
        self._ensure_version_column()
        try:
            with self._connection() as connection:
                return connection.execute(statement).mappings().all()
        except (NoSuchTableError, DBAPIError) as exc:
            if self._missing_table(exc):
                return []
            raise self._translate(exc, "read", what, name) from exc

    def update(self, config: SequenceConfig) -> SequenceConfig:
        self._ensure_version_column()
        row = config.as_row() | {"updated_at": _now(), "version": self.table.c.version + 1}
        del row["name"]
        with (
            self._errors("update", f"updating sequence {config.name!r}", config.name),
            self._transaction() as connection,
        ):
            result = connection.execute(
                sa.update(self.table).where(self.table.c.name == config.name).values(row)
            )
        if result.rowcount != 1:
            raise SequenceNotFound(config.name)
        stored = self.read(config.name)
        assert stored is not None
        return stored

    def delete(self, name: str) -> bool:
        """Remove a row; True if it existed."""
        validate_name(name)
        with self._transaction() as connection:
            result = connection.execute(sa.delete(self.table).where(self.table.c.name == name))
        return bool(result.rowcount)

    # reservation ----------------------------------------------------------

    def reserve(self, name: str, count: int) -> Block:
        validate_name(name)
        check_count(count)
        self._ensure_version_column()
        started = time.monotonic()
        gives_up = started + self.statement_timeout
        attempts = 0
        for attempt in range(self.max_retries):
            attempts += 1
            try:
                block = self._reserve_in_one_statement(name, count)
                if block is None:
                    block = self._reserve_under_row_lock(name, count)
                self.reservations += 1
                return block
            except _Conflict:
                pass
            except DBAPIError as exc:
                if self._missing_table(exc):
                    raise SequenceNotFound(
                        name,
                        "the sequence table does not exist yet; "
                        "register the sequence or run `autoseq init`",
                    ) from None
                late = time.monotonic() > gives_up
                if not _retryable(exc) or (late and exc.connection_invalidated):
                    what = f"reserving from sequence {name!r}"
                    raise self._translate(exc, "reserve", what, name) from exc
                if late:
                    break
            time.sleep(min(0.2, 0.001 * 2 ** min(attempt, 8)) * random.random())
        raise ReservationConflict(
            f"sequence {name!r}: gave up after {attempts} attempt(s) in "
            f"{time.monotonic() - started:.1f}s, each colliding with another reservation or "
            "waiting too long on the row's lock (is a transaction holding it?); raise "
            "batch_count (fewer, larger reservations) or SQLStore(max_retries=..., "
            "statement_timeout=...)",
            name=name,
        )

    def _reserve_in_one_statement(self, name: str, count: int) -> Block | None:
        """The common case in one round trip: ``UPDATE ... RETURNING``, autocommitted.

        Only a row the statement can prove ordinary is touched: valid (the
        checks of ``SequenceConfig.from_row``), not cycling, ``start`` not
        negative (so no sum can overflow) and with ``count`` values left
        before ``end``. Anything else (a missing row, the last values
        before ``end``, a cycle, a row edited into an impossible state)
        returns ``None`` untouched, for :meth:`_reserve_under_row_lock` to
        handle or refuse. ``None`` too where the database has no
        ``UPDATE ... RETURNING`` (MariaDB, SQLite before 3.35).
        """
        statement = self._one_statement
        if statement is None or count < 1:
            return None
        params = {"seq_name": name, "count": count, "span": count - 1, "now": _now()}
        if self.dialect == "postgresql":
            with self._connection() as connection:
                connection.execution_options(isolation_level="AUTOCOMMIT")
                row = connection.execute(statement, params).mappings().first()
        else:
            with self._transaction() as connection:
                row = connection.execute(statement, params).mappings().first()
        if row is None:
            return None
        stored = SequenceConfig.from_row(row)
        step, after = stored.step, stored.next_value
        return Block(name, after - count * step, after - step, step, stored, False)

    def _reserve_under_row_lock(self, name: str, count: int) -> Block:
        """Any row: read it under ``SELECT ... FOR UPDATE``, plan in Python, compare-and-set."""
        t = self.table
        with self._transaction() as connection:
            row = (
                connection.execute(sa.select(t).where(t.c.name == name).with_for_update())
                .mappings()
                .first()
            )
            if row is None:
                raise SequenceNotFound(name)
            block, new_current = plan_reservation(SequenceConfig.from_row(row), count)
            result = connection.execute(
                sa.update(t)
                .where(t.c.name == name, t.c.version == row["version"])
                .values(current=new_current, updated_at=_now(), version=t.c.version + 1)
            )
            if result.rowcount != 1:
                raise _Conflict
        return block

    def release(self, block: Block) -> bool:
        t = self.table
        self._ensure_version_column()
        with (
            self._errors("release", f"releasing a block of {block.name!r}", block.name),
            self._transaction() as connection,
        ):
            result = connection.execute(
                sa.update(t)
                .where(
                    t.c.name == block.name,
                    t.c.version == block.version,
                    t.c.current == block.last + block.step,
                )
                .values(current=block.first, updated_at=_now(), version=block.version + 1)
            )
        return result.rowcount == 1

    def compare_and_set(self, row: SequenceConfig, version: int) -> SequenceConfig | None:
        t = self.table
        self._ensure_version_column()
        values = row.as_row() | {"updated_at": _now(), "version": version + 1}
        del values["name"]
        with (
            self._errors("compare_and_set", f"writing sequence {row.name!r}", row.name),
            self._transaction() as connection,
        ):
            result = connection.execute(
                sa.update(t).where(t.c.name == row.name, t.c.version == version).values(values)
            )
            if result.rowcount != 1:
                exists = connection.execute(sa.select(t.c.name).where(t.c.name == row.name)).first()
                if exists is None:
                    raise SequenceNotFound(row.name)
                return None
        return self.read(row.name)

    def _missing_table(self, exc: BaseException) -> bool:
        if isinstance(exc, NoSuchTableError):
            return True
        text = str(getattr(exc, "orig", exc)).lower()
        return (
            "no such table" in text or "does not exist" in text or "doesn't exist" in text
        ) and self.table_name.lower() in text

    # lifecycle ------------------------------------------------------------

    def after_fork(self) -> None:
        # Connections belong to the parent; the child opens its own (and
        # must never shut the parent's sockets down from its watchdog).
        self._sockets = weakref.WeakSet()
        self._timers = _Watchdog(self.statement_timeout, self._shut_sockets)
        self._gate = _ForkGate(self._gate.timeout)
        self.engine.dispose(close=False)

    def close(self) -> None:
        self.engine.dispose()


class _Watchdog:
    """Calls ``expire`` when an armed operation runs past ``timeout`` seconds.

    One thread serves every operation of a store (instead of a timer thread
    started per operation, which cost as much as a round trip), and exits
    after a few idle seconds; the next ``arm`` starts another.
    """

    IDLE = 5.0

    def __init__(self, timeout: float, expire: Callable[[], None]) -> None:
        self.timeout = timeout
        self._expire = expire
        self._cond = threading.Condition()
        self._armed: dict[int, float] = {}  # token -> deadline, in arming order
        self._fired: set[int] = set()
        self._tokens = itertools.count()
        self._running = False

    def arm(self) -> int:
        with self._cond:
            token = next(self._tokens)
            self._armed[token] = time.monotonic() + self.timeout
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="autoseq-sql-watchdog", daemon=True).start()
            elif len(self._armed) == 1:
                self._cond.notify()
            return token

    def fired(self, token: int) -> bool:
        """True when ``token`` overran and ``expire`` was called for it."""
        with self._cond:
            return token in self._fired

    def disarm(self, token: int) -> None:
        with self._cond:
            self._armed.pop(token, None)
            self._fired.discard(token)

    def _run(self) -> None:
        cond = self._cond
        with cond:
            while True:
                if not self._armed:
                    cond.wait(self.IDLE)
                    if not self._armed:
                        self._running = False
                        return
                    continue
                # Deadlines grow with arming order: the first is the earliest.
                deadline = next(iter(self._armed.values()))
                wait = deadline - time.monotonic()
                if wait > 0:
                    cond.wait(wait)
                    continue
                now = time.monotonic()
                late = [t for t, d in self._armed.items() if d <= now]
                for t in late:
                    del self._armed[t]
                    self._fired.add(t)
                cond.release()
                try:
                    self._expire()
                except Exception:  # waking sockets is best effort
                    log.debug("autoseq: shutting stalled sockets failed", exc_info=True)
                finally:
                    cond.acquire()


class _ForkGate:
    """Lets a fork wait until no thread of this process is inside a SQLite operation.

    SQLite keeps the lock state of each open database file in per-process
    memory, which a child inherits. Forked while another thread is inside a
    write transaction, the child believes that transaction still holds the
    lock and gets "database is locked" on every reservation, forever. So
    operations pass through the gate; before a fork it is closed (waiting,
    at most ``timeout`` seconds, for those inside to leave) and reopened in
    the parent after; the child starts with a new, open gate.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._cond = threading.Condition()
        self._inside = 0

    @contextmanager
    def passage(self) -> Iterator[None]:
        with self._cond:
            self._inside += 1
        try:
            yield
        finally:
            with self._cond:
                self._inside -= 1
                self._cond.notify_all()

    def close(self) -> None:
        self._cond.acquire()
        self._cond.wait_for(lambda: self._inside == 0, self.timeout)

    def reopen(self) -> None:
        self._cond.release()


_gated: weakref.WeakSet[SQLStore] = weakref.WeakSet()
_closed_at_fork: list[_ForkGate] = []


def _close_gates_before_fork() -> None:
    for store in list(_gated):
        store._gate.close()
        _closed_at_fork.append(store._gate)


def _reopen_gates_in_parent() -> None:
    while _closed_at_fork:
        _closed_at_fork.pop().reopen()


def _forget_gates_in_child() -> None:
    _closed_at_fork.clear()  # SQLStore.after_fork gives each store a new gate


_hooks.on_fork(
    before=_close_gates_before_fork,
    after_in_parent=_reopen_gates_in_parent,
    after_in_child=_forget_gates_in_child,
)


class _Conflict(Exception):
    """The row moved between read and write; try again."""


def _retryable(exc: DBAPIError) -> bool:
    # Deadlocks, serialization failures and lock waits are worth another try;
    # a connection that was dropped is too (pre-ping replaces it).
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    code = getattr(orig, "sqlstate", None) or ""
    if code in ("40001", "40P01", "55P03"):
        return True
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and args[0] in (1205, 1213):
        return True
    return "database is locked" in str(orig).lower()


def _one_statement_reservation(table: sa.Table, engine: Engine) -> sa.Update | None:
    """``UPDATE ... RETURNING`` taking ``:count`` values of an ordinary row, or None.

    Every comparison is written so no intermediate sum can leave the BIGINT
    range (``start >= 0``, divisions instead of products), and the new
    ``current`` is at most ``2**63 - 1 - step`` by the last condition, so
    the database never raises an overflow and never stores a value
    ``SequenceConfig`` would refuse.
    """
    dialect = engine.dialect.name
    if dialect == "sqlite":
        import sqlite3

        if sqlite3.sqlite_version_info < (3, 35):
            return None
    elif dialect != "postgresql":
        return None  # MariaDB and MySQL have no UPDATE ... RETURNING
    c = table.c
    span = sa.bindparam("span", type_=sa.BigInteger)
    top = sa.literal(MAX_VALUE, sa.BigInteger) - c.step  # never overflows: step >= 1
    return (
        sa.update(table)
        .where(
            c.name == sa.bindparam("seq_name", type_=c.name.type),
            c.cycle == sa.false(),
            c.step >= 1,
            c.batch_count >= 1,
            c.start >= 0,
            c.start <= c.end,
            c.start <= top,
            c.current >= c.start,
            c.current <= c.end,
            c.current <= top,
            (c.current - c.start) % c.step == 0,
            (c.end - c.current) // c.step >= span,
            (top - c.current) // c.step >= span,
        )
        .values(
            current=c.current + sa.bindparam("count", type_=sa.BigInteger) * c.step,
            updated_at=sa.bindparam("now", type_=c.updated_at.type),
            version=c.version + 1,
        )
        .returning(*c)
    )


def _enable_wal(dbapi_connection: Any, timeout: float) -> None:
    """Put a SQLite file in WAL mode, waiting out connections doing the same.

    The switch needs the file to itself, and two connections that both hold
    a read lock while asking for it are a deadlock SQLite breaks at once with
    "database is locked", without calling the busy handler. Several
    processes opening a new file together hit exactly that, so the switch is
    retried until ``timeout``. A file already in WAL mode is left alone.
    """
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        try:
            (mode,) = dbapi_connection.execute("PRAGMA journal_mode").fetchone()
            if str(mode).lower() != "wal":
                dbapi_connection.execute("PRAGMA journal_mode=WAL")
            return
        except Exception as exc:
            if "locked" not in str(exc).lower() or time.monotonic() >= deadline:
                raise
        time.sleep(pause * random.uniform(0.5, 1.5))
        pause = min(pause * 2, 0.2)


def _now() -> datetime:
    return datetime.now(UTC)
