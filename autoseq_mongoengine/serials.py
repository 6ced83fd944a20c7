"""``SerialField``: a ``StringField`` filled with an `autoseq.Serial` value when written.

As ``SequenceField``: ``save()`` / ``objects.create()`` fill an empty serial
(``pre_save``), ``objects.insert([...])`` fills the whole bulk with one
``next_many`` per serial (``pre_bulk_insert``), and a value the user set is
kept. Serials come from the same ``sys_sequence`` collection as the
sequences, one row per period.

``gapless=True`` is refused (`autoseq_mongoengine.fields.refuse_gapless`):
mongoengine writes outside any session transaction.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from datetime import datetime, tzinfo
from typing import Any

from mongoengine import signals
from mongoengine.connection import DEFAULT_CONNECTION_NAME
from mongoengine.fields import StringField

from autoseq import SequenceRegistry, Serial
from autoseq.config import validate_name
from autoseq.serial import SerialOptions, template_length
from autoseq.stores.mongo import validate_collection_name
from autoseq_mongoengine import _compat
from autoseq_mongoengine.fields import owner_base_name, refuse_gapless
from autoseq_mongoengine.registry import sequences


class SerialField(StringField):  # type: ignore[misc]
    """A string field filled from a serial on save and insert: ``SerialField("T-{n:06d}")``.

    ``sequence_name`` defaults to ``"<collection>.<field>"``; ``collection_name``
    and ``db_alias`` say where ``sys_sequence`` lives, as for ``SequenceField``.
    The other keyword arguments are [`autoseq.Serial`][autoseq.serial.Serial]'s.
    """

    def __init__(
        self,
        template: str,
        *args: Any,
        sequence_name: str | None = None,
        collection_name: str | None = None,
        db_alias: str | None = None,
        period: str | None = None,
        tz: str | tzinfo = "UTC",
        start: int = 1,
        step: int = 1,
        batch_count: int = 100,
        gapless: bool = False,
        cycle: bool = False,
        clock: Callable[[], datetime] | None = None,
        **kwargs: Any,
    ) -> None:
        refuse_gapless(gapless, "SerialField")
        self.serial_options = SerialOptions(
            template,
            period=period,
            tz=tz,
            start=start,
            step=step,
            batch_count=batch_count,
            cycle=cycle,
            clock=clock,
        )
        self.serial_options.check(sequence_name or "x")  # refused where the document is declared
        self.template = template
        self.sequence_name = None if sequence_name is None else validate_name(sequence_name)
        self.collection_name = validate_collection_name(collection_name or "sys_sequence")
        self.db_alias = db_alias or DEFAULT_CONNECTION_NAME
        kwargs.setdefault("max_length", template_length(template, period))
        self._serials: dict[int, Serial] = {}
        self._guard = threading.Lock()
        super().__init__(*args, **kwargs)

    def get_sequence_name(self) -> str:
        """The serial's name (its rows are ``<name>:<period key>``)."""
        return self.sequence_name or f"{owner_base_name(self.owner_document)}.{self.name}"

    def serial(self) -> Serial:
        """The [`Serial`][autoseq.serial.Serial] serving this field in this process."""
        registry: SequenceRegistry = sequences.registry(self.db_alias, self.collection_name)
        found = self._serials.get(id(registry))
        if found is None or found.registry is not registry:
            with self._guard:
                found = self.serial_options.build(registry, self.get_sequence_name())
                self._serials[id(registry)] = found
        return found


_fields_of: weakref.WeakKeyDictionary[type, tuple[SerialField, ...]] = weakref.WeakKeyDictionary()


def serial_fields(document_class: type) -> tuple[SerialField, ...]:
    """The serial fields of a document class."""
    fields = _fields_of.get(document_class)
    if fields is None:
        declared = _compat.declared_fields(document_class)
        fields = tuple(f for f in declared.values() if isinstance(f, SerialField))
        _fields_of[document_class] = fields
    return fields


def _assign(document: Any, field: SerialField, value: str) -> None:
    _compat.assign(document, field.name, value)


def _fill_document(sender: Any, document: Any = None, **_kwargs: Any) -> None:
    if document is None:
        return
    for field in serial_fields(type(document)):
        if not _compat.stored(document, field.name):
            _assign(document, field, field.serial().next())


def _fill_bulk(sender: Any, documents: Iterable[Any] = (), **_kwargs: Any) -> None:
    pending: dict[int, tuple[SerialField, list[Any]]] = {}
    for document in documents:
        for field in serial_fields(type(document)):
            if not _compat.stored(document, field.name):
                pending.setdefault(id(field), (field, []))[1].append(document)
    for field, waiting in pending.values():
        values = field.serial().next_many(len(waiting))
        for document, value in zip(waiting, values, strict=True):
            _assign(document, field, value)


signals.pre_save.connect(_fill_document, weak=False)
signals.pre_bulk_insert.connect(_fill_bulk, weak=False)
