"""SnowflakeField on SQLite (file), PostgreSQL and MariaDB: every insert path gets an id."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from backends import unique_table
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from autoseq import InvalidSequenceConfig
from autoseq.snowflake import Snowflake
from autoseq.sqlalchemy import (
    SnowflakeField,
    application_tables,
    close_snowflakes,
    install,
    uninstall,
)
from autoseq.stores.sql import SQLStore
from autoseq.stores.sql.workers import SQLWorkers


@dataclass
class World:
    engine: sa.Engine
    store: SQLStore
    model: Any
    table: sa.Table


@pytest.fixture
def world(db_url: str) -> Iterator[World]:
    """A model keyed by SnowflakeField on tables of the test's own, installed on the engine."""

    class Base(DeclarativeBase):
        pass

    class Event(Base):
        __tablename__ = unique_table("event")
        id: Mapped[int] = SnowflakeField(primary_key=True)
        label: Mapped[str] = mapped_column(sa.String(40))

    engine = sa.create_engine(db_url)
    Base.metadata.create_all(engine)
    store = SQLStore(db_url, table=unique_table("seq"))
    install(engine, store=store)
    yield World(engine, store, Event, Event.__table__)  # type: ignore[arg-type]
    close_snowflakes()
    uninstall(engine)
    Base.metadata.drop_all(engine, tables=application_tables(Base.metadata))
    SQLWorkers(store).drop_table()
    store.close()
    engine.dispose()


def ids_of(world: World) -> list[int]:
    with world.engine.connect() as connection:
        return [row[0] for row in connection.execute(sa.select(world.table.c.id))]


def test_every_insert_path_gets_an_id(world: World) -> None:
    """Flush, ORM bulk, Core executemany and multi-row VALUES all get distinct snowflake ids."""
    Event = world.model
    with Session(world.engine) as session:
        session.add_all([Event(label=f"add{i}") for i in range(20)])
        session.flush()
        session.execute(sa.insert(Event), [{"label": f"bulk{i}"} for i in range(30)])
        session.commit()
    with world.engine.begin() as connection:
        connection.execute(sa.insert(world.table), [{"label": f"core{i}"} for i in range(30)])
        connection.execute(sa.insert(world.table).values([{"label": "mv1"}, {"label": "mv2"}]))
        connection.execute(sa.insert(world.table).values(label="one"))
    ids = ids_of(world)
    assert len(ids) == 83
    assert len(set(ids)) == 83
    assert all(0 < v < 2**63 for v in ids)
    (lease,) = SQLWorkers(world.store).list_workers("default")
    assert {(v >> 12) & 1023 for v in ids} == {lease.worker}


def test_explicit_value_is_kept(world: World) -> None:
    """An id the user gives is stored as given."""
    with Session(world.engine) as session:
        session.add(world.model(id=42, label="given"))
        session.commit()
    assert ids_of(world) == [42]


def test_an_explicit_id_that_is_not_an_int_is_refused_on_every_path(world: World) -> None:
    """A str id is refused before it reaches the database: flush, ORM bulk, Core."""
    Event = world.model
    with Session(world.engine) as session:
        session.add(Event(id="abc", label="flush"))
        with pytest.raises(InvalidSequenceConfig, match="must be an int"):
            session.flush()
    refused = pytest.raises(InvalidSequenceConfig, match="must be an int")
    with Session(world.engine) as session, refused:
        session.execute(sa.insert(Event), [{"id": "abc", "label": "bulk"}, {"label": "x"}])
    refused = pytest.raises(InvalidSequenceConfig, match="must be an int")
    with world.engine.begin() as connection, refused:
        connection.execute(sa.insert(world.table), [{"id": 1.5, "label": "core"}])
    assert ids_of(world) == []


def test_a_given_generator_is_used(world: World) -> None:
    """SnowflakeField(generator) takes its ids from that generator's layout and worker."""

    class Base(DeclarativeBase):
        pass

    with Snowflake(world.store, name="own", worker_bits=4, sequence_bits=8) as gen:

        class Thing(Base):
            __tablename__ = unique_table("thing")
            id: Mapped[int] = SnowflakeField(gen, primary_key=True)

        Base.metadata.create_all(world.engine)
        try:
            with Session(world.engine) as session:
                session.add_all([Thing() for _ in range(5)])
                session.commit()
                ids = session.scalars(sa.select(Thing.id)).all()
            assert {gen.decode(v).worker for v in ids} == {gen.worker_id}
        finally:
            Base.metadata.drop_all(world.engine, tables=application_tables(Base.metadata))


def test_reserved_arguments_are_refused() -> None:
    """A default of one's own on a snowflake column is refused with what to do."""
    with pytest.raises(InvalidSequenceConfig, match="remove the argument"):
        SnowflakeField(default=5)


def test_include_worker_table_keeps_alembic_from_dropping_the_leases(world: World) -> None:
    """Alembic proposes dropping the lease table unless include_worker_table declares it."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from autoseq.sqlalchemy import include_worker_table

    with Session(world.engine) as session:
        session.add(world.model(label="makes the lease table"))
        session.commit()
    leases = SQLWorkers(world.store)
    metadata = sa.MetaData()
    world.table.to_metadata(metadata)

    def dropped() -> list[str]:
        with world.engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), metadata)
        return [d[1].name for d in diff if isinstance(d, tuple) and d[0] == "remove_table"]

    # SQLite keeps the leases in the companion file, out of Alembic's sight
    beside = world.store.engine.url == world.engine.url
    assert (leases.table.name in dropped()) is beside
    declared = include_worker_table(metadata, leases.table.name)
    assert include_worker_table(metadata, leases.table.name) is declared
    assert leases.table.name not in dropped()
