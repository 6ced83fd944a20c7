"""Adoption: start a sequence where mongoengine's counter or the data left off.

A collection that already has documents numbered by mongoengine's own
``SequenceField`` (counter in ``mongoengine.counters``, ``{"_id":
"<name>.<field>", "next": <last value issued>}``) or by hand moves to autoseq
by moving the sequence's ``current`` past the larger of the counter and the
largest value stored in the field, with [`autoseq.maintenance.adopt`][autoseq.maintenance.adopt] (a
compare-and-set on the row's version). ``current`` never moves backwards.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mongoengine.connection import get_db
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import PyMongoError

from autoseq import maintenance
from autoseq.config import SequenceConfig, validate_name
from autoseq.errors import InvalidSequenceConfig, StoreUnavailable
from autoseq.stores.mongo import MongoStore
from autoseq_mongoengine import _compat
from autoseq_mongoengine.counters import (
    BUILTIN_COUNTERS,
    builtin_counter,
    convert_builtin_row,
    max_stored_value,
    read_counter,
)

_FIELD_NAME = re.compile(r"^[^$.\x00][^\x00]*$")


@dataclass(frozen=True, slots=True)
class Adoption:
    """What ``adopt`` found and did; ``row`` is the sequence as stored afterwards."""

    name: str
    counter: int | None
    max_value: int | None
    row: SequenceConfig
    moved: bool


def adopt_sequence(
    database: Database[Any],
    config: SequenceConfig,
    *,
    documents: Collection[Any] | None = None,
    field: str = "_id",
    counter_id: str | None = None,
    counters_collection: str = BUILTIN_COUNTERS,
    sequence_collection: str = "sys_sequence",
    numeric_only: bool = True,
    dry_run: bool = False,
) -> Adoption:
    """Move sequence ``config.name`` past what ``database`` already holds.

    Looks at the ``counter_id`` entry of ``counters_collection`` (mongoengine's
    counters) in ``database`` and at the largest value of ``field`` in the
    ``documents`` collection, and sets ``current`` to the first value of the
    sequence above both; the row (in ``sequence_collection`` of ``database``)
    is created from ``config`` when missing. ``numeric_only=False`` also reads
    values stored as strings (a field with ``value_decorator=str``), which
    scans the collection. ``dry_run`` computes without writing.
    """
    validate_name(config.name)
    validate_field_name(field)
    try:
        counter = read_counter(database, counters_collection, counter_id) if counter_id else None
        largest = None if documents is None else max_stored_value(documents, field, numeric_only)
    except PyMongoError as exc:
        raise StoreUnavailable(
            f"reading what sequence {config.name!r} must start after failed: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            name=config.name,
        ) from exc
    # The builtin may have kept a counter under this very name in the
    # collection autoseq shares with it (collection_name="counters"): it
    # counts, and it becomes autoseq's row first.
    shared = builtin_counter(database, sequence_collection, config.name)
    if shared is not None:
        counter = shared if counter is None else max(counter, shared)
        if not dry_run:
            convert_builtin_row(database, sequence_collection, config, lambda: largest)
    store = MongoStore(database, sequence_collection)
    try:
        seen = [value for value in (counter, largest) if value is not None]
        last = max(seen) if seen else None
        row = config if shared is not None and dry_run else (store.read(config.name) or config)
        target = row.first_value_after(last)
        if last is not None and target > row.last_value:
            raise InvalidSequenceConfig(
                f"sequence {config.name!r}: existing values reach {last}, past its "
                f"end={row.end}; raise end (or use another sequence) before adopting"
            )
        if dry_run:
            moved = target > row.next_value
            planned = row.with_current(target) if moved else row
            return Adoption(config.name, counter, largest, planned, moved=moved)
        before = store.read(config.name)
        adopted, _ = maintenance.adopt(store, config, last)
        moved = adopted.next_value != (before or config).next_value
        return Adoption(config.name, counter, largest, adopted, moved=moved)
    finally:
        store.close()


def adopt(
    document: Any,
    field: str | None = None,
    *,
    counters_collection: str | None = None,
    dry_run: bool = False,
) -> Adoption:
    """Adopt the sequence of ``document``'s autoseq ``SequenceField`` ``field``.

    ``field`` defaults to the primary key. The counter is the one
    mongoengine's own field would have used for the same declaration
    (``<sequence_name or collection>.<field>``), read from
    ``counters_collection``: by default ``mongoengine.counters`` and, when
    the field has a ``collection_name`` of its own, that collection too (the
    builtin kept its counters there under the same argument), whichever is
    higher; all on the field's ``db_alias``. The values are the field's values in the
    document's collection. Run it once, before the first insert with autoseq;
    processes already serving the sequence keep the block they hold.
    """
    from autoseq_mongoengine.fields import SequenceField
    from autoseq_mongoengine.registry import sequences

    name = field or _compat.id_field(document)
    declared = _compat.declared_fields(document).get(name)
    if not isinstance(declared, SequenceField):
        raise InvalidSequenceConfig(
            f"{document.__name__}.{name} is not an autoseq_mongoengine.SequenceField; "
            "declare it as one before adopting"
        )
    decorated = declared.value_decorator is not int
    database = get_db(declared.db_alias)
    counter_id = declared.builtin_counter_id()
    if counters_collection is None:
        counters_collection = BUILTIN_COUNTERS
        if declared.collection_name != declared.COLLECTION_NAME:
            here = builtin_counter(database, declared.collection_name, counter_id)
            there = read_counter(database, BUILTIN_COUNTERS, counter_id)
            if here is not None and (there is None or here > there):
                counters_collection = declared.collection_name
    result = adopt_sequence(
        database,
        declared.sequence_config(),
        documents=_compat.collection(document),
        field=declared.db_field,
        counter_id=counter_id,
        counters_collection=counters_collection,
        sequence_collection=declared.collection_name,
        numeric_only=not decorated,
        dry_run=dry_run,
    )
    if result.moved and not dry_run:
        sequences.forget(declared.db_alias, declared.collection_name, result.name)
    return result


def validate_field_name(field: object) -> str:
    """Return ``field`` if it names a document field (a dotted path is fine), not an operator."""
    if not isinstance(field, str) or not _FIELD_NAME.match(field) or field.endswith("."):
        raise InvalidSequenceConfig(
            f"field name {field!r} is not usable: give a field or dotted path that does not "
            "start with '$' or '.' and holds no NUL"
        )
    return field
