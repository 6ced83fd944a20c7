"""The store's own engine: pool, timeouts, the caller's options, SQLite's WAL and write lock."""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.engine.url import URL
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.pool import QueuePool

from autoseq.errors import InvalidSequenceConfig, StoreUnavailable
from autoseq.stores.sql._watchdog import SocketWatch

_MYSQL_DRIVERS = ("pymysql", "mysqldb", "mariadbconnector")


def needs_watchdog(url: URL) -> bool:
    """True where the driver has no client-side read timeout (libpq): see ``SocketWatch``."""
    return url.get_backend_name() != "sqlite" and url.get_driver_name() not in _MYSQL_DRIVERS


def make_engine(
    url: URL,
    *,
    private_memory: bool,
    connect_timeout: float,
    sqlite_timeout: float,
    statement_timeout: float,
    watch: SocketWatch | None,
    connect_args: Mapping[str, Any] | None = None,
    creator: Callable[..., Any] | None = None,
) -> Engine:
    """The store's engine on ``url``; ``watch`` sees every connection it opens.

    ``connect_args`` are the caller's options, over the store's own;
    ``creator`` (an application engine's own way to connect) replaces both.
    No pre-ping: a connection idle a while is pinged at checkout, a busy
    one is not (see `_ping_when_idle`).
    """
    sqlite = url.get_backend_name() == "sqlite"
    if sqlite:
        kwargs: dict[str, Any] = {
            "connect_args": {"timeout": sqlite_timeout, "check_same_thread": False}
        }
        if private_memory:
            # The database lives only as long as its one connection, and
            # that connection must serve one thread at a time, or a
            # prefetch worker's transaction interleaves with a caller's:
            # a pool of exactly one, lent out in turn.
            kwargs.update(poolclass=QueuePool, pool_size=1, max_overflow=0, pool_timeout=60)
        engine = sa.create_engine(url, **kwargs)
        _sqlite_immediate(engine, private_memory, sqlite_timeout)
        return engine
    url, options = driver_options(url, connect_args)
    kwargs = {"pool_size": 2, "max_overflow": 8, "pool_recycle": 3600}
    if creator is not None:
        kwargs["creator"] = _with_threshold(creator, url, options)
    else:
        kwargs["connect_args"] = _own_options(url, connect_timeout, statement_timeout) | options
    engine = sa.create_engine(url, **kwargs)
    if url.get_driver_name() == "psycopg" and "prepare_threshold" not in options:
        _prepare_after(engine, None)
    _ping_when_idle(engine)
    if watch is not None:
        event.listen(engine, "connect", lambda dbapi_connection, _: watch.add(dbapi_connection))
    return engine


def _own_options(url: URL, connect_timeout: float, statement_timeout: float) -> dict[str, Any]:
    driver = url.get_driver_name()
    options: dict[str, Any] = {}
    if driver in ("psycopg", "psycopg2", *_MYSQL_DRIVERS):
        options["connect_timeout"] = max(1, int(connect_timeout))
    if driver in _MYSQL_DRIVERS:
        timeout = max(1, int(statement_timeout))
        lock_wait = max(1, int(statement_timeout / 2))
        options.update(
            read_timeout=timeout,
            write_timeout=timeout,
            init_command=f"SET SESSION innodb_lock_wait_timeout = {lock_wait}",
        )
    return options


def driver_options(url: URL, connect_args: Mapping[str, Any] | None) -> tuple[URL, dict[str, Any]]:
    """``url`` without the query options the driver cannot take as text, and the caller's options.

    psycopg's ``prepare_threshold`` arrives from a URL as text, which psycopg
    stores as given and fails on (``TypeError``) at the fifth statement; it
    is read here as a number or ``None``.
    """
    options = dict(connect_args or {})
    raw = url.query.get("prepare_threshold")
    if raw is None or url.get_driver_name() != "psycopg":
        return url, options
    text = raw if isinstance(raw, str) else raw[-1]
    if text.strip().lower() in ("none", "null", ""):
        options.setdefault("prepare_threshold", None)
    elif text.strip().isdigit():
        options.setdefault("prepare_threshold", int(text))
    else:
        raise InvalidSequenceConfig(
            f"prepare_threshold={text!r} in the database URL; use a number of executions "
            "or None (no server-side prepared statements, as PgBouncer's transaction "
            "pooling needs)"
        )
    return url.difference_update_query(["prepare_threshold"]), options


def _with_threshold(
    creator: Callable[..., Any], url: URL, options: Mapping[str, Any]
) -> Callable[..., Any]:
    """``creator``, its psycopg connections given the URL's ``prepare_threshold`` (if any)."""
    if url.get_driver_name() != "psycopg" or "prepare_threshold" not in options:
        return creator
    threshold = options["prepare_threshold"]

    def connect() -> Any:
        dbapi_connection = creator()
        dbapi_connection.prepare_threshold = threshold  # before the dialect's first queries
        return dbapi_connection

    return connect


def _prepare_after(engine: Engine, threshold: int | None) -> None:
    # A server-side prepared statement lives on one server connection; behind
    # a pooler in transaction mode (PgBouncer) the next transaction may run on
    # another, where it "does not exist". The store's statements are short
    # and few, so it prepares none unless the caller asks (``threshold``).
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.prepare_threshold = threshold


#: A pooled connection unused this long (s) is pinged at checkout; a busier
#: one goes straight to its statement (one round trip per reservation), and a
#: disconnect that statement meets is retried on a new connection.
IDLE_PING = 1.0
_IDLE_SINCE = "autoseq_idle_since"


def _ping_when_idle(engine: Engine) -> None:
    @event.listens_for(engine, "checkin")
    def _checkin(_dbapi_connection: Any, record: Any) -> None:
        if record is not None:
            record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get(_IDLE_SINCE)
        if since is None or time.monotonic() - since < IDLE_PING:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            # The pool replaces a connection whose checkout raises this.
            raise DisconnectionError(f"idle connection found closed: {exc}") from exc


def transaction_settings(engine: Engine, settings: Mapping[str, str]) -> None:
    """Apply ``settings`` (PostgreSQL parameters) to every transaction of ``engine`` alone.

    ``SET LOCAL`` through ``set_config(..., true)``: a session setting would
    outlive the transaction on a pooled server connection (PgBouncer in
    transaction mode) and land on another client's, and would be missing
    from the next transaction this store runs there.
    """
    if not settings:
        return
    calls = ", ".join(f"set_config('{name}', '{value}', true)" for name, value in settings.items())

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        # An autocommit statement carries its own (the one-statement reservation).
        if connection.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            connection.exec_driver_sql(f"SELECT {calls}")


def _sqlite_immediate(engine: Engine, private_memory: bool, sqlite_timeout: float) -> None:
    # pysqlite's own transaction handling begins lazily (and deferred);
    # take the write lock up front so two reservations serialize instead
    # of failing on a lock upgrade.
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        if not private_memory:
            enable_wal(dbapi_connection, sqlite_timeout)

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def enable_wal(dbapi_connection: Any, timeout: float) -> None:
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


_F = TypeVar("_F", bound=Callable[..., Any])


def reconnecting(method: _F) -> _F:
    """Run ``method`` once more when it failed on a connection found dead.

    The pool pings only idle connections (``IDLE_PING``): one that died in
    use fails its next statement, and SQLAlchemy replaces it. Every
    operation wrapped so is a compare-and-set or otherwise safe to send
    twice, so a server restart or a failover costs no error.
    """

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except (DBAPIError, StoreUnavailable) as exc:
            cause = exc if isinstance(exc, DBAPIError) else exc.__cause__
            if not isinstance(cause, DBAPIError) or not cause.connection_invalidated:
                raise
        return method(*args, **kwargs)

    return cast(_F, wrapper)
