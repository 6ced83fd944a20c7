"""The store contract on MongoStore, plus what only MongoDB has (sessions, fork)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from mongo_server import CommandLog, MongoServer
from pymongo import monitoring

from autoseq import InvalidSequenceConfig, SequenceConfig, SequenceRegistry, StoreUnavailable
from autoseq.stores import MongoStore
from autoseq.stores.base import Block, release_many, reserve_many
from autoseq.stores.capabilities import ReservesMany
from autoseq.testing.contract import MaintenanceContract, StoreContract

pytestmark = pytest.mark.mongodb


@pytest.fixture
def mongo_store(mongo_server: MongoServer, mongo_db_name: str) -> Iterator[MongoStore]:
    """A MongoStore on a fresh database of the session's server."""
    store = MongoStore(mongo_server.url, database=mongo_db_name)
    yield store
    store.close()


class TestMongoStore(StoreContract):
    @pytest.fixture
    def store(self, mongo_store: MongoStore) -> MongoStore:
        return mongo_store

    @pytest.fixture
    def unavailable_store(self) -> Iterator[MongoStore]:
        store = MongoStore("mongodb://127.0.0.1:1/autoseq_test", timeout=0.5)
        yield store
        store.close()


class TestMongoMaintenance(MaintenanceContract):
    @pytest.fixture
    def store(self, mongo_store: MongoStore) -> MongoStore:
        return mongo_store

    def corrupt(self, store: Any, name: str, **fields: Any) -> None:
        store.collection.update_one({"_id": name}, {"$set": fields})


def test_a_row_without_version_reads_as_zero_and_is_upgraded(mongo_store: MongoStore) -> None:
    """A document written before versions existed reads as version 0; writes add it."""
    mongo_store.create(SequenceConfig("old"))
    mongo_store.collection.update_one({"_id": "old"}, {"$unset": {"version": ""}})
    row = mongo_store.read("old")
    assert row is not None
    assert row.version == 0
    block = mongo_store.reserve("old", 10)
    assert block.version == 1
    assert mongo_store.release(block) is True
    stale = mongo_store.compare_and_set(row.replace(current=500), 0)
    assert stale is None
    assert mongo_store.read("old").current == 1


def test_warm_reservation_is_one_round_trip(mongo_server: MongoServer, mongo_db_name: str) -> None:
    """Once the row is known, each reservation is a single find_one_and_update."""
    counter = CommandLog()
    client = mongo_server.client(event_listeners=[counter.listener])
    store = MongoStore(client[mongo_db_name])
    store.create(SequenceConfig("orders"))
    before = len(counter.commands)
    for _ in range(10):
        store.reserve("orders", 100)
    sent = [name for name, _ in counter.commands[before:]]
    assert sent == ["findAndModify"] * 10
    assert store.read("orders").current == 1001
    client.close()


def test_release_many_is_one_bulk_write(mongo_server: MongoServer, mongo_db_name: str) -> None:
    """Issue 34: handing back 300 blocks is one bulk write, not a findAndModify per block;
    each is still its own compare-and-set (a block reserved past stays a gap), and a
    fresh store continues every row from the tail handed back."""
    counter = CommandLog()
    client = mongo_server.client(event_listeners=[counter.listener])
    store = MongoStore(client[mongo_db_name])
    names = [f"h{i:03d}" for i in range(300)]
    store.create_many([SequenceConfig(name) for name in names])
    blocks = [store.reserve(name, 10) for name in names]
    store.reserve("h007", 5)  # reserved past h007's block
    tails = [Block(block.name, 4, 10, 1, block.row) for block in blocks]
    before = len(counter.commands)
    went = release_many(store, tails)
    sent = [name for name, _ in counter.commands[before:]]
    assert went == [name != "h007" for name in names]
    # h007 refused its update: one read says which went (secantusdb pages it with getMore)
    assert sent[:2] == ["update", "find"]
    assert set(sent[2:]) <= {"getMore"}
    assert release_many(store, tails[:3]) == [False] * 3  # re-sent: no rewind
    before = len(counter.commands)
    assert release_many(store, [store.reserve("h001", 2)]) == [True]
    assert [name for name, _ in counter.commands[before:]][-1:] == ["update"]  # all went
    fresh = MongoStore(client[mongo_db_name])
    assert {fresh.reserve(name, 1).first for name in names if name != "h007"} == {4}
    assert fresh.reserve("h007", 1).first == 16
    client.close()


def test_warm_of_1000_sequences_is_one_bulk_write(
    mongo_server: MongoServer, mongo_db_name: str
) -> None:
    """Issue 34: warm() of 1,000 loaded sequences is one bulk write of compare-and-sets
    (one update command) instead of a findAndModify per sequence on first use, and each
    first value then comes from memory."""
    counter = CommandLog()
    client = mongo_server.client(event_listeners=[counter.listener])
    store = MongoStore(client[mongo_db_name])
    names = [f"w{i:04d}" for i in range(1000)]
    store.create_many([SequenceConfig(name) for name in names])
    registry = SequenceRegistry(MongoStore(client[mongo_db_name]))
    registry.load()  # remembers every row: nothing is read again to plan
    locks = [registry.get(name) for name in names]
    before = len(counter.commands)
    warmed = registry.warm()
    warm = [name for name, _ in counter.commands[before:]]
    before = len(counter.commands)
    assert [lock.next() for lock in locks] == [1] * 1000
    first_values = [name for name, _ in counter.commands[before:]]
    assert (warmed, len(warm), len(first_values)) == (1000, 1, 0)
    assert warm == ["update"]
    assert isinstance(store, ReservesMany)
    # Each first block is sized for the 1,000 sequences warm() starts (the reservation
    # budget: 1,000 / 200 x batch_count), and the row moved past exactly that block.
    assert {lock.stats()["reserved_values"] for lock in locks} == {500}
    assert {store.read(name).current for name in names[:5]} == {501}
    registry.close_locks()
    client.close()


def test_reserve_many_plans_again_rows_another_store_moved(
    mongo_server: MongoServer, mongo_db_name: str
) -> None:
    """Rows another process reserved from since this store read them miss the bulk write's
    compare-and-set: one find says which went, those are planned from the rows it read
    and written by a second bulk write; every row gets reserve()'s block, none overlaps."""
    counter = CommandLog()
    client = mongo_server.client(event_listeners=[counter.listener])
    store = MongoStore(client[mongo_db_name])
    names = [f"m{i:03d}" for i in range(60)]
    store.create_many([SequenceConfig(name) for name in names])
    other = MongoStore(mongo_server.url, database=mongo_db_name)
    taken = {name: other.reserve(name, 10) for name in names[::2]}
    before = len(counter.commands)
    blocks = reserve_many(store, [(name, 5) for name in names])
    sent = [name for name, _ in counter.commands[before:]]
    assert [name for name in sent if name != "getMore"] == ["update", "find", "update"]
    for name, block in zip(names, blocks, strict=True):
        assert block is not None
        first = 11 if name in taken else 1
        assert (block.first, block.last, block.version) == (first, first + 4, block.row.version)
        assert store.read(name).current == first + 5
    assert [other.reserve(name, 1).first for name in names[:2]] == [16, 6]
    other.close()
    client.close()


def test_two_stores_interleave_without_overlap(
    mongo_server: MongoServer, mongo_db_name: str
) -> None:
    """Two stores (two processes' view) each holding a stale row still never overlap."""
    first = MongoStore(mongo_server.url, database=mongo_db_name)
    second = MongoStore(mongo_server.url, database=mongo_db_name)
    first.create(SequenceConfig("shared"))
    second.read("shared")
    values: list[int] = []
    for _ in range(20):
        values += first.reserve("shared", 5).values()
        values += second.reserve("shared", 3).values()
    assert sorted(values) == list(range(1, 20 * 8 + 1))
    first.close()
    second.close()


def test_settings_changed_elsewhere_are_honoured(
    mongo_server: MongoServer, mongo_db_name: str
) -> None:
    """A store whose remembered row predates another store's update() follows the new end."""
    worker = MongoStore(mongo_server.url, database=mongo_db_name)
    admin = MongoStore(mongo_server.url, database=mongo_db_name)
    row = worker.create(SequenceConfig("capped"))
    worker.reserve("capped", 10)
    admin.update(row.replace(current=11, end=15))
    assert list(worker.reserve("capped", 100).values()) == [11, 12, 13, 14, 15]
    worker.close()
    admin.close()


def test_exhausted_row_raised_elsewhere_serves_again(
    mongo_server: MongoServer, mongo_db_name: str
) -> None:
    """An exhausted sequence whose end another store raised serves the new range."""
    worker = MongoStore(mongo_server.url, database=mongo_db_name)
    admin = MongoStore(mongo_server.url, database=mongo_db_name)
    worker.create(SequenceConfig("grow", end=5))
    worker.reserve("grow", 10)
    stored = admin.read("grow")
    admin.update(SequenceConfig("grow", end=100, current=stored.current))
    assert worker.reserve("grow", 2).first == 6
    worker.close()
    admin.close()


def test_reservation_ignores_the_applications_transaction(
    mongo_server: MongoServer, mongo_db_name: str
) -> None:
    """A block reserved while the app's session is bound stays reserved when the app aborts."""
    client = mongo_server.client()
    store = MongoStore(client, database=mongo_db_name)
    store.create(SequenceConfig("tx"))
    client[mongo_db_name]["things"].insert_one({"_id": 0})
    with client.start_session() as session, session.bind():
        session.start_transaction()
        client[mongo_db_name]["things"].insert_one({"_id": 1})
        block = store.reserve("tx", 10)
        session.abort_transaction()
    assert client[mongo_db_name]["things"].count_documents({}) == 1
    assert (block.first, store.read("tx").current) == (1, 11)
    client.close()


def test_driver_errors_become_store_unavailable() -> None:
    """An unreachable server raises StoreUnavailable naming the sequence, cause chained."""
    store = MongoStore(f"mongodb://127.0.0.1:{_closed_port()}/db", timeout=0.5)
    with pytest.raises(StoreUnavailable, match="'orders'") as caught:
        store.reserve("orders", 10)
    assert caught.value.name == "orders"
    assert caught.value.__cause__ is not None
    assert caught.value.operation == "read"  # the row is read before the reservation
    assert caught.value.reason is not None
    assert caught.value.reason.startswith(type(caught.value.__cause__).__name__)
    assert caught.value.reason in str(caught.value)
    store.close()


def test_bad_arguments_are_refused() -> None:
    """A database-less URL, a bad collection name or a wrong type gets InvalidSequenceConfig."""
    with pytest.raises(InvalidSequenceConfig, match="database"):
        MongoStore("mongodb://127.0.0.1:1")
    for bad in ("", "$cmd", "system.users", "a\x00b", ".x", 7):
        with pytest.raises(InvalidSequenceConfig):
            MongoStore("mongodb://127.0.0.1:1/db", collection=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidSequenceConfig, match="MongoClient"):
        MongoStore(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("given", ["url", "client"])
def test_forked_child_opens_its_own_client(
    mongo_server: MongoServer, mongo_db_name: str, given: str
) -> None:
    """After fork the child reserves on a client of its own; parent and child never overlap."""
    client = mongo_server.client()
    source: Any = mongo_server.url if given == "url" else client
    store = MongoStore(source, database=mongo_db_name)
    store.create(SequenceConfig("forked"))
    parent_block = store.reserve("forked", 10)
    parent_client = store.collection.database.client
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            child_block = store.reserve("forked", 10)
            own = store.collection.database.client is not parent_client
            os.write(write_end, f"{child_block.first} {child_block.last} {own}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    first, last, own = os.read(read_end, 100).decode().split()
    os.close(read_end)
    assert status == 0
    assert own == "True"
    assert (int(first), int(last)) == (11, 20)
    assert parent_block.last == 10
    assert store.reserve("forked", 1).first == 21
    store.close()
    client.close()


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_mongo_code_is_imported_only_when_used() -> None:
    """import autoseq, autoseq.stores and the mongoengine CLI plugin load no MongoDB driver."""
    import subprocess
    import sys

    code = (
        "import sys, autoseq, autoseq.stores, autoseq_mongoengine, autoseq_mongoengine.cli\n"
        "print(sorted(m for m in ('pymongo', 'bson', 'mongoengine') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


def test_a_refused_url_leaves_no_client_open() -> None:
    """A URL naming no database is refused without leaving a MongoClient for the GC."""
    import gc
    import warnings

    gc.collect()  # what earlier tests left (a psycopg connection) is not this test's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        with pytest.raises(InvalidSequenceConfig, match="database"):
            MongoStore("mongodb://127.0.0.1:1")
        gc.collect()
    left = [str(w.message) for w in caught if w.category is ResourceWarning]
    assert [text[:40] for text in left if "MongoClient" in text] == []


def test_a_store_used_again_after_close_leaves_no_client_for_the_gc(
    mongo_server: MongoServer, mongo_db_name: str
) -> None:
    """A store used after close() (a prefetch of the shared pool that ran late) reopens
    a client; it is closed with the store, not left to the GC's ResourceWarning (seen
    in a full run, attributed to whichever test was running)."""
    import gc
    import warnings

    store = MongoStore(mongo_server.url, database=mongo_db_name)
    store.create(SequenceConfig("late"))
    store.close()
    assert store.reserve("late", 5).first == 1  # reopens a client
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        del store
        gc.collect()
    assert [str(w.message)[:40] for w in caught if w.category is ResourceWarning] == []


def test_create_many_reads_back_only_the_rows_that_existed(
    mongo_server: MongoServer, mongo_db_name: str
) -> None:
    """create_many sends no find for the rows it inserted (it knows them as MongoDB keeps
    them) and reads the rows that existed in finds of at most 250 names: secantusdb's
    ``$in`` costs the square of its length (3,000 names: 9 s), and 10,000 timed out."""
    sent: list[dict[str, Any]] = []

    class Listener(monitoring.CommandListener):
        def started(self, event: monitoring.CommandStartedEvent) -> None:
            if event.command_name == "find":
                sent.append(event.command)

        def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
            pass

        def failed(self, event: monitoring.CommandFailedEvent) -> None:
            pass

    client = mongo_server.client(event_listeners=[Listener()])
    store = MongoStore(client[mongo_db_name])
    old = [SequenceConfig(f"o{i:03d}", start=7) for i in range(600)]
    first = store.create_many(old)
    assert sent == []
    assert first == [store.read(config.name) for config in old]
    new = [SequenceConfig(f"n{i:03d}") for i in range(300)]
    before = len(sent)
    again = store.create_many([config.replace(start=1) for config in old] + new)
    lists = [command["filter"]["_id"]["$in"] for command in sent[before:]]
    assert sorted(name for names in lists for name in names) == [c.name for c in old]
    assert max(len(names) for names in lists) <= 250
    assert [row.start for row in again] == [7] * 600 + [1] * 300  # the stored rows win
    assert again == [store.read(config.name) for config in [*old, *new]]
    client.close()
