"""SQLAlchemy ``SerialField``: every insert path, explicit values, gapless at flush, parse."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from backends import installed_orm, unique_table
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from autoseq import GaplessUnavailable, InvalidSequenceConfig, SequenceRegistry
from autoseq.sqlalchemy import (
    SequenceField,
    SerialField,
    application_tables,
    install,
    serial_column,
    uninstall,
)
from autoseq.stores import MemoryStore
from autoseq.stores.sql import SQLStore

TODAY = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def clock() -> datetime:
    return TODAY


@dataclass
class Setup:
    engine: sa.Engine
    maker: sessionmaker[Session]
    order: Any
    invoice: Any
    store: SQLStore

    def numbers(self, model: Any) -> list[str]:
        with self.engine.connect() as connection:
            return list(connection.execute(sa.select(model.__table__.c.number)).scalars())


@pytest.fixture
def setup(db_url: str) -> Iterator[Setup]:
    """Order (daily serial) and Invoice (gapless yearly serial) models, installed on a store."""

    class Base(DeclarativeBase):
        pass

    class Order(Base):
        __tablename__ = unique_table("orders")
        id: Mapped[int] = SequenceField(primary_key=True)
        number: Mapped[str] = SerialField(
            "ORD-{date:%Y%m%d}-{n:05d}", period="day", clock=clock, batch_count=10, unique=True
        )
        name: Mapped[str] = mapped_column(sa.String(20), default="")

    class Invoice(Base):
        __tablename__ = unique_table("invoices")
        id: Mapped[int] = SequenceField(primary_key=True)
        number: Mapped[str] = SerialField(
            "INV-{date:%Y}-{n:06d}", period="year", gapless=True, clock=clock, unique=True
        )

    with installed_orm(db_url, Base.metadata) as (engine, maker, store, _registry):
        yield Setup(engine, maker, Order, Invoice, store)


def test_the_column_is_a_string_as_long_as_the_longest_serial(setup: Setup) -> None:
    """SerialField makes a VARCHAR sized to its template."""
    column = setup.order.__table__.c.number
    assert isinstance(column.type, sa.String)
    assert column.type.length == len("ORD-20261124-00001")


def test_add_and_flush_takes_serials_in_order(setup: Setup) -> None:
    """session.add_all + flush gives each new object the next serial of today."""
    with setup.maker() as session:
        orders = [setup.order(name=str(i)) for i in range(3)]
        session.add_all(orders)
        session.commit()
        assert [o.number for o in orders] == [f"ORD-20261124-0000{i}" for i in (1, 2, 3)]


def test_every_insert_path_gets_a_serial(setup: Setup) -> None:
    """Flush, ORM bulk, Core executemany and Core single insert all fill the serial."""
    table = setup.order.__table__
    with setup.maker() as session:
        session.add(setup.order(name="flush"))
        session.flush()
        session.execute(sa.insert(setup.order), [{"name": "orm-bulk"} for _ in range(3)])
        session.commit()
    with setup.engine.begin() as connection:
        connection.execute(sa.insert(table), [{"name": "core-many"} for _ in range(3)])
        connection.execute(sa.insert(table).values(name="core-one"))
    numbers = sorted(setup.numbers(setup.order))
    assert numbers == [f"ORD-20261124-{n:05d}" for n in range(1, 9)]


def test_an_explicit_serial_is_kept(setup: Setup) -> None:
    """A serial the user set is stored as given; a non-str is refused."""
    with setup.maker() as session:
        session.add(setup.order(number="LEGACY-1"))
        session.commit()
    with setup.engine.begin() as connection:
        connection.execute(sa.insert(setup.order.__table__), [{"number": "LEGACY-2"}])
    assert sorted(setup.numbers(setup.order)) == ["LEGACY-1", "LEGACY-2"]
    with setup.maker() as session:
        session.add(setup.order(number=42))
        with pytest.raises(InvalidSequenceConfig, match="must be a str"):
            session.flush()


def test_gapless_field_gives_a_rolled_back_number_back(setup: Setup) -> None:
    """A gapless invoice number taken in a rolled-back flush is taken again by the next one."""
    with setup.maker() as session:
        session.add(setup.invoice())
        session.commit()
    with setup.maker() as session:
        invoice = setup.invoice()
        session.add(invoice)
        session.flush()
        assert invoice.number == "INV-2026-000002"
        session.rollback()
    with setup.maker() as session:
        session.add_all([setup.invoice(), setup.invoice()])
        session.execute(sa.insert(setup.invoice), [{}, {}])
        session.commit()
    with setup.engine.begin() as connection:
        connection.execute(sa.insert(setup.invoice.__table__), [{}, {}])
        connection.execute(sa.insert(setup.invoice.__table__).values(id=10**9))
    assert sorted(setup.numbers(setup.invoice)) == [f"INV-2026-{n:06d}" for n in range(1, 9)]


def test_first_gapless_take_after_a_write_in_the_same_transaction(setup: Setup) -> None:
    """A gapless serial first used after the transaction wrote (SQLite: holds the file lock)."""
    with setup.maker() as session:
        session.add(setup.order())
        session.flush()
        invoice = setup.invoice()
        session.add(invoice)
        session.commit()
        assert invoice.number == "INV-2026-000001"


def test_gapless_field_in_autocommit_is_refused(setup: Setup) -> None:
    """A Core insert on an AUTOCOMMIT connection cannot take a gapless number."""
    auto = setup.engine.execution_options(isolation_level="AUTOCOMMIT")
    # Raised from the column default, SQLAlchemy wraps it in a StatementError.
    refused = (GaplessUnavailable, sa.exc.StatementError)
    with auto.connect() as connection, pytest.raises(refused, match="AUTOCOMMIT"):
        connection.execute(sa.insert(setup.invoice.__table__), [{}])
    assert setup.numbers(setup.invoice) == []


@pytest.mark.parametrize(
    "kind",
    [
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("mongodb", marks=pytest.mark.mongodb),
    ],
)
def test_serial_columns_on_any_store(kind: str, tmp_path: Any, request: Any) -> None:
    """serial_column on Memory, Redis and Mongo stores: every Core path, unique serials."""
    from core.test_serial import _redis_store

    if kind == "memory":
        store: Any = MemoryStore()
    elif kind == "redis":
        store = _redis_store()
    else:
        from autoseq.stores import MongoStore

        server = request.getfixturevalue("mongo_server")
        store = MongoStore(server.url, database=request.getfixturevalue("mongo_db_name"))
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'core.db'}")
    metadata = sa.MetaData()
    table = sa.Table(
        "tickets",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        serial_column("code", "T-{date:%Y%m}-{n:04d}", sequence="tickets", period="month"),
    )
    metadata.create_all(engine)
    install(engine, registry=SequenceRegistry(store))
    try:
        with engine.begin() as connection:
            connection.execute(sa.insert(table), [{"id": i} for i in range(1, 4)])
            connection.execute(sa.insert(table).values(id=4))
        with Session(engine) as session:
            session.execute(sa.insert(table), [{"id": 5}, {"id": 6}])
            session.commit()
        with engine.connect() as connection:
            codes = list(connection.execute(sa.select(table.c.code)).scalars())
    finally:
        uninstall(engine)
        engine.dispose()
        if kind == "redis":
            store.drop()
        store.close()
    assert len(codes) == len(set(codes)) == 6
    assert all(code.startswith("T-") and len(code) == len("T-202611-0001") for code in codes)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"template": "X{date:%Y}{n}"}, "period is None"),
        ({"template": "X{n}", "default": "x"}, "sets default itself"),
        ({"template": "X{n}", "sequence": ""}, "non-empty"),
    ],
)
def test_bad_declarations_fail_where_the_field_is_declared(
    kwargs: dict[str, Any], message: str
) -> None:
    """Templates and arguments that cannot work raise InvalidSequenceConfig at declaration."""
    with pytest.raises(InvalidSequenceConfig, match=message):
        SerialField(**kwargs)


def test_two_gapless_serials_in_one_flush_lock_in_name_order(db_url: str) -> None:
    """Writers adding two gapless serials in opposite orders never deadlock: locks go by name."""
    import threading
    import time

    def slow_clock() -> datetime:
        time.sleep(0.05)  # widens the window between the two row locks
        return TODAY

    class Base(DeclarativeBase):
        pass

    class Alpha(Base):
        __tablename__ = unique_table("alpha")
        id: Mapped[int] = SequenceField(primary_key=True)
        number: Mapped[str] = SerialField("A{n:05d}", sequence="lock-a", gapless=True)

    class Beta(Base):
        __tablename__ = unique_table("beta")
        id: Mapped[int] = SequenceField(primary_key=True)
        number: Mapped[str] = SerialField(
            "B{date:%Y}{n:05d}", sequence="lock-b", period="year", gapless=True, clock=slow_clock
        )

    engine = sa.create_engine(db_url, connect_args={"timeout": 30} if "sqlite" in db_url else {})
    Base.metadata.create_all(engine)
    store = SQLStore(db_url, table=unique_table("sys"))
    maker = sessionmaker(engine)
    install(maker, registry=SequenceRegistry(store))
    errors: list[BaseException] = []

    def writer(models: tuple[Any, Any]) -> None:
        try:
            for _ in range(4):
                with maker() as session:
                    session.add_all([models[0](), models[1]()])
                    session.commit()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=writer, args=((Beta, Alpha),)),
        threading.Thread(target=writer, args=((Alpha, Beta),)),
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        with engine.connect() as connection:
            alphas = sorted(connection.execute(sa.select(Alpha.__table__.c.number)).scalars())
        assert alphas == [f"A{n:05d}" for n in range(1, 9)]
    finally:
        uninstall(maker)
        store.drop()
        store.close()
        Base.metadata.drop_all(engine, tables=application_tables(Base.metadata))
        engine.dispose()


def test_gapless_sequence_field_is_an_integer_key_given_back_on_rollback(db_url: str) -> None:
    """SequenceField(gapless=True): integer keys in the caller's transaction, 1..K committed."""

    class Base(DeclarativeBase):
        pass

    class Voucher(Base):
        __tablename__ = unique_table("vouchers")
        id: Mapped[int] = SequenceField(primary_key=True, gapless=True)
        note: Mapped[str] = mapped_column(sa.String(10), default="")

    engine = sa.create_engine(db_url, connect_args={"timeout": 30} if "sqlite" in db_url else {})
    Base.metadata.create_all(engine)
    store = SQLStore(db_url, table=unique_table("sys"))
    maker = sessionmaker(engine)
    install(maker, registry=SequenceRegistry(store))
    install(engine, registry=SequenceRegistry(store))
    table = Voucher.__table__
    try:
        with maker() as session:
            session.add_all([Voucher(), Voucher()])
            session.commit()
        with maker() as session:
            session.add(Voucher())
            session.flush()
            session.rollback()
        with maker() as session:
            session.execute(sa.insert(Voucher), [{"note": "bulk"}, {"note": "bulk"}])
            session.add(Voucher(id=10**6))  # explicit: kept
            session.commit()
        with engine.begin() as connection:
            connection.execute(sa.insert(table), [{"note": "core"}])
            ids = sorted(connection.execute(sa.select(table.c.id)).scalars())
        assert ids == [1, 2, 3, 4, 5, 10**6]
        assert isinstance(table.c.id.type, sa.BigInteger)
    finally:
        uninstall(maker)
        uninstall(engine)
        store.drop()
        store.close()
        Base.metadata.drop_all(engine, tables=application_tables(Base.metadata))
        engine.dispose()


def test_gapless_sequence_field_starts_past_keys_already_stored(db_url: str) -> None:
    """A gapless key whose row is created for a table with rows starts past its max()."""

    class Base(DeclarativeBase):
        pass

    class Ticket(Base):
        __tablename__ = unique_table("tickets")
        id: Mapped[int] = SequenceField(primary_key=True, gapless=True)

    engine = sa.create_engine(db_url, connect_args={"timeout": 30} if "sqlite" in db_url else {})
    Base.metadata.create_all(engine)
    store = SQLStore(db_url, table=unique_table("sys"))
    maker = sessionmaker(engine)
    install(maker, registry=SequenceRegistry(store))
    try:
        with maker() as session:
            session.add_all([Ticket(id=7), Ticket(id=41)])  # explicit keys, no row yet
            session.commit()
        with maker() as session:
            ticket = Ticket()
            session.add(ticket)
            session.commit()
            assert ticket.id == 42
    finally:
        uninstall(maker)
        store.drop()
        store.close()
        Base.metadata.drop_all(engine, tables=application_tables(Base.metadata))
        engine.dispose()


def test_gapless_sequence_field_refuses_end_and_cycle() -> None:
    """end and cycle have no gapless meaning: refused with InvalidSequenceConfig."""
    with pytest.raises(InvalidSequenceConfig, match="start and step only"):
        SequenceField(gapless=True, end=99)


def test_a_callable_bound_value_is_not_checked_as_an_explicit_serial(setup: Setup) -> None:
    """values(number=bindparam(callable_=...)) inserts what the callable gives, unchecked."""
    table = setup.order.__table__
    # The callable is what SQLAlchemy sends; the placeholder value never reaches the database.
    given = sa.bindparam("given", 0, callable_=lambda: "LATE-1", type_=sa.String)
    with setup.engine.begin() as connection:
        connection.execute(sa.insert(table), [{"name": "first"}])
        connection.execute(sa.insert(table).values(number=given, name="late"))
    assert sorted(setup.numbers(setup.order)) == ["LATE-1", "ORD-20261124-00001"]


def test_core_executemany_mixing_given_and_missing_serials_on_a_fresh_engine(
    setup: Setup,
) -> None:
    """The first Core executemany on an installed engine fills the rows that lack a serial."""
    table = setup.order.__table__
    rows = [{"number": "KEPT-1", "name": "a"}, {"name": "b"}]
    with setup.engine.begin() as connection:
        connection.execute(sa.insert(table), rows)
    assert sorted(setup.numbers(setup.order)) == ["KEPT-1", "ORD-20261124-00001"]


def test_core_executemany_copies_only_the_rows_lacking_a_serial(setup: Setup) -> None:
    """Rows that carry their values reach the database as the caller's own dicts."""
    table = setup.order.__table__
    seen: list[Any] = []

    def spy(conn: Any, statement: Any, multiparams: Any, params: Any, options: Any) -> Any:
        seen.extend(multiparams)
        return statement, multiparams, params

    rows = [
        {"id": 10**9 + 1, "number": "KEPT-1", "name": "a"},
        {"name": "b"},
        {"id": 10**9 + 2, "number": "KEPT-2", "name": "c"},
    ]
    with setup.engine.begin() as connection:
        connection.execute(sa.insert(table), [{"name": "first"}])
    sa.event.listen(setup.engine, "before_execute", spy, retval=True)  # after autoseq's
    try:
        with setup.engine.begin() as connection:
            connection.execute(sa.insert(table), rows)
    finally:
        sa.event.remove(setup.engine, "before_execute", spy)
    assert [seen[0] is rows[0], seen[1] is rows[1], seen[2] is rows[2]] == [True, False, True]
    assert rows[1] == {"name": "b"}  # the caller's dict is never written to
    assert seen[1]["number"] == "ORD-20261124-00002"
    numbers = sorted(setup.numbers(setup.order))
    assert numbers == ["KEPT-1", "KEPT-2", "ORD-20261124-00001", "ORD-20261124-00002"]


def test_orm_bulk_insert_leaves_the_callers_dicts_alone(setup: Setup) -> None:
    """The same list bulk-inserted twice gets new serials each time and is never written to."""
    rows = [{"name": "x"}, {"name": "y", "number": "KEPT-3"}, {"name": "z"}]
    with setup.maker() as session:
        session.execute(sa.insert(setup.order), rows)
        session.execute(sa.insert(setup.order), rows[:1] + rows[2:])
        session.commit()
    assert rows == [{"name": "x"}, {"name": "y", "number": "KEPT-3"}, {"name": "z"}]
    assert sorted(setup.numbers(setup.order)) == ["KEPT-3"] + [
        f"ORD-20261124-{n:05d}" for n in range(1, 5)
    ]
