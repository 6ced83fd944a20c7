"""The SQLAlchemy integration on SQLite (file), PostgreSQL and MariaDB.

Every insert path gets values, explicit values are kept, a bulk costs one
reservation per sequence, and a caller's rollback never hands a value out
twice. Each test has its own tables and its own sequence table.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from backends import installed_orm, make_engine, unique_table
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    MappedAsDataclass,
    Session,
    mapped_column,
    scoped_session,
    sessionmaker,
)

from autoseq import (
    BufferPolicy,
    InvalidSequenceConfig,
    SequenceNotFound,
    SequenceRegistry,
    signals,
)
from autoseq.errors import AutoseqError, UnsupportedInsert
from autoseq.sqlalchemy import (
    SequenceField,
    application_tables,
    close_registries,
    default_registry,
    get_registry,
    install,
    sequence_column,
    sequence_spec,
    uninstall,
)
from autoseq.stores.sql import SQLStore

BIG = 10**12  # far above anything the sequences reach in a test


@dataclass
class Models:
    base: type[DeclarativeBase]
    order: Any  # the mapped class
    table: sa.Table
    orders_seq: str
    codes_seq: str


def make_models(batch_count: int = 100) -> Models:
    """A fresh declarative base with an Order model on unique table and sequence names."""
    table_name = unique_table("orders")
    codes = unique_table("codes")

    class Base(DeclarativeBase):
        pass

    class Order(Base):
        __tablename__ = table_name
        id: Mapped[int] = SequenceField(primary_key=True, batch_count=batch_count)
        code: Mapped[int] = SequenceField(sequence=codes, step=10, batch_count=500)
        name: Mapped[str] = mapped_column(sa.String(40), default="")

    return Models(Base, Order, Order.__table__, table_name, codes)  # type: ignore[arg-type]


@dataclass
class Setup:
    engine: sa.Engine
    maker: sessionmaker[Session]
    models: Models
    store: SQLStore
    registry: SequenceRegistry

    @property
    def Order(self) -> Any:
        return self.models.order

    def rows(self) -> list[tuple[int, int, str]]:
        with self.engine.connect() as connection:
            t = self.models.table
            return [tuple(r) for r in connection.execute(sa.select(t.c.id, t.c.code, t.c.name))]


@pytest.fixture
def setup(db_url: str) -> Iterator[Setup]:
    """Models on their own tables, a store on its own sequence table, maker + engine installed."""
    models = make_models()
    with installed_orm(db_url, models.base.metadata) as (engine, maker, store, registry):
        yield Setup(engine, maker, models, store, registry)


@pytest.fixture
def reserved() -> Iterator[list[dict[str, Any]]]:
    """Every block reservation made during the test, as the block_reserved signal reports it."""
    seen: list[dict[str, Any]] = []

    def receive(_sender: object, **kwargs: Any) -> None:
        seen.append(kwargs)

    signals.block_reserved.connect(receive, weak=False)
    yield seen
    signals.block_reserved.disconnect(receive)


def on_demand(seen: list[dict[str, Any]], name: str) -> int:
    """Reservations of ``name`` that a caller waited for (prefetches excluded)."""
    return sum(1 for r in seen if r["name"] == name and not r["prefetch"])


# declaration ----------------------------------------------------------------------


def test_field_is_a_plain_bigint_column_with_its_settings_in_info() -> None:
    """SequenceField makes a BIGINT without database autoincrement; the settings are in info."""
    models = make_models()
    column = models.table.c.code
    assert isinstance(column.type, sa.BigInteger)
    assert column.autoincrement is False
    assert column.server_default is None
    spec = sequence_spec(column)
    assert spec is not None
    assert (spec.sequence, spec.step, spec.batch_count) == (
        models.codes_seq,
        10,
        500,
    )
    ddl = str(sa.schema.CreateTable(models.table).compile(dialect=postgresql.dialect()))
    assert "SERIAL" not in ddl.upper()
    assert "IDENTITY" not in ddl.upper()


def rowid_table(connection: sa.Connection, table: sa.Table) -> tuple[str, list[str]]:
    """SQLite's DDL of ``table`` and the indexes SQLite made for it."""
    ddl = connection.execute(
        sa.text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :t"),
        {"t": table.name},
    ).scalar_one()
    indexes = connection.execute(
        sa.text("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = :t"),
        {"t": table.name},
    )
    return str(ddl), list(indexes.scalars())


def test_a_sqlite_sequence_key_is_the_rowid(tmp_path: Any) -> None:
    """On SQLite a SequenceField key is INTEGER PRIMARY KEY, the rowid: no second B-tree."""
    models = make_models(batch_count=7)
    url = f"sqlite:///{tmp_path / 'rowid.db'}"
    with installed_orm(url, models.base.metadata) as (engine, maker, _, _):
        with maker() as session:
            session.add_all([models.order(name=str(i)) for i in range(20)])
            session.commit()
            session.execute(sa.insert(models.order), [{"name": "bulk"} for _ in range(30)])
            session.commit()
        with engine.connect() as connection:
            ddl, indexes = rowid_table(connection, models.table)
            pairs = connection.execute(
                sa.text(f"SELECT rowid, id FROM {models.table.name} ORDER BY rowid")
            ).all()
    assert "id INTEGER NOT NULL" in ddl
    assert "PRIMARY KEY (id)" in ddl
    assert "code BIGINT NOT NULL" in ddl  # not a key: the type it always had
    assert indexes == []  # a BIGINT key adds sqlite_autoindex_<table>_1
    assert [rowid for rowid, _ in pairs] == [key for _, key in pairs] == list(range(1, 51))


def test_a_core_sequence_key_is_the_rowid_on_sqlite_and_bigint_elsewhere(tmp_path: Any) -> None:
    """sequence_column(primary_key=True) is INTEGER on SQLite, BIGINT on the servers."""
    metadata = sa.MetaData()
    table = sa.Table("core_rows", metadata, sequence_column("id", primary_key=True))
    assert "id BIGINT NOT NULL" in str(
        sa.schema.CreateTable(table).compile(dialect=postgresql.dialect())
    )
    url = f"sqlite:///{tmp_path / 'core.db'}"
    with installed_orm(url, metadata) as (engine, _, _, _), engine.begin() as connection:
        connection.execute(sa.insert(table), [{} for _ in range(5)])
        ddl, indexes = rowid_table(connection, table)
        pairs = connection.execute(sa.text("SELECT rowid, id FROM core_rows")).all()
    assert "id INTEGER NOT NULL" in ddl
    assert indexes == []
    assert sorted(pairs) == [(i, i) for i in range(1, 6)]


@pytest.mark.parametrize(
    "kwargs",
    [{"step": 0}, {"start": 10, "end": 5}, {"batch_count": 0}, {"sequence": ""}, {"sequence": 5}],
    ids=["step0", "start>end", "batch_count0", "empty-name", "int-name"],
)
def test_bad_settings_fail_at_declaration(kwargs: dict[str, Any]) -> None:
    """Settings that cannot work raise InvalidSequenceConfig when the field is declared."""
    with pytest.raises(InvalidSequenceConfig):
        SequenceField(**kwargs)


@pytest.mark.parametrize("clash", ["default", "server_default", "insert_default", "autoincrement"])
def test_field_refuses_arguments_that_would_compete_with_the_sequence(clash: str) -> None:
    """A default or autoincrement of one's own is refused with a message saying why."""
    with pytest.raises(InvalidSequenceConfig, match=r"sets .* itself"):
        SequenceField(primary_key=True, **{clash: "1"})


# insert paths --------------------------------------------------------------------


def test_add_and_flush_assigns_values_in_order(setup: Setup) -> None:
    """session.add() + flush gives each object the next values, step respected."""
    with setup.maker() as session:
        orders = [setup.Order(name=f"o{i}") for i in range(3)]
        for order in orders:
            session.add(order)
        session.flush()
        assert [(o.id, o.code) for o in orders] == [(1, 1), (2, 11), (3, 21)]
        session.commit()
    assert sorted(setup.rows()) == [(1, 1, "o0"), (2, 11, "o1"), (3, 21, "o2")]


def test_models_sharing_a_sequence_get_values_in_the_order_added(
    db_url: str, reserved: list[dict[str, Any]]
) -> None:
    """Two models, and two columns of one model, on one sequence: one take per flush,
    values ascending in the order the rows were added, whatever their model."""
    shared = unique_table("shared")

    class Base(DeclarativeBase):
        pass

    class Invoice(Base):
        __tablename__ = unique_table("invoices")
        id: Mapped[int] = SequenceField(primary_key=True, sequence=shared)
        name: Mapped[str] = mapped_column(sa.String(40), default="")

    class Refund(Base):
        __tablename__ = unique_table("refunds")
        id: Mapped[int] = SequenceField(primary_key=True, sequence=shared)
        ref: Mapped[int] = SequenceField(sequence=shared)
        name: Mapped[str] = mapped_column(sa.String(40), default="")

    with installed_orm(db_url, Base.metadata) as (_, maker, _, _), maker() as session:
        rows: list[Any] = []
        for i in range(6):
            rows.append((Invoice if i % 2 == 0 else Refund)(name=f"r{i}"))
        rows.insert(3, Refund(name="given", ref=BIG))  # an explicit value is kept
        session.add_all(rows)
        session.commit()
        got = [(type(r).__name__, r.id, getattr(r, "ref", None)) for r in rows]
    assert got == [
        ("Invoice", 1, None),
        ("Refund", 2, 3),
        ("Invoice", 4, None),
        ("Refund", 5, BIG),
        ("Refund", 6, 7),
        ("Invoice", 8, None),
        ("Refund", 9, 10),
    ]
    assert on_demand(reserved, shared) == 1


def test_add_all_of_thousands_costs_one_reservation_per_sequence(
    setup: Setup, reserved: list[dict[str, Any]]
) -> None:
    """add_all of 5,000 objects takes one next_many per sequence: one reservation each."""
    n = 5000
    with setup.maker() as session:
        orders = [setup.Order(name="bulk") for _ in range(n)]
        session.add_all(orders)
        session.commit()
        ids = [o.id for o in orders]
    assert ids == list(range(1, n + 1))
    assert on_demand(reserved, setup.models.orders_seq) == 1
    assert on_demand(reserved, setup.models.codes_seq) == 1
    assert sorted(code for _, code, _ in setup.rows()) == list(range(1, 10 * n, 10))


def test_orm_bulk_insert_fills_missing_keys_in_one_reservation(
    setup: Setup, reserved: list[dict[str, Any]]
) -> None:
    """session.execute(insert(Order), [dicts]) gets values, one reservation per sequence."""
    n = 20_000
    with setup.maker() as session:
        session.execute(sa.insert(setup.Order), [{"name": f"b{i}"} for i in range(n)])
        session.commit()
    rows = setup.rows()
    assert sorted(r[0] for r in rows) == list(range(1, n + 1))
    assert len({r[1] for r in rows}) == n
    orders = setup.models.orders_seq
    total = sum(1 for r in reserved if r["name"] == orders)
    assert on_demand(reserved, orders) == 1
    assert total <= math.ceil(n / 100) + 1


def test_orm_bulk_insert_returning_reports_the_assigned_keys(setup: Setup) -> None:
    """insert(Order).returning(Order.id) returns the values the sequence gave."""
    with setup.maker() as session:
        returned = session.scalars(
            sa.insert(setup.Order).returning(setup.Order.id),
            [{"name": "a"}, {"name": "b"}, {"name": "c"}],
        ).all()
        session.commit()
    assert sorted(returned) == [1, 2, 3]
    assert sorted(r[0] for r in setup.rows()) == [1, 2, 3]


def test_core_executemany_fills_parameters_in_one_reservation(
    setup: Setup, reserved: list[dict[str, Any]]
) -> None:
    """conn.execute(insert(table), [dicts]) gets values from one next_many per sequence."""
    n = 5000
    with setup.engine.begin() as connection:
        connection.execute(sa.insert(setup.models.table), [{"name": "c"} for _ in range(n)])
    assert sorted(r[0] for r in setup.rows()) == list(range(1, n + 1))
    assert on_demand(reserved, setup.models.orders_seq) == 1


def test_core_single_row_and_values_forms_get_values(setup: Setup) -> None:
    """One-row execute, insert().values(...) and multi-row VALUES all get values."""
    table = setup.models.table
    with setup.engine.begin() as connection:
        connection.execute(sa.insert(table), {"name": "param"})
        connection.execute(sa.insert(table).values(name="values"))
        connection.execute(sa.insert(table).values([{"name": "multi1"}, {"name": "multi2"}]))
    rows = sorted(setup.rows())
    assert [r[0] for r in rows] == [1, 2, 3, 4]
    assert [r[2] for r in rows] == ["param", "values", "multi1", "multi2"]
    assert [r[1] for r in rows] == [1, 11, 21, 31]


def test_core_on_a_connection_opened_before_install_still_gets_values(db_url: str) -> None:
    """The column's own default covers a connection that predates the engine listener."""
    engine = make_engine(db_url)
    models = make_models()
    models.base.metadata.create_all(engine)
    store = SQLStore(db_url, table=unique_table("sys"))
    registry = SequenceRegistry(store)
    try:
        with engine.begin() as connection:
            install(engine, registry=registry)
            connection.execute(sa.insert(models.table), [{"name": "x"}, {"name": "y"}])
        with engine.connect() as connection:
            ids = connection.execute(sa.select(models.table.c.id)).scalars().all()
        assert sorted(ids) == [1, 2]
    finally:
        uninstall(engine)
        registry.close(release=False)
        store.drop()
        models.base.metadata.drop_all(engine, tables=application_tables(models.base.metadata))
        engine.dispose()


def test_explicit_values_are_kept_on_every_path(setup: Setup) -> None:
    """A value the user sets is never overwritten: add, ORM bulk, Core, values()."""
    table = setup.models.table
    with setup.maker() as session:
        session.add(setup.Order(id=BIG + 1, name="add"))
        session.add(setup.Order(code=BIG + 2, name="add-code"))
        session.execute(
            sa.insert(setup.Order), [{"id": BIG + 3, "name": "bulk"}, {"name": "bulk-auto"}]
        )
        session.commit()
    with setup.engine.begin() as connection:
        connection.execute(sa.insert(table), [{"id": BIG + 4, "code": BIG + 5, "name": "core"}])
        connection.execute(sa.insert(table).values(id=BIG + 6, name="values"))
    by_name = {name: (id_, code) for id_, code, name in setup.rows()}
    assert by_name["add"][0] == BIG + 1
    assert by_name["add-code"][1] == BIG + 2
    assert by_name["bulk"][0] == BIG + 3
    assert by_name["core"] == (BIG + 4, BIG + 5)
    assert by_name["values"][0] == BIG + 6
    generated = sorted(
        id_ for name, (id_, _) in by_name.items() if name in ("add-code", "bulk-auto")
    )
    assert generated == [1, 2]  # explicit keys consumed no sequence values


def test_missing_rows_are_created_from_the_field_arguments(setup: Setup) -> None:
    """First use creates the sys_sequence table and each row with the field's settings."""
    assert setup.store.read_all() == []
    with setup.maker() as session:
        session.add(setup.Order(name="first"))
        session.commit()
    rows = {row.name: row for row in setup.store.read_all()}
    codes = rows[setup.models.codes_seq]
    assert (codes.step, codes.batch_count, codes.start) == (10, 500, 1)
    assert rows[setup.models.orders_seq].batch_count == 100


def test_auto_create_off_raises_sequence_not_found(db_url: str) -> None:
    """With auto_create=False a missing row raises SequenceNotFound and nothing is inserted."""
    engine = make_engine(db_url)
    models = make_models()
    models.base.metadata.create_all(engine)
    store = SQLStore(db_url, table=unique_table("sys"))
    maker = sessionmaker(engine)
    install(maker, store=store, auto_create=False)
    try:
        with maker() as session:
            session.add(models.order(name="x"))
            with pytest.raises(SequenceNotFound, match=models.orders_seq):
                session.flush()
        with engine.connect() as connection:
            count = sa.select(sa.func.count()).select_from(models.table)
            assert connection.execute(count).scalar() == 0
        assert store.read_all() == []
    finally:
        uninstall(maker)
        store.drop()
        store.close()
        models.base.metadata.drop_all(engine, tables=application_tables(models.base.metadata))
        engine.dispose()


def test_without_install_an_insert_says_to_call_install(tmp_path: Any) -> None:
    """An insert no install() covers fails with a message naming install()."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'bare.db'}")
    models = make_models()
    models.base.metadata.create_all(engine)
    with pytest.raises(sa.exc.StatementError) as caught, engine.begin() as connection:
        connection.execute(sa.insert(models.table).values(name="x"))
    assert isinstance(caught.value.orig, AutoseqError)
    assert "install(" in str(caught.value.orig)


def test_mixin_columns_take_one_sequence_per_table(setup: Setup, db_url: str) -> None:
    """A SequenceField on a mixin names each table's own sequence after that table."""

    class Base(DeclarativeBase):
        pass

    class Keyed:
        id: Mapped[int] = SequenceField(primary_key=True)

    names = unique_table("a"), unique_table("b")

    class A(Keyed, Base):
        __tablename__ = names[0]

    class B(Keyed, Base):
        __tablename__ = names[1]

    Base.metadata.create_all(setup.engine)
    try:
        with setup.maker() as session:
            session.add_all([A(), A(), B()])
            session.commit()
        assert {row.name: row.current for row in setup.store.read_all()} == {
            names[0]: 101,
            names[1]: 101,
        }
    finally:
        Base.metadata.drop_all(setup.engine, tables=application_tables(Base.metadata))


def test_joined_inheritance_uses_the_parent_tables_sequence(setup: Setup) -> None:
    """A joined-table subclass takes its key from the parent table's sequence."""

    class Base(DeclarativeBase):
        pass

    parent, child = unique_table("parent"), unique_table("child")

    class Parent(Base):
        __tablename__ = parent
        id: Mapped[int] = SequenceField(primary_key=True)
        kind: Mapped[str] = mapped_column(sa.String(10))
        __mapper_args__ = {"polymorphic_on": "kind", "polymorphic_identity": "p"}

    class Child(Parent):
        __tablename__ = child
        id: Mapped[int] = mapped_column(sa.ForeignKey(f"{parent}.id"), primary_key=True)
        __mapper_args__ = {"polymorphic_identity": "c"}

    Base.metadata.create_all(setup.engine)
    try:
        with setup.maker() as session:
            objects = [Parent(), Child(), Child()]
            session.add_all(objects)
            session.commit()
            assert [o.id for o in objects] == [1, 2, 3]
        assert [row.name for row in setup.store.read_all()] == [parent]
    finally:
        Base.metadata.drop_all(setup.engine, tables=application_tables(Base.metadata))


def test_core_table_with_sequence_column(setup: Setup) -> None:
    """sequence_column() gives a Core table the same behaviour."""
    metadata = sa.MetaData()
    name = unique_table("core")
    table = sa.Table(
        name,
        metadata,
        sequence_column("id", primary_key=True, start=100, step=5),
        sa.Column("note", sa.String(20)),
    )
    metadata.create_all(setup.engine)
    try:
        with setup.engine.begin() as connection:
            connection.execute(sa.insert(table), [{"note": "a"}, {"note": "b"}])
            connection.execute(sa.insert(table).values(note="c"))
            ids = connection.execute(sa.select(table.c.id).order_by(table.c.id)).scalars().all()
        assert ids == [100, 105, 110]
    finally:
        metadata.drop_all(setup.engine, tables=application_tables(metadata))


# which install covers what -----------------------------------------------------


def test_install_on_engine_covers_plain_sessions_bound_to_it(setup: Setup) -> None:
    """install(engine) alone serves ORM flushes of a plain Session on that engine."""
    uninstall(setup.maker)
    with Session(setup.engine) as session:
        order = setup.Order(name="plain")
        session.add(order)
        session.commit()
        assert order.id == 1
    assert setup.store.reservations >= 1


def test_install_on_scoped_session_covers_its_sessions(setup: Setup) -> None:
    """install(scoped_session(...)) covers the sessions it hands out."""
    scoped = scoped_session(sessionmaker(setup.engine))
    uninstall(setup.engine)
    install(scoped, registry=setup.registry)
    try:
        scoped.add(setup.Order(name="scoped"))
        scoped.commit()
        assert [r[0] for r in setup.rows()] == [1]
    finally:
        scoped.remove()
        uninstall(scoped)


def test_session_maker_install_wins_over_engine_install(setup: Setup, db_url: str) -> None:
    """A sessionmaker's own store serves its sessions even when the engine has another."""
    other = SQLStore(db_url, table=unique_table("sys"))
    other_registry = SequenceRegistry(other)
    maker = sessionmaker(setup.engine)
    install(maker, registry=other_registry)
    try:
        with maker() as session:
            session.add(setup.Order(name="mine"))
            session.execute(sa.insert(setup.Order), [{"name": "bulk"}])
            session.commit()
        assert other.reservations >= 2
        assert setup.store.reservations == 0
    finally:
        uninstall(maker)
        other_registry.close(release=False)
        other.drop()


def test_install_on_session_class_covers_every_session_and_engine(tmp_path: Any) -> None:
    """install(Session) covers any session and Core on any engine, each on its own database."""
    url = f"sqlite:///{tmp_path / 'global.db'}"
    engine = make_engine(url)
    models = make_models()
    models.base.metadata.create_all(engine)
    install(Session)
    try:
        with Session(engine) as session:
            session.add(models.order(name="session"))
            session.commit()
        with engine.begin() as connection:
            connection.execute(sa.insert(models.table), [{"name": "core1"}, {"name": "core2"}])
        registry = get_registry(engine)
        assert isinstance(registry.store, SQLStore)
        assert registry.store.url.database == str(tmp_path / "global.db") + ".autoseq"
        with engine.connect() as connection:
            ids = connection.execute(sa.select(models.table.c.id)).scalars().all()
        assert sorted(ids) == [1, 2, 3]
    finally:
        uninstall(Session)
        close_registries()
        engine.dispose()


def test_default_store_is_sys_sequence_in_the_binds_database(db_url: str) -> None:
    """Without store=, values come from sys_sequence of the session's own database."""
    engine = make_engine(db_url)
    # The shared servers may hold a sys_sequence of someone else's: only its rows
    # of this test are deleted then, and the table is dropped only if it made it.
    existed = sa.inspect(engine).has_table("sys_sequence")
    models = make_models()
    models.base.metadata.create_all(engine)
    maker = sessionmaker(engine)
    install(maker)
    try:
        with maker() as session:
            session.add_all([models.order(name="a"), models.order(name="b")])
            session.commit()
            registry = get_registry(session)
        store = registry.store
        assert isinstance(store, SQLStore)
        assert store.table_name == "sys_sequence"
        assert registry is default_registry(engine)
        row = store.read(models.orders_seq)
        assert row is not None
        assert row.current == 101
    finally:
        uninstall(maker)
        store.delete(models.orders_seq)
        store.delete(models.codes_seq)
        close_registries()
        models.base.metadata.drop_all(engine, tables=application_tables(models.base.metadata))
        if not existed:
            store.drop()
        engine.dispose()


# rollback safety -----------------------------------------------------------------


def test_values_taken_in_a_rolled_back_session_are_never_handed_out_again(setup: Setup) -> None:
    """Rollback after taking values, then more inserts: no IntegrityError, no repeat."""
    with setup.maker() as session:
        lost = [setup.Order(name="lost") for _ in range(250)]
        session.add_all(lost)
        session.flush()
        lost_ids = {o.id for o in lost}
        session.rollback()
        kept = [setup.Order(name="kept") for _ in range(250)]
        session.add_all(kept)
        session.commit()
        kept_ids = {o.id for o in kept}
    assert len(lost_ids) == len(kept_ids) == 250
    assert not lost_ids & kept_ids
    assert min(kept_ids) > max(lost_ids)
    assert sorted(r[0] for r in setup.rows()) == sorted(kept_ids)


def test_values_taken_in_a_rolled_back_core_transaction_are_never_reused(setup: Setup) -> None:
    """A Core transaction rolled back after inserting does not give its values back."""
    table = setup.models.table
    with setup.engine.connect() as connection:
        transaction = connection.begin()
        connection.execute(sa.insert(table), [{"name": "lost"} for _ in range(300)])
        transaction.rollback()
    with setup.engine.begin() as connection:
        connection.execute(sa.insert(table), [{"name": "kept"} for _ in range(300)])
    ids = sorted(r[0] for r in setup.rows())
    assert ids == list(range(301, 601))


def test_many_blocks_inside_one_open_transaction_with_a_rollback_in_the_middle(
    db_url: str,
) -> None:
    """One long transaction takes 30 blocks, rolls a savepoint back, goes on, commits."""
    engine = make_engine(db_url)
    models = make_models(batch_count=10)  # small blocks: the transaction outlives many
    models.base.metadata.create_all(engine)
    store = SQLStore(db_url, table=unique_table("sys"))
    registry = SequenceRegistry(store, policy=BufferPolicy(max_batch_count=10, prefetch=False))
    maker = sessionmaker(engine)
    install(maker, registry=registry)
    try:
        with maker() as session:
            for _ in range(10):  # each flush reserves while the transaction holds its locks
                session.add_all([models.order(name="before") for _ in range(10)])
                session.flush()
            savepoint = session.begin_nested()
            session.add_all([models.order(name="undone") for _ in range(100)])
            session.flush()
            savepoint.rollback()
            for _ in range(10):
                session.add_all([models.order(name="after") for _ in range(10)])
                session.flush()
            session.commit()
        with engine.connect() as connection:
            t = models.table
            rows = connection.execute(sa.select(t.c.id, t.c.name)).all()
        ids = [r[0] for r in rows]
        assert len(rows) == 200
        assert len(set(ids)) == 200
        assert {r[1] for r in rows} == {"before", "after"}
        # ids: 20 flushes of one block of 10 and one bulk of 100; codes: one block of 500
        assert store.reservations == 20 + 1 + 1
    finally:
        uninstall(maker)
        registry.close(release=False)
        store.drop()
        models.base.metadata.drop_all(engine, tables=application_tables(models.base.metadata))
        engine.dispose()


def test_dataclass_mapping_fills_init_false_fields(tmp_path: Any) -> None:
    """With MappedAsDataclass, SequenceField(init=False) attributes are filled on flush."""

    class Base(MappedAsDataclass, DeclarativeBase):
        pass

    class Ticket(Base):
        __tablename__ = "tickets"
        id: Mapped[int] = SequenceField(primary_key=True, init=False)
        serial: Mapped[int] = SequenceField(sequence="serials", start=500, init=False)
        title: Mapped[str] = mapped_column(sa.String(20))

    url = f"sqlite:///{tmp_path / 'dc.db'}"
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    registry = SequenceRegistry(SQLStore(url))
    install(engine, registry=registry)
    try:
        with Session(engine) as session:
            tickets = [Ticket(title="a"), Ticket(title="b")]
            session.add_all(tickets)
            session.commit()
            assert [(t.id, t.serial) for t in tickets] == [(1, 500), (2, 501)]
    finally:
        uninstall(engine)
        registry.close(release=False)
        engine.dispose()


def test_a_registry_that_creates_rows_still_takes_the_fields_settings(tmp_path: Any) -> None:
    """A registry with auto_create=True creates missing rows from the field, not its defaults."""
    url = f"sqlite:///{tmp_path / 'auto.db'}"
    engine = make_engine(url)
    models = make_models()
    models.base.metadata.create_all(engine)
    store = SQLStore(url)
    registry = SequenceRegistry(store, auto_create=True)
    install(engine, registry=registry)
    try:
        with Session(engine) as session:
            session.add(models.order(name="x"))
            session.commit()
        codes = store.read(models.codes_seq)
        assert codes is not None
        assert (codes.step, codes.batch_count) == (10, 500)
    finally:
        uninstall(engine)
        registry.close(release=False)
        engine.dispose()


# a new row starts past the keys already there ----------------------------------------


def test_a_new_row_starts_past_keys_already_in_the_table(setup: Setup) -> None:
    """A table filled before autoseq (or after sys_sequence was lost) continues past max()."""
    with setup.engine.begin() as connection:
        connection.execute(
            sa.insert(setup.models.table),
            [{"id": 7000 + i, "code": 90 + 10 * i, "name": "old"} for i in range(3)],
        )
    with setup.maker.begin() as session:
        session.add(setup.Order(name="new"))
    new = [row for row in setup.rows() if row[2] == "new"]
    assert new == [(7003, 111, "new")]  # codes 90..110 on the 1 + 10k grid: next 111


def test_a_dropped_sequence_table_restarts_past_existing_keys(setup: Setup, db_url: str) -> None:
    """After sys_sequence is dropped, the re-created row is past every key in the table."""
    with setup.maker.begin() as session:
        session.add_all([setup.Order(name="a") for _ in range(5)])
    top = max(row[0] for row in setup.rows())
    setup.registry.close_locks(release=False)
    setup.store.drop()
    with setup.maker.begin() as session:
        session.add(setup.Order(name="after"))
    ids = [row[0] for row in setup.rows()]
    assert len(ids) == len(set(ids)) == 6
    assert max(ids) == top + 1


@pytest.mark.parametrize("bad", [1.5, "abc", True])
def test_insert_values_with_a_non_int_key_is_refused(setup: Setup, bad: Any) -> None:
    """insert().values(id=<not an int>) is refused before the database sees it."""
    with (
        pytest.raises(InvalidSequenceConfig, match="must be an int"),
        setup.engine.begin() as connection,
    ):
        connection.execute(sa.insert(setup.models.table).values(id=bad, name="x"))
    assert setup.rows() == []


def three_names() -> Any:
    """A SELECT of three rows with one ``name`` column, for ``from_select``."""
    rows = [sa.select(sa.literal(name, sa.String(40)).label("name")) for name in "abc"]
    return sa.union_all(*rows)


@pytest.mark.parametrize(("names", "missing"), [(["id", "name"], "code"), (["code", "name"], "id")])
def test_insert_from_select_leaving_a_sequence_column_is_refused(
    setup: Setup, names: list[str], missing: str
) -> None:
    """INSERT ... FROM SELECT that leaves a sequence column to its default is refused, unwritten.

    The default would be evaluated once for the statement, so every row
    would share one value (a key: a misleading duplicate-key error).
    """
    table = setup.models.table
    select = sa.select(sa.literal(7) + sa.func.length(sa.literal("x")), three_names().subquery())
    statement = sa.insert(table).from_select(names, select)
    with (
        pytest.raises(UnsupportedInsert, match=rf"\.{missing}\b.*Name '{missing}'") as caught,
        setup.engine.begin() as connection,
    ):
        connection.execute(statement)
    assert (caught.value.table, caught.value.column) == (table.name, missing)
    with pytest.raises(UnsupportedInsert), setup.maker.begin() as session:
        session.execute(sa.insert(setup.Order).from_select(names, select))
    assert setup.rows() == []


def test_insert_from_select_naming_every_sequence_column_keeps_the_selected_values(
    setup: Setup,
) -> None:
    """A from_select that gives the sequence columns inserts what the SELECT chose."""
    numbered = three_names().subquery()
    select = sa.select(
        sa.func.length(numbered.c.name) + 100, sa.func.length(numbered.c.name) + 200, numbered
    ).where(numbered.c.name == "b")
    with setup.engine.begin() as connection:
        statement = sa.insert(setup.models.table).from_select(["id", "code", "name"], select)
        connection.execute(statement)
    assert setup.rows() == [(101, 201, "b")]
