"""MongoDB: majority write and read concern for sequences and leases, doctor, failover noticed.

secantusdb is a single node that answers ``hello`` as the primary of a
one-member replica set (``setName``, ``electionId``, ``setVersion``); no
election can happen on it. So the failover check is proven here against
pymongo's own ``ServerDescription`` built from two ``hello`` replies (the
objects pymongo's monitor builds after an election); a real election on
a real replica set is not tried.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from bson import ObjectId
from pymongo.hello import Hello
from pymongo.server_description import ServerDescription

from autoseq import SequenceConfig, doctor
from autoseq.errors import InvalidSequenceConfig, StoreUnavailable
from autoseq.stores.base import reserve_many
from autoseq.stores.mongo import MongoStore, PrimaryWatch
from autoseq.stores.mongo.workers import MongoWorkers

pytestmark = pytest.mark.mongodb


@pytest.fixture
def url(mongo_server: Any, mongo_db_name: str) -> str:
    """The test's database on the session's MongoDB server."""
    return f"{mongo_server.url.rstrip('/')}/{mongo_db_name}"


@pytest.fixture
def store(url: str) -> Iterator[MongoStore]:
    """A store with the default durability."""
    made = MongoStore(url)
    yield made
    made.close()


def replication(store: MongoStore) -> list[tuple[str, str]]:
    """The ``replication`` findings of a doctor run on ``store``."""
    report = doctor.examine(store)
    return [(f.level, f.message) for f in report.findings if f.check == "replication"]


def test_sequence_and_lease_writes_wait_for_a_majority_and_read_majority(
    store: MongoStore,
) -> None:
    """By default rows and leases are written w:majority and read at read concern majority."""
    store.create(SequenceConfig("orders"))
    assert store.reserve("orders", 10).first == 1
    leases = MongoWorkers(store).collection
    for collection in (store.collection, leases):
        assert collection.write_concern.document == {"w": "majority"}
        assert collection.read_concern.level == "majority"


def test_write_and_read_concern_are_settings(url: str) -> None:
    """MongoStore(write_concern=1, read_concern='local') writes and reads with those."""
    store = MongoStore(url, write_concern=1, read_concern="local")
    try:
        store.create(SequenceConfig("orders"))
        assert store.reserve("orders", 5).last == 5
        assert store.collection.write_concern.document == {"w": 1}
        assert store.collection.read_concern.level == "local"
    finally:
        store.close()


@pytest.mark.parametrize(
    ("setting", "value"),
    [("write_concern", 0), ("write_concern", "all"), ("read_concern", "snapshot")],
)
def test_unknown_concerns_are_refused(setting: str, value: object) -> None:
    """w:0 (unacknowledged) or an unknown level: InvalidSequenceConfig naming the choices."""
    with pytest.raises(InvalidSequenceConfig, match=setting):
        MongoStore("mongodb://127.0.0.1:1/x", **{setting: value})


def test_doctor_says_w1_on_a_replica_set_can_repeat_values(url: str, store: MongoStore) -> None:
    """Replica set with w:1: doctor says error and names write_concern='majority'; default ok."""
    weak = MongoStore(url, write_concern=1, read_concern="local")
    try:
        findings = replication(weak)
    finally:
        weak.close()
    assert [level for level, _ in findings] == ["error", "warning"]
    assert "w:1" in findings[0][1]
    assert "write_concern='majority'" in findings[0][1]
    assert "read_concern='majority'" in findings[1][1]
    ((level, message),) = replication(store)
    assert level == "ok"
    assert "w:majority" in message


def test_the_primary_election_is_read_without_a_round_trip(store: MongoStore) -> None:
    """A reservation notes the primary's (set, electionId, setVersion) from pymongo's topology."""
    store.create(SequenceConfig("orders"))
    block = store.reserve("orders", 10)
    hello = store.collection.database.client.admin.command("hello")
    assert not block.failover
    assert store.primary.identity == (hello["setName"], hello["electionId"], hello["setVersion"])


def _primary(election: str, version: int = 1) -> ServerDescription:
    reply = {
        "ok": 1,
        "isWritablePrimary": True,
        "setName": "rs0",
        "hosts": ["db1:27017", "db2:27017"],
        "setVersion": version,
        "electionId": ObjectId(election),
        "maxWireVersion": 21,
    }
    return ServerDescription(("db1", 27017), Hello(reply))


def test_a_new_election_id_is_a_failover() -> None:
    """Another electionId (or setVersion) on the set's primary is noticed once; the same is not."""
    watch = PrimaryWatch()
    first = "7fffffff0000000000000001"
    assert watch.note([_primary(first)]) is False
    assert watch.note([_primary(first)]) is False
    assert watch.note([_primary("7fffffff0000000000000002")]) is True
    assert watch.note([_primary("7fffffff0000000000000002")]) is False
    assert watch.note([_primary("7fffffff0000000000000002", version=2)]) is True


def test_reserve_many_writes_at_the_stores_write_concern(url: str, mongo_server: Any) -> None:
    """reserve_many's bulk write asks for w:majority, as reserve's findAndModify does: a
    block is used only once a failover cannot roll it back."""
    from pymongo import monitoring

    sent: list[tuple[str, Any]] = []

    class Listener(monitoring.CommandListener):
        def started(self, event: monitoring.CommandStartedEvent) -> None:
            sent.append((event.command_name, event.command.get("writeConcern")))

        def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
            pass

        def failed(self, event: monitoring.CommandFailedEvent) -> None:
            pass

    client = mongo_server.client(event_listeners=[Listener()])
    store = MongoStore(client[url.rsplit("/", 1)[1]])
    try:
        store.create_many([SequenceConfig("a"), SequenceConfig("b")])
        store.reserve("a", 10)
        assert [block.first for block in reserve_many(store, [("a", 5), ("b", 5)])] == [11, 1]
    finally:
        client.close()
    writes = [(name, concern) for name, concern in sent if name in ("findAndModify", "update")]
    assert writes == [("findAndModify", {"w": "majority"}), ("update", {"w": "majority"})]


def test_reserve_many_serves_nothing_its_write_concern_did_not_confirm(
    url: str, store: MongoStore
) -> None:
    """A write concern the server cannot satisfy (w:3 on one node): the rows are written,
    but reserve_many raises StoreUnavailable and hands no block out, as reserve does; the
    values written are skipped, never served."""
    store.create_many([SequenceConfig("a"), SequenceConfig("b")])
    weak = MongoStore(url, write_concern=3)
    try:
        weak.read_all()
        with pytest.raises(StoreUnavailable, match="reserving from 2 sequence"):
            reserve_many(weak, [("a", 10), ("b", 10)])
        with pytest.raises(StoreUnavailable, match="reserving from sequence 'a'"):
            weak.reserve("a", 10)
    finally:
        weak.close()
    assert [store.read(name).current for name in ("a", "b")] == [21, 11]


def test_reserve_many_marks_its_blocks_after_a_new_primary(
    store: MongoStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks reserve_many made on a primary other than before say failover (the locks drop
    what they buffered), as reserve's do."""
    store.create_many([SequenceConfig("a"), SequenceConfig("b")])
    assert [block.failover for block in reserve_many(store, [("a", 5), ("b", 5)])] == [False] * 2
    monkeypatch.setattr(store.primary, "observe", lambda client: True)
    blocks = reserve_many(store, [("a", 5), ("b", 5)])
    assert [(block.first, block.failover) for block in blocks] == [(6, True), (6, True)]
