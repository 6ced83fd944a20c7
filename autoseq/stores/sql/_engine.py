"""The store's own engine per dialect: pool sizes, timeouts, SQLite's WAL and write lock."""

from __future__ import annotations

import random
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.engine.url import URL
from sqlalchemy.pool import QueuePool

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
) -> Engine:
    """The store's engine on ``url``; ``watch`` sees every connection it opens."""
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    sqlite = url.get_backend_name() == "sqlite"
    if sqlite:
        kwargs = {"connect_args": {"timeout": sqlite_timeout, "check_same_thread": False}}
        if private_memory:
            # The database lives only as long as its one connection, and
            # that connection must serve one thread at a time, or a
            # prefetch worker's transaction interleaves with a caller's:
            # a pool of exactly one, lent out in turn.
            kwargs.update(poolclass=QueuePool, pool_size=1, max_overflow=0, pool_timeout=60)
    else:
        kwargs.update(pool_size=2, max_overflow=8, pool_recycle=3600)
        driver = url.get_driver_name()
        if driver in ("psycopg", "psycopg2", *_MYSQL_DRIVERS):
            kwargs["connect_args"] = {"connect_timeout": max(1, int(connect_timeout))}
        if driver in _MYSQL_DRIVERS:
            timeout = max(1, int(statement_timeout))
            lock_wait = max(1, int(statement_timeout / 2))
            kwargs["connect_args"].update(
                read_timeout=timeout,
                write_timeout=timeout,
                init_command=f"SET SESSION innodb_lock_wait_timeout = {lock_wait}",
            )
    engine = sa.create_engine(url, **kwargs)
    if sqlite:
        _sqlite_immediate(engine, private_memory, sqlite_timeout)
    elif watch is not None:
        _watch_connections(engine, watch, statement_timeout)
    return engine


def _watch_connections(engine: Engine, watch: SocketWatch, statement_timeout: float) -> None:
    postgresql = engine.dialect.name == "postgresql"

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        watch.add(dbapi_connection)
        if postgresql:
            # A row held by a stuck transaction fails the wait cleanly
            # (retried, then ReservationConflict). A session setting, not a
            # startup option, so poolers that refuse options still connect.
            autocommit = dbapi_connection.autocommit
            dbapi_connection.autocommit = True
            cursor = dbapi_connection.cursor()
            cursor.execute(f"SET lock_timeout = {max(1, int(statement_timeout * 500))}")
            cursor.close()
            dbapi_connection.autocommit = autocommit


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
