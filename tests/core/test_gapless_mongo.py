"""Gapless serials on MongoDB, inside the caller's session transaction (secantusdb or MongoDB)."""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from mongo_server import MongoServer

from autoseq import GaplessUnavailable, SequenceConfig, Serial
from autoseq.errors import InvalidCount
from autoseq.lock import MAX_MANY
from autoseq.stores import MongoStore
from autoseq.stores.mongo import gapless as gapless_mongo

pytestmark = pytest.mark.mongodb


class Abort(Exception):
    """Raised in a transaction's callback to abort it."""


@pytest.fixture
def db(mongo_server: MongoServer, mongo_db_name: str) -> Iterator[Any]:
    """A database on the session's server, with its own client (sessions belong to it)."""
    client = mongo_server.client()
    yield client[mongo_db_name]
    client.drop_database(mongo_db_name)
    client.close()


def test_an_aborted_transaction_gives_the_number_back(db: Any) -> None:
    """A value taken in an aborted transaction is taken again by the next one."""
    serial = Serial(MongoStore(db), "inv", "M{n:04d}", gapless=True)

    def take(session: Any) -> str:
        return serial.next(session)

    with db.client.start_session() as session:
        assert session.with_transaction(take) == "M0001"
        session.start_transaction()
        assert serial.next(session) == "M0002"
        session.abort_transaction()
        assert session.with_transaction(take) == "M0002"


def test_outside_a_transaction_is_refused(db: Any) -> None:
    """No session, or a session without a transaction: GaplessUnavailable."""
    serial = Serial(MongoStore(db), "r", "R{n}", gapless=True)
    with pytest.raises(GaplessUnavailable, match="inside a transaction"):
        serial.next()
    with db.client.start_session() as session, pytest.raises(GaplessUnavailable):
        serial.next(session)


def test_writers_with_random_aborts_commit_exactly_one_to_k(db: Any) -> None:
    """4 threads, 30% of transactions aborted: the committed serials are exactly 1..K."""
    store = MongoStore(db)
    serial = Serial(store, "g", "G{n:06d}", gapless=True)
    db.create_collection("numbers")
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        rng = random.Random(seed)

        def callback(session: Any) -> None:
            value = serial.next(session)
            db.numbers.insert_one({"_id": value}, session=session)
            if rng.random() < 0.3:
                raise Abort

        try:
            with db.client.start_session() as session:
                for _ in range(12):
                    with contextlib.suppress(Abort):
                        session.with_transaction(callback)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    counters = sorted(int(doc["_id"][1:]) for doc in db.numbers.find())
    assert 0 < len(counters) < 48
    assert counters == list(range(1, len(counters) + 1))


def test_a_count_out_of_bounds_is_refused_before_anything_is_written(db: Any) -> None:
    """next_many(10**12) in a transaction is InvalidCount, and no row is created."""
    store = MongoStore(db)
    serial = Serial(store, "huge", "H{n}", gapless=True)
    with db.client.start_session() as session:
        session.start_transaction()
        with pytest.raises(InvalidCount):
            serial.next_many(10**12, session)
        with pytest.raises(InvalidCount):
            gapless_mongo.take(session, store, SequenceConfig("huge-take"), MAX_MANY + 1)
        session.abort_transaction()
    assert store.read("huge") is None
    assert store.read("huge-take") is None
