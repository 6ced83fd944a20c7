"""A rolled-back gapless number is never reused by its old holder (SQLAlchemy, issue 29).

Each SQL database, through an ORM session and through Core: an object (or
a row of parameters) whose transaction or savepoint rolled back does not
keep the number it was given, so the plain retry of the same code commits
with a fresh one. Counted on what was committed: every row kept, each
numbered column exactly ``1..K`` with no repeat, and the sequence still
serving new rows afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from backends import async_url, drop_sql_store, installed_orm, unique_table
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from autoseq import SequenceRegistry
from autoseq.sqlalchemy import SequenceField, SerialField, application_tables, install, uninstall
from autoseq.stores.sql import SQLStore


class Rollback(Exception):
    """Raised inside a transaction to roll it back."""


@dataclass
class Ledger:
    """A model whose key and two other columns are gapless, none of them unique but the key."""

    engine: sa.Engine
    maker: sessionmaker[Session]
    model: Any

    def new(self, note: str) -> Any:
        return self.model(note=note)

    def committed(self) -> list[tuple[int, str, int, str]]:
        table = self.model.__table__
        with self.engine.connect() as connection:
            query = sa.select(table.c.id, table.c.number, table.c.seq_no, table.c.note)
            return [tuple(row) for row in connection.execute(query.order_by(table.c.id))]

    def save(self, entry: Any) -> None:
        """Add ``entry`` in a new session and commit: the plain code a retry runs again."""
        with self.maker() as session:
            session.add(entry)
            session.commit()

    def retry(self, lost: list[Any], earlier: list[str]) -> None:
        """``lost`` hold no number; B takes the ones given back; ``lost`` retried; all 1..K."""
        assert [(e.id, e.number, e.seq_no) for e in lost] == [(None, None, None)] * len(lost)
        for entry in [self.new("b"), *lost]:
            self.save(entry)
        self.check_gapless([*earlier, "b", *(e.note for e in lost)])

    def check_gapless(self, notes: list[str]) -> None:
        """Every note committed once; id, number and seq_no each exactly 1..K, no repeat."""
        rows = self.committed()
        assert sorted(row[3] for row in rows) == sorted(notes)
        k = len(notes)
        assert [row[0] for row in rows] == list(range(1, k + 1))
        assert sorted(row[1] for row in rows) == [f"INV-{n:05d}" for n in range(1, k + 1)]
        assert sorted(row[2] for row in rows) == list(range(1, k + 1))


@pytest.fixture
def ledger(db_url: str) -> Iterator[Ledger]:
    """A gapless key, a gapless serial and a gapless integer column, installed on a SQLStore."""

    class Base(DeclarativeBase):
        pass

    table = unique_table("ledger")

    class Entry(Base):
        __tablename__ = table
        id: Mapped[int] = SequenceField(primary_key=True, gapless=True)
        number: Mapped[str] = SerialField("INV-{n:05d}", gapless=True)
        seq_no: Mapped[int] = SequenceField(sequence=f"{table}.seq", gapless=True)
        note: Mapped[str] = mapped_column(sa.String(20))

    # expire_on_commit=False: the tests read objects after their session ends.
    with installed_orm(db_url, Base.metadata, expire_on_commit=False) as installed:
        engine, maker, _store, _registry = installed
        yield Ledger(engine, maker, Entry)


def test_a_retry_after_rollback_never_takes_another_writers_number(ledger: Ledger) -> None:
    """A rolls back, B takes the number back, A retries: three rows, numbers 1..3, none lost."""
    ledger.save(ledger.new("first"))
    a = ledger.new("a")
    with ledger.maker() as session:
        session.add(a)
        session.flush()
        assert (a.id, a.number, a.seq_no) == (2, "INV-00002", 2)
        session.rollback()
    ledger.retry([a], earlier=["first"])
    assert (a.id, a.number, a.seq_no) == (3, "INV-00003", 3)


def test_a_flush_that_fails_later_gives_every_pending_object_fresh_numbers(ledger: Ledger) -> None:
    """A flush whose second INSERT fails: the first object's numbers are cleared, retry commits."""
    ledger.save(ledger.new("first"))
    a = ledger.new("a")
    with ledger.maker() as session:
        session.add(a)
        session.add(ledger.model(id=1, note="clash"))  # a key already committed
        with pytest.raises(sa.exc.IntegrityError):
            session.flush()
        session.rollback()
    ledger.retry([a], earlier=["first"])


def test_a_retry_alone_does_not_leave_the_sequence_stuck(ledger: Ledger) -> None:
    """A rolls back and retries with nobody between; the next five inserts all commit."""
    a = ledger.new("a")
    with ledger.maker() as session:
        session.add(a)
        session.commit()
        session.add(b := ledger.new("b"))
        session.flush()
        session.rollback()
    ledger.save(b)
    failed = 0
    for i in range(5):
        try:
            ledger.save(ledger.new(f"new{i}"))
        except sa.exc.IntegrityError:
            failed += 1
    assert failed == 0
    ledger.check_gapless(["a", "b", *(f"new{i}" for i in range(5))])


def test_a_savepoint_rolled_back_gives_its_objects_fresh_numbers(ledger: Ledger) -> None:
    """Objects flushed in a rolled-back begin_nested() are retried in the same transaction."""
    with ledger.maker() as session:
        kept = ledger.new("kept")
        session.add(kept)
        session.flush()
        retried = [ledger.new("r1"), ledger.new("r2")]
        try:
            with session.begin_nested():
                session.add_all(retried)
                session.flush()
                assert [r.id for r in retried] == [2, 3]
                raise Rollback
        except Rollback:
            pass
        assert [(r.id, r.number, r.seq_no) for r in retried] == [(None, None, None)] * 2
        assert kept.id == 1  # the enclosing transaction still holds its number
        session.add(ledger.new("between"))
        session.flush()
        session.add_all(retried)
        session.commit()
    assert [r.id for r in retried] == [3, 4]
    ledger.check_gapless(["kept", "r1", "r2", "between"])


def test_a_released_savepoint_rolled_back_with_its_transaction(ledger: Ledger) -> None:
    """Numbers taken in a savepoint that was released go back with the whole transaction."""
    a, c = ledger.new("a"), ledger.new("c")
    with ledger.maker() as session:
        # Written first so that the transaction has begun (pysqlite would
        # otherwise make the savepoint the transaction, committed on release).
        session.add(c)
        session.flush()
        with session.begin_nested():
            session.add(a)
        assert a.id == 2
        session.rollback()
    ledger.retry([a, c], earlier=[])


def test_a_session_closed_without_commit_gives_its_objects_fresh_numbers(ledger: Ledger) -> None:
    """A flushed session closed without commit: the retry inserts anew, B's row untouched."""
    a = ledger.new("a")
    with ledger.maker() as session:
        session.add(a)
        session.flush()
    a.note = "a2"  # a change to a kept key would have updated B's row
    ledger.retry([a], earlier=[])


def test_an_expunged_object_keeps_its_numbers_when_the_transaction_commits(
    ledger: Ledger,
) -> None:
    """Expunged after its flush, the object's row still commits: it keeps the numbers."""
    a = ledger.new("a")
    with ledger.maker() as session:
        session.add(a)
        session.flush()
        session.expunge(a)
        session.commit()
    assert (a.id, a.number, a.seq_no) == (1, "INV-00001", 1)
    ledger.save(ledger.new("b"))
    ledger.check_gapless(["a", "b"])


def test_an_explicit_value_is_kept_through_a_rollback(ledger: Ledger) -> None:
    """A value the user gave is not autoseq's to clear: it is still there after a rollback."""
    a = ledger.model(note="a", number="MANUAL-1")
    with ledger.maker() as session:
        session.add(a)
        session.flush()
        session.rollback()
    assert a.number == "MANUAL-1"
    assert a.id is None


def test_orm_bulk_and_core_retries_take_fresh_numbers(ledger: Ledger) -> None:
    """The same parameter list inserted again after a rollback gets new numbers, no repeat."""
    table = ledger.model.__table__
    rows = [{"note": "core1"}, {"note": "core2"}]
    with ledger.engine.connect() as connection:
        connection.execute(sa.insert(table), rows)
        connection.rollback()
    with ledger.maker() as session:
        session.execute(sa.insert(ledger.model), [{"note": "bulk1"}])
        session.rollback()
    ledger.save(ledger.new("between"))
    with ledger.engine.begin() as connection:
        connection.execute(sa.insert(table), rows)
    with ledger.maker() as session:
        session.execute(sa.insert(ledger.model), [{"note": "bulk1"}])
        session.commit()
    assert rows == [{"note": "core1"}, {"note": "core2"}]
    ledger.check_gapless(["between", "core1", "core2", "bulk1"])


def test_an_async_session_retry_takes_fresh_numbers(db_url: str) -> None:
    """Under AsyncSession too: a rolled-back object is retried with fresh numbers, B's row kept."""
    pytest.importorskip("sqlalchemy.ext.asyncio")
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    class Base(DeclarativeBase):
        pass

    class Entry(Base):
        __tablename__ = unique_table("ledger")
        id: Mapped[int] = SequenceField(primary_key=True, gapless=True)
        number: Mapped[str] = SerialField("INV-{n:05d}", gapless=True)
        note: Mapped[str] = mapped_column(sa.String(20))

    store = SQLStore(db_url, table=unique_table("sys"))
    registry = SequenceRegistry(store)

    async def main() -> list[tuple[Any, ...]]:
        engine = create_async_engine(async_url(db_url))
        async with engine.begin() as connection:
            await connection.run_sync(Base.metadata.create_all)
        maker = async_sessionmaker(engine, expire_on_commit=False)
        install(maker, registry=registry)
        try:
            a = Entry(note="a")
            async with maker() as session:
                session.add(a)
                await session.flush()
                await session.rollback()
            assert (a.id, a.number) == (None, None)
            for entry in (Entry(note="b"), a):
                async with maker() as session:
                    session.add(entry)
                    await session.commit()
            async with engine.connect() as connection:
                query = sa.select(Entry.id, Entry.number, Entry.note).order_by(Entry.id)
                return [tuple(row) for row in await connection.execute(query)]
        finally:
            uninstall(maker)
            async with engine.begin() as connection:
                await connection.run_sync(
                    Base.metadata.drop_all, tables=application_tables(Base.metadata)
                )
            await engine.dispose()

    try:
        rows = asyncio.run(main())
    finally:
        registry.close(release=False)
        drop_sql_store(store)
    assert rows == [(1, "INV-00001", "b"), (2, "INV-00002", "a")]
