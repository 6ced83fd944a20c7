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
in-memory database gets a private in-memory one. Gapless rows, whose values
are taken in the caller's transaction, stay in the application's file
(``_appfile``); the store reads and writes them there too, so it holds
every row of the application.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.engine.url import URL
from sqlalchemy.exc import DBAPIError, IntegrityError, NoSuchTableError, SQLAlchemyError

from autoseq import _hooks, signals
from autoseq.config import (
    MAX_VALUE,
    ROW_COLUMNS,
    SequenceConfig,
    configs_from_values,
    utc_now,
    validate_name,
)
from autoseq.errors import (
    InvalidSequenceConfig,
    ReservationConflict,
    SequenceExhausted,
    SequenceNotFound,
    StoreUnavailable,
)
from autoseq.stores._errors import translating, unavailable
from autoseq.stores.base import (
    Block,
    check_configs,
    check_count,
    check_requests,
    first_configs,
    plan_reservation,
    reset_after_fork,
)
from autoseq.stores.capabilities import one_per_store
from autoseq.stores.sql._appfile import (
    AppFileRows,
    application_file,
    gapless_sqlite_table,
    locked,
)
from autoseq.stores.sql._engine import (
    make_engine,
    needs_watchdog,
    reconnecting,
    transaction_settings,
)
from autoseq.stores.sql._epoch import (
    DEFAULT_SKIP_BLOCKS,
    Epoch,
    Treatment,
    epoch_table,
    epoch_table_name,
    validate_skip_blocks,
)
from autoseq.stores.sql._forkgate import ForkGate
from autoseq.stores.sql._replication import (
    SYNCHRONOUS_COMMIT,
    Replication,
    validate_synchronous_commit,
)
from autoseq.stores.sql._replication import findings as replication_findings
from autoseq.stores.sql._statements import (
    Conflict,
    batch_release,
    make_names_binary,
    missing_table,
    mixed_reservation,
    name_type,
    one_statement_reservation,
    retryable,
    sequence_table,
    speaks_postgresql,
    validate_table_name,
)
from autoseq.stores.sql._urls import (
    DRIVER_EXTRAS,
    SIDECAR_SUFFIX,
    SYNC_DRIVERS,
    MissingDriver,
    check_driver,
    store_url,
    sync_driver_url,
)
from autoseq.stores.sql._watchdog import SocketWatch

if TYPE_CHECKING:
    from autoseq.stores.capabilities import GaplessEngine
    from autoseq.workers import WorkerLeases

__all__ = [
    "DRIVER_EXTRAS",
    "SIDECAR_SUFFIX",
    "SYNCHRONOUS_COMMIT",
    "SYNC_DRIVERS",
    "MissingDriver",
    "SQLStore",
    "check_driver",
    "epoch_table",
    "epoch_table_name",
    "make_names_binary",
    "name_type",
    "reconnecting",
    "sequence_table",
    "store_url",
    "sync_driver_url",
    "validate_table_name",
]


log = logging.getLogger("autoseq")
#: How long (s) ``read`` and ``create`` wait for a lock on the application's
#: SQLite file before answering without its gapless rows (see ``_app_read``).
SERVING_WAIT = 1.0


class SQLStore:
    """A [`SequenceStore`][autoseq.stores.base.SequenceStore] on any SQLAlchemy Core database.

    ``engine_or_url`` names the application's database; the store opens its
    own small engine on it, so a reservation never uses (or waits for) one of
    the application's connections or transactions. ``max_retries`` bounds
    conflict and deadlock retries; ``connect_timeout`` (seconds) bounds how
    long an unreachable server may take to fail; ``statement_timeout``
    (seconds) bounds how long a server that stopped answering on an open
    connection can hold an operation, and how long a reservation retries;
    half of it bounds each wait for a row another transaction holds locked.
    ``synchronous_commit`` (PostgreSQL) is set for the store's sessions:
    ``"on"`` (the default) makes every reservation durable on disk and, when
    the server has synchronous standbys, on them before it is handed out,
    whatever the server or role says; a reservation the server reports as
    committed only locally is never served. ``None`` keeps the server's.
    ``failover_skip_blocks`` (PostgreSQL): at the first connection to a new
    primary (its timeline differs from the epoch recorded beside the rows),
    every row moves forward by that many of its largest blocks before
    anything is served, so values an asynchronous standby never received
    are not handed out again by any process (docs/scaling.md); 0 skips
    nothing (worker leases are still kept).
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
        synchronous_commit: str | None = "on",
        connect_args: Mapping[str, Any] | None = None,
        failover_skip_blocks: int = DEFAULT_SKIP_BLOCKS,
    ) -> None:
        self.table_name = validate_table_name(table)
        synchronous_commit = validate_synchronous_commit(synchronous_commit)
        self.failover_skip_blocks = validate_skip_blocks(failover_skip_blocks)
        engine_or_url = getattr(engine_or_url, "sync_engine", engine_or_url)  # an AsyncEngine
        if isinstance(engine_or_url, Engine):
            app_url = engine_or_url.url
            if connect_args is not None:
                raise InvalidSequenceConfig(
                    "SQLStore(engine, connect_args=...): the store connects as the engine "
                    "does; give the options to create_engine(), or give SQLStore a URL"
                )
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
        self.table = sequence_table(self.table_name, raw_flags=True)
        self.dialect = self.url.get_backend_name()
        self._table_ready = False
        self._version_ready = False
        # No client-side read timeout in libpq: see _deadline().
        self._watch = SocketWatch(statement_timeout) if needs_watchdog(self.url) else None
        self._gate = ForkGate(sqlite_timeout + 1.0)
        if self.dialect == "sqlite" and not private_memory:
            _gated.add(self)
        self.engine = make_engine(
            self.url,
            private_memory=private_memory,
            connect_timeout=connect_timeout,
            sqlite_timeout=sqlite_timeout,
            statement_timeout=statement_timeout,
            watch=self._watch,
            connect_args=connect_args,
            creator=_connects_like(engine_or_url, self.url),
        )
        #: Where gapless rows live on SQLite: ``main.<table>_gapless`` of the
        #: application's file, which the caller's transaction covers.
        self.gapless_table = gapless_sqlite_table(self.table_name)
        path = None if private_memory else application_file(app_url)
        self._app_rows = (
            None if path is None else AppFileRows(path, self.gapless_table, sqlite_timeout)
        )
        self._app_locked_until = 0.0
        self.replication = (
            Replication(
                self.engine,
                synchronous_commit,
                Epoch(
                    self.table_name,
                    failover_skip_blocks,
                    max(1, int(statement_timeout * 500)),
                    synchronous_commit,
                    self.engine.dialect.identifier_preparer.quote,
                ),
                self._treated,
            )
            if self.dialect == "postgresql"
            else None
        )
        settings = self._session_settings(statement_timeout)
        transaction_settings(self.engine, settings)
        self._one_statement = one_statement_reservation(self.table, self.engine, settings)
        self._many_statement = one_statement_reservation(
            self.table, self.engine, settings, many=True
        )
        self._mixed_statement = mixed_reservation(self.table, self.engine, settings)
        self._release_statement = batch_release(self.table, self.engine)
        reset_after_fork(self)

    def _session_settings(self, statement_timeout: float) -> dict[str, str]:
        """What each transaction sets for itself (PostgreSQL and its look-alikes).

        ``lock_timeout``: a row held by a stuck transaction fails the wait
        cleanly (retried, then ``ReservationConflict``) within half of
        ``statement_timeout``; ``synchronous_commit`` (PostgreSQL itself).
        """
        if not speaks_postgresql(self.engine.dialect):
            return {}
        settings = {"lock_timeout": str(max(1, int(statement_timeout * 500)))}
        if self.replication is not None:
            settings |= self.replication.settings()
        return settings

    def _treated(self, treatment: Treatment) -> None:
        """Say what a failover treatment did (a connection of this store ran it)."""
        skipped = sum(skip.skipped for skip in treatment.skips)
        log.warning(
            "PostgreSQL failover (system %s timeline %s, the rows were written on timeline %s): "
            "moved %d sequence row(s) forward (%d values in all) past what the lost "
            "replication window could have served, and kept %d live worker lease(s)",
            *treatment.now,
            treatment.was[1],
            len(treatment.skips),
            skipped,
            treatment.leases,
        )
        for skip in treatment.skips:
            if skip.short:
                log.warning(
                    "sequence %r: the failover margin is %d values but only %d were left "
                    "before end; the row now stands at its end (reservations raise "
                    "SequenceExhausted, or a cycling row starts over, where values the old "
                    "primary served may come again). Raise end, or check the keys in use and "
                    "set the sequence below them (`autoseq set`)",
                    skip.name,
                    skip.wanted,
                    skip.skipped,
                )
            signals.failover_skipped.send(
                self,
                name=skip.name,
                skipped=skip.skipped,
                wanted=skip.wanted,
                short=skip.short,
                primary=treatment.now,
                was=treatment.was,
            )
        for name in treatment.unreadable:
            log.warning(
                "sequence %r: its row is not valid, so the failover treatment could not move "
                "it; fix it (`autoseq doctor`) and move it past the keys in use",
                name,
            )

    # engine ---------------------------------------------------------------

    def _deadline(self) -> AbstractContextManager[None]:
        """Bound the operation inside to ``statement_timeout`` where the driver cannot."""
        return nullcontext() if self._watch is None else self._watch.deadline()

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
        """Create ``sys_sequence`` unless it exists, or bring an older one up to date.

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
        self._upgrade_table()
        self._record_epoch()

    def _record_epoch(self) -> None:
        """Record which primary the rows are on (PostgreSQL), unless recorded (see `_epoch`)."""
        if self.replication is None:
            return
        with (
            self._errors("create_table", "recording the epoch beside the sequence table"),
            self._connection() as connection,
        ):
            self.replication.record_epoch(connection.connection.dbapi_connection)

    def drop(self) -> None:
        """Drop ``sys_sequence`` (tests, ``autoseq`` maintenance), and its epoch record."""
        self.table.drop(self.engine, checkfirst=True)
        if self.replication is not None:
            quoted = self.engine.dialect.identifier_preparer.quote(
                epoch_table_name(self.table_name)
            )
            with self._transaction() as connection:
                connection.exec_driver_sql(f"DROP TABLE IF EXISTS {quoted}")
        self._table_ready = False

    def drop_table(self) -> None:
        """Deprecated: `drop()` (every store drops itself by that name)."""
        warnings.warn(
            "SQLStore.drop_table() is deprecated: call drop(); the old name goes in the next "
            "release",
            DeprecationWarning,
            stacklevel=2,
        )
        self.drop()

    def _ensure_table(self) -> None:
        if not self._table_ready:
            self.create_table()

    def _upgrade_table(self) -> None:
        """Bring a table made by an older autoseq up to date (once per store).

        Adds ``version``, and on MariaDB/MySQL gives ``name`` its binary
        collation, so that names differing in case or accents are two rows.
        """
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
                        # Look again on the connection that alters: SQLite
                        # checks ADD COLUMN against that connection's cached
                        # schema, which reading the columns refreshes (a
                        # pooled connection may have last seen the column
                        # before another one dropped it).
                        present = sa.inspect(connection).get_columns(self.table_name)
                        if "version" not in {column["name"] for column in present}:
                            connection.exec_driver_sql(
                                f"ALTER TABLE {quoted} ADD COLUMN version BIGINT NOT NULL DEFAULT 0"
                            )
                            log.info("added the version column to %s", self.table_name)
                except DBAPIError:
                    # Another process or connection added it first. Ask with a
                    # statement, not the inspector: a statement checks the
                    # schema the server has now, where a reflected answer came
                    # from the same view that just missed the column.
                    if not self._selects_version():
                        raise
        if self.dialect in ("mysql", "mariadb"):
            self._make_names_binary()
        self._version_ready = True

    def _make_names_binary(self) -> None:
        what = "giving the sequence table's name column a binary collation (needs ALTER)"
        with (
            self._errors("upgrade_table", what, catch=SQLAlchemyError),
            self._transaction() as connection,
        ):
            if make_names_binary(connection, self.table_name, self.statement_timeout / 2):
                log.info("%s: names now compare byte for byte", self.table_name)

    def _selects_version(self) -> bool:
        """Whether ``SELECT version`` from the table works (the column exists)."""
        try:
            with self._deadline(), self.engine.connect() as connection:
                connection.execute(sa.select(self.table.c.version).where(sa.false()))
        except DBAPIError:
            return False
        return True

    # rows -----------------------------------------------------------------

    @reconnecting
    def create(self, config: SequenceConfig) -> SequenceConfig:
        gapless = self._app_read(config.name, serving=True)
        if gapless is not None:
            return SequenceConfig.from_row(gapless)  # the stored row wins, wherever it is
        self._ensure_table()
        row = config.as_row() | {"updated_at": utc_now(), "version": 0}
        with self._errors("create", f"creating sequence {config.name!r}", config.name):
            try:
                with self._transaction() as connection:
                    connection.execute(sa.insert(self.table).values(row))
            except IntegrityError:
                pass  # another process created it first: the stored row wins
        stored = self._own_raw(config.name)  # a gapless row would have been returned above
        if stored is None:  # pragma: no cover - deleted between insert and read
            raise SequenceNotFound(config.name, "it was deleted while being created")
        return SequenceConfig.from_row(stored)

    @reconnecting
    def create_many(self, configs: list[SequenceConfig]) -> list[SequenceConfig]:
        """``create`` of each config in one transaction: multi-row INSERTs, one commit.

        The rows that exist win, as in ``create`` (a gapless row of the
        application's file too), and a name given twice gets the row of its
        first config. Every item is checked first and the rows go in one
        transaction, so a bad item or a failure leaves nothing written. A
        creator racing this one (its INSERT collides) makes the whole
        transaction start again, reading the rows it created.
        """
        items = check_configs(configs)
        firsts = first_configs(items)
        if not firsts:
            return []
        stored = {
            name: SequenceConfig.from_row(row)
            for name, row in self._app_read_all(set(firsts)).items()
        }
        own = [config for name, config in firsts.items() if name not in stored]
        if own:
            self._ensure_table()
            self._upgrade_table()
            rows = configs_from_values(self._insert_missing(own))
            stored |= {row.name: row for row in rows}
        return [stored[config.name] for config in items]

    def _chunk(self, columns: int = 1) -> int:
        """Rows of ``columns`` bound values per statement: within every database's limit
        on bound parameters (SQLite's was 999 before 3.32; elsewhere 32,766 or more)."""
        if self.dialect == "sqlite":
            import sqlite3

            if sqlite3.sqlite_version_info < (3, 32):
                return 900 // columns
        return 5000 // columns

    def _insert_missing(self, configs: list[SequenceConfig]) -> list[Any]:
        """Insert the rows of ``configs`` that do not exist, in one transaction; every row
        of ``configs`` as stored then (tuples in ``ROW_COLUMNS`` order)."""
        t = self.table
        names = [config.name for config in configs]
        listed = t.c.name.in_(sa.bindparam("names", expanding=True, type_=t.c.name.type))
        exists = sa.select(t.c.name).where(listed)
        stored = sa.select(*(t.c[column] for column in ROW_COLUMNS)).where(listed)
        size = self._chunk()
        chunks = [names[at : at + size] for at in range(0, len(names), size)]
        per_insert = self._chunk(len(ROW_COLUMNS))
        what = f"creating {len(configs)} sequence(s)"
        started = time.monotonic()
        for attempt in range(self.max_retries):
            try:
                with self._transaction() as connection:
                    found: set[str] = set()
                    for chunk in chunks:
                        found.update(connection.execute(exists, {"names": chunk}).scalars())
                    now = utc_now()
                    new = [
                        config.as_row() | {"updated_at": now, "version": 0}
                        for config in configs
                        if config.name not in found
                    ]
                    for at in range(0, len(new), per_insert):
                        # one multi-row INSERT per chunk (executemany: SQLAlchemy's
                        # insertmanyvalues, psycopg's pipeline, sqlite3's loop)
                        connection.execute(sa.insert(t), new[at : at + per_insert])
                    rows: list[Any] = []
                    for chunk in chunks:
                        rows.extend(connection.execute(stored, {"names": chunk}))
                return rows
            except IntegrityError:
                pass  # another process created one of them meanwhile: read again
            except DBAPIError as exc:
                late = time.monotonic() > started + self.statement_timeout
                if not retryable(exc) or late or attempt == self.max_retries - 1:
                    raise self._translate(exc, "create", what, None) from exc
            time.sleep(min(0.2, 0.001 * 2 ** min(attempt, 8)) * random.random())
        raise ReservationConflict(
            f"{what}: gave up after {self.max_retries} attempt(s), each colliding with "
            "another process creating some of the same rows; try again, or raise "
            "SQLStore(max_retries=...)"
        )

    def _app_read_all(self, names: set[str]) -> dict[str, dict[str, Any]]:
        """The gapless rows among ``names`` in the application's SQLite file, as stored.

        Waits as `_app_read` does when serving: a moment at most, then
        answers as if none existed.
        """
        if self._app_rows is None or time.monotonic() < self._app_locked_until:
            return {}
        what = "reading gapless sequences in the application's file"
        with self._gate.passage(), self._errors("read", what):
            try:
                rows = self._app_rows.read_all_raw(wait=SERVING_WAIT)
            except DBAPIError as exc:
                if not locked(exc):
                    raise
                log.debug("%s: the application's file is locked; blocks only", what)
                self._app_locked_until = time.monotonic() + 10 * SERVING_WAIT
                return {}
        return {row["name"]: row for row in rows if row["name"] in names}

    @reconnecting
    def read(self, name: str) -> SequenceConfig | None:
        validate_name(name)
        gapless = self._app_read(name, serving=True)
        row = gapless if gapless is not None else self._own_raw(name)
        return None if row is None else SequenceConfig.from_row(row)

    @reconnecting
    def read_own(self, name: str) -> SequenceConfig | None:
        """Row ``name`` of the store's own table (on SQLite the companion), never a gapless one."""
        row = self._own_raw(validate_name(name))
        return None if row is None else SequenceConfig.from_row(row)

    @reconnecting
    def read_raw(self, name: str) -> dict[str, Any] | None:
        """The stored row as the driver returns it, unvalidated (for repairs)."""
        validate_name(name)
        gapless = self._app_read(name)
        return gapless if gapless is not None else self._own_raw(name)

    def _own_raw(self, name: str) -> dict[str, Any] | None:
        statement = sa.select(self.table).where(self.table.c.name == name)
        rows = self._select(statement, f"reading sequence {name!r}", name)
        return dict(rows[0]) if rows else None

    @reconnecting
    def read_all(self) -> list[SequenceConfig]:
        return configs_from_values(self.read_all_values())

    @reconnecting
    def read_all_values(self) -> list[Any]:
        """Every stored row as a tuple in `autoseq.config.ROW_COLUMNS` order, by name, unchecked.

        Gapless rows included. What ``SequenceRegistry.load()`` reads: plain
        tuples cost about what the SELECT itself does (issue 34).
        """
        statement = sa.select(*(self.table.c[column] for column in ROW_COLUMNS))
        rows: list[Any] = list(self._select(statement, "reading sequences", tuples=True))
        if self._app_rows is not None:
            what = "reading gapless sequences in the application's file"
            with self._gate.passage(), self._errors("read", what):
                gapless = self._app_rows.read_all_raw()
            if gapless:
                by_name = {row[0]: row for row in rows}
                by_name |= {
                    row["name"]: tuple(row.get(column) for column in ROW_COLUMNS) for row in gapless
                }
                rows = list(by_name.values())
        rows.sort(key=itemgetter(0))
        return rows

    @reconnecting
    def stored_names(self) -> list[str]:
        """Every stored name, rows that fail validation included, in order."""
        return [str(row["name"]) for row in self._all_raw()]

    def _all_raw(self) -> list[Mapping[Any, Any]]:
        """Every stored row, gapless ones included, by name (read-only mappings)."""
        rows: dict[str, Mapping[Any, Any]] = {
            row["name"]: row for row in self._select(sa.select(self.table), "reading sequences")
        }
        if self._app_rows is not None:
            what = "reading gapless sequences in the application's file"
            with self._gate.passage(), self._errors("read", what):
                rows |= {row["name"]: row for row in self._app_rows.read_all_raw()}
        return [rows[name] for name in sorted(rows)]

    def _app_read(self, name: str, *, serving: bool = False) -> dict[str, Any] | None:
        """Gapless row ``name`` of the application's SQLite file, as stored, or None.

        ``serving``: for ``read`` and ``create``, which a registry calls on a
        sequence's first use, maybe inside the caller's transaction on that
        very file. A transaction that holds it exclusively (a large one
        spills its changes into the file) would make the read wait for the
        caller, who waits for the value: so such a read waits a moment only,
        then answers from the store's own table as if no gapless row
        existed, which is right for the blocks a registry serves. Every
        other read (read_raw, read_all, compare_and_set: the operators'
        paths) waits for the lock as long as the store's timeout.
        """
        if self._app_rows is None:
            return None
        what = f"reading gapless sequence {name!r}"
        if serving and time.monotonic() < self._app_locked_until:
            return None  # locked a moment ago: do not wait again for each call
        with self._gate.passage(), self._errors("read", what, name):
            if not serving:
                return self._app_rows.read_raw(name)
            try:
                return self._app_rows.read_raw(name, wait=SERVING_WAIT)
            except DBAPIError as exc:
                if not locked(exc):
                    raise
                log.debug("%s: the application's file is locked; blocks only", what)
                self._app_locked_until = time.monotonic() + 10 * SERVING_WAIT
                return None

    def _select(
        self, statement: sa.Select[Any], what: str, name: str | None = None, *, tuples: bool = False
    ) -> Sequence[Any]:
        """The rows ``statement`` reads (mappings, or tuples); none while the table does not
        exist yet."""
        if self._app_rows is not None and not os.path.exists(self.url.database or ""):
            return []  # no companion file yet: reading must not create one
        self._upgrade_table()
        try:
            with self._connection() as connection:
                result = connection.execute(statement)
                return result.all() if tuples else result.mappings().all()
        except (NoSuchTableError, DBAPIError) as exc:
            if self._missing_table(exc):
                return []
            raise self._translate(exc, "read", what, name) from exc

    @reconnecting
    def update(self, config: SequenceConfig) -> SequenceConfig:
        if self._app_rows is not None:
            what = f"updating gapless sequence {config.name!r}"
            with self._gate.passage(), self._errors("update", what, config.name):
                updated = self._app_rows.update(config)
            if updated:
                stored = self.read(config.name)
                assert stored is not None
                return stored
        self._upgrade_table()
        row = config.as_row() | {"updated_at": utc_now(), "version": self.table.c.version + 1}
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

    @reconnecting
    def delete(self, name: str) -> bool:
        """Remove a row; True if it existed."""
        validate_name(name)
        with self._gate.passage():
            gapless = self._app_rows is not None and self._app_rows.delete(name)
        with self._transaction() as connection:
            result = connection.execute(sa.delete(self.table).where(self.table.c.name == name))
        return bool(result.rowcount) or gapless

    # reservation ----------------------------------------------------------

    def reserve(self, name: str, count: int) -> Block:
        validate_name(name)
        check_count(count)
        self._upgrade_table()
        started = time.monotonic()
        gives_up = started + self.statement_timeout
        attempts = 0
        for attempt in range(self.max_retries):
            attempts += 1
            try:
                with self._watching() as warnings:
                    block = self._reserve_in_one_statement(name, count)
                    if block is None:
                        block = self._reserve_under_row_lock(name, count)
                self.reservations += 1
                return self._durable(block, warnings)
            except Conflict:
                pass
            except DBAPIError as exc:
                if self._missing_table(exc):
                    raise SequenceNotFound(
                        name,
                        "the sequence table does not exist yet; "
                        "register the sequence or run `autoseq init`",
                    ) from None
                late = time.monotonic() > gives_up
                if not retryable(exc) or (late and exc.connection_invalidated):
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

    def reserve_many(self, requests: list[tuple[str, int]]) -> list[Block | None]:
        """A block of many sequences in few round trips, each row's own compare-and-set.

        Where the database has ``UPDATE ... FROM ... RETURNING`` (PostgreSQL,
        SQLite 3.38+): one statement per 5,000 names, each row taking its own
        count under the conditions of the one-statement reservation
        (`mixed_reservation`); a row it leaves alone (missing, cycling, near
        its end, hand-edited) is None, for ``reserve`` to handle or refuse.
        On an older SQLite with ``RETURNING``: one such statement per count.
        Elsewhere (MariaDB, MySQL): the rows are read under ``SELECT ... FOR
        UPDATE``, planned as ``reserve`` plans them, and written by one
        ``UPDATE`` whose ``(name, version) IN (...)`` is the compare-and-set;
        a missing, exhausted or hand-edited row is None. A name asked twice
        is None after its first. On SQLite the statements share one
        transaction; elsewhere each chunk commits alone, so a row is locked
        for one statement only. A failure after some blocks came back
        returns those (the rest None); before, it raises ``StoreUnavailable``.
        """
        items = check_requests(requests)
        out: list[Block | None] = [None] * len(items)
        if not items:
            return out
        self._upgrade_table()
        index: dict[str, int] = {}
        counts: dict[str, int] = {}
        for at, (name, count) in enumerate(items):
            if name not in index:
                index[name] = at
                counts[name] = count
        one_statement = self._mixed_statement is not None or self._many_statement is not None
        size = self._chunk() if one_statement else self._chunk(3)
        # In one order everywhere: processes reserving overlapping rows together lock them
        # in the same order, so their statements never deadlock.
        names = sorted(counts)
        chunks = [
            {name: counts[name] for name in names[at : at + size]}
            for at in range(0, len(names), size)
        ]
        got: list[Block] = []
        try:
            with self._watching() as warnings:
                if self.dialect == "sqlite":  # one writer anyway: one transaction, one commit
                    got = self._reserving(chunks, one_transaction=True)
                else:
                    for chunk in chunks:
                        got.extend(self._reserving([chunk], one_transaction=False))
        except StoreUnavailable:
            if not got:
                raise
            log.debug("reserve_many: stopped after %d block(s); the rest reserve alone", len(got))
        if warnings:
            raise StoreUnavailable(
                f"the server committed {len(got)} reservation(s) without confirming they "
                f"reached the synchronous standby ({warnings[0]}); those values are skipped. "
                "Check the standby (pg_stat_replication) and leave commits waiting for it "
                "uncancelled",
                operation="reserve",
                reason="not replicated",
            )
        for block in self._marked(got):
            out[index[block.name]] = block
        self.reservations += len(got)
        return out

    def _reserving(self, chunks: list[dict[str, int]], *, one_transaction: bool) -> list[Block]:
        """Reserve from each row of every chunk the values it maps to, retrying conflicts."""
        started = time.monotonic()
        what = f"reserving from {sum(map(len, chunks))} sequence(s)"
        for attempt in range(self.max_retries):
            try:
                got: list[Block] = []
                if self._mixed_statement is None and self._many_statement is None:
                    with self._transaction() as connection:
                        for chunk in chunks:
                            got.extend(self._reserve_locked_rows(connection, chunk))
                    return got
                context = self._transaction() if one_transaction else self._connection()
                with context as connection:
                    if not one_transaction:
                        connection.execution_options(isolation_level="AUTOCOMMIT")
                    for chunk in chunks:
                        got.extend(self._reserve_returning(connection, chunk))
                return got
            except Conflict:
                pass
            except DBAPIError as exc:
                if self._missing_table(exc):
                    return []
                late = time.monotonic() > started + self.statement_timeout
                if not retryable(exc) or late or attempt == self.max_retries - 1:
                    raise self._translate(exc, "reserve", what, None) from exc
            time.sleep(min(0.2, 0.001 * 2 ** min(attempt, 8)) * random.random())
        raise ReservationConflict(
            f"reserving from many sequences: gave up after {self.max_retries} attempt(s), "
            "each colliding with another reservation; reserve them one by one"
        )

    def _reserve_returning(self, connection: Connection, counts: dict[str, int]) -> list[Block]:
        """Reserve ``counts`` with ``UPDATE ... RETURNING``: one statement for them all where
        the database joins them (`mixed_reservation`), else one per count."""
        now = utc_now()
        statement = self._mixed_statement
        rows: list[Any] = []
        if statement is not None:
            if self.dialect == "sqlite":
                wanted = json.dumps([[name, n] for name, n in counts.items()], ensure_ascii=False)
                params: dict[str, Any] = {"wanted": wanted}
            else:
                params = {"names": list(counts), "counts": list(counts.values())}
            rows.extend(connection.execute(statement, params | {"now": now}).all())
        elif (many := self._many_statement) is not None:
            by_count: dict[int, list[str]] = {}
            for name, count in counts.items():
                by_count.setdefault(count, []).append(name)
            for count, names in by_count.items():
                params = {"seq_names": names, "count": count, "span": count - 1, "now": now}
                rows.extend(connection.execute(many, params).all())
        return [_returned_block(row, counts[row.name]) for row in configs_from_values(rows)]

    def _reserve_locked_rows(self, connection: Connection, counts: dict[str, int]) -> list[Block]:
        """Without ``UPDATE ... RETURNING``: read the rows under ``FOR UPDATE``, plan each as
        ``reserve`` does, and write them in one ``UPDATE`` guarded by each row's version."""
        t = self.table
        columns = [t.c[column] for column in ROW_COLUMNS]
        rows = connection.execute(
            sa.select(*columns).where(t.c.name.in_(list(counts))).with_for_update()
        ).all()
        planned: list[tuple[Block, int]] = []
        for row in rows:
            try:
                [stored] = configs_from_values([row])
                planned.append(plan_reservation(stored, counts[stored.name]))
            except (InvalidSequenceConfig, SequenceExhausted):
                continue  # left to reserve(), which refuses it by name
        if not planned:
            return []
        unchanged = sa.tuple_(t.c.name, t.c.version).in_(
            [(block.name, block.version - 1) for block, _ in planned]
        )
        current = sa.case({block.name: new for block, new in planned}, value=t.c.name)
        result = connection.execute(
            sa.update(t)
            .where(unchanged)
            .values(current=current, updated_at=utc_now(), version=t.c.version + 1)
        )
        if result.rowcount != len(planned):
            raise Conflict
        return [block for block, _ in planned]

    def _watching(self) -> AbstractContextManager[list[str]]:
        """The server's warnings to this thread inside (PostgreSQL), committing included."""
        return nullcontext([]) if self.replication is None else self.replication.watching()

    def _durable(self, block: Block, warnings: list[str]) -> Block:
        """``block`` if its commit is durable, marked when the primary changed; else raise."""
        if warnings:
            # Committed locally only: a failover now would hand it out again.
            raise StoreUnavailable(
                f"sequence {block.name!r}: the server committed the reservation of "
                f"{block.first}..{block.last} without confirming it reached the synchronous "
                f"standby ({warnings[0]}); those values are skipped. Check the standby "
                "(pg_stat_replication) and leave commits waiting for it uncancelled",
                name=block.name,
                operation="reserve",
                reason="not replicated",
            )
        [marked] = self._marked([block])
        return marked

    def _marked(self, blocks: list[Block]) -> list[Block]:
        """``blocks``, each marked ``failover`` when the primary changed since the last ask."""
        # Asked once a reservation, whatever it returned: the answer resets.
        if self.replication is None or not self.replication.failed_over():
            return blocks
        return [dataclasses.replace(block, failover=True) for block in blocks]

    def _reserve_in_one_statement(self, name: str, count: int) -> Block | None:
        """The common case in one round trip: ``UPDATE ... RETURNING``, autocommitted.

        Only a row the statement can prove ordinary is touched: valid (the
        checks of ``SequenceConfig.from_row``), not cycling, ``start`` not
        negative (so no sum can overflow) and with ``count`` values left
        before ``end``. Anything else (a missing row, the last values
        before ``end``, a cycle, a row edited into an impossible state)
        returns ``None`` untouched, for `_reserve_under_row_lock` to
        handle or refuse. ``None`` too where the database has no
        ``UPDATE ... RETURNING`` (MariaDB, SQLite before 3.35).
        """
        statement = self._one_statement
        if statement is None or count < 1:
            return None
        params = {"seq_name": name, "count": count, "span": count - 1, "now": utc_now()}
        if self.dialect != "sqlite":  # SQLite takes its write lock with BEGIN IMMEDIATE
            with self._connection() as connection:
                connection.execution_options(isolation_level="AUTOCOMMIT")
                row = connection.execute(statement, params).mappings().first()
        else:
            with self._transaction() as connection:
                row = connection.execute(statement, params).mappings().first()
        if row is None:
            return None
        return _returned_block(SequenceConfig.from_row(row), count)

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
                .values(current=new_current, updated_at=utc_now(), version=t.c.version + 1)
            )
            if result.rowcount != 1:
                raise Conflict
        return block

    @reconnecting
    def release(self, block: Block) -> bool:
        self._upgrade_table()
        with (
            self._errors("release", f"releasing a block of {block.name!r}", block.name),
            self._transaction() as connection,
        ):
            return self._release_in(connection, block)

    @reconnecting
    def release_many(self, blocks: list[Block]) -> list[bool]:
        """``release`` of each block in one transaction: one commit, not one per block."""
        if not blocks:
            return []
        self._upgrade_table()
        with (
            self._errors("release", f"releasing {len(blocks)} block(s)", None),
            self._transaction() as connection,
        ):
            return self._release_batch(connection, blocks)

    def _release_batch(self, connection: Connection, blocks: list[Block]) -> list[bool]:
        """One statement for every block, where the database has one (`batch_release`).

        The same compare-and-set as `release()` for each row: ``name``,
        ``version`` and ``current`` must all still be what the block left.
        The blocks travel as a fixed number of parameters, so the statement
        costs the same to build and parse for ten blocks or ten thousand.
        """
        statement = self._release_statement
        names = {block.name for block in blocks}
        if statement is None or len(names) != len(blocks):
            return [self._release_in(connection, block) for block in blocks]
        # A block whose end is past BIGINT matches no stored ``current``: it
        # stays a gap without reaching the database (where it would not bind).
        sent = [block for block in blocks if block.last + block.step <= MAX_VALUE]
        if not sent:
            return [False] * len(blocks)
        params: dict[str, Any] = {"now": utc_now()}
        if self.dialect == "sqlite":
            params["blocks"] = json.dumps(
                [[b.name, b.version, b.last + b.step, b.first] for b in sent], ensure_ascii=False
            )
        else:
            params["names"] = [b.name for b in sent]
            params["versions"] = [b.version for b in sent]
            params["currents"] = [b.last + b.step for b in sent]
            params["firsts"] = [b.first for b in sent]
        went = set(connection.execute(statement, params).scalars())
        return [block.name in went for block in blocks]

    def _release_in(self, connection: Connection, block: Block) -> bool:
        """The compare-and-set of ``current`` back to ``block.first``, in ``connection``."""
        t = self.table
        result = connection.execute(
            sa.update(t)
            .where(
                t.c.name == block.name,
                t.c.version == block.version,
                t.c.current == block.last + block.step,
            )
            .values(current=block.first, updated_at=utc_now(), version=block.version + 1)
        )
        return result.rowcount == 1

    @reconnecting
    def compare_and_set(self, row: SequenceConfig, version: int) -> SequenceConfig | None:
        if self._app_read(row.name) is not None:
            return self._app_compare_and_set(row, version)
        t = self.table
        self._upgrade_table()
        values = row.as_row() | {"updated_at": utc_now(), "version": version + 1}
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

    def _app_compare_and_set(self, row: SequenceConfig, version: int) -> SequenceConfig | None:
        """``compare_and_set`` of a gapless row, in the application's SQLite file."""
        assert self._app_rows is not None
        what = f"writing gapless sequence {row.name!r}"
        with self._gate.passage(), self._errors("compare_and_set", what, row.name):
            written, exists = self._app_rows.compare_and_set(row, version)
        if not exists:
            raise SequenceNotFound(row.name)
        return self.read(row.name) if written else None

    @reconnecting
    def replication_findings(self) -> list[tuple[str, str]]:
        """(level, message) pairs for ``doctor``: could a failover repeat values? (PostgreSQL)"""
        if self.replication is None:
            return []
        with (
            self._errors("doctor", "reading the replication settings"),
            self._connection() as connection,
        ):
            return replication_findings(
                connection.connection.dbapi_connection,
                self.replication.synchronous_commit,
                self.replication.epoch,
            )

    def _missing_table(self, exc: BaseException) -> bool:
        return missing_table(exc, self.table_name)

    # capabilities (autoseq.stores.capabilities) ---------------------------

    def worker_leases(self) -> WorkerLeases:
        """Snowflake worker-id leases in ``sys_worker`` beside this store's table."""
        from autoseq.stores.sql.workers import SQLWorkers

        return one_per_store(self, lambda: SQLWorkers(self))

    def gapless_engine(self) -> GaplessEngine:
        """Gapless values taken in the caller's SQL transaction."""
        from autoseq.stores.sql import gapless

        return gapless

    def column_max(self, table: str, column: str) -> int | None:
        """``max(table.column)`` in the application's database (``schema.table`` allowed)."""
        from autoseq.stores.sql._columns import column_max

        return column_max(self.app_url, table, column)

    def doctor_findings(self) -> list[tuple[str, str, str]]:
        """What ``autoseq doctor`` checks on this store beyond its rows."""
        from autoseq.stores.sql._doctor import findings

        return findings(self)

    def location(self) -> str:
        """The database URL, without its password."""
        return str(self.url.render_as_string(hide_password=True))

    def sqlite_files(self) -> tuple[str, str] | None:
        """(application database, companion file) of a SQLite file store, else None."""
        if self.dialect != "sqlite":
            return None
        companion = self.url.database
        if not companion or companion == ":memory:" or companion.startswith("file:"):
            return None
        application = companion.removesuffix(SIDECAR_SUFFIX)
        return application, companion

    def rows_may_exist(self) -> bool:
        """Whether a row can exist, without creating an empty SQLite file to find out."""
        if self.dialect != "sqlite":
            return True
        files = [self.app_url.database, self.url.database]
        if any(not database or database == ":memory:" for database in files):
            return True
        return any(os.path.exists(str(database)) for database in files)

    # lifecycle ------------------------------------------------------------

    def after_fork(self) -> None:
        # Connections belong to the parent; the child opens its own (and
        # must never shut the parent's sockets down from its watchdog).
        if self._watch is not None:
            self._watch.after_fork()
        self._gate = ForkGate(self._gate.timeout)
        self.engine.dispose(close=False)
        if self._app_rows is not None:
            self._app_rows.dispose(close=False)

    def close(self) -> None:
        self.engine.dispose()
        if self._app_rows is not None:
            self._app_rows.dispose()


def _returned_block(stored: SequenceConfig, count: int) -> Block:
    """The block of ``count`` values a reservation statement ended at ``stored`` (its new row)."""
    step, after = stored.step, stored.next_value
    return Block(stored.name, after - count * step, after - step, step, stored)


def _connects_like(engine_or_url: object, url: URL) -> Callable[..., Any] | None:
    """An application engine's own way to connect, where the store connects the same way.

    Its ``connect_args``, ``do_connect`` hooks or custom ``creator`` then
    apply to the store's connections too (a pooler's options, credentials
    from a connector). Not where the store swapped an asyncio driver for a
    sync one, nor on SQLite, whose store lives in a companion file.
    """
    if not isinstance(engine_or_url, Engine) or url.get_backend_name() == "sqlite":
        return None
    if engine_or_url.url.drivername != url.drivername:
        return None
    return engine_or_url.pool._creator


_gated: weakref.WeakSet[SQLStore] = weakref.WeakSet()
_closed_at_fork: list[ForkGate] = []


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
