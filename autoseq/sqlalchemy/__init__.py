"""SQLAlchemy integration: ``SequenceField`` columns and ``install()``.

Declare the column, call ``install()`` once, and every insert path
SQLAlchemy 2.x has (the session's flush, ORM bulk, Core executemany, a
column's own default) gets the next values of the column's sequence;
`autoseq.sqlalchemy.listeners` says which listener fills which.

Every kind of generated column (``SequenceField``, ``SerialField``,
``SnowflakeField``) is filled by these same listeners. A value the user
gave (not ``None``) is always kept. The default store is a
[`SQLStore`][autoseq.stores.sql.SQLStore] on the bind's own database (one
registry per URL, cached); it commits each block in its own transaction, so a
rollback of the caller's transaction never hands a value out again.

The package, by concern (each module imports only those above it):
`compat` (SQLAlchemy internals), `specs` (what a column carries in
``Column.info``), `registries` (``install()``'s decisions, default registries,
locks), `serial` and `snowflake` (their generators), `targets` (a generated
column as the listeners see it), `listeners`, `columns` (the declarations),
`alembic` (migration helpers; Alembic itself is imported only when used),
`schema` (the store's tables for Alembic and ``create_all``) and `installing` (``install()``).
"""

from __future__ import annotations

# The names marked F401 are importable here as before the package (and through
# the old ``autoseq.serial_sqlalchemy`` path) but are not part of ``__all__``.
from autoseq.sqlalchemy.columns import (
    SequenceField,
    SerialField,
    SnowflakeField,
    gapless_sequence_field,  # noqa: F401
    sequence_column,
    serial_column,
)
from autoseq.sqlalchemy.installing import get_registry, install, uninstall
from autoseq.sqlalchemy.registries import close_registries, default_registry
from autoseq.sqlalchemy.schema import (
    application_tables,
    include_sequence_table,
    include_worker_table,
)
from autoseq.sqlalchemy.snowflake import close_snowflakes
from autoseq.sqlalchemy.specs import (
    INFO_KEY,
    SERIAL_INFO_KEY,  # noqa: F401
    SNOWFLAKE_INFO_KEY,  # noqa: F401
    SequenceSpec,
    SerialSpec,  # noqa: F401
    SnowflakeSpec,  # noqa: F401
    sequence_spec,
    serial_spec,  # noqa: F401
)
from autoseq.sqlalchemy.targets import SerialTarget  # noqa: F401

__all__ = [
    "INFO_KEY",
    "SequenceField",
    "SequenceSpec",
    "SerialField",
    "SnowflakeField",
    "application_tables",
    "close_registries",
    "close_snowflakes",
    "default_registry",
    "get_registry",
    "include_sequence_table",
    "include_worker_table",
    "install",
    "sequence_column",
    "sequence_spec",
    "serial_column",
    "uninstall",
]
