"""Worker leases in a ``sys_worker`` collection beside a ``MongoStore``'s ``sys_sequence``.

One document per (layout, worker id), ``_id`` = ``"<worker>@<name>"``. Taking
a new id is an insert (a duplicate ``_id`` means another generator won);
taking a free one, renewing and releasing are ``find_one_and_update``
filtered on what was read (the version, or the owner), acknowledged by a
majority like the sequence rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from autoseq.config import validate_name
from autoseq.workers import LAYOUT_ROW, WorkerLease, candidates, layout_row, taken

if TYPE_CHECKING:
    from pymongo.collection import Collection

    from autoseq.stores.mongo import MongoStore


def worker_collection_name(sequence_collection: str) -> str:
    """``sys_worker`` beside ``sys_sequence``, else ``<collection>_worker``."""
    if sequence_collection == "sys_sequence":
        return "sys_worker"
    return f"{sequence_collection}_worker"


class MongoWorkers:
    """`WorkerLeases` on a ``MongoStore``'s database."""

    def __init__(self, store: MongoStore, collection: str | None = None) -> None:
        self.store = store
        self.collection_name = collection or worker_collection_name(store.collection_name)

    @property
    def collection(self) -> Collection[dict[str, Any]]:
        """The leases' collection, with the store's codec, read and write settings."""
        rows = self.store.collection
        return rows.database.get_collection(
            self.collection_name,
            codec_options=rows.codec_options,
            read_preference=rows.read_preference,
            write_concern=rows.write_concern,
            read_concern=rows.read_concern,
        )

    def acquire_worker(
        self, name: str, owner: str, count: int, now_ms: int, ttl_ms: int
    ) -> WorkerLease | None:
        validate_name(name)

        def attempt() -> WorkerLease | bool | None:
            collection = self.collection
            query = {"name": name, "worker": {"$ne": LAYOUT_ROW}}
            rows = {r.worker: r for r in map(_lease, collection.find(query))}
            free = candidates(rows, count, now_ms)
            if not free:
                return None
            for worker in free:
                row = rows.get(worker)
                lease = taken(row, name, worker, owner, now_ms + ttl_ms)
                fields = lease.held_fields()
                if row is None:
                    try:
                        collection.insert_one(
                            {"_id": _id(name, worker), "name": name, "worker": worker, **fields}
                        )
                    except DuplicateKeyError:
                        continue
                    return lease
                won = collection.find_one_and_update(
                    {"_id": _id(name, worker), "version": row.version},
                    {"$set": fields},
                    return_document=ReturnDocument.AFTER,
                )
                if won is not None and won.get("owner") == owner:
                    return lease
            return False  # lost every race: read again

        for _ in range(8):
            result = self.store._run(
                "lease", f"leasing a worker id of snowflake {name!r}", name, attempt
            )
            if result is not False:
                return result  # type: ignore[return-value]
        return None

    def renew_worker(
        self, lease: WorkerLease, now_ms: int, ttl_ms: int, last_ms: int
    ) -> WorkerLease | None:
        expires = max(now_ms + ttl_ms, lease.expires_ms)
        last = max(last_ms, lease.last_ms)
        # $max: a renewal sent later may already have extended it
        doc = self._write(lease, {"$max": {"expires_ms": expires, "last_ms": last}}, "renewing")
        return None if doc is None else _lease(doc)

    def release_worker(self, lease: WorkerLease, last_ms: int) -> bool:
        last = max(last_ms, lease.last_ms)
        fields = {"owner": None, "expires_ms": last, "last_ms": last}
        return self._write(lease, {"$set": fields}, "releasing") is not None

    def _write(
        self, lease: WorkerLease, update: dict[str, Any], what: str
    ) -> dict[str, Any] | None:
        def write() -> dict[str, Any] | None:
            return self.collection.find_one_and_update(
                {"_id": _id(lease.name, lease.worker), "owner": lease.owner},
                {**update, "$inc": {"version": 1}},
                return_document=ReturnDocument.AFTER,
            )

        return self.store._run("lease", f"{what} worker {lease.worker}", lease.name, write)

    def claim_layout(self, name: str, layout: str, now_ms: int, wait_ms: int) -> WorkerLease:
        validate_name(name)
        fresh = layout_row(name, layout, now_ms, wait_ms)

        fields = _document(fresh)
        del fields["_id"]

        def claim() -> dict[str, Any] | None:
            try:
                return self.collection.find_one_and_update(
                    {"_id": _id(name, LAYOUT_ROW)},
                    {"$setOnInsert": fields},
                    upsert=True,
                    return_document=ReturnDocument.AFTER,
                )
            except DuplicateKeyError:
                return None  # two upserts at once: the loser reads the winner's

        what = f"recording the layout of snowflake {name!r}"
        for _ in range(3):
            doc = self.store._run("lease", what, name, claim)
            if doc is not None:
                return _lease(doc)
        raise self.store._translate(
            RuntimeError("concurrent upserts kept failing"), "lease", what, name
        )

    def list_workers(self, name: str | None = None, *, layouts: bool = False) -> list[WorkerLease]:
        query: dict[str, Any] = {} if layouts else {"worker": {"$ne": LAYOUT_ROW}}
        if name is not None:
            query["name"] = name
        docs = self.store._run(
            "lease", "listing worker leases", name, lambda: list(self.collection.find(query))
        )
        return sorted(map(_lease, docs), key=lambda r: (r.name, r.worker))


def _id(name: str, worker: int) -> str:
    return f"{worker}@{name}"


def _document(row: WorkerLease) -> dict[str, Any]:
    return {
        "_id": _id(row.name, row.worker),
        "name": row.name,
        "worker": row.worker,
        "owner": row.owner,
        "expires_ms": row.expires_ms,
        "last_ms": row.last_ms,
        "version": row.version,
    }


def _lease(doc: dict[str, Any]) -> WorkerLease:
    return WorkerLease(
        doc["name"],
        int(doc["worker"]),
        doc.get("owner"),
        int(doc["expires_ms"]),
        int(doc["last_ms"]),
        int(doc["version"]),
    )
