"""Gapless numbering on MongoDB: each value taken in the caller's session transaction.

The row is read and rewritten (a compare-and-set on ``version``) inside the
caller's transaction, so an aborted transaction gives the value back. Two
transactions taking from one row cannot both commit: MongoDB aborts the
second writer with a ``WriteConflict`` labelled ``TransientTransactionError``,
which ``ClientSession.with_transaction`` retries; committed values are
consecutive. Outside a transaction the value would be committed alone, so
that is refused.
"""

from __future__ import annotations

import weakref
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pymongo.client_session import ClientSession

from autoseq.config import SequenceConfig
from autoseq.errors import GaplessUnavailable, SequenceExhausted, SequenceNotFound
from autoseq.stores.base import check_count, check_many, plan_reservation

if TYPE_CHECKING:
    from autoseq.stores.mongo import MongoStore

_created: weakref.WeakKeyDictionary[MongoStore, set[str]] = weakref.WeakKeyDictionary()


def take(session: Any, store: MongoStore, config: SequenceConfig, count: int = 1) -> list[int]:
    """``count`` consecutive values of ``config``'s row, in ``session``'s transaction."""
    check_many(check_count(count, "take"), "take")
    if not isinstance(session, ClientSession) or not session.in_transaction:
        raise GaplessUnavailable(
            f"sequence {config.name!r} is gapless on MongoDB: pass a pymongo ClientSession "
            "inside a transaction (session.with_transaction(...) or start_transaction()), "
            f"got {session!r}"
        )
    known = _created.setdefault(store, set())
    if config.name not in known:
        # Committed on its own, outside the caller's transaction: creating
        # the row is not a value and must not be undone by an abort.
        store.create(config)
        known.add(config.name)
    collection = store.collection
    stored = collection.find_one({"_id": config.name}, session=session)
    if stored is None:
        known.discard(config.name)  # deleted since: the next take creates it again
        raise SequenceNotFound(config.name, "its row was deleted while in use")
    row = SequenceConfig.from_row({**stored, "name": stored["_id"]})
    block, new_current = plan_reservation(row, count)
    if block.count < count:
        raise SequenceExhausted(config.name, block.last + block.step, row.end)
    result = collection.update_one(
        {"_id": config.name, "current": stored["current"], "version": stored.get("version", 0)},
        {
            "$set": {"current": new_current, "updated_at": datetime.now(UTC)},
            "$inc": {"version": 1},
        },
        session=session,
    )
    if result.modified_count != 1:
        # Our snapshot's row is not the stored one: a transaction must not
        # go on with a value someone else may commit too.
        raise GaplessUnavailable(
            f"sequence {config.name!r}: the row changed under this transaction; the server "
            "did not report the write conflict, so abort and retry the transaction"
        )
    return list(block.values())


__all__ = ["take"]
