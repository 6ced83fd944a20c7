"""Every use autoseq_mongoengine makes of mongoengine's private internals, in one place.

mongoengine has no public API for what a field needs to fill a document
before it is written, so these helpers reach into its documents and
classes (``_data``, ``_mark_as_changed``, ``_meta``, ``_fields``,
``_get_collection``...). Tested with mongoengine 0.29.3 on pymongo 4.20.0;
a mongoengine release that renames one of them breaks only this module,
and ``tests/mongoengine/test_upstream.py`` runs mongoengine's own field
tests against the drop-in.
"""

from __future__ import annotations

from typing import Any


def declared_fields(document_class: type) -> dict[str, Any]:
    """The fields a document class declares, by attribute name."""
    fields: dict[str, Any] = getattr(document_class, "_fields", {})
    return fields


def stored(document: Any, name: str) -> Any:
    """The value a document holds for field ``name`` (None when unset), without conversion."""
    return document._data.get(name)


def assign(document: Any, name: str, value: Any) -> None:
    """Set field ``name`` and mark it changed, as a write of the document will need.

    Not ``setattr``: mongoengine takes a primary key set on a new document
    for "this document exists" and would save it as an update (an upsert of
    the changed fields) instead of an insert.
    """
    document._data[name] = value
    document._mark_as_changed(name)


def is_new(document: Any) -> bool:
    """True for a document not loaded from the database (not saved yet)."""
    return bool(getattr(document, "_created", True))


def is_initialised(document: Any) -> bool:
    """False while mongoengine is still building or loading the document."""
    return bool(getattr(document, "_initialised", False))


def changed_fields(document: Any) -> Any:
    """The names of the fields changed since the document was loaded."""
    return getattr(document, "_changed_fields", ())


def has_collection(document_class: type) -> bool:
    """False for an embedded document class: its values live inside other documents."""
    return hasattr(document_class, "_get_collection")


def is_abstract(document_class: Any) -> bool:
    """True for an abstract document class (``meta = {"abstract": True}``)."""
    return bool(document_class._meta.get("abstract"))


def id_field(document_class: Any) -> str:
    """The attribute name of a document class's primary key."""
    return str(document_class._meta["id_field"])


def collection(document_class: Any) -> Any:
    """The pymongo collection holding a document class's documents."""
    return document_class._get_collection()


def collection_name(document_class: Any) -> str:
    """The name of the collection a document class is stored in."""
    return str(document_class._get_collection_name())


def class_name(document_class: Any) -> str:
    """mongoengine's dotted class name (``Parent.Child`` for an inherited document)."""
    return str(document_class._class_name)
