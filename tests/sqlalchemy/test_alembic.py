"""SQLAlchemy with Alembic: real autogenerate keeps sys_sequence; conversions; driver checks.

Each test gets a database of its own (a fresh SQLite file, or a fresh
PostgreSQL/MariaDB database), because autogenerate compares the whole
database with the models.
"""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from backends import sql_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from autoseq.errors import StoreTableInUse
from autoseq.sqlalchemy import (
    SequenceField,
    SerialField,
    SnowflakeField,
    close_registries,
    close_snowflakes,
    include_sequence_table,
    include_worker_table,
    install,
    sequence_column,
    uninstall,
)
from autoseq.sqlalchemy.alembic import ALLOW_DROP_ENV, STORE_TABLES
from autoseq.stores.sql import MissingDriver, SQLStore

alembic = pytest.importorskip("alembic")
from alembic import command  # noqa: E402
from alembic.config import Config  # noqa: E402

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", marks=pytest.mark.postgres, id="postgres"),
]
SERVERS = [
    pytest.param("postgres", marks=pytest.mark.postgres, id="postgres"),
    pytest.param("mysql", marks=pytest.mark.mysql, id="mysql"),
]
CONVERT_BACKENDS = [*BACKENDS, pytest.param("mysql", marks=pytest.mark.mysql, id="mysql")]

ENV_PY = """
from alembic import context

config = context.config
context.configure(
    connection=config.attributes["connection"],
    target_metadata=config.attributes["metadata"],
)
with context.begin_transaction():
    context.run_migrations()
"""


@pytest.fixture
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of its own on the backend named by the test's parameter."""
    backend = request.param
    server = sql_url(backend, tmp_path)
    if backend == "sqlite":
        yield server
        return
    name = f"wt_ag_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield sa.make_url(server).set(database=name).render_as_string(hide_password=False)
    finally:
        close_registries()
        with admin.connect() as connection:
            force = " WITH (FORCE)" if backend == "postgres" else ""
            connection.exec_driver_sql(f"DROP DATABASE {name}{force}")
        admin.dispose()


def alembic_project(root: Path) -> Config:
    """A minimal Alembic project whose env.py takes connection and metadata from attributes."""
    cfg = Config(str(root / "alembic.ini"))
    command.init(cfg, str(root / "migrations"))
    (root / "migrations" / "env.py").write_text(ENV_PY)
    cfg = Config(str(root / "alembic.ini"))
    cfg.set_main_option("script_location", str(root / "migrations"))
    return cfg


def autogenerate(cfg: Config, engine: sa.Engine, metadata: sa.MetaData, message: str) -> str:
    """Run ``alembic revision --autogenerate`` and return the migration's text."""
    with engine.begin() as connection:
        cfg.attributes.update(connection=connection, metadata=metadata)
        script = command.revision(cfg, message=message, autogenerate=True)
    assert script is not None
    assert not isinstance(script, list)
    return Path(script.path).read_text()


def upgrade(cfg: Config, engine: sa.Engine, metadata: sa.MetaData) -> None:
    with engine.begin() as connection:
        cfg.attributes.update(connection=connection, metadata=metadata)
        command.upgrade(cfg, "head")


def upgrade_ops(migration: str) -> str:
    """The body of ``upgrade()`` in a migration file."""
    body = migration.split("def upgrade()", 1)[1].split("def downgrade()", 1)[0]
    return body


def make_models(with_line: bool) -> tuple[type[Any], sa.MetaData]:
    class Base(DeclarativeBase):
        pass

    class Order(Base):
        __tablename__ = "orders"
        id: Mapped[int] = SequenceField(primary_key=True)
        name: Mapped[str] = mapped_column(sa.String(40), default="")

    if with_line:
        include_sequence_table(Base.metadata)
    return Order, Base.metadata


def insert_orders(engine: sa.Engine, order: type[Any], n: int) -> list[int]:
    install(engine)
    try:
        with Session(engine) as session:
            rows = [order(name=str(i)) for i in range(n)]
            session.add_all(rows)
            session.commit()
            return [row.id for row in rows]
    finally:
        uninstall(engine)


@pytest.mark.parametrize("fresh_url", CONVERT_BACKENDS, indirect=True)
def test_autogenerate_creates_sys_sequence_and_never_drops_it(
    fresh_url: str, tmp_path: Path
) -> None:
    """With include_sequence_table, the first migration creates sys_sequence, later ones keep it."""
    order, metadata = make_models(with_line=True)
    engine = sa.create_engine(fresh_url)
    cfg = alembic_project(tmp_path / "project")
    first = autogenerate(cfg, engine, metadata, "initial")
    assert "op.create_table('sys_sequence'" in first
    for column in ("name", "start", "end", "step", "current", "batch", "batch_count", "cycle"):
        assert f"sa.Column('{column}'" in first
    assert "sa.Column('version', sa.BigInteger(), server_default='0', nullable=False)" in first
    upgrade(cfg, engine, metadata)
    assert insert_orders(engine, order, 3) == [1, 2, 3]  # the app runs once
    second = autogenerate(cfg, engine, metadata, "after the app ran")
    assert "sys_sequence" not in second
    assert "op." not in upgrade_ops(second)
    engine.dispose()


@pytest.mark.parametrize("fresh_url", SERVERS, indirect=True)
def test_autogenerate_after_the_app_created_the_table_proposes_nothing(
    fresh_url: str, tmp_path: Path
) -> None:
    """sys_sequence made by the store at run time is not dropped by the next migration."""
    order, bare = make_models(with_line=False)
    engine = sa.create_engine(fresh_url)
    bare.create_all(engine)
    insert_orders(engine, order, 2)  # the store creates sys_sequence itself
    _, metadata = make_models(with_line=True)
    cfg = alembic_project(tmp_path / "project")
    migration = autogenerate(cfg, engine, metadata, "models exist already")
    assert "drop_table" not in migration
    assert "sys_sequence" not in migration
    engine.dispose()


@pytest.mark.parametrize("fresh_url", SERVERS, indirect=True)
def test_autogenerate_adds_the_version_column_to_an_older_table(
    fresh_url: str, tmp_path: Path
) -> None:
    """A sys_sequence from before ``version`` gets an add_column with a server default."""
    _, metadata = make_models(with_line=True)
    engine = sa.create_engine(fresh_url)
    metadata.create_all(engine)
    with engine.begin() as connection:
        connection.exec_driver_sql("ALTER TABLE sys_sequence DROP COLUMN version")
    cfg = alembic_project(tmp_path / "project")
    migration = autogenerate(cfg, engine, metadata, "upgrade autoseq")
    assert (
        "op.add_column('sys_sequence', sa.Column('version', sa.BigInteger(), "
        "server_default='0', nullable=False))"
    ) in migration
    assert "drop_table" not in migration
    engine.dispose()


def test_include_sequence_table_is_idempotent() -> None:
    """Calling include_sequence_table twice returns the one table it declared."""
    metadata = sa.MetaData()
    assert include_sequence_table(metadata) is include_sequence_table(metadata)
    assert "version" in include_sequence_table(metadata).c


# zero extra lines: the fields declare the store's tables themselves -----------------


def zero_line_models() -> tuple[type[Any], type[Any], type[Any], sa.MetaData]:
    """Sequence, serial and snowflake models, and no autoseq line beside them."""

    class Base(DeclarativeBase):
        pass

    class Order(Base):
        __tablename__ = "orders"
        id: Mapped[int] = SequenceField(primary_key=True)
        number: Mapped[str] = SerialField("N{n:04}")

    class Event(Base):
        __tablename__ = "events"
        id: Mapped[int] = SnowflakeField(primary_key=True)
        name: Mapped[str] = mapped_column(sa.String(40), default="")

    class Note(Base):
        __tablename__ = "notes"
        id: Mapped[int] = mapped_column(primary_key=True)
        number: Mapped[int] = SequenceField(gapless=True)

    return Order, Event, Note, Base.metadata


def run_the_app(engine: sa.Engine, models: list[type[Any]], n: int) -> list[list[Any]]:
    """Insert ``n`` rows of each model under install(): per model, the values handed out."""
    install(engine)
    try:
        with Session(engine) as session:
            rows = [[model() for _ in range(n)] for model in models]
            session.add_all([row for group in rows for row in group])
            session.commit()
            return [
                [(r.id, r.number) for r in rows[0]],
                [r.id for r in rows[1]],
                [r.number for r in rows[2]],
            ]
    finally:
        uninstall(engine)
        close_snowflakes()


@pytest.mark.parametrize("fresh_url", BACKENDS, indirect=True)
def test_autogenerate_with_no_extra_line_creates_the_store_tables_once(
    fresh_url: str, tmp_path: Path
) -> None:
    """No autoseq line: autogenerate creates sys_sequence and sys_worker once, check then passes."""
    *models, metadata = zero_line_models()
    engine = sa.create_engine(fresh_url)
    cfg = alembic_project(tmp_path / "project")
    first = autogenerate(cfg, engine, metadata, "initial")
    assert upgrade_ops(first).count("op.create_table('sys_sequence'") == 1
    assert upgrade_ops(first).count("op.create_table('sys_worker'") == 1
    assert "drop_table" not in upgrade_ops(first)
    upgrade(cfg, engine, metadata)
    orders, events, notes = run_the_app(engine, models, 3)  # the store makes rows and leases
    assert orders == [(1, "N0001"), (2, "N0002"), (3, "N0003")]
    assert len(set(events)) == 3
    assert notes == [1, 2, 3]
    with engine.begin() as connection:
        cfg.attributes.update(connection=connection, metadata=metadata)
        command.check(cfg)  # raises AutogenerateDiffsDetected on any proposed change
    second = autogenerate(cfg, engine, metadata, "after the app ran")
    assert "op." not in upgrade_ops(second)
    assert "sys_sequence" not in second
    assert "sys_worker" not in second
    engine.dispose()


@pytest.mark.parametrize("fresh_url", SERVERS, indirect=True)
def test_autogenerate_after_the_app_made_the_tables_proposes_no_drop(
    fresh_url: str, tmp_path: Path
) -> None:
    """Tables the store made at run time, then Alembic adopted: no drop, check passes."""
    *models, metadata = zero_line_models()
    engine = sa.create_engine(fresh_url)
    for model in models:  # only the application's tables, as before Alembic
        model.__table__.create(engine)
    run_the_app(engine, models, 2)  # the store makes sys_sequence and sys_worker itself
    cfg = alembic_project(tmp_path / "project")
    migration = autogenerate(cfg, engine, metadata, "adopt")
    assert "drop_table" not in upgrade_ops(migration)
    assert "'sys_sequence'" not in migration
    assert "'sys_worker'" not in migration
    engine.dispose()


@pytest.mark.parametrize("fresh_url", BACKENDS, indirect=True)
def test_a_downgrade_refuses_to_drop_live_sequence_rows(
    fresh_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """downgrade base stops before dropping a store table with rows, unless told to."""
    *models, metadata = zero_line_models()
    engine = sa.create_engine(fresh_url)
    cfg = alembic_project(tmp_path / "project")
    migration = autogenerate(cfg, engine, metadata, "initial")
    assert "autoseq.sqlalchemy.alembic.drop_store_table('sys_sequence')" in migration
    assert "autoseq.sqlalchemy.alembic.drop_store_table('sys_worker')" in migration
    assert "op.drop_table('orders')" in migration
    upgrade(cfg, engine, metadata)
    run_the_app(engine, models, 2)  # SQLite: gapless rows in app.db, the rest in the companion
    before = store_rows(engine)
    assert sum(before.values()) >= 1
    monkeypatch.delenv(ALLOW_DROP_ENV, raising=False)
    with pytest.raises(StoreTableInUse, match=r"row\(s\).*AUTOSEQ_ALLOW_DROP=sys_"):
        downgrade(cfg, engine, metadata)
    after = store_rows(engine)
    assert {t: n for t, n in after.items() if n} == {t: n for t, n in before.items() if n}
    if engine.dialect.name == "postgresql":  # transactional DDL: rolled back whole
        assert after == before
        assert "orders" in sa.inspect(engine).get_table_names()
    offline = downgrade_sql(cfg, engine, metadata, capsys)
    assert "DROP TABLE sys_sequence" in offline  # a script to read: written, not refused
    assert store_rows(engine) == after
    monkeypatch.setenv(ALLOW_DROP_ENV, "1")
    downgrade(cfg, engine, metadata)
    assert store_rows(engine) == {}
    engine.dispose()


def store_rows(engine: sa.Engine) -> dict[str, int]:
    """Rows per store table present in the application's database."""
    present = set(sa.inspect(engine).get_table_names()) & STORE_TABLES
    with engine.connect() as connection:
        return {
            table: connection.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one()
            for table in present
        }


def downgrade_sql(
    cfg: Config, engine: sa.Engine, metadata: sa.MetaData, capsys: pytest.CaptureFixture[str]
) -> str:
    """``alembic downgrade head:base --sql``: the script it prints."""
    capsys.readouterr()
    with engine.begin() as connection:
        cfg.attributes.update(connection=connection, metadata=metadata)
        command.downgrade(cfg, "head:base", sql=True)
    return capsys.readouterr().out


def downgrade(cfg: Config, engine: sa.Engine, metadata: sa.MetaData) -> None:
    with engine.begin() as connection:
        cfg.attributes.update(connection=connection, metadata=metadata)
        command.downgrade(cfg, "base")


# SQLite keys are the rowid; older BIGINT keys are left alone --------------------------


def bigint_key_models() -> sa.MetaData:
    """The orders table as autoseq declared it before its SQLite key became the rowid."""

    class Base(DeclarativeBase):
        pass

    class Order(Base):
        __tablename__ = "orders"
        id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
        name: Mapped[str] = mapped_column(sa.String(40), default="")

    include_sequence_table(Base.metadata)
    return Base.metadata


def key_type(engine: sa.Engine) -> str:
    """The type the database reports for ``orders.id``."""
    columns = sa.inspect(engine).get_columns("orders")
    return str(next(c["type"] for c in columns if c["name"] == "id"))


@pytest.mark.parametrize("fresh_url", BACKENDS, indirect=True)
def test_a_project_made_with_bigint_keys_sees_no_change(fresh_url: str, tmp_path: Path) -> None:
    """A BIGINT key from an older autoseq: autogenerate proposes nothing, alembic check passes."""
    engine = sa.create_engine(fresh_url)
    cfg = alembic_project(tmp_path / "project")
    old = bigint_key_models()
    assert "sa.Column('id', sa.BigInteger(), autoincrement=False" in autogenerate(
        cfg, engine, old, "made by an older autoseq"
    )
    upgrade(cfg, engine, old)
    order, metadata = make_models(with_line=False)
    with engine.begin() as connection:
        cfg.attributes.update(connection=connection, metadata=metadata)
        command.check(cfg)  # raises AutogenerateDiffsDetected on any proposed change
    assert "op." not in upgrade_ops(autogenerate(cfg, engine, metadata, "upgraded autoseq"))
    assert key_type(engine) == "BIGINT"
    assert insert_orders(engine, order, 5) == [1, 2, 3, 4, 5]
    engine.dispose()


@pytest.mark.parametrize("fresh_url", BACKENDS, indirect=True)
def test_a_new_project_gets_the_rowid_key_on_sqlite(fresh_url: str, tmp_path: Path) -> None:
    """The first migration declares INTEGER on SQLite, BIGINT elsewhere; check then passes."""
    engine = sa.create_engine(fresh_url)
    cfg = alembic_project(tmp_path / "project")
    order, metadata = make_models(with_line=False)
    migration = autogenerate(cfg, engine, metadata, "initial")
    assert "sa.BigInteger().with_variant(sa.Integer(), 'sqlite')" in migration
    upgrade(cfg, engine, metadata)
    with engine.begin() as connection:
        cfg.attributes.update(connection=connection, metadata=metadata)
        command.check(cfg)
    assert key_type(engine) == ("INTEGER" if engine.dialect.name == "sqlite" else "BIGINT")
    assert insert_orders(engine, order, 5) == [1, 2, 3, 4, 5]
    engine.dispose()


def test_a_custom_sequence_table_replaces_the_declared_default() -> None:
    """include_sequence_table(md, "app_seq") takes back the sys_sequence a field declared."""
    *_, metadata = zero_line_models()
    assert {"sys_sequence", "sys_worker"} <= set(metadata.tables)
    include_sequence_table(metadata, "app_seq")
    include_worker_table(metadata, "app_seq_worker")
    assert "sys_sequence" not in metadata.tables
    assert "sys_worker" not in metadata.tables
    assert {"app_seq", "app_seq_worker"} <= set(metadata.tables)


def test_mixins_and_copies_declare_the_tables_too() -> None:
    """A SequenceField from a mixin, and a Table copied to other MetaData, bring sys_sequence."""

    class Base(DeclarativeBase):
        pass

    class Keyed:
        id: Mapped[int] = SequenceField(primary_key=True)

    class Invoice(Keyed, Base):
        __tablename__ = "invoices"

    assert "sys_sequence" in Base.metadata.tables
    other = sa.MetaData()
    Invoice.__table__.to_metadata(other)
    assert "sys_sequence" in other.tables
    core = sa.MetaData()
    sa.Table("t", core, sequence_column("id", primary_key=True))
    assert "sys_sequence" in core.tables
    assert "sys_worker" not in core.tables


# converting an Identity / serial / AUTO_INCREMENT key ------------------------------

CONVERT_MIGRATION = '''
"""convert legacy.id"""
from autoseq.sqlalchemy.alembic import convert_column

revision = "convert01"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    convert_column("legacy", "id")


def downgrade() -> None:
    pass
'''


def legacy_table(metadata: sa.MetaData, backend: str, serial: bool) -> sa.Table:
    if serial:
        id_column = sa.Column("id", sa.Integer, primary_key=True)  # SERIAL on PostgreSQL
    elif backend == "postgres":
        id_column = sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True)
    else:
        id_column = sa.Column("id", sa.Integer, primary_key=True, autoincrement=True)
    return sa.Table("legacy", metadata, id_column, sa.Column("name", sa.String(40)))


@pytest.mark.parametrize(
    ("fresh_url", "serial"),
    [
        *[pytest.param(p.values[0], False, marks=p.marks, id=p.id) for p in CONVERT_BACKENDS],
        pytest.param("postgres", True, marks=pytest.mark.postgres, id="postgres-serial"),
    ],
    indirect=["fresh_url"],
)
def test_convert_column_drops_the_old_default_and_moves_the_sequence(
    fresh_url: str, serial: bool, tmp_path: Path
) -> None:
    """After the Alembic conversion, ORM inserts continue past the old keys, never colliding."""
    backend = sa.make_url(fresh_url).get_backend_name()
    backend = {"postgresql": "postgres"}.get(backend, backend)
    engine = sa.create_engine(fresh_url)
    legacy_table(sa.MetaData(), backend, serial).create(engine)
    with engine.begin() as connection:
        for i in range(5):  # the database's own generator numbers them
            connection.exec_driver_sql(f"INSERT INTO legacy (name) VALUES ('old{i}')")
    cfg = alembic_project(tmp_path / "project")
    (tmp_path / "project" / "migrations" / "versions" / "convert01.py").write_text(
        textwrap.dedent(CONVERT_MIGRATION)
    )
    upgrade(cfg, engine, sa.MetaData())

    class Base(DeclarativeBase):
        pass

    class Legacy(Base):
        __tablename__ = "legacy"
        id: Mapped[int] = SequenceField(primary_key=True)
        name: Mapped[str] = mapped_column(sa.String(40))

    assert insert_orders(engine, Legacy, 3) == [6, 7, 8]
    if backend != "sqlite":
        # The database no longer numbers rows itself: a raw insert must give the key.
        with pytest.raises(sa.exc.DBAPIError), engine.begin() as connection:
            connection.exec_driver_sql("INSERT INTO legacy (name) VALUES ('raw')")
    with engine.connect() as connection:
        keys = [row[0] for row in connection.exec_driver_sql("SELECT id FROM legacy")]
    assert sorted(keys) == list(range(1, 9))
    engine.dispose()


@pytest.mark.parametrize("fresh_url", CONVERT_BACKENDS, indirect=True)
def test_convert_never_moves_a_row_backward(fresh_url: str) -> None:
    """A sequence already past the column's keys stays where it is."""
    from autoseq.sqlalchemy.alembic import convert_on

    backend = {"postgresql": "postgres"}.get(
        sa.make_url(fresh_url).get_backend_name(), sa.make_url(fresh_url).get_backend_name()
    )
    engine = sa.create_engine(fresh_url)
    legacy_table(sa.MetaData(), backend, serial=False).create(engine)
    with engine.begin() as connection:
        connection.exec_driver_sql("INSERT INTO legacy (name) VALUES ('a')")
        first = convert_on(connection, "legacy", "id", start=100)
        second = convert_on(connection, "legacy", "id", start=100)
    assert (first.next_value, second.next_value) == (100, 100)
    engine.dispose()


# a missing sync driver -------------------------------------------------------------


def test_install_names_the_extra_when_the_sync_driver_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An asyncpg-only install fails at install(), naming autoseq[postgres], not at commit."""
    pytest.importorskip("asyncpg")
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if psycopg were not installed
    engine = create_async_engine("postgresql+asyncpg://postgres@127.0.0.1:5432/nowhere")
    with pytest.raises(MissingDriver, match=r"autoseq\[postgres\]") as caught:
        install(async_sessionmaker(engine))
    assert "asyncpg" in str(caught.value)
    with pytest.raises(MissingDriver, match=r"autoseq\[postgres\]"):
        install(engine)
    with pytest.raises(MissingDriver, match=r"autoseq\[postgres\]"):
        SQLStore(engine)
