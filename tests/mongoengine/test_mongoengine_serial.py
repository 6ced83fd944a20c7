"""autoseq_mongoengine.SerialField on a real MongoDB server: save, create, bulk insert."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import mongoengine as me
import pytest

from autoseq import GaplessUnavailable, InvalidSequenceConfig
from autoseq_mongoengine import SequenceField, SerialField

pytestmark = [pytest.mark.mongodb, pytest.mark.usefixtures("me_db")]


def clock() -> datetime:
    return datetime(2026, 11, 24, 9, 0, tzinfo=UTC)


class Shipment(me.Document):
    id = SequenceField(primary_key=True)
    number = SerialField("SH-{date:%Y%m%d}-{n:05d}", period="day", clock=clock, batch_count=4)
    note = me.StringField()


def test_save_create_and_bulk_insert_take_consecutive_serials(me_db: Any) -> None:
    """save(), objects.create() and objects.insert([...]) fill serials in order."""
    first = Shipment(note="a").save()
    second = Shipment.objects.create(note="b")
    bulk = Shipment.objects.insert([Shipment(note=str(i)) for i in range(6)])
    numbers = [first.number, second.number, *(s.number for s in bulk)]
    assert numbers == [f"SH-20261124-{n:05d}" for n in range(1, 9)]
    stored = sorted(doc["number"] for doc in me_db["shipment"].find())
    assert stored == numbers
    assert "shipment.number:2026-11-24" in {row["_id"] for row in me_db["sys_sequence"].find()}


def test_an_explicit_serial_is_kept(me_db: Any) -> None:
    """A number set by the user is saved as given, in save and insert."""
    Shipment(number="OLD-1").save()
    Shipment.objects.insert([Shipment(number="OLD-2"), Shipment()])
    assert sorted(doc["number"] for doc in me_db["shipment"].find()) == [
        "OLD-1",
        "OLD-2",
        "SH-20261124-00001",
    ]


def test_reading_or_resaving_never_takes_a_serial(me_db: Any) -> None:
    """An unsaved document reads None; saving a loaded one keeps its serial."""
    shipment = Shipment(note="x")
    assert shipment.number is None
    shipment.save()
    loaded = Shipment.objects.get(id=shipment.id)
    loaded.note = "y"
    loaded.save()
    assert Shipment.objects.get(id=shipment.id).number == "SH-20261124-00001"


def test_max_length_comes_from_the_template() -> None:
    """The field validates length against the longest serial of its template."""
    assert Shipment.number.max_length == len("SH-20261124-00001")


def test_gapless_is_refused_with_the_reason() -> None:
    """mongoengine has no session transaction to hold a gapless number: refused at declaration."""
    with pytest.raises(GaplessUnavailable, match="session transaction"):
        SerialField("G{n}", gapless=True)


def test_a_gapless_sequence_field_is_refused_with_the_reason() -> None:
    """SequenceField(gapless=True) is refused like SerialField's, never silently gappy;
    a non-bool gapless is a configuration error."""
    from autoseq_mongoengine import SequenceField

    with pytest.raises(GaplessUnavailable, match="passes no session to pymongo"):
        SequenceField(gapless=True)
    with pytest.raises(InvalidSequenceConfig, match="gapless must be True or False"):
        SequenceField(gapless="yes")
    assert SequenceField(gapless=False).cycle is False


def test_a_bad_template_is_refused_at_declaration() -> None:
    """A template without {n} raises InvalidSequenceConfig where the field is declared."""
    with pytest.raises(InvalidSequenceConfig, match=r"has no \{n\}"):
        SerialField("nothing")
