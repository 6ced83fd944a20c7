"""``MongoStore``: ``sys_sequence`` rows as MongoDB documents (pymongo).

One document per sequence, ``_id`` = the name, beside the row's other fields.
A reservation is a compare-and-set: compute the block from the row with
`plan_reservation`, then ``find_one_and_update``
filtered on the ``current`` (and the settings) it was computed from. The
update is a single-document write, atomic on any server, committed with
``w="majority"`` before a value is handed out, so a failover cannot roll a
block back and hand it out again.

The row each successful write returns is remembered, and the next
reservation starts from it without reading: while the block fits below
``end`` it is one ``$inc`` of ``current`` filtered on the remembered
settings (so writers never collide; a token written with it proves the
returned image is this reservation's own), otherwise the compare-and-set.
Either way a block costs one round trip while the row is known; a write that
matches nothing sends the store back to reading the row.

Every operation runs in an empty `contextvars` context: a pymongo
session the application bound with ``ClientSession.bind()`` (and so its
transaction) is never picked up, so an application's abort cannot take a
reserved block back.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import random
import re
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import pymongo
from bson.codec_options import CodecOptions
from pymongo import ReturnDocument, UpdateOne
from pymongo.database import Database
from pymongo.errors import BulkWriteError, ConfigurationError, DuplicateKeyError, PyMongoError
from pymongo.read_concern import ReadConcern
from pymongo.read_preferences import ReadPreference
from pymongo.server_type import SERVER_TYPE
from pymongo.write_concern import WriteConcern

from autoseq.config import SequenceConfig, utc_now, validate_name
from autoseq.errors import (
    InvalidSequenceConfig,
    ReservationConflict,
    SequenceExhausted,
    SequenceNotFound,
    StoreUnavailable,
    UsageError,
)
from autoseq.stores._errors import translating, unavailable
from autoseq.stores.base import (
    Block,
    check_configs,
    check_count,
    check_requests,
    first_configs,
    plan_reservation,
    reset_after_fork,
)
from autoseq.stores.capabilities import one_per_store

if TYPE_CHECKING:
    from pymongo.collection import Collection

    from autoseq.stores.capabilities import GaplessEngine
    from autoseq.workers import WorkerLeases

_T = TypeVar("_T")
#: The server's code for a duplicate key (an insert of a row that exists).
_DUPLICATE_KEY = 11000
log = logging.getLogger("autoseq")
#: Read concerns a store may ask for (None: the server's default).
READ_CONCERNS = ("majority", "linearizable", "local")
_COLLECTION_NAME = re.compile(r"^(?!system\.)[^$\x00]{1,120}$")
#: The row's settings; a compare-and-set on all of them fails when ``update()``
#: (or a hand edit, valid or not) changed any since the row was read, so the
#: row is read again and checked before a block is planned from it.
_PLAN_FIELDS = ("start", "end", "step", "cycle", "batch", "batch_count")
#: Names one bulk write of `MongoStore.reserve_many` reserves for: one operation stays
#: well inside ``timeout`` (1,000 took 1.4 s on secantusdb holding 10,000 rows).
MANY_CHUNK = 1_000
#: Bulk writes per chunk: a row that moved under another writer is read and tried again
#: this many times in all, then left to ``reserve``.
MANY_ROUNDS = 3
#: Names one ``find`` of `MongoStore.create_many` reads back: secantusdb's ``$in`` costs the
#: square of its length (1,000 names 1.1 s, 3,000 names 9 s), so 10,000 in one list timed out.
_READ_CHUNK = 250


def validate_collection_name(collection: object) -> str:
    """Return ``collection`` if MongoDB accepts it as a collection name."""
    if (
        not isinstance(collection, str)
        or not _COLLECTION_NAME.match(collection)
        or collection.startswith(".")
        or collection.endswith(".")
    ):
        raise InvalidSequenceConfig(
            f"collection name {collection!r} is not usable: give 1-120 characters without "
            "'$' or NUL, not starting with 'system.' and not starting or ending with '.'"
        )
    return collection


class MongoStore:
    """A [`SequenceStore`][autoseq.stores.base.SequenceStore] on a MongoDB collection.

    ``client_or_url_or_database`` is a ``mongodb://`` URL (the store opens
    and owns its client; the URL names the database unless ``database``
    does), a ``MongoClient`` (``database`` or the client's default database)
    or a pymongo ``Database``. A client given by the application is shared in
    this process and never closed by the store; after ``os.fork()`` the child
    opens its own. ``timeout`` (seconds) bounds every operation, server
    selection included; ``max_retries`` bounds compare-and-set conflicts.
    ``write_concern`` (``"majority"``, the default, or a number of members)
    is what every sequence and lease write waits for before a value is
    handed out: on a replica set only ``"majority"`` survives a failover.
    ``read_concern`` (``"majority"``, the default, ``"linearizable"``,
    ``"local"`` or None for the server's) is what rows are read at, so a
    block is never planned from a write a failover could roll back.
    """

    def __init__(
        self,
        client_or_url_or_database: str | pymongo.MongoClient[Any] | Database[Any],
        collection: str = "sys_sequence",
        *,
        database: str | None = None,
        max_retries: int = 30,
        timeout: float = 10.0,
        write_concern: str | int = "majority",
        read_concern: str | None = "majority",
    ) -> None:
        self.collection_name = validate_collection_name(collection)
        self.write_concern = validate_write_concern(write_concern)
        self.read_concern = validate_read_concern(read_concern)
        self.primary = PrimaryWatch()
        self.max_retries = max_retries
        self.timeout = timeout
        self.reservations = 0
        self._guard = threading.Lock()
        self._rows: dict[str, Mapping[str, Any]] = {}
        self._has_mod = True
        # Any: mongomock's client and database are not pymongo's classes.
        source: Any = client_or_url_or_database
        if isinstance(source, str):
            url = source
            self._new_client: Callable[[], pymongo.MongoClient[Any]] = lambda: pymongo.MongoClient(
                url, serverSelectionTimeoutMS=int(timeout * 1000), tz_aware=True
            )
            self._client: pymongo.MongoClient[Any] | None = self._new_client()
            self._owns_client = True
        elif isinstance(source, pymongo.MongoClient):
            self._client, self._owns_client = source, False
            self._new_client = _duplicate_of(source)
        elif isinstance(source, Database) or _is_database(source):
            self._client, self._owns_client = source.client, False
            self._new_client = _duplicate_of(source.client)
            database = database or source.name
        elif _is_client(source):
            self._client, self._owns_client = source, False
            self._new_client = _duplicate_of(source)
        else:
            raise InvalidSequenceConfig(
                "MongoStore needs a mongodb:// URL, a MongoClient or a Database "
                "(pymongo's, or one that behaves alike such as mongomock's), "
                f"got {type(source).__name__}"
            )
        if database is None:
            assert self._client is not None
            try:
                database = self._client.get_default_database().name
            except ConfigurationError:
                if self._owns_client:
                    self._client.close()  # or the GC closes it, with a ResourceWarning
                raise InvalidSequenceConfig(
                    "MongoStore needs a database: name it in the URL "
                    "(mongodb://host:27017/mydb) or pass database='mydb'"
                ) from None
        self.database_name = database
        self._collection: Collection[dict[str, Any]] | None = None
        self._reopened: weakref.finalize[Any, Any] | None = None
        reset_after_fork(self)

    # connection -------------------------------------------------------------

    @property
    def collection(self) -> Collection[dict[str, Any]]:
        """The pymongo collection holding the rows (opened on first use)."""
        collection = self._collection
        if collection is None:
            with self._guard:
                if self._client is None:
                    self._client, self._owns_client = self._new_client(), True
                    # Reopened after close() (a prefetch that ran late, a forked
                    # child): closed with the store, never left to the GC.
                    self._reopened = weakref.finalize(self, self._client.close)
                # Plain dicts, aware datetimes and primary reads whatever
                # the application's client is configured with.
                database = self._client[self.database_name]
                options: dict[str, Any] = {
                    "read_preference": ReadPreference.PRIMARY,
                    "write_concern": WriteConcern(w=self.write_concern),
                    "read_concern": ReadConcern(self.read_concern),
                }
                try:
                    collection = database.get_collection(
                        self.collection_name,
                        codec_options=CodecOptions(tz_aware=True, tzinfo=UTC),
                        **options,
                    )
                except NotImplementedError:
                    # mongomock takes no tzinfo; aware UTC datetimes all the same.
                    collection = database.get_collection(
                        self.collection_name, codec_options=CodecOptions(tz_aware=True), **options
                    )
                self._collection = collection
        return collection

    def _run(self, op: str, what: str, name: str | None, operation: Callable[[], _T]) -> _T:
        """Run ``operation`` outside any bound session, translating driver errors.

        ``op`` names the store operation (``"reserve"``...) and ``what`` says
        it in words, for [`StoreUnavailable`][autoseq.errors.StoreUnavailable].
        """

        def bounded() -> _T:
            with pymongo.timeout(self.timeout):
                return operation()

        with translating(PyMongoError, self._translate, op, what, name):
            return contextvars.Context().run(bounded)

    def _translate(
        self, exc: BaseException, operation: str, what: str, name: str | None
    ) -> StoreUnavailable:
        where = f"in {self.database_name}.{self.collection_name}"
        return unavailable(exc, operation=operation, what=what, where=where, name=name)

    # rows -------------------------------------------------------------------

    def create(self, config: SequenceConfig) -> SequenceConfig:
        row = _document(config)
        del row["_id"]

        def upsert() -> dict[str, Any] | None:
            try:
                stored = self.collection.find_one_and_update(
                    {"_id": config.name},
                    {"$setOnInsert": row},
                    upsert=True,
                    return_document=ReturnDocument.AFTER,
                )
            except DuplicateKeyError:
                stored = None
            # Two upserts raced and the server did not retry the loser: it
            # raised DuplicateKeyError or (secantusdb) returned no document.
            # Either way the winner's row is there now.
            return stored or self.collection.find_one({"_id": config.name})

        stored = self._run("create", f"creating sequence {config.name!r}", config.name, upsert)
        if stored is None:  # pragma: no cover - deleted between upsert and read
            raise SequenceNotFound(config.name, "it was deleted while being created")
        return self._remember(stored)

    def create_many(self, configs: list[SequenceConfig]) -> list[SequenceConfig]:
        """``create`` of each: one unordered ``insert_many`` (a row that exists is a
        duplicate key, left as stored), then the rows that existed read back.

        A row inserted is known as MongoDB keeps it, so only the names that
        existed are read, `_READ_CHUNK` at a time. Every item is checked
        before anything is sent. Not one transaction: a store failure part
        way leaves the rows inserted so far, each a row ``create`` would have
        made (the call can be repeated).
        """
        items = check_configs(configs)
        firsts = first_configs(items)
        if not firsts:
            return []
        documents = [_document(config) for config in firsts.values()]

        def insert_and_read() -> list[Mapping[str, Any]]:
            existed: list[str] = []
            try:
                self.collection.insert_many(documents, ordered=False)
            except BulkWriteError as exc:
                details = exc.details or {}
                errors = details.get("writeErrors") or []
                if details.get("writeConcernErrors") or any(
                    error.get("code") != _DUPLICATE_KEY for error in errors
                ):
                    raise
                existed = [documents[error["index"]]["_id"] for error in errors]
            skip = set(existed)
            found: list[Mapping[str, Any]] = [d for d in documents if d["_id"] not in skip]
            for at in range(0, len(existed), _READ_CHUNK):
                names = existed[at : at + _READ_CHUNK]
                found.extend(self.collection.find({"_id": {"$in": names}}, batch_size=len(names)))
            return found

        what = f"creating {len(documents)} sequence(s)"
        found = self._run("create", what, None, insert_and_read)
        stored = {row.name: row for row in map(self._remember, found)}
        for name in firsts:
            if name not in stored:  # pragma: no cover - deleted between insert and read
                raise SequenceNotFound(name, "it was deleted while being created")
        return [stored[config.name] for config in items]

    def read(self, name: str) -> SequenceConfig | None:
        stored = self._find(name)
        return None if stored is None else self._remember(stored)

    def read_raw(self, name: str) -> dict[str, Any] | None:
        """The stored document as plain data, unvalidated (for repairs)."""
        stored = self._find(name)
        return None if stored is None else {**stored, "name": stored["_id"]}

    def _find(self, name: str) -> Mapping[str, Any] | None:
        """The stored document of ``name``, or None."""
        validate_name(name)
        return self._run(
            "read",
            f"reading sequence {name!r}",
            name,
            lambda: self.collection.find_one({"_id": name}),
        )

    def read_all(self) -> list[SequenceConfig]:
        rows = self._run("read", "reading sequences", None, lambda: list(self.collection.find({})))
        return sorted((self._remember(row) for row in rows), key=lambda row: row.name)

    def update(self, config: SequenceConfig) -> SequenceConfig:
        row = _document(config)
        del row["_id"], row["version"]
        stored = self._run(
            "update",
            f"updating sequence {config.name!r}",
            config.name,
            lambda: self.collection.find_one_and_update(
                {"_id": config.name},
                {"$set": row, "$inc": {"version": 1}},
                return_document=ReturnDocument.AFTER,
            ),
        )
        if stored is None:
            self._rows.pop(config.name, None)
            raise SequenceNotFound(config.name)
        return self._remember(stored)

    def delete(self, name: str) -> bool:
        """Remove a row; True if it existed."""
        validate_name(name)
        self._rows.pop(name, None)
        result = self._run(
            "delete",
            f"deleting sequence {name!r}",
            name,
            lambda: self.collection.delete_one({"_id": name}),
        )
        return result.deleted_count == 1

    def drop(self) -> None:
        """Drop the whole collection (tests, maintenance)."""
        self._rows.clear()
        self._run("drop", "dropping the sequence collection", None, lambda: self.collection.drop())

    def _remember(self, stored: Mapping[str, Any]) -> SequenceConfig:
        row = _config(stored)
        self._rows[row.name] = stored
        return row

    # reservation ------------------------------------------------------------

    def reserve(self, name: str, count: int) -> Block:
        validate_name(name)
        check_count(count)
        stored = self._rows.get(name)
        if stored is not None:
            block = self._increment(name, stored, count)
            if block is not None:
                return self._noticed(block)
            stored = None
        conflicts = 0
        while conflicts < self.max_retries:
            fresh = stored is None
            if stored is None:
                stored = self._fetch(name)
            try:
                block, new_current = plan_reservation(_config(stored), count)
            except SequenceExhausted:
                if fresh:
                    raise
                stored = None  # the remembered row may be out of date: look again
                continue
            updated = self._compare_and_set(name, stored, new_current)
            if updated is not None:
                self._rows[name] = updated
                self.reservations += 1
                return self._noticed(block)
            # A remembered row that lost was stale (another process reserved
            # since): read again at once. A freshly read row that lost means
            # real contention, so back off with jitter before trying again.
            stored = None
            if fresh:
                conflicts += 1
                time.sleep(min(0.2, 0.001 * 2 ** min(conflicts, 8)) * random.random())
        raise ReservationConflict(
            f"sequence {name!r}: {self.max_retries} reservations in a row collided with others; "
            "raise batch_count (fewer, larger reservations) or MongoStore(max_retries=...)",
            name=name,
        )

    def _noticed(self, block: Block) -> Block:
        """``block``, marked when the client now writes to another primary (a failover)."""
        if self.primary.observe(self._client) and not block.failover:
            return dataclasses.replace(block, failover=True)
        return block

    def replication_findings(self) -> list[tuple[str, str]]:
        """(level, message) pairs for ``doctor``: could a failover repeat values?"""
        hello = self._run("doctor", "asking the server who it is", None, self._hello)
        return replication_findings(hello, self.write_concern, self.read_concern)

    def _hello(self) -> Mapping[str, Any]:
        database = self.collection.database
        return dict(database.client.admin.command("hello"))

    def _increment(self, name: str, stored: Mapping[str, Any], count: int) -> Block | None:
        """Reserve with one ``$inc`` while the block fits below ``end``: no conflicts.

        The filter pins every setting the arithmetic depends on and bounds
        ``current`` so the block cannot be cut at ``end``; the document as it
        was before the increment then gives exactly the block
        ``plan_reservation`` would. ``None`` (settings changed, near the end,
        exhausted, or an image that is not this reservation's own) sends the
        caller to the compare-and-set path.
        """
        row = _config(stored)
        if count < 1 or row.next_value > row.last_value:
            return None
        highest_first = row.last_value - (count - 1) * row.step
        if highest_first < row.start:
            return None
        # $type: a current a shell rewrote as a double must not be incremented
        # (and then refused): it goes to the read-and-validate path instead.
        bounds: dict[str, Any] = {"$gte": row.start, "$lte": highest_first}
        if row.step > 1:
            if row.start < 0 or not self._has_mod:
                return None  # $mod truncates towards zero: leave negatives to the CAS path
            bounds["$mod"] = [row.step, row.start % row.step]  # a hand-edited current
        guard: dict[str, Any] = {
            "_id": name,
            "current": bounds,
            # Spelled as $or, not {"$type": [...]}, which mongomock cannot read.
            "$or": [{"current": {"$type": "int"}}, {"current": {"$type": "long"}}],
        }
        guard.update({field: stored[field] for field in _PLAN_FIELDS})
        token = uuid.uuid4().hex
        try:
            after = self._run(
                "reserve",
                f"reserving from sequence {name!r}",
                name,
                lambda: self.collection.find_one_and_update(
                    guard,
                    {
                        "$inc": {"current": count * row.step, "version": 1},
                        "$set": {"updated_at": utc_now(), "reserved_by": token},
                    },
                    return_document=ReturnDocument.AFTER,
                ),
            )
        except StoreUnavailable as exc:
            if "$mod" not in bounds or "$mod" not in str(exc):
                raise
            # A server without $mod (mongomock) rejected the filter before
            # writing anything: the compare-and-set path serves it from now on.
            self._has_mod = False
            return None
        if after is None:
            return None
        if after.get("reserved_by") != token:
            # The server returned a document another reservation had already
            # moved on (some MongoDB-compatible servers do not read the image
            # under the write lock): our range is unknown, so it is skipped,
            # a gap and never a duplicate, and the compare-and-set path runs.
            return None
        before = {
            **after,
            "current": after["current"] - count * row.step,
            "version": after["version"] - 1,
        }
        block, _ = plan_reservation(_config(before), count)
        self._rows[name] = after
        self.reservations += 1
        return block

    def _fetch(self, name: str) -> Mapping[str, Any]:
        stored = self._find(name)
        if stored is None:
            self._rows.pop(name, None)
            raise SequenceNotFound(name)
        return stored

    def _compare_and_set(
        self, name: str, stored: Mapping[str, Any], new_current: int
    ) -> dict[str, Any] | None:
        """Move ``current`` to ``new_current`` only if the row is still ``stored``."""
        guard = {"_id": name, "current": stored["current"], **_version_is(stored)}
        guard.update({field: stored[field] for field in _PLAN_FIELDS})
        return self._run(
            "reserve",
            f"reserving from sequence {name!r}",
            name,
            lambda: self.collection.find_one_and_update(
                guard,
                {"$set": {"current": new_current, "updated_at": utc_now()}, "$inc": {"version": 1}},
                return_document=ReturnDocument.AFTER,
            ),
        )

    def reserve_many(self, requests: list[tuple[str, int]]) -> list[Block | None]:
        """A block of many sequences in few round trips, each `reserve`'s compare-and-set.

        Rows are planned from the documents this store remembers (``load``
        and ``register_many`` leave every one; the others come in one
        ``find``), then written by one unordered ``bulk_write`` per
        `MANY_CHUNK` names: an ``UpdateOne`` filtered on the ``current``,
        ``version`` and settings planned from, at the store's write concern,
        so a block is used only once a failover cannot roll it back. When
        not every update matched, one ``find`` says which went (a row at the
        version this call wrote, with its token) and gives the others' rows
        to plan again, up to `MANY_ROUNDS` times. None for a row missing,
        invalid, exhausted or whose block would wrap (left to ``reserve``),
        for a name after its first, and for a row still moving under other
        writers. A failure after some blocks came back returns those (the
        rest None); before, it raises ``StoreUnavailable``.
        """
        items = check_requests(requests)
        out: list[Block | None] = [None] * len(items)
        wanted: dict[str, tuple[int, int]] = {}
        for at, (name, count) in enumerate(items):
            wanted.setdefault(name, (at, count))
        names = list(wanted)
        got: list[Block] = []
        try:
            for start in range(0, len(names), MANY_CHUNK):
                chunk = {name: wanted[name][1] for name in names[start : start + MANY_CHUNK]}
                self._reserve_chunk(chunk, got)
        except StoreUnavailable:
            if not got:
                raise
            log.debug("reserve_many: stopped after %d block(s); the rest reserve alone", len(got))
        if got and self.primary.observe(self._client):
            got = [dataclasses.replace(block, failover=True) for block in got]
        for block in got:
            out[wanted[block.name][0]] = block
        self.reservations += len(got)
        return out

    def _reserve_chunk(self, counts: dict[str, int], got: list[Block]) -> None:
        """Reserve from ``counts``' rows, a bulk write per round, adding to ``got`` the
        blocks that went (kept there when a later round fails)."""
        stored = self._rows_of(list(counts))
        for _ in range(MANY_ROUNDS):
            planned = _planned(stored, counts)
            if not planned:
                return
            went, stored = self._write_blocks(planned)
            got.extend(went)

    def _rows_of(self, names: list[str]) -> dict[str, Mapping[str, Any]]:
        """The remembered document of each name, the others read in one ``find``."""
        rows = {name: self._rows[name] for name in names if name in self._rows}
        unknown = [name for name in names if name not in rows]
        if unknown:
            found = self._run(
                "reserve",
                f"reading {len(unknown)} sequence(s) to reserve from",
                None,
                lambda: list(
                    self.collection.find({"_id": {"$in": unknown}}, batch_size=len(unknown))
                ),
            )
            rows.update((row["_id"], row) for row in found)
        return rows

    def _write_blocks(
        self, planned: dict[str, tuple[Block, Mapping[str, Any]]]
    ) -> tuple[list[Block], dict[str, Mapping[str, Any]]]:
        """Write every planned block in one bulk write: (blocks that went, the rows of
        those that did not, as read after it)."""
        token = uuid.uuid4().hex  # marks this call's writes, for the read that says which went
        now = utc_now()
        now = now.replace(microsecond=now.microsecond // 1000 * 1000)  # what MongoDB keeps
        changes = {
            name: {
                "current": block.last + block.step,
                "updated_at": now,
                "version": block.version,
                "reserved_by": token,
            }
            for name, (block, _) in planned.items()
        }
        updates = [
            UpdateOne(_unchanged(name, row), {"$set": changes[name]})
            for name, (_, row) in planned.items()
        ]
        found = self._bulk_reserve(list(planned), updates)
        went: list[Block] = []
        others: dict[str, Mapping[str, Any]] = {}
        for name, (block, stored) in planned.items():
            row = found.get(name, {}) if found is not None else changes[name]
            if row.get("reserved_by") == token and row.get("version") == block.version:
                self._rows[name] = {**stored, **changes[name]}
                went.append(block)
            elif row:
                others[name] = row
            else:
                self._rows.pop(name, None)  # deleted meanwhile
        return went, others

    def _bulk_reserve(
        self, names: list[str], updates: list[UpdateOne]
    ) -> dict[str, Mapping[str, Any]] | None:
        """Send ``updates`` (of the rows ``names``) in one unordered bulk write; None when
        every one went, else each row as it is now (a missing row absent)."""
        what = f"reserving from {len(updates)} sequence(s)"
        result = self._run(
            "reserve", what, None, lambda: self.collection.bulk_write(updates, ordered=False)
        )
        if result.modified_count == len(updates):
            return None
        found = self._run(
            "reserve",
            f"reading which of {len(names)} reservation(s) went",
            None,
            lambda: list(self.collection.find({"_id": {"$in": names}}, batch_size=len(names))),
        )
        return {row["_id"]: row for row in found}

    def release(self, block: Block) -> bool:
        validate_name(block.name)
        updated = self._run(
            "release",
            f"releasing a block of {block.name!r}",
            block.name,
            lambda: self.collection.find_one_and_update(
                {
                    "_id": block.name,
                    "current": block.last + block.step,
                    **_version_is({"version": block.version}),
                },
                {
                    "$set": {
                        "current": block.first,
                        "updated_at": utc_now(),
                        "version": block.version + 1,
                    }
                },
                return_document=ReturnDocument.AFTER,
            ),
        )
        if updated is None:
            return False
        self._rows[block.name] = updated
        return True

    def release_many(self, blocks: list[Block]) -> list[bool]:
        """``release`` of each block in one unordered ``bulk_write`` (one round trip).

        Each ``UpdateOne`` is the compare-and-set of `release`: ``current``
        and ``version`` must still be what the block left. A bulk write
        counts the updates without saying which went: when every block went
        (the common case at shutdown) that is exact; otherwise one ``find``
        of the rows tells, a row that went being at the version, ``current``
        and ``updated_at`` this call wrote. Not one transaction: a store
        failure part way may leave some blocks handed back and raises.
        """
        if not blocks:
            return []
        for block in blocks:
            validate_name(block.name)
        if len({block.name for block in blocks}) != len(blocks):
            return [self.release(block) for block in blocks]
        now = utc_now()
        updates = [
            UpdateOne(
                {
                    "_id": block.name,
                    "current": block.last + block.step,
                    **_version_is({"version": block.version}),
                },
                {"$set": {"current": block.first, "updated_at": now, "version": block.version + 1}},
            )
            for block in blocks
        ]

        def write() -> list[Mapping[str, Any]] | None:
            result = self.collection.bulk_write(updates, ordered=False)
            if result.modified_count == len(blocks):
                return None
            return list(
                self.collection.find(
                    {"_id": {"$in": [b.name for b in blocks]}},
                    {"current": 1, "version": 1, "updated_at": 1},
                    batch_size=len(blocks),
                )
            )

        found = self._run("release", f"releasing {len(blocks)} block(s)", None, write)
        if found is None:
            went = [True] * len(blocks)
        else:
            stored = {row["_id"]: row for row in found}
            went = [_released(stored.get(block.name), block, now) for block in blocks]
        for block, ok in zip(blocks, went, strict=True):
            if ok:
                self._rows.pop(block.name, None)  # read again on its next reservation
        return went

    def compare_and_set(self, row: SequenceConfig, version: int) -> SequenceConfig | None:
        document = _document(row)
        del document["_id"]
        document["version"] = version + 1

        def write() -> dict[str, Any] | None:
            updated = self.collection.find_one_and_update(
                {"_id": row.name, **_version_is({"version": version})},
                {"$set": document},
                return_document=ReturnDocument.AFTER,
            )
            if updated is None and self.collection.find_one({"_id": row.name}) is None:
                raise SequenceNotFound(row.name)
            return updated

        stored = self._run("compare_and_set", f"writing sequence {row.name!r}", row.name, write)
        if stored is None:
            self._rows.pop(row.name, None)
            return None
        return self._remember(stored)

    # lifecycle --------------------------------------------------------------

    # capabilities (autoseq.stores.capabilities) ---------------------------

    def worker_leases(self) -> WorkerLeases:
        """Snowflake worker-id leases in a ``sys_worker`` collection beside this one."""
        from autoseq.stores.mongo.workers import MongoWorkers

        return one_per_store(self, lambda: MongoWorkers(self))

    def gapless_engine(self) -> GaplessEngine:
        """Gapless values taken in the caller's session transaction."""
        from autoseq.stores.mongo import gapless as gapless_mongo

        return gapless_mongo

    def column_max(self, table: str, column: str) -> int | None:
        """The largest number in field ``column`` of collection ``table``, None when empty."""
        validate_collection_name(table)
        if not column or column.startswith("$") or "\x00" in column:
            raise UsageError(f"--column {column!r} is not a document field name")
        database = self.collection.database
        check_documents(database, table, column)
        top = database[table].find_one(
            {column: {"$type": "number"}}, sort=[(column, -1)], projection={column: 1}
        )
        if top is None:
            return None
        value: Any = top.get(column)
        if isinstance(value, float):
            raise UsageError(f"{table}.{column} holds a float ({value}); keys must be integers")
        return int(value)

    def stored_names(self) -> list[str]:
        """Every row's ``_id``, including rows that fail validation."""
        try:
            return sorted(str(doc["_id"]) for doc in self.collection.find({}, {"_id": 1}))
        except PyMongoError as exc:
            raise StoreUnavailable(f"reading sequence names failed: {exc}") from exc

    def location(self) -> str:
        """``database.collection``."""
        return f"{self.database_name}.{self.collection_name}"

    # lifecycle ------------------------------------------------------------

    def after_fork(self) -> None:
        # A MongoClient is not fork-safe: the child opens its own on first
        # use and leaves the parent's alone (closing it could disturb the
        # parent's sockets). Locks a parent thread held are replaced too.
        self._guard = threading.Lock()
        self._client = None
        self._collection = None
        self._rows = {}
        if self._reopened is not None:
            self._reopened.detach()  # the parent's client: never closed from here
            self._reopened = None

    def close(self) -> None:
        with self._guard:
            if self._owns_client and self._client is not None:
                self._client.close()
                self._client = None
            if self._reopened is not None:
                self._reopened.detach()  # closed above: the finalizer need not keep it
                self._reopened = None
            self._collection = None
            self._rows = {}


def _duplicate_of(client: pymongo.MongoClient[Any]) -> Callable[[], pymongo.MongoClient[Any]]:
    """A factory for a new client with the same settings as ``client``."""
    duplicate = getattr(client, "_duplicate", None)
    if duplicate is None:
        if isinstance(client, pymongo.MongoClient):  # pragma: no cover - pymongo 4 has it
            raise InvalidSequenceConfig(
                "this pymongo version cannot copy a MongoClient for a forked process; "
                "pass MongoStore a mongodb:// URL instead"
            )
        # A client with no sockets to share (mongomock's lives in memory): the
        # child keeps using its copy.
        return lambda: client
    return lambda: duplicate()


def _is_database(source: object) -> bool:
    """Whether ``source`` quacks like a pymongo ``Database`` (mongomock's does).

    Asked of the class: pymongo's client and database answer any attribute
    (a database or a collection of that name).
    """
    return all(hasattr(type(source), attribute) for attribute in ("client", "get_collection"))


def _is_client(source: object) -> bool:
    """Whether ``source`` quacks like a ``MongoClient`` (mongomock's does)."""
    return all(
        hasattr(type(source), attribute) for attribute in ("get_database", "get_default_database")
    )


def _document(config: SequenceConfig) -> dict[str, Any]:
    """The document of ``config`` exactly as MongoDB keeps it (milliseconds of ``updated_at``)."""
    row = config.as_row()
    now = utc_now()
    now = now.replace(microsecond=now.microsecond // 1000 * 1000)
    return {"_id": row.pop("name"), **row, "updated_at": now}


def _released(stored: Mapping[str, Any] | None, block: Block, now: datetime) -> bool:
    """Whether ``stored`` is the row ``block``'s hand-back at ``now`` wrote."""
    if stored is None:
        return False
    written = stored.get("updated_at")
    if isinstance(written, datetime):  # MongoDB keeps milliseconds
        written = written.replace(tzinfo=UTC) if written.tzinfo is None else written
        stamp = now.replace(microsecond=now.microsecond // 1000 * 1000)
        same_time = written == stamp
    else:
        same_time = False
    return (
        stored.get("version") == block.version + 1
        and stored.get("current") == block.first
        and same_time
    )


def _version_is(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A filter matching the row's version; a row from before versions counts as 0."""
    version = stored.get("version") or 0
    if version == 0:
        return {"$or": [{"version": 0}, {"version": {"$exists": False}}]}
    return {"version": version}


def _config(stored: Mapping[str, Any]) -> SequenceConfig:
    return SequenceConfig.from_row({**stored, "name": stored["_id"]})


def _unchanged(name: str, stored: Mapping[str, Any]) -> dict[str, Any]:
    """A filter matching ``name``'s row only while it is ``stored``: the same ``current``,
    version and settings, so a block planned from ``stored`` is what the server would plan.

    The version is pinned as read (absent: still absent), never as `_version_is`'s ``$or``:
    secantusdb then scans the collection for each update instead of using ``_id`` (200
    updates of a bulk write took 3.4 s on 1,000 rows instead of 0.3 s).
    """
    version = stored.get("version", {"$exists": False})
    guard = {"_id": name, "current": stored["current"], "version": version}
    guard.update({field: stored[field] for field in _PLAN_FIELDS})
    return guard


def _planned(
    stored: Mapping[str, Mapping[str, Any]], counts: Mapping[str, int]
) -> dict[str, tuple[Block, Mapping[str, Any]]]:
    """The block `MongoStore.reserve` would take of each name's ``stored`` row, with that row;
    a row missing, invalid, exhausted or about to wrap is left out (``reserve`` says why)."""
    planned: dict[str, tuple[Block, Mapping[str, Any]]] = {}
    for name, count in counts.items():
        row = stored.get(name)
        if row is None:
            continue
        try:
            block, _ = plan_reservation(_config(row), count)
        except (InvalidSequenceConfig, SequenceExhausted):
            continue
        if not block.cycled:
            planned[name] = (block, row)
    return planned


def row_document(config: SequenceConfig) -> dict[str, Any]:
    """The MongoDB document ``MongoStore`` stores for ``config`` (``_id`` = the name)."""
    return _document(config)


def hide_password(url: str) -> str:
    """``url`` with the password of its user part replaced by ``***``, for messages."""
    return re.sub(r"^([a-z+]+://[^:/@]*):[^@/]*@", r"\1:***@", url)


def ping(client: pymongo.MongoClient[Any], url: str) -> None:
    """Raise ``StoreUnavailable`` in one line unless the server ``client`` talks to answers.

    pymongo's own message carries the whole topology description; a person
    at a shell needs the address and the cause.
    """
    try:
        client.admin.command("ping")
    except PyMongoError as exc:
        raise unreachable(exc, url) from None


def unreachable(exc: BaseException, url: str) -> StoreUnavailable:
    """A one-line ``StoreUnavailable`` for ``exc``: the address and cause, not the topology."""
    cause = str(exc).split(", Timeout:", 1)[0]
    return StoreUnavailable(f"cannot reach MongoDB at {hide_password(url)}: {cause}")


def check_documents(database: Database[Any], collection: str, field: str) -> None:
    """Raise ``InvalidSequenceConfig`` for a collection or field that is not there (a typo).

    A collection that exists with no documents yet is not an error: there
    is nothing to start past. One whose documents all lack ``field`` is.
    """
    names = database.list_collection_names()
    if collection not in names:
        known = ", ".join(sorted(n for n in names if not n.startswith("system."))) or "none"
        raise InvalidSequenceConfig(
            f"no collection {collection!r} in database {database.name!r} "
            f"(its collections: {known}); check the collection name"
        )
    documents = database[collection]
    if documents.find_one({}, projection={"_id": 1}) is None:
        return
    if documents.find_one({field: {"$exists": True}}, projection={"_id": 1}) is None:
        raise InvalidSequenceConfig(
            f"no document in {database.name}.{collection} has a field {field!r}; "
            "check the field name"
        )


def validate_write_concern(value: object) -> str | int:
    """``value`` if it is ``"majority"`` or a number of members (1 or more), else raise."""
    if value == "majority":
        return "majority"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise InvalidSequenceConfig(
        f"write_concern={value!r}; use 'majority' (a reservation survives a failover) or a "
        "number of members that must have it (1: the primary alone, which a failover can roll "
        "back)"
    )


def validate_read_concern(value: object) -> str | None:
    """``value`` if it is one of `READ_CONCERNS` or None, else raise."""
    if value is None or (isinstance(value, str) and value in READ_CONCERNS):
        return value
    raise InvalidSequenceConfig(
        f"read_concern={value!r}; use one of {', '.join(READ_CONCERNS)}, or None for the "
        "server's default"
    )


class PrimaryWatch:
    """Which primary a client writes to: its replica set, election id and config version.

    pymongo keeps the primary's ``hello`` reply in its topology description
    (no round trip to look): a new ``electionId`` (or ``setVersion``) on the
    primary of the same set means another member was elected, a failover.
    """

    def __init__(self) -> None:
        self.identity: tuple[Any, ...] | None = None
        self._guard = threading.Lock()

    def observe(self, client: Any) -> bool:
        """Note the primary ``client`` sees now; True when it is another than before."""
        if not isinstance(client, pymongo.MongoClient):
            return False  # mongomock's: no servers, no elections
        return self.note(client.topology_description.server_descriptions().values())

    def note(self, servers: Any) -> bool:
        """Note the primary among ``servers`` (pymongo ``ServerDescription``); True if new."""
        primaries = [
            (server.replica_set_name, server.election_id, server.set_version)
            for server in servers
            if server.server_type == SERVER_TYPE.RSPrimary
        ]
        if len(primaries) != 1 or primaries[0][1] is None:
            return False  # a standalone, or the driver does not know one now
        with self._guard:
            before, self.identity = self.identity, primaries[0]
        if before is None or before == primaries[0]:
            return False
        log.warning(
            "MongoDB primary changed (replica set %s, election %s, version %s; was election "
            "%s, version %s): a failover; blocks reserved before are dropped",
            primaries[0][0],
            primaries[0][1],
            primaries[0][2],
            before[1],
            before[2],
        )
        return True


def replication_findings(
    hello: Mapping[str, Any], write_concern: str | int, read_concern: str | None
) -> list[tuple[str, str]]:
    """(level, message) pairs: could a failover repeat values, given the server's ``hello``?"""
    if "setName" not in hello:
        if hello.get("msg") == "isdbgrid":
            return [("ok", "a sharded cluster: each shard is a replica set; see its own check")]
        return [("ok", "a standalone server: no failover can roll a reservation back")]
    members = len(hello.get("hosts", [])) + len(hello.get("passives", []))
    found: list[tuple[str, str]] = []
    if write_concern != "majority":
        found.append(
            (
                "error",
                f"replica set {hello['setName']!r} ({members} member(s)) and the store writes "
                f"with w:{write_concern}: a failover can roll back a reservation the primary "
                "alone had, and hand its values out again; use "
                "MongoStore(write_concern='majority') (the default)",
            )
        )
    else:
        found.append(
            (
                "ok",
                f"replica set {hello['setName']!r} ({members} member(s)): reservations and "
                "leases wait for a majority (w:majority)",
            )
        )
    if read_concern in (None, "local"):
        found.append(
            (
                "warning",
                f"read concern {read_concern or 'the server default'}: a row read may be a "
                "write a failover rolls back; use MongoStore(read_concern='majority') "
                "(the default)",
            )
        )
    return found
