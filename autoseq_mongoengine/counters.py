"""mongoengine's counters and the values already stored: what a sequence starts after.

The lowest layer of the mongoengine integration's numbering: reading
mongoengine's own counters (``mongoengine.counters``, or a shared
``collection_name``), the largest value a field holds, and taking over a row
in the builtin's layout. `autoseq_mongoengine.fields` (a row missing or in
the builtin's layout at first use) and `autoseq_mongoengine.adoption`
(``adopt``) both read them; neither imports the other for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import PyMongoError

from autoseq.config import SequenceConfig
from autoseq.errors import StoreUnavailable
from autoseq.stores.mongo import row_document, validate_collection_name

BUILTIN_COUNTERS = "mongoengine.counters"


def read_counter(database: Database[Any], collection: str, counter_id: str) -> int | None:
    """The ``next`` of counter ``counter_id`` in ``collection`` as an int (None: none)."""
    entry = database[validate_collection_name(collection)].find_one({"_id": counter_id})
    if entry is None:
        return None
    return as_int(entry.get("next"))


def max_stored_value(target: Collection[Any], field: str, numeric_only: bool) -> int | None:
    """The largest integer in ``field`` of ``target``; ``numeric_only=False`` scans strings too."""
    if numeric_only:
        top = target.find_one(
            {field: {"$type": "number"}}, projection={field: 1}, sort=[(field, -1)]
        )
        return None if top is None else as_int(top.get(field))
    largest: int | None = None
    for document in target.find({field: {"$exists": True}}, projection={field: 1}):
        value = as_int(document.get(field))
        if value is not None and (largest is None or value > largest):
            largest = value
    return largest


def as_int(value: Any) -> int | None:
    """``value`` as an int; None for a bool, None or what `int` refuses."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def builtin_counter(database: Database[Any], collection: str, counter_id: str) -> int | None:
    """The builtin's counter ``counter_id`` in ``collection``, if the row has its layout."""
    entry = database[validate_collection_name(collection)].find_one({"_id": counter_id})
    if entry is None or "current" in entry:
        return None  # missing, or a row of autoseq's own
    return as_int(entry.get("next"))


def convert_builtin_row(
    database: Database[Any],
    collection: str,
    config: SequenceConfig,
    floor: Callable[[], int | None],
) -> bool:
    """Replace a row in mongoengine's counter layout named ``config.name`` by autoseq's.

    With ``collection_name`` shared with the builtin (``"counters"``), a
    non-primary field's counter ``{_id: "doc.field", next: 7}`` has the name
    autoseq gives the field's sequence. The row becomes an autoseq row past
    both the counter and ``floor()`` (the largest stored value), in one
    replace filtered on the counter as read, so a concurrent conversion or
    an increment by the builtin makes this one miss (and the caller read
    again) rather than move a value backward. False when there is no such row.
    """
    target = database[validate_collection_name(collection)]
    try:
        entry = target.find_one({"_id": config.name})
        if entry is None or "current" in entry or "next" not in entry:
            return False
        seen = [value for value in (as_int(entry.get("next")), floor()) if value is not None]
        last = max(seen) if seen else None
        row = config.with_current(config.first_value_after(last))
        replaced = target.find_one_and_replace(
            {"_id": config.name, "next": entry["next"], "current": {"$exists": False}},
            row_document(row),
        )
    except PyMongoError as exc:
        raise StoreUnavailable(
            f"converting mongoengine's counter {config.name!r} in {collection} failed: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            name=config.name,
        ) from exc
    return (
        replaced is not None
        or target.find_one({"_id": config.name, "current": {"$exists": True}}) is not None
    )
