"""SQLAlchemy integration: ``SequenceField`` columns and ``install()``.

Declare the column, call ``install()`` once, and every insert path gets the
next values of the column's sequence. Where SQLAlchemy 2.x routes each path:

* ``session.add()`` / ``add_all()`` + flush: a ``before_flush`` listener sets
  the attribute of every pending object that has none, taking one
  ``next_many`` per sequence per flush, so the ORM inserts known keys.
* ORM bulk ``session.execute(insert(Order), [dicts])``: ``do_orm_execute``
  works out which columns need values, and the values go into the row
  copies the ORM makes for its Core insert (never into the caller's dicts,
  and with no copy of our own).
  Any other statement run through a session (one row, joined inheritance)
  gets the missing keys added to copies of the rows that lack them.
* Core ``conn.execute(insert(table), [dicts])``: an engine ``before_execute``
  listener (``retval=True``) fills the parameter dicts, one ``next_many`` per
  sequence per statement.
* Anything else that reaches Core without a value (``insert().values(...)``,
  multi-row VALUES, legacy bulk methods, a connection opened before the engine
  was watched): the column's own Python default takes ``next()`` per row.

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
