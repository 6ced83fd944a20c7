"""autoseq_mongoengine.SequenceField as a true drop-in, on secantusdb and on mongomock.

What a user switching from mongoengine's own field relies on: a partly
loaded document keeps its stored values, a dropped database or sequence
collection is met by re-creating the row past the documents, every
``pre_save`` receiver sees the key, a counters collection shared with the
builtin works, and a new document is inserted, not upserted.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import mongoengine as me
import pytest
from mongo_server import ME_SERVERS, me_db_on
from mongoengine import signals

from autoseq_mongoengine import SequenceField, adopt, sequences


@pytest.fixture(params=ME_SERVERS)
def me_any(request: pytest.FixtureRequest) -> Iterator[Any]:
    """mongoengine's default alias on a fresh database of a real server, then of mongomock."""
    yield from me_db_on(request)


class Slip(me.Document):
    id = SequenceField(primary_key=True)
    serial = SequenceField(sequence_name="slip_serials")
    title = me.StringField()


class Counted(me.Document):
    id = SequenceField(primary_key=True, collection_name="counters")
    serial = SequenceField(collection_name="counters")
    meta = {"collection": "counted"}


class BuiltinCounted(me.Document):
    id = me.SequenceField(primary_key=True, collection_name="counters")
    serial = me.SequenceField(collection_name="counters")
    meta = {"collection": "counted"}


class SmallSlip(me.Document):
    id = SequenceField(primary_key=True, batch_count=5)


def test_mongomock_connection_works() -> None:
    """connect(mongo_client_class=mongomock.MongoClient): saves and bulk inserts get values."""
    mongomock = pytest.importorskip("mongomock")
    me.connect(
        db="autoseq_mock2", host="mongodb://localhost", mongo_client_class=mongomock.MongoClient
    )
    try:
        assert [Slip(title="a").save().id for _ in range(3)] == [1, 2, 3]
        inserted = Slip.objects.insert([Slip() for _ in range(5)], load_bulk=False)
        assert len(inserted) == 5
        assert sorted(Slip.objects.distinct("id")) == list(range(1, 9))
    finally:
        sequences.close()
        me.disconnect()


@pytest.mark.parametrize("partial", ["only", "exclude"])
def test_saving_a_partly_loaded_document_keeps_stored_values(me_any: Any, partial: str) -> None:
    """only("title") / exclude("serial") then save(): the stored serial never changes."""
    for i in range(3):
        Slip(title=str(i)).save()
    query = Slip.objects.only("title") if partial == "only" else Slip.objects.exclude("serial")
    loaded = query.get(id=2)
    loaded.title = "changed"
    loaded.save()
    stored = me_any["slip"].find_one({"_id": 2})
    assert (stored["serial"], stored["title"]) == (2, "changed")
    assert loaded.serial is None  # not loaded, and no value taken for it
    assert Slip(title="next").save().serial == 4  # nothing was burned


def test_clearing_a_value_on_a_loaded_document_takes_a_new_one(me_any: Any) -> None:
    """Setting the field to None on a stored document takes the next value at once, as the
    builtin does: reading it shows the value, saving stores it; a new document keeps None."""
    Slip(title="a").save()
    loaded = Slip.objects.get(id=1)
    loaded.serial = None
    assert loaded.serial == 2  # taken on the assignment, not on this read
    loaded.save()
    assert loaded.serial == 2
    assert me_any["slip"].find_one({"_id": 1})["serial"] == 2
    fresh = Slip(title="b")
    fresh.serial = None
    assert fresh.serial is None  # a new document takes its value at save
    assert fresh.save().serial == 3


def test_a_dropped_database_restarts_without_sequence_not_found(me_any: Any) -> None:
    """A running process whose database is dropped serves its block, then re-creates the row."""
    assert SmallSlip().save().id == 1
    me.connection.get_connection().drop_database(me_any.name)
    later = [SmallSlip().save().id for _ in range(12)]  # past the block of 5 it held
    assert len(set(later)) == 12
    assert sorted(SmallSlip.objects.distinct("id")) == sorted(later)
    assert me_any["sys_sequence"].find_one({"_id": "small_slip"}) is not None


def test_a_dropped_sequence_collection_in_a_running_process(me_any: Any) -> None:
    """Dropping sys_sequence under a running process re-creates the row past the documents."""
    saved = [Slip(title=str(i)).save().id for i in range(3)]
    Slip(id=500, title="imported").save()
    me_any.drop_collection("sys_sequence")
    # The process still holds the rest of its block (4..100): it may serve it,
    # and the re-created row starts past every stored document.
    later = [Slip(title="x").save().id for _ in range(200)]
    assert len({*saved, 500, *later}) == 204
    assert me_any["sys_sequence"].find_one({"_id": "slip"})["current"] > 500


def test_every_pre_save_receiver_sees_the_key(me_any: Any) -> None:
    """30 pre_save receivers, connected in any order, all see both sequence values."""
    seen: list[tuple[Any, Any]] = []
    receivers = []
    for _ in range(30):

        def receiver(sender: Any, document: Any, **_: Any) -> None:
            seen.append((document.id, document.serial))

        receivers.append(receiver)
        signals.pre_save.connect(receiver, sender=Slip)
    try:
        Slip(title="a").save()
    finally:
        for receiver in receivers:
            signals.pre_save.disconnect(receiver, sender=Slip)
    assert seen == [(1, 1)] * 30


def test_shared_counters_collection_with_the_builtin(me_any: Any) -> None:
    """collection_name="counters" with the builtin's rows in it: no collision, no reuse."""
    for _ in range(3):
        BuiltinCounted().save()  # rows {_id: "counted.id" / "counted.serial", next: 3}
    assert me_any["counters"].find_one({"_id": "counted.serial"})["next"] == 3
    created = Counted().save()
    assert created.id == 4
    assert created.serial == 4
    assert sorted(Counted.objects.distinct("serial")) == [1, 2, 3, 4]


def test_adopt_reads_a_counters_collection_of_any_name(me_any: Any) -> None:
    """adopt() finds the builtin's counter in the field's own collection_name too."""
    for _ in range(4):
        BuiltinCounted().save()
    me_any["counted"].delete_many({})  # only the counters say how far it went
    result = adopt(Counted, "serial")
    assert result.counter == 4
    assert Counted().save().serial == 5
    adopted_id = adopt(Counted)
    assert adopted_id.counter == 4


def test_adopt_names_the_counters_collection(me_any: Any) -> None:
    """adopt(counters_collection=...) reads the builtin's counter where it says."""
    me_any["legacy_counters"].insert_one({"_id": "slip.id", "next": 41})
    result = adopt(Slip, counters_collection="legacy_counters")
    assert (result.counter, result.moved) == (41, True)
    assert Slip(title="a").save().id == 42


def test_a_new_document_is_inserted_not_upserted(me_db: Any, command_log: Any) -> None:
    """save() of a new document sends one insert and no findAndModify on its collection."""
    Slip(title="warm up").save()
    before = len(command_log.commands)
    Slip(title="a").save()
    sent = [name for name, target in command_log.commands[before:] if target == "slip"]
    assert sent == ["insert"]


def test_an_explicit_key_still_replaces_as_mongoengine_does(me_any: Any) -> None:
    """A document saved with a key the user set keeps mongoengine's replace-or-insert."""
    Slip(title="a").save()
    Slip(id=1, title="replaced").save()
    assert Slip.objects.count() == 1
    assert Slip.objects.get(id=1).title == "replaced"


def test_threads_saving_never_share_a_key(me_any: Any) -> None:
    """Eight threads saving new documents get distinct keys, with inserts, not upserts."""
    keys: list[int] = []
    guard = threading.Lock()

    def work() -> None:
        mine = [Slip(title="t").save().id for _ in range(25)]
        with guard:
            keys.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(keys) == len(set(keys)) == 200
    assert Slip.objects.count() == 200
