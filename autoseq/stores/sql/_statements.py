"""The table and the statements a ``SQLStore`` runs, and how it reads their failures."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.exc import DBAPIError, NoSuchTableError

from autoseq.config import MAX_VALUE, NAME_MAX_LENGTH
from autoseq.errors import Conflict as Conflict  # its home before 0.x
from autoseq.errors import InvalidSequenceConfig

TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def validate_table_name(table: object) -> str:
    """Return ``table`` if it is a plain identifier, else raise ``InvalidSequenceConfig``."""
    if not isinstance(table, str) or not TABLE_NAME.match(table):
        raise InvalidSequenceConfig(
            f"table name {table!r} is not a plain identifier; use letters, digits "
            "and underscores (at most 63, not starting with a digit)"
        )
    return table


class StoredFlag(sa.types.TypeDecorator[bool]):
    """A boolean column read back exactly as stored, for ``SequenceConfig.from_row`` to judge.

    SQLAlchemy's ``Boolean`` reads SQLite's and MySQL's integer storage with
    ``bool(value)``, so a hand edit to the text ``'false'`` or to ``2``
    would read as True and a row serving refuses elsewhere would be served.
    Writes still go through ``Boolean`` (True/False become 1/0 there).
    """

    impl = sa.Boolean
    cache_ok = True

    def result_processor(self, dialect: Dialect, coltype: Any) -> None:
        return None


#: The collation of a name column on MariaDB/MySQL: byte for byte, as on every
#: other store. Their default collations fold case and accents, which made
#: ``orders`` and ``Orders`` (or ``cafe`` and ``café``) one row.
NAME_COLLATION = "utf8mb4_bin"


def name_type() -> sa.types.TypeEngine[str]:
    """The type of a column keyed by a sequence name (binary collation on MariaDB/MySQL)."""
    binary = mysql.VARCHAR(NAME_MAX_LENGTH, charset="utf8mb4", collation=NAME_COLLATION)
    return sa.String(NAME_MAX_LENGTH).with_variant(binary, "mysql", "mariadb")


def names_folded(connection: Connection, table_name: str) -> bool:
    """Whether ``name`` of ``table_name`` compares names other than byte for byte (MySQL)."""
    if connection.dialect.name not in ("mysql", "mariadb"):
        return False
    collation = connection.execute(
        sa.text(
            "SELECT collation_name FROM information_schema.columns WHERE "
            "table_schema = DATABASE() AND table_name = :table AND column_name = 'name'"
        ),
        {"table": table_name},
    ).scalar()
    return collation is not None and collation != NAME_COLLATION


def make_names_binary(connection: Connection, table_name: str, lock_wait: float) -> bool:
    """Give ``name`` of an older table the binary collation (MariaDB/MySQL); True if altered.

    Safe on any table: names the old collation held apart stay apart, and
    no two rows can collide, since the old collation already made them one.
    The ALTER waits at most ``lock_wait`` seconds for transactions using the
    table (a gapless take holds its row until commit) rather than stalling
    every statement queued behind its metadata lock.
    """
    if not names_folded(connection, table_name):
        return False
    quoted = connection.dialect.identifier_preparer.quote(table_name)
    connection.exec_driver_sql(f"SET SESSION lock_wait_timeout = {max(1, int(lock_wait))}")
    try:
        connection.exec_driver_sql(
            f"ALTER TABLE {quoted} MODIFY name VARCHAR({NAME_MAX_LENGTH}) "
            f"CHARACTER SET utf8mb4 COLLATE {NAME_COLLATION} NOT NULL"
        )
    finally:
        connection.exec_driver_sql("SET SESSION lock_wait_timeout = DEFAULT")
    return True


def sequence_table(
    name: str = "sys_sequence", metadata: sa.MetaData | None = None, *, raw_flags: bool = False
) -> sa.Table:
    """The ``sys_sequence`` table as SQLAlchemy Core sees it (the schema every store shares).

    ``raw_flags``: read ``batch`` and ``cycle`` as stored (`StoredFlag`),
    for code that builds ``SequenceConfig.from_row`` from them, which refuses
    a hand edit; the DDL is the same. Off for an application's metadata, so
    Alembic renders the columns as plain ``sa.Boolean()``.
    """
    flag: type[sa.types.TypeEngine[bool]] = StoredFlag if raw_flags else sa.Boolean
    return sa.Table(
        validate_table_name(name),
        metadata if metadata is not None else sa.MetaData(),
        sa.Column("name", name_type(), primary_key=True),
        sa.Column("start", sa.BigInteger, nullable=False),
        sa.Column("end", sa.BigInteger, nullable=False),
        sa.Column("step", sa.BigInteger, nullable=False),
        sa.Column("current", sa.BigInteger, nullable=False),
        sa.Column("batch", flag, nullable=False),
        sa.Column("batch_count", sa.Integer, nullable=False),
        sa.Column("cycle", flag, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("version", sa.BigInteger, nullable=False, server_default="0"),
    )


#: SQLSTATEs worth another try: serialization failure (PostgreSQL, and the
#: "restart transaction" of CockroachDB and YugabyteDB), deadlock, lock not
#: available (a lock_timeout).
RETRY_SQLSTATES = frozenset({"40001", "40P01", "55P03"})
#: MySQL-protocol error numbers worth another try: lock wait timeout and
#: deadlock (MySQL, MariaDB), and TiDB's optimistic-transaction conflicts:
#: 8002 (SELECT FOR UPDATE write conflict), 8022 (transaction retry failed),
#: 8028 (schema changed under the transaction), 9007 (write conflict).
RETRY_ERRNOS = frozenset({1205, 1213, 8002, 8022, 8028, 9007})


def sqlstate(error: object) -> str:
    """A driver error's SQLSTATE, "" if it has none.

    psycopg 3 names it ``sqlstate``, psycopg2 (CockroachDB's default driver) ``pgcode``.
    """
    return str(getattr(error, "sqlstate", None) or getattr(error, "pgcode", None) or "")


def retryable(exc: DBAPIError) -> bool:
    # A connection that was dropped is worth another try too: the retry takes
    # a new one (the pool invalidated the old ones).
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    if sqlstate(orig) in RETRY_SQLSTATES:
        return True
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and args[0] in RETRY_ERRNOS:
        return True
    return "database is locked" in str(orig).lower()


def missing_table(exc: BaseException, table_name: str) -> bool:
    """True when ``exc`` says the table ``table_name`` does not exist."""
    if isinstance(exc, NoSuchTableError):
        return True
    text = str(getattr(exc, "orig", exc)).lower()
    return (
        "no such table" in text or "does not exist" in text or "doesn't exist" in text
    ) and table_name.lower() in text


def speaks_postgresql(dialect: Dialect) -> bool:
    """Whether ``dialect`` speaks PostgreSQL's SQL (PostgreSQL, CockroachDB, YugabyteDB...).

    Its own class or a subclass of SQLAlchemy's PostgreSQL dialect, whatever
    its name: ``set_config`` and ``lock_timeout`` are there.
    """
    return isinstance(dialect, PGDialect)


def one_statement_reservation(
    table: sa.Table, engine: Engine, settings: Mapping[str, str], *, many: bool = False
) -> sa.Update | None:
    """``UPDATE ... RETURNING`` taking ``:count`` values of an ordinary row, or None.

    Where the dialect can ``UPDATE ... RETURNING`` (its ``update_returning``),
    whatever its name. Every comparison is written so no intermediate sum can
    leave the BIGINT range (``start >= 0``, divisions instead of products),
    and the new ``current`` is at most ``2**63 - 1 - step`` by the last
    condition, so the database never raises an overflow and never stores a
    value ``SequenceConfig`` would refuse. ``settings`` (PostgreSQL
    parameters) are set for the statement's own transaction inside it
    (``set_config(..., true)``, evaluated before the row is locked and
    still in force at the commit), so they cost no round trip of their own.
    ``many``: every row named in ``:seq_names`` (an expanding list) instead of
    ``:seq_name``, each under the same conditions (``SQLStore.reserve_many``).
    """
    dialect = engine.dialect
    if not dialect.update_returning:
        return None  # MariaDB and MySQL have no UPDATE ... RETURNING
    if dialect.name == "sqlite":
        import sqlite3

        if sqlite3.sqlite_version_info < (3, 35):
            return None
    c = table.c
    if many:
        names: sa.ColumnElement[bool] = c.name.in_(
            sa.bindparam("seq_names", expanding=True, type_=c.name.type)
        )
    else:
        names = c.name == sa.bindparam("seq_name", type_=c.name.type)
    span = sa.bindparam("span", type_=sa.BigInteger)
    count = sa.bindparam("count", type_=sa.BigInteger)
    return (
        sa.update(table)
        .where(names, *_reservable(c, span, settings))
        .values(
            current=c.current + count * c.step,
            updated_at=sa.bindparam("now", type_=c.updated_at.type),
            version=c.version + 1,
        )
        .returning(*c)
    )


def _reservable(
    c: Any, span: sa.ColumnElement[Any], settings: Mapping[str, str]
) -> list[sa.ColumnElement[Any]]:
    """The conditions under which a reservation statement moves a row ``span + 1`` steps."""
    top = sa.literal(MAX_VALUE, sa.BigInteger) - c.step  # never overflows: step >= 1
    return [
        c.cycle == sa.false(),
        c.batch.in_([sa.true(), sa.false()]),  # a hand-edited flag goes to the refusing path
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
        *(sa.func.set_config(k, v, sa.true()).is_not(None) for k, v in settings.items()),
    ]


def mixed_reservation(
    table: sa.Table, engine: Engine, settings: Mapping[str, str]
) -> sa.Update | None:
    """One ``UPDATE ... FROM ... RETURNING`` taking a count of its own from each named row.

    ``SQLStore.reserve_many`` for rows wanting different counts (prefetches
    of many sequences, each sized for its own pace) in one statement, under
    the conditions of `one_statement_reservation`. The (name, count) pairs
    come in a fixed number of parameters whatever their number (PostgreSQL:
    two arrays through ``unnest``; SQLite: one JSON array through
    ``json_each``), so the statement is compiled once. None where the
    dialect has no such form (MariaDB/MySQL, SQLite before 3.38).
    """
    wanted = _passed_rows(
        engine, "wanted", "wanted", [("name", "names", sa.Text()), ("n", "counts", sa.BigInteger())]
    )
    if wanted is None:
        return None
    c = table.c
    count = wanted.c.n
    return (
        sa.update(table)
        .where(c.name == wanted.c.name, *_reservable(c, count - 1, settings))
        .values(
            current=c.current + count * c.step,
            updated_at=sa.bindparam("now", type_=c.updated_at.type),
            version=c.version + 1,
        )
        .returning(*c)
    )


def _passed_rows(
    engine: Engine,
    alias: str,
    document: str,
    columns: list[tuple[str, str, sa.types.TypeEngine[Any]]],
) -> sa.FromClause | None:
    """Rows sent as a fixed number of parameters, as a table named ``alias``, or None.

    ``columns``: (column, array parameter, type) of each. PostgreSQL: one
    array parameter a column, through ``unnest``; SQLite 3.38+ (UPDATE FROM,
    RETURNING, built-in JSON): one JSON array of rows in the ``document``
    parameter, through ``json_each``. None elsewhere (MariaDB/MySQL, other
    PostgreSQL look-alikes, older SQLite).
    """
    from sqlalchemy.dialects import postgresql

    dialect = engine.dialect
    if not dialect.update_returning:
        return None
    if dialect.name == "postgresql":
        arrays = [sa.bindparam(param, type_=postgresql.ARRAY(kind)) for _, param, kind in columns]
        return (
            sa.func.unnest(*arrays)
            .table_valued(*(name for name, _, _ in columns))
            .render_derived(name=alias)
        )
    if dialect.name != "sqlite":
        return None
    import sqlite3

    if sqlite3.sqlite_version_info < (3, 38):
        return None
    each = sa.func.json_each(sa.bindparam(document, type_=sa.Text)).table_valued("value")
    return sa.select(
        *(
            sa.func.json_extract(each.c.value, sa.literal_column(f"'$[{at}]'"), type_=kind).label(
                name
            )
            for at, (name, _, kind) in enumerate(columns)
        )
    ).subquery(alias)


def batch_release(table: sa.Table, engine: Engine) -> sa.Update | None:
    """One ``UPDATE ... FROM ... RETURNING`` handing many blocks back, or None.

    The compare-and-set of ``SQLStore.release`` for every row at once: a row
    goes back to its block's ``first`` only if ``name``, ``version`` and
    ``current`` are all still what the block left. The blocks come in a fixed
    number of parameters whatever their number (PostgreSQL: four arrays
    through ``unnest``; SQLite: one JSON array through ``json_each``), so the
    statement is compiled once and parsed in constant time, and the database
    joins each block to its row by the primary key. None where the dialect
    has no such form (MariaDB/MySQL, other PostgreSQL look-alikes, SQLite
    before 3.38): ``release`` of each block, in one transaction, then.
    """
    c = table.c
    blocks = _passed_rows(
        engine,
        "handed",
        "blocks",
        [
            ("name", "names", sa.Text()),
            ("version", "versions", sa.BigInteger()),
            ("cur", "currents", sa.BigInteger()),
            ("first", "firsts", sa.BigInteger()),
        ],
    )
    if blocks is None:
        return None
    return (
        sa.update(table)
        .where(
            c.name == blocks.c.name,
            c.version == blocks.c.version,
            c.current == blocks.c.cur,
        )
        .values(
            current=blocks.c.first,
            updated_at=sa.bindparam("now", type_=c.updated_at.type),
            version=c.version + 1,
        )
        .returning(c.name)
    )
