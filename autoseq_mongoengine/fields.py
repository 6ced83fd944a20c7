"""``SequenceField``: mongoengine's ``SequenceField``, batched from ``sys_sequence``.

mongoengine's own field takes one ``findAndModify`` per value, and takes it
when the attribute is merely read. This one takes values from a
[`SequenceLock`][autoseq.lock.SequenceLock] (one reservation per block) and only when a
document is written:

* ``Document.save()`` (and ``objects.create()``): the new document's empty
  sequence fields are filled before ``pre_save`` is sent (``Document.save``
  is wrapped once, at import, so every receiver sees them), and a primary
  key taken this way is inserted, not upserted; a loaded document gets a
  value only for a field the user set to ``None``, never for one that was
  not loaded (``only()``, ``exclude()``);
* ``objects.insert([...])``: a ``pre_bulk_insert`` receiver fills the whole
  bulk with one ``next_many`` per sequence, about N / block reservations;
* anything else that serialises an unsaved document for writing
  (``to_mongo()``, an embedded document): ``generate()``, one value, so no
  document is ever written without its value.

Reading the attribute of an unsaved document gives ``None`` and costs
nothing. A value the user set is kept.
"""

from __future__ import annotations

import contextvars
import dataclasses
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from mongoengine import signals
from mongoengine.base import BaseField
from mongoengine.connection import DEFAULT_CONNECTION_NAME, get_db
from mongoengine.document import Document
from pymongo.errors import PyMongoError

from autoseq import maintenance
from autoseq.config import MAX_VALUE, SequenceConfig, validate_name
from autoseq.errors import (
    GaplessUnavailable,
    InvalidSequenceConfig,
    SequenceExhausted,
    SequenceNotFound,
    StoreUnavailable,
)
from autoseq.lock import BufferPolicy, SequenceLock
from autoseq.stores.mongo import MongoStore, validate_collection_name
from autoseq_mongoengine import _compat
from autoseq_mongoengine.counters import convert_builtin_row, max_stored_value
from autoseq_mongoengine.registry import sequences


def refuse_gapless(gapless: object, field: str) -> None:
    """Refuse ``gapless=True``: no mongoengine write can join a session transaction.

    mongoengine (up to 0.29, the newest release) passes no ``session`` to
    pymongo on ``save()`` or ``insert()``. A number taken in the caller's
    transaction would then be given back when that transaction aborts while
    the document already holds it outside it, so the next document would get
    the same number; taken outside a transaction it would be lost when the
    write fails. Either breaks what gapless promises, so it is refused.
    """
    if gapless is False:
        return
    if gapless is not True:
        raise InvalidSequenceConfig(f"gapless must be True or False, got {gapless!r}")
    raise GaplessUnavailable(
        f"autoseq_mongoengine.{field}(gapless=True): mongoengine saves outside any session "
        "transaction (it passes no session to pymongo), so a number could be neither given "
        "back when a save fails nor kept when the caller's transaction aborts; use "
        "gapless=False (block-served, gaps possible), autoseq.Serial(MongoStore(db), ..., "
        "gapless=True).next(session) with pymongo writes in that session, or a SQL database"
    )


class SequenceField(BaseField):  # type: ignore[misc]
    """An integer field filled from a named sequence in blocks; see the module docstring.

    The first four arguments are mongoengine's: ``collection_name`` (where
    sequences live, default ``"sys_sequence"``), ``db_alias`` (the connection,
    default mongoengine's default alias), ``sequence_name`` and
    ``value_decorator`` (applied to each value, e.g. ``str``). The sequence
    name defaults to the document's collection name for the primary key and
    to ``"<collection>.<field>"`` for any other field. ``start``, ``end``,
    ``step``, ``batch``, ``batch_count`` and ``cycle`` create the sequence's
    row on first use; a row that exists keeps its own settings. ``policy``
    tunes buffering ([`BufferPolicy`][autoseq.lock.BufferPolicy]).
    """

    _auto_gen = True
    COLLECTION_NAME = "sys_sequence"
    VALUE_DECORATOR: Callable[[int], Any] = int

    def __init__(
        self,
        collection_name: str | None = None,
        db_alias: str | None = None,
        sequence_name: str | None = None,
        value_decorator: Callable[[int], Any] | None = None,
        *args: Any,
        start: int = 1,
        end: int = MAX_VALUE,
        step: int = 1,
        batch: bool = True,
        batch_count: int = 100,
        cycle: bool = False,
        policy: BufferPolicy | None = None,
        gapless: bool = False,
        **kwargs: Any,
    ) -> None:
        refuse_gapless(gapless, "SequenceField")
        self.collection_name = validate_collection_name(collection_name or self.COLLECTION_NAME)
        self.db_alias = db_alias or DEFAULT_CONNECTION_NAME
        self.sequence_name = None if sequence_name is None else validate_name(sequence_name)
        self.value_decorator: Callable[[int], Any] = (
            value_decorator if callable(value_decorator) else type(self).VALUE_DECORATOR
        )
        self.start, self.end, self.step = start, end, step
        self.batch, self.batch_count, self.cycle = batch, batch_count, cycle
        self.policy = policy
        self._resolved_name: str | None = None
        # Refuses bad settings at declaration; each row's config is a copy renamed.
        self._template = SequenceConfig(
            sequence_name or "placeholder",
            start=start,
            end=end,
            step=step,
            batch=batch,
            batch_count=batch_count,
            cycle=cycle,
        )
        super().__init__(*args, **kwargs)

    # naming -----------------------------------------------------------------

    def get_sequence_name(self) -> str:
        """The name of this field's row in ``sys_sequence``."""
        if self.sequence_name:
            return self.sequence_name
        if self._resolved_name is None:
            base = owner_base_name(self.owner_document)
            self._resolved_name = validate_name(base if self.primary_key else f"{base}.{self.name}")
        return self._resolved_name

    def builtin_counter_id(self) -> str:
        """The ``_id`` mongoengine's own SequenceField would use in ``mongoengine.counters``."""
        return f"{self.sequence_name or owner_base_name(self.owner_document)}.{self.name}"

    def sequence_config(self) -> SequenceConfig:
        """The row this field creates when its sequence does not exist yet."""
        return dataclasses.replace(self._template, name=self.get_sequence_name())

    def store(self) -> MongoStore:
        """The store holding this field's sequence (on the field's connection alias)."""
        return sequences.store(self.db_alias, self.collection_name)

    def lock(self) -> SequenceLock:
        """The lock serving this field's values in this process."""

        def serving() -> SequenceLock:
            return sequences.lock(
                self.db_alias,
                self.collection_name,
                self.sequence_config(),
                self.policy,
                self.stored_max,
            )

        try:
            return serving()
        except InvalidSequenceConfig:
            # A row in mongoengine's own counter layout under our name (a
            # shared collection_name): take it over, then serve from it.
            if not convert_builtin_row(
                get_db(self.db_alias),
                self.collection_name,
                self.sequence_config(),
                self.stored_max,
            ):
                raise
            return serving()

    def _stored_in(self) -> Any:
        """The document class whose collection holds this field's values (None: unknown)."""
        document = self.owner_document
        if document is None or not _compat.has_collection(document):
            return None  # an embedded document: its values live inside other documents
        if _compat.is_abstract(document):
            return None
        return document

    def stored_max(self) -> int | None:
        """The largest value of this field already stored in the documents (None if none).

        Asked when the sequence's row is missing (first use, a dropped
        ``sys_sequence``), so the row starts past documents already there.
        A decorated field (values stored as strings) is scanned.
        """
        document = self._stored_in()
        if document is None:
            return None
        try:
            return max_stored_value(
                _compat.collection(document),
                self.db_field,
                numeric_only=self.value_decorator is int,
            )
        except PyMongoError as exc:
            raise StoreUnavailable(
                f"reading the largest {document.__name__}.{self.name} failed: {exc}",
                name=self.get_sequence_name(),
            ) from exc

    # values -----------------------------------------------------------------

    def __set__(self, instance: Any, value: Any) -> None:
        # As mongoengine's own field: a stored document whose value is set to
        # None gets the next value at once, so reading it back shows the new
        # value. A new document, or one being built or loaded (not yet
        # _initialised), keeps None until save: a value is never taken on read.
        if (
            value is None
            and _compat.is_initialised(instance)
            and not _compat.is_new(instance)
            and isinstance(instance, Document)
        ):
            value = self._take_decorated()
        super().__set__(instance, value)

    def generate(self) -> Any:
        """The next value, decorated (one value; saves and inserts take theirs in bulk).

        ``None`` while a loaded document that lacks this field (``only()``,
        ``exclude()``) is being saved: mongoengine asks every empty
        auto-generated field for a value when it serialises a document, and
        that value must neither be written nor burned.
        """
        if self in _keeping.get():
            return None
        return self.value_decorator(self._take(1)[0])

    def generate_many(self, n: int) -> list[Any]:
        """``n`` values, decorated, from about n / block reservations."""
        return [self.value_decorator(value) for value in self._take(n)]

    def _take_decorated(self) -> Any:
        return self.value_decorator(self._take(1)[0])

    def _take(self, n: int) -> list[int]:
        try:
            return self.lock().next_many(n)
        except SequenceNotFound:
            # The row went away under a running process (a test dropped the
            # database or the collection): take a fresh lock, which creates
            # the row again past the documents that are still there.
            sequences.forget(self.db_alias, self.collection_name, self.get_sequence_name())
            return self.lock().next_many(n)

    def get_next_value(self) -> Any:
        """The value the next document saved by this process will get; consumes nothing.

        That is the next value this process has buffered, else the stored
        row's next unreserved value (``start`` when there is no row yet). As
        with mongoengine's field, another process may take it first.
        """
        name = self.get_sequence_name()
        buffered = sequences.peek(self.db_alias, self.collection_name, name)
        if buffered is not None:
            return self.value_decorator(buffered)
        row = self.store().read(name)
        if row is None:
            return self.value_decorator(self.start)
        if row.exhausted:
            if not row.cycle:
                raise SequenceExhausted(name, row.next_value, row.end)
            return self.value_decorator(row.start)
        return self.value_decorator(row.next_value)

    def set_next_value(self, value: Any, *, force: bool = False) -> Any:
        """Record ``value`` as the last value issued: the next document gets ``value + step``.

        This is what mongoengine's ``set_next_value`` does (it stores the
        counter, which is then incremented), so ``set_next_value(max_id)``
        after an import keeps working. Unlike it, the write is a
        compare-and-set on the row's version ([`autoseq.maintenance`][autoseq.maintenance]),
        safe beside saves in other processes, and moves forward only: a
        value behind what was already issued raises ``ValueMovesBackward``
        unless ``force=True`` (only with every writer stopped), or unless no
        stored document holds a value of the field (mongoengine's reset after
        ``drop_collection()``). Never at or below a value already stored, even
        forced. Processes that already hold a block keep serving it; this one
        drops its own, and first hands back its unserved blocks (the current
        and a prefetched one) with a compare-and-set, so ``set_next_value(1000)``
        after ten saves is accepted though this process holds 11..1700. Refused
        when another process reserved after those blocks: it may hold values
        at or above the new one.
        """
        if isinstance(value, bool):
            raise InvalidSequenceConfig(f"set_next_value needs an integer value, got {value!r}")
        try:
            last = int(value)
        except (TypeError, ValueError):
            raise InvalidSequenceConfig(
                f"set_next_value needs an integer value, got {value!r}"
            ) from None
        if isinstance(value, float) and value != last:
            raise InvalidSequenceConfig(f"set_next_value needs an integer value, got {value!r}")
        name = self.get_sequence_name()
        store = self.store()
        floor = self.stored_max()
        # mongoengine's reset idiom (drop_collection(), then set_next_value(0))
        # moves back over values no stored document holds any more.
        restart = floor is None and self._stored_in() is not None
        row = store.read(name) or store.create(self.sequence_config())
        current = maintenance.first_value_after(row, last)
        if last < row.start - row.step or current > row.last_value:
            raise InvalidSequenceConfig(
                f"sequence {name!r}: set_next_value({last}) would make the next value "
                f"{current}, outside [start={row.start}, end={row.end}]; "
                "choose a value in range or change start/end first"
            )
        force = force or restart
        # Not only when ``current`` is behind the row read above: a prefetch
        # in flight may move the row on after that read.
        if not force and (floor is None or current > floor):
            self._hand_back_blocks(name)
        maintenance.set_current(store, name, current, force=force, floor=floor)
        sequences.forget(self.db_alias, self.collection_name, name)
        return self.value_decorator(last)

    def _hand_back_blocks(self, name: str) -> None:
        """Give this process's unserved blocks of ``name`` back before moving its row back.

        The row's ``current`` counts what this process reserved ahead (its
        block, a prefetched one: 11..1700 after ten saves), so a move to
        1001 would look like going behind values in use. Waits for a
        prefetch in flight; the compare-and-set misses (blocks kept away as
        gaps) when another process reserved after them.
        """
        sequences.hand_back(self.db_alias, self.collection_name, name)

    # mongoengine hooks ------------------------------------------------------

    def to_python(self, value: Any) -> Any:
        return value

    def prepare_query_value(self, op: str, value: Any) -> Any:
        # As mongoengine's field: query values get the decorator, so a
        # str-decorated field can be queried with an int.
        return None if value is None else self.value_decorator(value)


def owner_base_name(owner: Any) -> str:
    """The base of mongoengine's default counter name for a field of ``owner``.

    The collection name of a concrete document; for an abstract document
    (or an embedded one) its class name in snake case, shared by every
    document inheriting the field.
    """
    if owner is None:
        raise InvalidSequenceConfig(
            "this SequenceField is not attached to a document; declare it on a Document "
            "or pass sequence_name='name'"
        )
    if issubclass(owner, Document) and not _compat.is_abstract(owner):
        return _compat.collection_name(owner)
    return (
        "".join(f"_{c}" if c.isupper() else c for c in _compat.class_name(owner)).strip("_").lower()
    )


_fields_of: weakref.WeakKeyDictionary[type, tuple[SequenceField, ...]] = weakref.WeakKeyDictionary()


def sequence_fields(document_class: type) -> tuple[SequenceField, ...]:
    """The autoseq sequence fields of a document class."""
    fields = _fields_of.get(document_class)
    if fields is None:
        declared = _compat.declared_fields(document_class)
        fields = tuple(f for f in declared.values() if isinstance(f, SequenceField))
        _fields_of[document_class] = fields
    return fields


def _assign(document: Any, field: SequenceField, value: Any) -> None:
    _compat.assign(document, field.name, value)


def _fill_document(sender: Any, document: Any = None, **_kwargs: Any) -> bool:
    """Give a document its missing values; True when its primary key was one of them.

    A new document gets every empty sequence field. A loaded one gets only
    the fields the user emptied (set to None): a field that is empty
    because it was not loaded (``only()``, ``exclude()``) keeps its stored
    value.
    """
    if document is None:
        return False
    new = _compat.is_new(document)
    changed = () if new else _compat.changed_fields(document)
    primary = False
    for field in sequence_fields(type(document)):
        if _compat.stored(document, field.name) is None and (new or field.name in changed):
            _assign(document, field, field._take_decorated())
            primary = primary or field.primary_key
    return primary


def _fill_bulk(sender: Any, documents: Iterable[Any] = (), **_kwargs: Any) -> None:
    pending: dict[int, tuple[SequenceField, list[Any]]] = {}
    for document in documents:
        for field in sequence_fields(type(document)):
            if _compat.stored(document, field.name) is None:
                pending.setdefault(id(field), (field, []))[1].append(document)
    for field, waiting in pending.values():
        for document, value in zip(waiting, field.generate_many(len(waiting)), strict=True):
            _assign(document, field, value)


_keeping: contextvars.ContextVar[frozenset[SequenceField]] = contextvars.ContextVar(
    "autoseq_keeping", default=frozenset()
)
_save_without_autoseq = Document.save


def _save(document: Any, *args: Any, **kwargs: Any) -> Any:
    """``Document.save`` with the sequence values in place before any ``pre_save`` receiver.

    blinker calls receivers in no fixed order, so values assigned by a
    receiver of our own could come after a user's. A new document whose
    primary key autoseq just took is saved with ``force_insert``: the key
    is fresh, so mongoengine's replace-then-insert (an upsert, two round
    trips) would only find nothing to replace.
    """
    fields = sequence_fields(type(document))
    if not fields:
        return _save_without_autoseq(document, *args, **kwargs)
    if _fill_document(None, document) and not args and "force_insert" not in kwargs:
        kwargs["force_insert"] = True
    keep = frozenset(field for field in fields if _compat.stored(document, field.name) is None)
    if not keep:
        return _save_without_autoseq(document, *args, **kwargs)
    token = _keeping.set(keep)
    try:
        return _save_without_autoseq(document, *args, **kwargs)
    finally:
        _keeping.reset(token)


Document.save = _save
# Still needed: a subclass whose save() does not call Document.save, and
# objects.create(); a document already filled by _save is left as it is.
signals.pre_save.connect(_fill_document, weak=False)
signals.pre_bulk_insert.connect(_fill_bulk, weak=False)
