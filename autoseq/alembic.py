"""Alembic helpers: move an ``Identity``/serial/autoincrement key onto a sequence.

A table whose key the database generated keeps that generator after the
model switches to ``SequenceField``: the column's default (a serial's
``nextval``, an ``IDENTITY``, ``AUTO_INCREMENT``) stays, the sequence starts
at 1 and the first insert collides with an existing key. In the migration
that switches the model::

    from autoseq.alembic import convert_column

    def upgrade() -> None:
        convert_column("orders", "id")

drops the column's database-side generator (PostgreSQL: the identity, or
the serial's default and its owned sequence; MariaDB/MySQL:
``AUTO_INCREMENT``) and moves the sequence's ``sys_sequence`` row past the
largest key, creating it when missing. SQLite cannot drop a rowid alias's
generator without rebuilding the table; the sequence is moved all the same
(see docs/sqlalchemy.md for raw inserts).

Alembic is imported only by :func:`convert_column`; :func:`convert_on` takes
any SQLAlchemy ``Connection`` (a script, a test).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict, Unpack

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from autoseq import maintenance
from autoseq.config import SETTING_NAMES, SequenceConfig, validate_name
from autoseq.errors import InvalidSequenceConfig
from autoseq.stores.sql import sequence_table, validate_table_name


class ConvertOptions(TypedDict, total=False):
    """What :func:`convert_on` and :func:`convert_column` take besides the column.

    ``sequence`` defaults to the table name, as ``SequenceField`` does;
    ``start``, ``end``, ``step`` and ``batch_count`` create the row when it
    is missing (defaults: :class:`~autoseq.SequenceConfig`'s); a stored row
    keeps its own.
    """

    sequence: str | None
    start: int
    end: int
    step: int
    batch_count: int
    sequence_table_name: str


def convert_column(table: str, column: str, **options: Unpack[ConvertOptions]) -> SequenceConfig:
    """In an Alembic ``upgrade()``: :func:`convert_on` on the migration's connection."""
    from alembic import op

    return convert_on(op.get_bind(), table, column, **options)


def convert_on(
    connection: Connection, table: str, column: str, **options: Unpack[ConvertOptions]
) -> SequenceConfig:
    """Drop ``table.column``'s database default and move its sequence past ``max(column)``.

    ``options``: see :class:`ConvertOptions`. Returns the row as stored. Run
    it before processes using the sequence start: a running process keeps
    serving the block it holds.
    """
    validate_table_name(table)
    validate_table_name(column)
    sequence_table_name = options.get("sequence_table_name", "sys_sequence")
    name = validate_name(options.get("sequence") or table)
    settings: dict[str, Any] = {k: v for k, v in options.items() if k in SETTING_NAMES}
    config = SequenceConfig(name, **settings)
    dialect = connection.dialect.name
    drop_default = _DROP_DEFAULT.get(dialect)
    if drop_default is not None:
        drop_default(connection, table, column)
    elif dialect != "sqlite":
        raise InvalidSequenceConfig(
            f"convert_column does not know how to drop a column default on {dialect}; "
            "drop it by hand, then run `autoseq sync`"
        )
    target = sa.table(table, sa.column(column))
    top = connection.execute(sa.select(sa.func.max(target.c[column]))).scalar()
    floor = None if top is None else int(top)
    if dialect == "sqlite":
        # The rows live in the companion file (see autoseq.stores.sql), which
        # the migration's own transaction does not hold.
        from autoseq.stores.sql import SQLStore

        store = SQLStore(connection.engine.url, table=sequence_table_name)
        try:
            row, _ = maintenance.adopt(store, config, floor)
        finally:
            store.close()
        return row
    return _adopt_in_transaction(connection, sequence_table_name, config, floor)


def _column_facts(connection: Connection, query: str, table: str, column: str) -> Any:
    """The ``information_schema`` row ``query`` selects for ``table.column``; it must exist."""
    found = connection.execute(sa.text(query), {"t": table, "c": column}).first()
    if found is None:
        raise InvalidSequenceConfig(f"column {table}.{column} does not exist in this database")
    return found


def _drop_postgres_default(connection: Connection, table: str, column: str) -> None:
    quoted_table, quoted_column = _quote(connection, table), _quote(connection, column)
    (identity,) = _column_facts(
        connection,
        "SELECT is_identity FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = :t AND column_name = :c",
        table,
        column,
    )
    if identity == "YES":
        connection.exec_driver_sql(
            f"ALTER TABLE {quoted_table} ALTER COLUMN {quoted_column} DROP IDENTITY IF EXISTS"
        )
        return
    owned = connection.execute(
        sa.text("SELECT pg_get_serial_sequence(:t, :c)"), {"t": quoted_table, "c": column}
    ).scalar()
    connection.exec_driver_sql(
        f"ALTER TABLE {quoted_table} ALTER COLUMN {quoted_column} DROP DEFAULT"
    )
    if owned:
        # A serial's sequence, owned by the column; nothing else may use it.
        connection.exec_driver_sql(f"DROP SEQUENCE IF EXISTS {owned}")


def _drop_mysql_auto_increment(connection: Connection, table: str, column: str) -> None:
    found = _column_facts(
        connection,
        "SELECT COLUMN_TYPE, EXTRA FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :t AND COLUMN_NAME = :c",
        table,
        column,
    )
    column_type, extra = str(found[0]), str(found[1] or "")
    if "auto_increment" in extra.lower():
        connection.exec_driver_sql(
            f"ALTER TABLE {_quote(connection, table)} MODIFY {_quote(connection, column)} "
            f"{column_type} NOT NULL"
        )


_DROP_DEFAULT: dict[str, Callable[[Connection, str, str], None]] = {
    "postgresql": _drop_postgres_default,
    "mysql": _drop_mysql_auto_increment,
    "mariadb": _drop_mysql_auto_increment,
}


def _adopt_in_transaction(
    connection: Connection, name: str, config: SequenceConfig, floor: int | None
) -> SequenceConfig:
    """Create or move the row on the migration's own connection.

    A migration may create ``sys_sequence`` in its own transaction; a store
    on another connection could not see that table, and would wait on it.
    The row is locked, so a reservation elsewhere waits for the migration
    and then sees the moved row.
    """
    t = sequence_table(name, sa.MetaData(), raw_flags=True)
    t.create(connection, checkfirst=True)
    found = (
        connection.execute(sa.select(t).where(t.c.name == config.name).with_for_update())
        .mappings()
        .first()
    )
    now = sa.func.now()
    if found is None:
        opening = config
        if floor is not None and floor >= config.next_value:
            opening = config.with_current(config.first_value_after(floor))
        connection.execute(
            sa.insert(t).values(opening.as_row() | {"updated_at": now, "version": 0})
        )
        return opening
    row = SequenceConfig.from_row(found)
    wanted = maintenance.sync_target(row, floor, holder=config.name)
    if wanted is None:
        return row
    moved = row.with_current(wanted)
    connection.execute(
        sa.update(t)
        .where(t.c.name == row.name, t.c.version == row.version)
        .values(current=moved.next_value, updated_at=now, version=row.version + 1)
    )
    return moved


def _quote(connection: Connection, identifier: str) -> str:
    return str(connection.dialect.identifier_preparer.quote(identifier))


__all__ = ["ConvertOptions", "convert_column", "convert_on"]
