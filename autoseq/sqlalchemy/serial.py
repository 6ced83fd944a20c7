"""Serial columns' values: one [`Serial`][autoseq.serial.Serial] per column and registry.

A ``SerialField`` (declared in `autoseq.sqlalchemy.columns`) is filled by the
same listeners as every generated column, through its `SerialTarget`
(`autoseq.sqlalchemy.targets`): one ``next_many`` per serial per flush or
statement, the column's Python default one row at a time. With
``gapless=True`` the values are taken at flush or insert on the session's or
statement's own connection, several serials in one flush in name order
([`autoseq.stores.sql.gapless.lock_order`][autoseq.stores.sql.gapless.lock_order]).
A ``SequenceField(gapless=True)`` is such a serial with an integer key.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

from sqlalchemy.sql.schema import Column

from autoseq.registry import SequenceRegistry
from autoseq.serial import Serial
from autoseq.sqlalchemy.compat import engine_of
from autoseq.sqlalchemy.registries import column_floor
from autoseq.sqlalchemy.specs import serial_spec

_serials: dict[tuple[int, str], tuple[SequenceRegistry, Serial]] = {}
_guard = threading.Lock()
#: The integer-key serials (``SequenceField(gapless=True)``) and their column.
_integer_serials: weakref.WeakKeyDictionary[Serial, Column[Any]] = weakref.WeakKeyDictionary()


def serial_for(registry: SequenceRegistry, column: Column[Any]) -> Serial:
    """The serial of serial column ``column`` on ``registry``, made on first use."""
    spec = serial_spec(column)
    assert spec is not None
    name = spec.name_for(column)
    key = (id(registry), name)
    found = _serials.get(key)
    if found is not None and found[0] is registry:
        return found[1]
    with _guard:
        found = _serials.get(key)
        if found is None or found[0] is not registry:
            found = (registry, spec.build(registry, name))
            _serials[key] = found
            if spec.integer:
                _integer_serials[found[1]] = column
        return found[1]


def take(serial: Serial, count: int, connection: Any) -> list[Any]:
    """``count`` values of ``serial``; a gapless one in ``connection``'s transaction."""
    column = _integer_serials.get(serial)
    if column is not None and serial.gapless:
        # An integer key: a row created now starts past the keys already stored.
        from autoseq.stores.sql import gapless

        bound = gapless.connection_of(connection, serial.name)
        store = gapless.check_store(serial.store, serial.name)
        engine = engine_of(bound)
        floor = functools.partial(column_floor, engine, column, serial.name)
        return gapless.take(bound, store, serial.row_config(None), count, floor)
    values = serial.next_many(count, connection) if serial.gapless else serial.next_many(count)
    if column is not None:
        return [int(value) for value in values]
    return values


__all__ = ["serial_for", "take"]
