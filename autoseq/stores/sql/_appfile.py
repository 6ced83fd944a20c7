"""The rows a SQLite ``SQLStore`` keeps in the application's own file: gapless ones.

A gapless value is taken in the caller's transaction, which covers the
application's file only, so on SQLite gapless rows live there, in
``main.<table>_gapless``, while rows served in blocks live in the companion
file. The store reads and writes both, so that every command, doctor and
the admin see one place holding every row of the application; a name with a
row in both places is the gapless one (the row its values come from).

The application's file is the application's: it is opened without WAL or
any other change, never created, and written only in short ``BEGIN
IMMEDIATE`` transactions (an operator's set or change).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine, RowMapping
from sqlalchemy.engine.url import URL
from sqlalchemy.exc import DBAPIError

from autoseq.config import SequenceConfig, utc_now
from autoseq.stores.sql._statements import sequence_table


def gapless_sqlite_table(table_name: str) -> sa.Table:
    """The gapless rows' table in the application's SQLite file: ``main.<table>_gapless``.

    Same columns as the store's own table; named apart and qualified with
    ``main`` so that it is never confused with the companion's table when a
    connection has the companion attached (Django does, read-only).
    """
    plain = sequence_table(f"{table_name}_gapless", raw_flags=True)
    return plain.to_metadata(sa.MetaData(), schema="main")


def application_file(app_url: URL) -> str | None:
    """The application's SQLite file of a store on ``app_url``, or None.

    A URL naming a companion file (``app.db.autoseq``, as Django's companion
    alias does) belongs to ``app.db``. None for memory (another process
    cannot see it) and ``file:`` URIs.
    """
    from autoseq.stores.sql._urls import SIDECAR_SUFFIX

    database = app_url.database or ""
    if app_url.get_backend_name() != "sqlite" or database in ("", ":memory:"):
        return None
    if database.startswith("file:") or "mode=memory" in database:
        return None
    return os.path.realpath(database.removesuffix(SIDECAR_SUFFIX))


class AppFileRows:
    """Gapless rows of one store in the application's SQLite file at ``path``."""

    def __init__(self, path: str, table: sa.Table, timeout: float) -> None:
        self.path = path
        self.table = table
        self._timeout_ms = int(timeout * 1000)
        # Made now (it connects only when used), so threads never race to make two.
        self._engine = sa.create_engine(
            URL.create("sqlite", database=path),
            connect_args={"timeout": timeout, "check_same_thread": False},
        )
        event.listen(self._engine, "connect", _autocommit)

    def _connect(self) -> Engine:
        return self._engine

    def _present(self) -> bool:
        return os.path.exists(self.path)  # never create the application's file

    def _select(self, statement: sa.Select[Any], wait: float | None = None) -> Sequence[RowMapping]:
        if not self._present():
            return []
        try:
            with self._connect().connect() as connection:
                if wait is None:
                    return connection.execute(statement).mappings().all()
                connection.exec_driver_sql(f"PRAGMA busy_timeout = {int(wait * 1000)}")
                try:
                    return connection.execute(statement).mappings().all()
                finally:
                    connection.exec_driver_sql(f"PRAGMA busy_timeout = {self._timeout_ms}")
        except DBAPIError as exc:
            if _missing(exc):
                return []  # no gapless value taken yet
            raise

    def read_raw(self, name: str, *, wait: float | None = None) -> dict[str, Any] | None:
        """Row ``name`` as stored, or None; waiting at most ``wait`` s for a writer's lock."""
        rows = self._select(sa.select(self.table).where(self.table.c.name == name), wait)
        return dict(rows[0]) if rows else None

    def read_all_raw(self, *, wait: float | None = None) -> list[dict[str, Any]]:
        """Every row as stored, by name; waiting at most ``wait`` s for a writer's lock."""
        return [dict(row) for row in self._select(sa.select(self.table), wait)]

    def holds(self, name: str) -> bool:
        """Whether row ``name`` is here."""
        return bool(self._select(sa.select(self.table.c.name).where(self.table.c.name == name)))

    @contextmanager
    def _writing(self) -> Iterator[Connection]:
        with self._connect().connect() as connection:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                yield connection
            except BaseException:
                connection.exec_driver_sql("ROLLBACK")
                raise
            connection.exec_driver_sql("COMMIT")

    def compare_and_set(self, row: SequenceConfig, version: int) -> tuple[bool, bool]:
        """Write ``row`` if its stored version is ``version``: (written, the row exists)."""
        t = self.table
        values = row.as_row() | {"updated_at": utc_now(), "version": version + 1}
        del values["name"]
        with self._writing() as connection:
            result = connection.execute(
                sa.update(t).where(t.c.name == row.name, t.c.version == version).values(values)
            )
            if result.rowcount == 1:
                return True, True
            exists = connection.execute(sa.select(t.c.name).where(t.c.name == row.name)).first()
        return False, exists is not None

    def update(self, config: SequenceConfig) -> bool:
        """Overwrite row ``config.name``'s settings; False when it is not here."""
        if not self.holds(config.name):
            return False
        t = self.table
        values = config.as_row() | {"updated_at": utc_now(), "version": t.c.version + 1}
        del values["name"]
        with self._writing() as connection:
            result = connection.execute(sa.update(t).where(t.c.name == config.name).values(values))
        return bool(result.rowcount == 1)

    def delete(self, name: str) -> bool:
        """Remove row ``name``; True if it was here."""
        if not self.holds(name):
            return False
        with self._writing() as connection:
            result = connection.execute(sa.delete(self.table).where(self.table.c.name == name))
        return bool(result.rowcount)

    def dispose(self, *, close: bool = True) -> None:
        """Let go of the connections (``close=False`` after fork: they are the parent's)."""
        self._engine.dispose(close=close)


def _autocommit(dbapi_connection: Any, _record: Any) -> None:
    # Each read is its own statement; writes begin explicitly (BEGIN IMMEDIATE).
    dbapi_connection.isolation_level = None


def _missing(exc: DBAPIError) -> bool:
    return "no such table" in str(exc.orig).lower()


def locked(exc: DBAPIError) -> bool:
    """Whether ``exc`` is SQLite's "database is locked" (a writer holds the file)."""
    return "locked" in str(exc.orig).lower()
