"""``SnowflakeField``: a mongoengine field holding a snowflake id, taken when a document is written.

Worker ids are leased from the ``sys_worker`` collection beside the field's
``sys_sequence`` (same connection alias and database), one generator per
layout and store. As with [`SequenceField`][autoseq_mongoengine.fields.SequenceField], the
id is assigned on ``save()`` (``pre_save``), on ``objects.insert([...])``
(``pre_bulk_insert``) and by ``to_mongo()`` of an unsaved document; reading
the attribute of an unsaved document gives ``None``. A value the user set is
kept.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

from mongoengine import signals
from mongoengine.base import BaseField
from mongoengine.connection import DEFAULT_CONNECTION_NAME

from autoseq.snowflake import SharedSnowflakes, Snowflake
from autoseq.stores.mongo import MongoStore, validate_collection_name
from autoseq_mongoengine import _compat
from autoseq_mongoengine.registry import sequences

_generators = SharedSnowflakes()


def generator(store: MongoStore, layout: str = "default") -> Snowflake:
    """The generator of ``layout`` leasing from ``store`` (shared in this process)."""
    return _generators.get(store, layout)


def close_generators() -> None:
    """Close every generator (releasing its worker id); tests and shutdown."""
    _generators.close()


class SnowflakeField(BaseField):  # type: ignore[misc]
    """A 64-bit snowflake id, assigned when the document is first written.

    ``collection_name`` and ``db_alias`` say where the worker leases live
    (beside that ``sys_sequence``; defaults as for ``SequenceField``);
    ``layout`` names the snowflake layout.
    """

    _auto_gen = True  # to_mongo() of an unsaved document calls generate()

    def __init__(
        self,
        collection_name: str | None = None,
        db_alias: str | None = None,
        *args: Any,
        layout: str = "default",
        **kwargs: Any,
    ) -> None:
        self.collection_name = validate_collection_name(collection_name or "sys_sequence")
        self.db_alias = db_alias or DEFAULT_CONNECTION_NAME
        self.layout = layout
        super().__init__(*args, **kwargs)

    def generator(self) -> Snowflake:
        """This field's generator in this process."""
        return generator(sequences.store(self.db_alias, self.collection_name), self.layout)

    def generate(self) -> int:
        """A new id."""
        return self.generator().next()

    def to_python(self, value: Any) -> Any:
        return value

    def validate(self, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.error(f"a snowflake id is an int, got {type(value).__name__} {value!r}")

    def prepare_query_value(self, op: str, value: Any) -> Any:
        return None if value is None else int(value)


_fields_of: weakref.WeakKeyDictionary[type, tuple[SnowflakeField, ...]] = (
    weakref.WeakKeyDictionary()
)


def snowflake_fields(document_class: type) -> tuple[SnowflakeField, ...]:
    """The snowflake fields of a document class."""
    fields = _fields_of.get(document_class)
    if fields is None:
        declared = _compat.declared_fields(document_class)
        fields = tuple(f for f in declared.values() if isinstance(f, SnowflakeField))
        _fields_of[document_class] = fields
    return fields


def _assign(document: Any, field: SnowflakeField, value: int) -> None:
    _compat.assign(document, field.name, value)


def _fill_document(sender: Any, document: Any = None, **_kwargs: Any) -> None:
    if document is None:
        return
    for field in snowflake_fields(type(document)):
        if _compat.stored(document, field.name) is None:
            _assign(document, field, field.generate())


def _fill_bulk(sender: Any, documents: Iterable[Any] = (), **_kwargs: Any) -> None:
    for document in documents:
        _fill_document(sender, document)


signals.pre_save.connect(_fill_document, weak=False)
signals.pre_bulk_insert.connect(_fill_bulk, weak=False)

__all__ = ["SnowflakeField", "close_generators", "generator", "snowflake_fields"]
