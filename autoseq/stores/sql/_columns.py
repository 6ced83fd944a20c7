"""Reading the application's own tables: ``max()`` of an integer column.

``autoseq sync`` and ``doctor --column`` read it through `SQLStore.column_max`.
The SQLAlchemy integration's floor for a new row reads the bind's own database
instead, whatever store serves it (`autoseq.sqlalchemy.registries.column_floor`).
"""

from __future__ import annotations

import os
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.exc import NoSuchTableError

from autoseq.errors import InvalidSequenceConfig, StoreUnavailable, UsageError
from autoseq.stores.sql._statements import validate_table_name
from autoseq.stores.sql._urls import sync_driver_url


def _split(table_name: str) -> tuple[str | None, str]:
    *schema, name = table_name.split(".")
    if len(schema) > 1:
        raise UsageError(f"--table {table_name!r}: use name or schema.name")
    try:
        for part in [*schema, name]:
            validate_table_name(part)
    except InvalidSequenceConfig as exc:
        raise UsageError(f"--table: {exc}") from None
    return (schema[0] if schema else None), name


def _check_file(app_url: URL) -> None:
    if app_url.get_backend_name() == "sqlite":
        database = app_url.database or ""
        if database in ("", ":memory:") or not os.path.exists(database):
            raise UsageError(f"--url names no existing SQLite database file ({database!r})")


def _integer_column(engine: sa.Engine, table_name: str, column_name: str) -> sa.Column[Any]:
    schema, name = _split(table_name)
    try:
        table = sa.Table(name, sa.MetaData(), schema=schema, autoload_with=engine)
    except NoSuchTableError:
        raise UsageError(f"table {table_name!r} does not exist in that database") from None
    except sa.exc.DBAPIError as exc:
        raise StoreUnavailable(f"reading table {table_name!r} failed: {exc.orig}") from exc
    column = table.columns.get(column_name)
    if column is None:
        known = ", ".join(c.name for c in table.columns)
        raise UsageError(f"table {table_name!r} has no column {column_name!r} ({known})")
    if not isinstance(column.type, sa.Integer):
        raise UsageError(f"column {table_name}.{column_name} is {column.type}, not an integer")
    return column


def column_max(app_url: URL, table_name: str, column_name: str) -> int | None:
    """``max(table.column)`` in the application's database at ``app_url``, None when empty."""
    _split(table_name)
    _check_file(app_url)
    engine = sa.create_engine(sync_driver_url(app_url))  # asyncpg & co need an event loop
    try:
        column = _integer_column(engine, table_name, column_name)
        with engine.connect() as connection:
            value: Any = connection.execute(sa.select(sa.func.max(column))).scalar()
    finally:
        engine.dispose()
    return None if value is None else int(value)
