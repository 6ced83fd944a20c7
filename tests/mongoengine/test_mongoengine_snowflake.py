"""autoseq_mongoengine.SnowflakeField on a real MongoDB server: ids on save, insert, to_mongo."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mongoengine as me
import pytest

from autoseq_mongoengine import SnowflakeField
from autoseq_mongoengine.snowflake import close_generators

pytestmark = [pytest.mark.mongodb, pytest.mark.usefixtures("me_db")]


class Flake(me.Document):
    id = SnowflakeField(primary_key=True)
    ref = SnowflakeField(layout="refs")
    title = me.StringField()


@pytest.fixture(autouse=True)
def _close_generators(me_db: Any) -> Iterator[None]:
    yield
    close_generators()  # before me_db closes the connection


def worker_of(value: int) -> int:
    return (value >> 12) & 1023


def test_save_and_insert_assign_distinct_ids(me_db: Any) -> None:
    """save(), objects.create() and a bulk insert give every document its own ids."""
    saved = [Flake(title=str(i)).save() for i in range(5)]
    created = Flake.objects.create(title="created")
    inserted = Flake.objects.insert([Flake(title=f"bulk{i}") for i in range(200)])
    every = [*saved, created, *inserted]
    ids = [f.id for f in every]
    refs = [f.ref for f in every]
    assert len(set(ids)) == len(set(refs)) == 206
    assert all(isinstance(v, int) and 0 < v < 2**63 for v in ids)
    assert Flake.objects.count() == 206
    assert me_db["flake"].count_documents({"_id": {"$in": ids}}) == 206
    assert len({worker_of(v) for v in ids}) == 1
    leases = {doc["name"] for doc in me_db["sys_worker"].find()}
    assert leases == {"default", "refs"}


def test_values_taken_on_write_not_on_read(me_db: Any) -> None:
    """An unsaved document reads None; to_mongo() of it assigns an id."""
    flake = Flake(title="x")
    assert flake.id is None
    doc = flake.to_mongo()
    assert isinstance(doc["_id"], int)
    assert flake.id == doc["_id"]


def test_explicit_ids_are_kept(me_db: Any) -> None:
    """An id set by the user is stored as given; the document is inserted, not updated."""
    Flake(id=12, ref=34, title="given").save()
    stored = me_db["flake"].find_one({"_id": 12})
    assert (stored["ref"], stored["title"]) == (34, "given")


def test_a_non_int_value_is_refused(me_db: Any) -> None:
    """Validation refuses a value that is not an int."""
    with pytest.raises(me.ValidationError, match="snowflake id is an int"):
        Flake(id="abc").save()
