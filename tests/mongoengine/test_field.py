"""autoseq_mongoengine.SequenceField on a real MongoDB server (secantusdb or AUTOSEQ_MONGO_URL)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, ClassVar

import mongoengine as me
import pytest
from mongo_server import ME_SERVERS, CommandLog, me_db_on

from autoseq import InvalidSequenceConfig, SequenceConfig, SequenceExhausted
from autoseq.errors import ValueMovesBackward
from autoseq_mongoengine import SequenceField

pytestmark = [pytest.mark.mongodb, pytest.mark.usefixtures("me_db")]


@pytest.fixture(params=ME_SERVERS)
def me_db(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Each test on secantusdb, then on mongomock (tests needing a real server skip there)."""
    yield from me_db_on(request)


class Ticket(me.Document):
    id = SequenceField(primary_key=True)
    serial = SequenceField(sequence_name="serials", batch_count=1000, value_decorator=str)
    title = me.StringField()


class Invoice(me.Document):
    number = SequenceField(start=1000, step=10, batch_count=50)
    title = me.StringField()
    meta = {"collection": "invoices"}


class Seat(me.Document):
    id = SequenceField(primary_key=True, end=3)
    ring = SequenceField(start=1, end=3, cycle=True, batch_count=2)


class Parcel(me.Document):
    id = SequenceField(primary_key=True, collection_name="my_sequences", batch=False)


class Builtin(me.Document):
    id = me.SequenceField(primary_key=True)
    serial = me.SequenceField(sequence_name="serials")


class Named(me.Document):
    id = SequenceField(primary_key=True)
    serial = SequenceField(sequence_name="serials")


def rows(db: Any, collection: str = "sys_sequence") -> dict[str, dict[str, Any]]:
    return {row["_id"]: row for row in db[collection].find()}


def test_save_assigns_ordered_values(me_db: Any) -> None:
    """Each save takes the next value of its sequences; the stored documents carry them."""
    saved = [Ticket(title=str(i)).save() for i in range(5)]
    assert [t.id for t in saved] == [1, 2, 3, 4, 5]
    assert [t.serial for t in saved] == ["1", "2", "3", "4", "5"]
    stored = me_db["ticket"].find_one({"_id": 3})
    assert (stored["serial"], stored["title"]) == ("3", "2")


def test_objects_create_and_save_on_loaded_document(me_db: Any) -> None:
    """objects.create assigns values; re-saving a loaded document keeps them."""
    ticket = Ticket.objects.create(title="a")
    loaded = Ticket.objects.get(id=ticket.id)
    loaded.title = "b"
    loaded.save()
    assert (loaded.id, loaded.serial) == (1, "1")
    assert Ticket.objects.count() == 1
    assert Ticket(title="c").save().id == 2


def test_reading_the_attribute_never_burns_a_value(me_db: Any) -> None:
    """An unsaved document's field reads None, as often as asked; the next save gets 1."""
    ticket = Ticket(title="x")
    for _ in range(50):
        assert (ticket.id, ticket.serial, ticket.pk) == (None, None, None)
    assert Ticket.id.get_next_value() == 1
    assert Ticket(title="y").id is None
    assert ticket.save().id == 1
    assert Ticket(title="z").save().id == 2
    assert rows(me_db)["ticket"]["current"] == 101  # one block reserved, nothing more


def test_explicit_values_are_kept(me_db: Any) -> None:
    """Values the user set survive save and bulk insert; the sequence fills only the rest."""
    ticket = Ticket(id=500, serial="S-1", title="given").save()
    assert (ticket.id, ticket.serial) == (500, "S-1")
    zero = Ticket(id=0, title="zero").save()
    assert (zero.id, zero.serial) == (0, "1")
    bulk = [Ticket(title="a"), Ticket(id=900, title="b"), Ticket(title="c", serial="own")]
    Ticket.objects.insert(bulk, load_bulk=False)
    # the id sequence is first used here: its row starts past the 500 already stored
    assert [t.id for t in bulk] == [501, 900, 502]
    assert [t.serial for t in bulk] == ["2", "3", "own"]
    assert me_db["ticket"].find_one({"_id": 900})["title"] == "b"


def test_bulk_insert_takes_about_n_over_block_reservations(
    me_db: Any, command_log: CommandLog
) -> None:
    """Inserting 5,000 documents costs at most ceil(N / block) + 1 sequence round trips each."""
    n = 5000
    before = command_log.count("sys_sequence")
    documents = [Ticket(title=str(i)) for i in range(n)]
    Ticket.objects.insert(documents, load_bulk=False)
    assert [t.id for t in documents] == list(range(1, n + 1))
    assert [t.serial for t in documents] == [str(v) for v in range(1, n + 1)]
    trips = command_log.count("sys_sequence") - before
    assert trips <= (math.ceil(n / 100) + 1) + (math.ceil(n / 1000) + 1)
    assert command_log.count("ticket", "insert") >= 1
    assert me_db["ticket"].count_documents({}) == n
    assert len(me_db["ticket"].distinct("serial")) == n


def test_bulk_insert_returns_loaded_documents(me_db: Any) -> None:
    """insert() with load_bulk returns the stored documents with their values."""
    loaded = Ticket.objects.insert([Ticket(title=str(i)) for i in range(20)])
    assert [t.id for t in loaded] == list(range(1, 21))
    assert loaded[4].serial == "5"
    single = Ticket.objects.insert(Ticket(title="one"))
    assert single.id == 21


def test_value_decorator_applies_to_values_and_queries(me_db: Any) -> None:
    """A str-decorated field stores strings and can be queried with an int."""
    Ticket(title="a").save()
    Ticket(title="b").save()
    assert me_db["ticket"].find_one({"_id": 2})["serial"] == "2"
    assert Ticket.objects.get(serial=2).title == "b"
    assert Ticket.objects(id__in=[1, 2]).count() == 2


def test_non_primary_field_with_settings(me_db: Any) -> None:
    """A non-key field uses '<collection>.<field>' and its own start, step and block."""
    invoices = [Invoice(title=str(i)).save() for i in range(3)]
    assert [i.number for i in invoices] == [1000, 1010, 1020]
    row = rows(me_db)["invoices.number"]
    assert (row["start"], row["step"], row["batch_count"]) == (1000, 10, 50)
    assert row["current"] == 1000 + 50 * 10
    assert invoices[0].id is not None  # an ObjectId primary key, untouched


def test_rows_have_the_design_fields(me_db: Any) -> None:
    """Rows have every sys_sequence field (plus the last reservation's token) and the settings."""
    Ticket(title="a").save()
    row = rows(me_db)["serials"]
    assert set(row) - {"reserved_by"} == {
        "_id",
        "start",
        "end",
        "step",
        "current",
        "batch",
        "batch_count",
        "cycle",
        "updated_at",
        "version",
    }
    assert (row["batch"], row["batch_count"], row["cycle"]) == (True, 1000, False)


def test_existing_row_keeps_its_settings(me_db: Any) -> None:
    """A row that already exists wins over the field's arguments."""
    Invoice.number.store().create(SequenceConfig("invoices.number", start=7, batch_count=3))
    assert [Invoice(title=str(i)).save().number for i in range(4)] == [7, 8, 9, 10]


def test_end_raises_exhausted_and_cycle_wraps(me_db: Any) -> None:
    """A field reaching end raises SequenceExhausted; a cycling one starts over."""
    seats = [Seat().save() for _ in range(3)]
    assert [s.id for s in seats] == [1, 2, 3]
    assert [s.ring for s in seats] == [1, 2, 3]
    with pytest.raises(SequenceExhausted, match="'seat'"):
        Seat().save()
    more = [Seat(id=10 + i).save() for i in range(3)]
    assert [s.ring for s in more] == [1, 2, 3]
    assert Seat.objects.count() == 6


def test_collection_name_and_unbatched_mode(me_db: Any, command_log: CommandLog) -> None:
    """collection_name picks where the row lives; batch=False reserves one value per insert."""
    for _ in range(3):
        Parcel().save()
    assert "parcel" in rows(me_db, "my_sequences")
    assert "parcel" not in rows(me_db)
    assert rows(me_db, "my_sequences")["parcel"]["current"] == 4
    assert sorted(me_db["parcel"].distinct("_id")) == [1, 2, 3]
    assert command_log.count("my_sequences", "findAndModify") == 4  # create + 3 reservations


def test_db_alias_puts_the_row_on_that_connection(
    me_db: Any, mongo_server: Any, mongo_db_name: str
) -> None:
    """A field with db_alias keeps its sequence in that connection's database."""
    other_db = mongo_db_name + "_other"
    me.connect(db=other_db, host=mongo_server.url, alias="other", uuidRepresentation="standard")
    try:
        # A class name no other test module uses: mongoengine's document
        # registry is by name, and disconnect() resets only the class it holds.
        class AliasedShipment(me.Document):
            id = SequenceField(primary_key=True, db_alias="other")
            meta: ClassVar[dict[str, Any]] = {"collection": "shipment"}

        assert AliasedShipment().save().id == 1
        other = me.get_db("other")
        assert other["sys_sequence"].find_one({"_id": "shipment"})["current"] == 101
        assert me_db["sys_sequence"].find_one({"_id": "shipment"}) is None
        assert me_db["shipment"].count_documents({}) == 1
    finally:
        me.get_db("other").client.drop_database(other_db)
        me.disconnect("other")


def test_get_next_value_peeks_without_consuming(me_db: Any) -> None:
    """get_next_value gives the value the next save gets, never reserving or creating."""
    assert Ticket.id.get_next_value() == 1
    assert "ticket" not in rows(me_db)
    for _ in range(10):
        Ticket(title="t").save()
    assert Ticket.id.get_next_value() == 11
    assert Ticket.id.get_next_value() == 11
    assert Ticket.serial.get_next_value() == "11"
    assert Ticket(title="u").save().id == 11


def test_set_next_value_behaves_like_mongoengine(me_db: Any) -> None:
    """set_next_value(v) records v as issued: the next document gets v + 1, here and as stored."""
    Ticket(title="before").save()
    assert Ticket.id.set_next_value(1000) == 1000
    assert rows(me_db)["ticket"]["current"] == 1001
    assert Ticket.id.get_next_value() == 1001
    assert Ticket(title="after").save().id == 1001
    with pytest.raises(ValueMovesBackward, match="only move forward"):
        Ticket.serial.set_next_value(0)  # a reset could repeat serials already issued
    with pytest.raises(ValueMovesBackward, match="already stored"):
        Ticket.serial.set_next_value(0, force=True)  # serials "1" and "2" are stored
    assert Ticket.serial.set_next_value(2, force=True) == "2"
    assert Ticket(title="forced").save().serial == "3"


def test_reset_after_drop_collection_restarts_at_one_as_mongoengines(me_db: Any) -> None:
    """drop_collection() then set_next_value(0), mongoengine's reset idiom, restarts at 1."""
    for round_ in range(3):
        saved = [Ticket(title=str(i)).save() for i in range(3)]
        assert [t.id for t in saved] == [1, 2, 3], f"round {round_}"
        assert [t.serial for t in saved] == ["1", "2", "3"], f"round {round_}"
        Ticket.drop_collection()
        assert Ticket.id.set_next_value(0) == 0
        assert Ticket.serial.set_next_value(0) == "0"
    assert Ticket.objects.count() == 0


def test_set_next_value_within_the_blocks_this_process_holds(me_db: Any) -> None:
    """mongoengine's idiom (ten saves, then set_next_value(v)) past this process's own buffer.

    The ten saves reserve 1..100 (and may prefetch more), so the row is past
    51; those values are this process's alone, so they are handed back and the
    move is accepted: the next document gets 51, then 1001 after a second move.
    """
    Ticket.drop_collection()
    assert [Ticket(title=str(i)).save().id for i in range(10)] == list(range(1, 11))
    assert rows(me_db)["ticket"]["current"] >= 101  # the block this process holds
    assert Ticket.id.set_next_value(50) == 50
    assert rows(me_db)["ticket"]["current"] == 51
    assert Ticket(title="a").save().id == 51
    assert Ticket.id.set_next_value(1000) == 1000
    assert Ticket(title="b").save().id == 1001
    with pytest.raises(ValueMovesBackward, match="only move forward"):
        Ticket.id.set_next_value(1000)  # 1001 is stored (and served): never again


def test_set_next_value_refused_when_another_process_reserved_after_this_one(
    me_db: Any,
) -> None:
    """Blocks held here go back only if no one reserved after them; else the move is refused.

    A second registry on its own store stands for another process: its block
    lies past this process's, so the hand-back's compare-and-set misses and
    no value it holds is ever served here.
    """
    from autoseq.registry import SequenceRegistry
    from autoseq.stores.mongo import MongoStore

    Ticket.drop_collection()
    mine = [Ticket(title=str(i)).save().id for i in range(10)]
    other = SequenceRegistry(MongoStore(me_db, "sys_sequence"))
    try:
        theirs = other.get("ticket").next_many(5)
        with pytest.raises(ValueMovesBackward, match="only move forward"):
            Ticket.id.set_next_value(50)
        later = [Ticket(title="later").save().id for _ in range(5)]
    finally:
        other.close_locks(release=False)
    assert min(theirs) > max(mine)
    assert len(set(mine + theirs + later)) == 20


def test_a_reset_below_a_stored_value_is_refused_and_nothing_moves(me_db: Any) -> None:
    """set_next_value(0) while documents hold values refuses, forced or not; the row stays."""
    Ticket(title="kept").save()
    before = rows(me_db)["ticket"]["current"]
    for force in (False, True):
        with pytest.raises(ValueMovesBackward):
            Ticket.id.set_next_value(0, force=force)
    assert rows(me_db)["ticket"]["current"] == before
    assert Ticket(title="next").save().id == 2


def test_set_next_value_follows_step_and_range(me_db: Any) -> None:
    """set_next_value keeps to start + k * step and refuses values outside the range."""
    Invoice.number.set_next_value(1234)
    assert Invoice(title="a").save().number == 1240
    with pytest.raises(InvalidSequenceConfig, match="outside"):
        Invoice.number.set_next_value(5)
    with pytest.raises(InvalidSequenceConfig, match="outside"):
        Seat.id.set_next_value(3)
    with pytest.raises(InvalidSequenceConfig, match="integer"):
        Invoice.number.set_next_value("ten")


def test_builtin_counter_id_matches_mongoengine(me_db: Any) -> None:
    """builtin_counter_id is exactly the counter _id mongoengine's own field uses."""
    Builtin().save()
    counters = {row["_id"] for row in me_db["mongoengine.counters"].find()}
    assert counters == {"builtin.id", "serials.serial"}
    assert Named.id.builtin_counter_id() == "named.id"
    assert Named.serial.builtin_counter_id() == "serials.serial"
    assert (Named.id.get_sequence_name(), Named.serial.get_sequence_name()) == (
        "named",
        "serials",
    )


def test_abstract_base_shares_one_sequence(me_db: Any) -> None:
    """A field declared on an abstract document is named after it, like mongoengine's."""

    class Numbered(me.Document):
        code = SequenceField()
        meta = {"abstract": True}

    class Apple(Numbered):
        pass

    class Pear(Numbered):
        pass

    values = [Apple().save().code, Pear().save().code, Apple().save().code]
    assert values == [1, 2, 3]
    assert "numbered.code" in rows(me_db)


def test_bad_declarations_are_refused() -> None:
    """Bad settings or names fail when the field is declared, with InvalidSequenceConfig."""
    with pytest.raises(InvalidSequenceConfig, match="step"):
        SequenceField(step=0)
    with pytest.raises(InvalidSequenceConfig, match="start"):
        SequenceField(start=10, end=5)
    with pytest.raises(InvalidSequenceConfig):
        SequenceField(sequence_name="")
    with pytest.raises(InvalidSequenceConfig, match="collection name"):
        SequenceField(collection_name="$bad")


def test_reconnecting_continues_the_sequence(me_db: Any, mongo_server: Any) -> None:
    """After disconnect() and connect() the field serves from the new client, no reuse."""
    first = [Ticket(title="a").save().id for _ in range(3)]
    name = me_db.name
    me.disconnect()
    me.connect(db=name, host=mongo_server.url, uuidRepresentation="standard")
    second = [Ticket(title="b").save().id for _ in range(3)]
    assert first == [1, 2, 3]
    assert min(second) > 3
    assert len(set(first + second)) == 6


class Line(me.EmbeddedDocument):
    number = SequenceField()


class Basket(me.Document):
    lines = me.ListField(me.EmbeddedDocumentField(Line))


def test_embedded_document_gets_values_when_written(me_db: Any) -> None:
    """A field of an embedded document is filled when its parent is written, not when read."""
    basket = Basket(lines=[Line(), Line()])
    assert [line.number for line in basket.lines] == [None, None]
    basket.save()
    assert [line.number for line in basket.lines] == [1, 2]
    stored = me_db["basket"].find_one({"_id": basket.id})
    assert [line["number"] for line in stored["lines"]] == [1, 2]
    assert "line.number" in rows(me_db)


def test_a_dropped_sequence_collection_restarts_past_the_documents(me_db: Any) -> None:
    """After sys_sequence is dropped, the re-created row is past every stored id and serial."""
    from autoseq_mongoengine import sequences

    saved = [Ticket(title=str(i)).save() for i in range(5)]
    Ticket(id=900, serial="950", title="imported").save()
    sequences.close()  # a new process: nothing buffered
    me_db.drop_collection("sys_sequence")
    after = Ticket(title="after").save()
    assert after.id == 901
    assert after.serial == "951"  # a str-decorated field is scanned
    assert after.id not in {t.id for t in saved}
