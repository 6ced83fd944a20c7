"""Which servers the tests can reach, and what to do when one is missing.

A test that needs a server it cannot reach skips with the reason, unless
``AUTOSEQ_REQUIRE_BACKENDS`` names that backend (comma-separated, or
``all``): then it fails, so CI never passes by skipping.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import pytest

POSTGRES_URL = os.environ.get(
    "AUTOSEQ_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("AUTOSEQ_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
REDIS_URL = os.environ.get("AUTOSEQ_REDIS_URL", "redis://127.0.0.1:6379/15")
SQL_BACKENDS = ("sqlite", "postgres", "mysql")


def required() -> set[str]:
    """Backends that must be present (from ``AUTOSEQ_REQUIRE_BACKENDS``)."""
    raw = os.environ.get("AUTOSEQ_REQUIRE_BACKENDS", "")
    return {part.strip().lower() for part in raw.split(",") if part.strip()}


def unavailable(backend: str, reason: str) -> NoReturn:
    """Skip, or fail when the backend is required."""
    names = required()
    if backend in names or "all" in names:
        pytest.fail(f"{backend} is required (AUTOSEQ_REQUIRE_BACKENDS) but {reason}")
    pytest.skip(f"{backend} not available: {reason}")


@functools.cache
def _sql_problem(url: str) -> str | None:
    try:
        import sqlalchemy as sa

        engine = sa.create_engine(url, connect_args={"connect_timeout": 3})
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        return f"cannot connect to {url}: {type(exc).__name__}: {exc}".splitlines()[0]
    return None


#: Tables every model with a generated column declares in its metadata (zero-line
#: Alembic): ``create_all()`` in a test makes them on a shared server if absent.
DECLARED_STORE_TABLES = frozenset({"sys_sequence", "sys_sequence_gapless", "sys_worker"})


def server_tables(url: str) -> set[str] | None:
    """The tables of ``url``'s database, or None when the server cannot be reached."""
    if _sql_problem(url):
        return None
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def drop_tables(url: str, names: set[str]) -> None:
    """Drop ``names`` from ``url``'s database where they exist."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        metadata = sa.MetaData()
        metadata.reflect(engine, only=lambda name, _meta: name in names)
        metadata.drop_all(engine)
    finally:
        engine.dispose()


def sql_url(backend: str, tmp_path: os.PathLike[str] | str) -> str:
    """A database URL for ``backend``; SQLite gets a fresh file under ``tmp_path``."""
    if backend == "sqlite":
        return f"sqlite:///{os.path.join(os.fspath(tmp_path), 'app.db')}"
    url = {"postgres": POSTGRES_URL, "mysql": MYSQL_URL}[backend]
    problem = _sql_problem(url)
    if problem:
        unavailable(backend, problem)
    return url


def unique_table(prefix: str = "seq") -> str:
    """A table name no other test uses, so tests sharing a server stay apart."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def drop_sql_store(store: Any) -> None:
    """Drop what a test's ``SQLStore`` made on a shared server, then close it.

    That is its sequence table and the worker-lease table a snowflake on it
    made (``<table>_worker``), which ``drop()`` leaves alone.
    """
    from autoseq.stores.sql.workers import SQLWorkers

    SQLWorkers(store).drop_table()
    store.drop()
    store.close()


ASYNC_DRIVERS = {"sqlite": "aiosqlite", "postgresql": "asyncpg", "mysql": "aiomysql"}


def async_url(db_url: str) -> str:
    """``db_url`` with its asyncio driver (skips when that driver is not installed)."""
    from sqlalchemy.engine import make_url

    url = make_url(db_url)
    driver = ASYNC_DRIVERS[url.get_backend_name()]
    pytest.importorskip(driver)
    return url.set(drivername=f"{url.get_backend_name()}+{driver}").render_as_string(
        hide_password=False
    )


def make_engine(db_url: str) -> Any:
    """An engine on ``db_url``; SQLite waits up to 30 s for the file's write lock."""
    import sqlalchemy as sa

    return sa.create_engine(db_url, connect_args={"timeout": 30} if "sqlite" in db_url else {})


@contextmanager
def installed_orm(db_url: str, metadata: Any, **session_options: Any) -> Iterator[Any]:
    """``metadata``'s tables, a store on its own sequence table, maker + engine installed.

    Yields ``(engine, sessionmaker, store, registry)``; all dropped after.
    """
    from sqlalchemy.orm import sessionmaker

    from autoseq import SequenceRegistry
    from autoseq.sqlalchemy import application_tables, install, uninstall
    from autoseq.stores.sql import SQLStore

    engine = make_engine(db_url)
    metadata.create_all(engine)
    store = SQLStore(db_url, table=unique_table("sys"))
    registry = SequenceRegistry(store)
    maker = sessionmaker(engine, **session_options)
    install(maker, registry=registry)
    install(engine, registry=registry)
    try:
        yield engine, maker, store, registry
    finally:
        uninstall(maker)
        uninstall(engine)
        registry.close(release=False)
        store.drop()
        store.close()
        metadata.drop_all(engine, tables=application_tables(metadata))
        engine.dispose()


def make_app_database(url: str) -> str:
    """``url``, with its SQLite file created: the application's database exists before autoseq."""
    import sqlalchemy as sa

    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database:
        sqlite3.connect(parsed.database).close()
    return url


def redis_requests(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A one-item list counting the requests every Redis connection of this process sends
    from now on: one per command, one per pipeline (its commands go out together)."""
    import redis.connection

    sent = [0]
    send = redis.connection.AbstractConnection.send_packed_command

    def counted(connection: Any, command: Any, check_health: bool = True) -> None:
        sent[0] += 1
        send(connection, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    return sent
