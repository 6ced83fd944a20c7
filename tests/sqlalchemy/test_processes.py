"""The SQLAlchemy integration across processes: the first-use race.

Four fresh interpreters (``spawn``: nothing inherited, everything imported and
created from scratch) start at once on a database where neither the sequence
table nor the row exists, and insert through the ORM. Exactly one row must
come out, with no error and no duplicate key.
"""

from __future__ import annotations

import multiprocessing
import traceback
from typing import Any

import sqlalchemy as sa
from backends import unique_table
from sqlalchemy.orm import DeclarativeBase, Mapped, sessionmaker

from autoseq import SequenceRegistry
from autoseq.sqlalchemy import SequenceField, application_tables, install
from autoseq.stores.sql import SQLStore

PROCESSES = 4
ROWS = 200
SPAWN = multiprocessing.get_context("spawn")


def _insert_on_first_use(
    db_url: str, sys_table: str, table_name: str, barrier: Any, results: Any
) -> None:
    """Runs in a spawned process: declare the model, install, insert at the signal."""
    # (Mapped is imported at module level: annotations are resolved there.)
    try:

        class Base(DeclarativeBase):
            pass

        class Order(Base):
            __tablename__ = table_name
            id: Mapped[int] = SequenceField(primary_key=True, batch_count=50)

        engine = sa.create_engine(
            db_url, connect_args={"timeout": 30} if db_url.startswith("sqlite") else {}
        )
        registry = SequenceRegistry(SQLStore(db_url, table=sys_table))
        maker = sessionmaker(engine)
        install(maker, registry=registry)
        barrier.wait(timeout=120)
        ids: list[int] = []
        with maker() as session:
            for _ in range(ROWS // 50):  # several flushes, some within the others' first use
                orders = [Order() for _ in range(50)]
                session.add_all(orders)
                session.commit()
                ids += [order.id for order in orders]
        registry.close(release=False)
        results.put(("ok", ids))
    except BaseException:
        results.put(("error", traceback.format_exc()))


def test_processes_creating_the_same_sequence_at_once_get_one_row(db_url: str) -> None:
    """Four processes whose first insert creates table and row: one row, no error, no repeat."""
    sys_table, table_name = unique_table("sys"), unique_table("race")
    metadata = sa.MetaData()
    orders = sa.Table(
        table_name,
        metadata,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
    )
    engine = sa.create_engine(db_url)
    metadata.create_all(engine)
    store = SQLStore(db_url, table=sys_table)
    try:
        barrier = SPAWN.Barrier(PROCESSES)
        results = SPAWN.Queue()
        workers = [
            SPAWN.Process(
                target=_insert_on_first_use,
                args=(db_url, sys_table, table_name, barrier, results),
            )
            for _ in range(PROCESSES)
        ]
        for worker in workers:
            worker.start()
        outcomes = [results.get(timeout=240) for _ in workers]
        for worker in workers:
            worker.join(timeout=60)
        errors = [detail for status, detail in outcomes if status == "error"]
        assert errors == []
        ids = [value for _, values in outcomes for value in values]
        assert len(ids) == len(set(ids)) == PROCESSES * ROWS
        rows = store.read_all()
        assert [row.name for row in rows] == [table_name]
        assert rows[0].batch_count == 50
        with engine.connect() as connection:
            stored = connection.execute(sa.select(orders.c.id)).scalars().all()
        assert sorted(stored) == sorted(ids)
    finally:
        store.drop()
        store.close()
        metadata.drop_all(engine, tables=application_tables(metadata))
        engine.dispose()
