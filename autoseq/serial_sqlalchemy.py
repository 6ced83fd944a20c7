"""SQLAlchemy ``SerialField``: a string column filled with [`Serial`][autoseq.serial.Serial] values.

Re-exported by [`autoseq.sqlalchemy`][autoseq.sqlalchemy]; the same ``install()`` decides the
store, and the same listeners fill the column: a serial column is one more
`Target` (`SerialTarget`), so every
insert path that gives ``SequenceField`` its values gives a serial its own
(one ``next_many`` per serial per flush or statement; the column's Python
default one row at a time). A value the user set is kept. With ``gapless=True`` the
values are taken at flush or insert on the session's or statement's own
connection, several serials in one flush in name order
([`autoseq.stores.sql.gapless.lock_order`][autoseq.stores.sql.gapless.lock_order]).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.engine.default import DefaultExecutionContext
from sqlalchemy.orm import MappedColumn, mapped_column
from sqlalchemy.sql.schema import Column

from autoseq._sqlalchemy_compat import engine_of
from autoseq._sqlalchemy_target import Target, check_int
from autoseq.config import validate_name
from autoseq.errors import InvalidSequenceConfig
from autoseq.registry import SequenceRegistry
from autoseq.serial import Serial, template_length
from autoseq.stores.memory import MemoryStore

#: Key in ``Column.info`` under which a serial column's settings travel.
SERIAL_INFO_KEY = "autoseq_serial"


@dataclass(frozen=True)
class SerialSpec:
    """What a serial column was declared with; ``sequence=None`` means ``<table>.<column>``."""

    template: str
    sequence: str | None = None
    period: str | None = None
    tz: str | tzinfo = "UTC"
    start: int = 1
    step: int = 1
    batch_count: int = 100
    gapless: bool = False
    cycle: bool = False
    clock: Callable[[], datetime] | None = None
    #: A gapless integer sequence column (``SequenceField(gapless=True)``), not a string.
    integer: bool = False

    def __post_init__(self) -> None:
        if self.sequence is not None:
            validate_name(self.sequence)
        # refuse a bad template or setting where the column is declared
        self.build(SequenceRegistry(MemoryStore()), "placeholder", gapless=False)

    def build(
        self, registry: SequenceRegistry, name: str, *, gapless: bool | None = None
    ) -> Serial:
        """The [`Serial`][autoseq.serial.Serial] of this column on ``registry``."""
        return Serial(
            registry,
            name,
            self.template,
            period=self.period,
            tz=self.tz,
            start=self.start,
            step=self.step,
            batch_count=self.batch_count,
            gapless=self.gapless if gapless is None else gapless,
            cycle=self.cycle,
            clock=self.clock,
        )

    def name_for(self, column: Column[Any]) -> str:
        """The serial's name: ``sequence``, else ``<table>.<column>``."""
        if self.sequence is not None:
            return self.sequence
        table = getattr(column, "table", None)
        if table is None:
            raise InvalidSequenceConfig(
                f"column {column.key!r} is not attached to a table, so its serial cannot be "
                "named after it; pass sequence='name'"
            )
        return str(table.name) if self.integer else f"{table.name}.{column.key}"


def SerialField(
    template: str,
    *,
    sequence: str | None = None,
    period: str | None = None,
    tz: str | tzinfo = "UTC",
    start: int = 1,
    step: int = 1,
    batch_count: int = 100,
    gapless: bool = False,
    cycle: bool = False,
    clock: Callable[[], datetime] | None = None,
    **mapped_column_kwargs: Any,
) -> MappedColumn[Any]:
    """A ``String`` mapped column filled from a [`Serial`][autoseq.serial.Serial] at insert.

    Its length fits the longest serial the template makes. The remaining
    keyword arguments go to ``mapped_column`` (``unique``, ``index``...).
    """
    spec = SerialSpec(
        template, sequence, period, tz, start, step, batch_count, gapless, cycle, clock
    )
    return mapped_column(_string(spec), **_column_kwargs(spec, mapped_column_kwargs))


def gapless_sequence_field(
    sequence: str | None = None, *, start: int = 1, step: int = 1, **mapped_column_kwargs: Any
) -> MappedColumn[Any]:
    """``SequenceField(gapless=True)``: a ``BigInteger`` taken in the caller's transaction.

    The sequence (default: the table's name) is a row like any other; each
    value is taken at flush or insert on the session's or statement's own
    connection, as gapless serials are ([`autoseq.stores.sql.gapless`][autoseq.stores.sql.gapless]).
    """
    spec = SerialSpec("{n}", sequence, start=start, step=step, gapless=True, integer=True)
    kwargs = _column_kwargs(spec, mapped_column_kwargs)
    kwargs["autoincrement"] = False
    return mapped_column(sa.BigInteger, **kwargs)


def serial_column(name: str, template: str, **kwargs: Any) -> Column[str]:
    """The Core counterpart of ``SerialField``: ``Table(..., serial_column("number", "N{n}"))``."""
    names = SerialSpec.__dataclass_fields__
    spec = SerialSpec(template, **{k: kwargs.pop(k) for k in list(kwargs) if k in names})
    return Column(name, _string(spec), **_column_kwargs(spec, kwargs))


def _string(spec: SerialSpec) -> sa.String:
    return sa.String(template_length(spec.template, spec.period))


def _column_kwargs(spec: SerialSpec, kwargs: dict[str, Any]) -> dict[str, Any]:
    clash = [key for key in ("default", "insert_default", "server_default") if key in kwargs]
    if clash:
        raise InvalidSequenceConfig(
            f"a serial column sets {', '.join(clash)} itself (values come from the serial); "
            "remove the argument"
        )
    kwargs = dict(kwargs)
    kwargs["info"] = {**kwargs.get("info", {}), SERIAL_INFO_KEY: spec}
    kwargs.setdefault("nullable", False)
    kwargs["insert_default"] = _column_default
    return kwargs


def _column_default(context: DefaultExecutionContext) -> Any:
    """The column's Python-side default: the one of every generated column."""
    from autoseq.sqlalchemy import _column_default as generated_default

    return generated_default(context)


def serial_spec(column: Any) -> SerialSpec | None:
    """The ``SerialSpec`` a column carries, or ``None``."""
    info = getattr(column, "info", None)
    spec = info.get(SERIAL_INFO_KEY) if info else None
    return spec if isinstance(spec, SerialSpec) else None


# serials per registry -------------------------------------------------------------

_serials: dict[tuple[int, str], tuple[SequenceRegistry, Serial]] = {}
_guard = threading.Lock()
#: The integer-key serials (``SequenceField(gapless=True)``) and their column.
_integer_serials: weakref.WeakKeyDictionary[Serial, Column[Any]] = weakref.WeakKeyDictionary()


def _serial_for(registry: SequenceRegistry, column: Column[Any]) -> Serial:
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


def _check_explicit(value: object, column: Column[Any]) -> None:
    spec = serial_spec(column)
    if spec is not None and spec.integer:
        check_int(value, column)
        return
    if not isinstance(value, str):
        raise InvalidSequenceConfig(
            f"explicit value for {column.table.name}.{column.name} must be a str, got "
            f"{type(value).__name__} {value!r}; leave it unset (None) to take the next serial"
        )


def _take(serial: Serial, count: int, connection: Any) -> list[Any]:
    column = _integer_serials.get(serial)
    if column is not None and serial.gapless:
        # An integer key: a row created now starts past the keys already stored.
        from autoseq.sqlalchemy import _column_floor
        from autoseq.stores.sql import gapless

        bound = gapless.connection_of(connection, serial.name)
        store = gapless.check_store(serial.store, serial.name)
        engine = engine_of(bound)
        floor = functools.partial(_column_floor, engine, column, serial.name)
        return gapless.take(bound, store, serial.row_config(None), count, floor)
    values = serial.next_many(count, connection) if serial.gapless else serial.next_many(count)
    if column is not None:
        return [int(value) for value in values]
    return values


class SerialTarget(Target):
    """A serial column (or a gapless integer key), as `autoseq.sqlalchemy` fills it."""

    __slots__ = ()
    what = "a serial"

    @staticmethod
    def _spec(column: Column[Any]) -> SerialSpec:
        spec = serial_spec(column)
        assert spec is not None
        return spec

    @classmethod
    def name_of(cls, column: Column[Any]) -> str:
        return cls._spec(column).name_for(column)

    @classmethod
    def in_transaction(cls, column: Column[Any]) -> bool:
        return cls._spec(column).gapless

    @classmethod
    def check_explicit(cls, value: object, column: Column[Any]) -> None:
        _check_explicit(value, column)

    def resolve(self) -> Serial:
        assert self.installation is not None
        return _serial_for(self.installation.registry_for(self.bind), self.column)

    def take(self, n: int, connection: Connection | None) -> list[Any]:
        return _take(self.source(), n, connection)


__all__ = [
    "SERIAL_INFO_KEY",
    "SerialField",
    "SerialSpec",
    "SerialTarget",
    "gapless_sequence_field",
    "serial_column",
    "serial_spec",
]
