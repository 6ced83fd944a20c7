"""Transactions: the caller's transaction rolls back after taking values; nothing repeats.

Each SQL database, through a plain SQLAlchemy connection and through an ORM
session with ``autoseq.sqlalchemy`` installed: rows whose keys were taken
inside a transaction that then rolled back (whole, or to a savepoint) are
gone, and no later key (in this process, or in a restarted one that starts
from what the store committed) ever equals one of theirs.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from backends import unique_table
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Session, mapped_column, sessionmaker

from autoseq import BufferPolicy, SequenceConfig, SequenceRegistry
from autoseq.sqlalchemy import application_tables
from autoseq.stores.sql import store_url

from .harness import HERE, Check, read_values, spawn, tally, value_files

ROUNDS = 4
DJANGO_WORKER = HERE / "django_worker.py"
DJANGO_KILLS = 6
POLICY = BufferPolicy(prefetch_at=0.5)


class Rollback(Exception):
    """Raised to roll the caller's transaction back."""


@pytest.fixture
def app_engine(sql_target: Any) -> Iterator[sa.Engine]:
    """The application's own engine on the same database as the store."""
    engine = sa.create_engine(sql_target.url)
    yield engine
    engine.dispose()


def test_core_connection_rollback_never_repeats(
    sql_target: Any, app_engine: sa.Engine, record_property: Any
) -> None:
    """Keys taken inside a connection's transaction that rolls back never come back."""
    orders = sa.Table(
        unique_table("orders"),
        sa.MetaData(),
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("round", sa.Integer, nullable=False),
    )
    orders.create(app_engine)
    try:
        gone: list[int] = []
        kept: list[int] = []
        for round_no in range(ROUNDS):
            # a fresh registry per round: a restarted process sees only what
            # the store committed, so a reservation undone with the caller's
            # transaction would show as a repeated key
            registry = SequenceRegistry(sql_target.open(), policy=POLICY)
            lock = registry.register(SequenceConfig("orders", batch_count=7))
            with app_engine.connect() as connection:
                transaction = connection.begin()
                first = [lock.next() for _ in range(5)]
                connection.execute(sa.insert(orders), [{"id": i, "round": round_no} for i in first])
                # the application's transaction now holds its write locks (on
                # SQLite, the whole database file): reserve several more blocks
                more = lock.next_many(30) + [lock.next() for _ in range(12)]
                connection.execute(sa.insert(orders), [{"id": i, "round": round_no} for i in more])
                transaction.rollback()
            gone += first + more
            with app_engine.begin() as connection:
                ids = lock.next_many(20)
                connection.execute(sa.insert(orders), [{"id": i, "round": round_no} for i in ids])
                kept += ids
            registry.close()
        with app_engine.connect() as connection:
            stored = list(connection.execute(sa.select(orders.c.id)).scalars())
        assert sorted(stored) == sorted(kept)
        check = Check.of(gone + kept)
        assert check.duplicates == 0, f"repeated keys {check.repeated(gone + kept)}"
        assert not set(gone) & set(stored)
    finally:
        orders.drop(app_engine)
    tally(
        record_property,
        sql_target.id,
        "rollback: connection",
        values=check.values,
        duplicates=0,
        rolled_back=len(gone),
        gaps=check.gaps,
    )


def test_session_rollback_and_savepoint_never_repeat(
    sql_target: Any, app_engine: sa.Engine, record_property: Any
) -> None:
    """ORM session: flushed, bulk-inserted or savepoint rows rolled back: keys never reused."""
    from autoseq.sqlalchemy import SequenceField, install, uninstall

    class Base(DeclarativeBase):
        pass

    order_table = unique_table("orders")
    Order: Any = type(
        "Order",
        (Base,),
        {
            "__tablename__": order_table,
            "id": SequenceField(primary_key=True, batch_count=7),
            "note": mapped_column(sa.String(20), default=""),
        },
    )
    Base.metadata.create_all(app_engine)
    maker = sessionmaker(app_engine)
    gone: list[int] = []
    kept: list[int] = []
    try:
        for _ in range(ROUNDS):
            install(maker, store=sql_target.open(), policy=POLICY)  # a restarted process
            with maker() as session:
                flushed = [Order(note="gone") for _ in range(20)]
                session.add_all(flushed)
                session.flush()
                gone += [o.id for o in flushed]
                session.execute(sa.insert(Order), [{"note": "bulk"} for _ in range(25)])
                gone += list(
                    session.execute(sa.select(Order.id).where(Order.note == "bulk")).scalars()
                )
                session.rollback()
            with maker() as session, session.begin():
                session.add_all([Order(note="kept") for _ in range(9)])
                nested = session.begin_nested()
                doomed = [Order(note="gone") for _ in range(11)]
                session.add_all(doomed)
                session.flush()
                gone += [o.id for o in doomed]
                nested.rollback()
                session.add_all([Order(note="kept") for _ in range(9)])
            with maker() as session:
                kept += list(
                    session.execute(sa.select(Order.id).where(Order.id.not_in(kept))).scalars()
                )
        assert len(kept) == ROUNDS * 18
        assert len(gone) == ROUNDS * (20 + 25 + 11)
        check = Check.of(gone + kept)
        assert check.duplicates == 0, f"repeated keys {check.repeated(gone + kept)}"
    finally:
        uninstall(maker)
        Base.metadata.drop_all(app_engine, tables=application_tables(Base.metadata))
    tally(
        record_property,
        sql_target.id,
        "rollback: orm session",
        values=check.values,
        duplicates=0,
        rolled_back=len(gone),
        gaps=check.gaps,
    )


def test_blocks_are_committed_while_the_callers_transaction_is_open(
    sql_target: Any, app_engine: sa.Engine
) -> None:
    """Each reservation commits on its own, even while the caller holds write locks."""
    scratch = sa.Table(unique_table("scratch"), sa.MetaData(), sa.Column("id", sa.BigInteger))
    scratch.create(app_engine)
    registry = SequenceRegistry(sql_target.open(), policy=BufferPolicy(prefetch=False))
    lock = registry.register(SequenceConfig("independent", batch=False))
    try:
        with Session(app_engine) as session, session.begin():
            values = []
            for _ in range(20):
                values.append(lock.next())
                session.execute(sa.insert(scratch), {"id": values[-1]})  # holds write locks
            seen_elsewhere = sql_target.open().read("independent")
            assert seen_elsewhere is not None
            assert seen_elsewhere.current == 21, "a reservation waited for the caller's commit"
            session.rollback()
        assert values == list(range(1, 21))
        assert lock.next() == 21
    finally:
        registry.close()
        scratch.drop(app_engine)


@contextmanager
def private_database(sql_target: Any, tmp_path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    """A database of its own (Django's sys_sequence has a fixed name): settings and URL."""
    url = make_url(sql_target.url)
    if sql_target.id == "sqlite":
        path = str(tmp_path / "django.sqlite3")
        # Several processes write the application's own file inside atomic():
        # give them longer than Django's 5 s default to take turns on a busy box.
        database = {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": path,
            # BEGIN IMMEDIATE: a deferred transaction that read first cannot wait
            # for the write lock (SQLite answers "database is locked" at once).
            "OPTIONS": {"timeout": 60, "transaction_mode": "IMMEDIATE"},
        }
        yield database, f"sqlite:///{path}"
        return
    name = f"autoseq_rel_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    engine = "postgresql" if sql_target.id == "postgres" else "mysql"
    database = {
        "ENGINE": f"django.db.backends.{engine}",
        "NAME": name,
        "HOST": url.host,
        "PORT": str(url.port or ""),
        "USER": url.username,
        "PASSWORD": url.password or "",
    }
    try:
        yield database, url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            if sql_target.id == "postgres":
                connection.exec_driver_sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
                )
            connection.exec_driver_sql(f"DROP DATABASE {name}")
        admin.dispose()


def test_django_atomic_rollback_and_kill_never_repeat(
    sql_target: Any, tmp_path: Path, record_property: Any
) -> None:
    """Django processes save rows in atomic() that rolls back or is SIGKILLed: keys never repeat."""
    rng = random.Random()
    out = tmp_path / "values"
    out.mkdir()
    stop = tmp_path / "stop"
    with private_database(sql_target, tmp_path) as (database, url):
        job: dict[str, Any] = {"database": database, "table": "tickets", "stop": str(stop)}
        creator = spawn({**job, "create": True, "out": ""}, DJANGO_WORKER)
        assert creator.process.wait(timeout=60) == 0, creator.stderr()
        started = 0

        def start() -> Any:
            nonlocal started
            started += 1
            return spawn({**job, "out": str(out / f"d{started}.t0")}, DJANGO_WORKER)

        pool = [start(), start()]
        kills = mid_atomic = 0
        for kill in range(DJANGO_KILLS):
            slot = rng.randrange(len(pool))
            if kill % 2:
                mid_atomic += pool[slot].wait_for("in-atomic", timeout=10.0)
            else:
                time.sleep(rng.uniform(0.2, 0.8))
            assert pool[slot].process.poll() is None, pool[slot].stderr()
            pool[slot].kill()
            kills += 1
            pool[slot] = start()
        time.sleep(1.0)
        stop.touch()
        for worker in pool:
            assert worker.process.wait(timeout=60) == 0, worker.stderr()
        values = [v for vs in read_values(value_files(out)).values() for v in vs]
        check = Check.of(values)
        assert check.duplicates == 0, f"repeated keys {check.repeated(values)}"
        engine = sa.create_engine(url)
        with engine.connect() as connection:
            committed = list(connection.exec_driver_sql("SELECT id FROM tickets").scalars())
        engine.dispose()
        store_engine = sa.create_engine(store_url(make_url(url))[0])
        with store_engine.connect() as connection:
            current = connection.exec_driver_sql(
                "SELECT current FROM sys_sequence WHERE name = 'tickets'"
            ).scalar_one()
        store_engine.dispose()
        assert check.values >= 13, "the workers never got through one atomic block"
        assert set(committed) <= set(values)
        assert current > check.highest
    tally(
        record_property,
        sql_target.id,
        "django atomic + kill",
        values=check.values,
        duplicates=0,
        gaps=check.gaps,
        committed=len(committed),
        kills=kills,
        kills_mid_atomic=mid_atomic,
    )
