"""Declaring generated columns: ``SequenceField``, ``SerialField``, ``SnowflakeField``.

Each declaration is an ordinary ``BigInteger`` (or ``String``) column that
carries its spec in ``Column.info`` (`autoseq.sqlalchemy.specs`) and has the
listeners' `column_default` as its Python-side default; ``install()`` makes
the listeners fill it on every insert path. The Core counterparts
(``sequence_column``, ``serial_column``) build a ``Column`` for a ``Table``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, tzinfo
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import MappedColumn, mapped_column
from sqlalchemy.sql.schema import Column

from autoseq.config import MAX_VALUE
from autoseq.errors import InvalidSequenceConfig
from autoseq.serial import template_length
from autoseq.sqlalchemy.listeners import column_default
from autoseq.sqlalchemy.specs import (
    INFO_KEY,
    RESERVED_KWARGS,
    SERIAL_INFO_KEY,
    SNOWFLAKE_INFO_KEY,
    SequenceSpec,
    SerialSpec,
    SnowflakeSpec,
)

# sequence keys -------------------------------------------------------------------


def SequenceField(
    sequence: str | None = None,
    *,
    start: int = 1,
    end: int = MAX_VALUE,
    step: int = 1,
    batch: bool = True,
    batch_count: int = 100,
    cycle: bool = False,
    gapless: bool = False,
    **mapped_column_kwargs: Any,
) -> MappedColumn[Any]:
    """A ``BigInteger`` mapped column filled from sequence ``sequence`` (default: the table).

    The remaining keyword arguments go to ``mapped_column`` (``primary_key``,
    ``unique``, ``index``, ``nullable``...). The column gets no database-side
    autoincrement: values always come from the sequence or from the user.
    A primary key is ``INTEGER`` on SQLite, where that makes it the rowid.
    ``gapless=True`` takes each value in the caller's transaction instead of
    from a block (docs/serials.md); it takes ``start`` and ``step`` only.
    """
    if gapless:
        if end != MAX_VALUE or cycle:
            raise InvalidSequenceConfig(
                "SequenceField(gapless=True) takes start and step only: end and cycle "
                "are not supported for gapless sequences"
            )
        return gapless_sequence_field(sequence, start=start, step=step, **mapped_column_kwargs)
    spec = SequenceSpec(sequence, start, end, step, batch, batch_count, cycle)
    return mapped_column(
        _key_type(mapped_column_kwargs), **_sequence_kwargs(spec, mapped_column_kwargs)
    )


def sequence_column(
    name: str,
    sequence: str | None = None,
    *,
    start: int = 1,
    end: int = MAX_VALUE,
    step: int = 1,
    batch: bool = True,
    batch_count: int = 100,
    cycle: bool = False,
    **column_kwargs: Any,
) -> Column[int]:
    """The Core counterpart of ``SequenceField``: ``Table("orders", md, sequence_column("id"))``."""
    spec = SequenceSpec(sequence, start, end, step, batch, batch_count, cycle)
    return Column(name, _key_type(column_kwargs), **_sequence_kwargs(spec, column_kwargs))


#: ``BIGINT``, but ``INTEGER`` on SQLite: there an ``INTEGER PRIMARY KEY`` is the
#: rowid, one B-tree per row, where a ``BIGINT`` key adds a unique index (both
#: hold 64 bits). Alembic keeps an older ``BIGINT`` key as it is (see
#: ``autoseq.sqlalchemy.alembic.keep_sqlite_integer_keys``).
_ROWID_KEY = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _key_type(column_kwargs: Mapping[str, Any]) -> sa.types.TypeEngine[int]:
    """The type of a sequence column: ``_ROWID_KEY`` for a primary key, else ``BigInteger``."""
    return _ROWID_KEY if column_kwargs.get("primary_key") else sa.BigInteger()


def _sequence_kwargs(spec: SequenceSpec, kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs = _filled_kwargs(
        kwargs,
        INFO_KEY,
        spec,
        "a sequence column",
        "values come from the sequence",
        RESERVED_KWARGS,
        " (with MappedAsDataclass, pass init=False)",
    )
    kwargs["autoincrement"] = False
    return kwargs


def _filled_kwargs(
    kwargs: dict[str, Any],
    info_key: str,
    spec: object,
    what: str,
    why: str,
    reserved: tuple[str, ...],
    hint: str = "",
) -> dict[str, Any]:
    """The column arguments of ``what`` (a column autoseq fills at insert), carrying ``spec``.

    Refuses an argument of ``reserved``, which the column sets itself (``why``).
    """
    clash = [key for key in reserved if key in kwargs]
    if clash:
        raise InvalidSequenceConfig(
            f"{what} sets {', '.join(clash)} itself ({why}); remove the argument{hint}"
        )
    kwargs = dict(kwargs)
    kwargs["info"] = {**kwargs.get("info", {}), info_key: spec}
    kwargs.setdefault("nullable", False)
    kwargs["insert_default"] = column_default
    return kwargs


# serials ----------------------------------------------------------------------------


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
        template, period, tz, start, step, batch_count, gapless, cycle, clock, sequence
    )
    return mapped_column(_string(spec), **_serial_kwargs(spec, mapped_column_kwargs))


def gapless_sequence_field(
    sequence: str | None = None, *, start: int = 1, step: int = 1, **mapped_column_kwargs: Any
) -> MappedColumn[Any]:
    """``SequenceField(gapless=True)``: a ``BigInteger`` taken in the caller's transaction.

    The sequence (default: the table's name) is a row like any other; each
    value is taken at flush or insert on the session's or statement's own
    connection, as gapless serials are ([`autoseq.stores.sql.gapless`][autoseq.stores.sql.gapless]).
    """
    spec = SerialSpec("{n}", sequence=sequence, start=start, step=step, gapless=True, integer=True)
    kwargs = _serial_kwargs(spec, mapped_column_kwargs)
    kwargs["autoincrement"] = False
    return mapped_column(sa.BigInteger, **kwargs)


def serial_column(name: str, template: str, **kwargs: Any) -> Column[str]:
    """The Core counterpart of ``SerialField``: ``Table(..., serial_column("number", "N{n}"))``."""
    names = SerialSpec.__dataclass_fields__
    spec = SerialSpec(template, **{k: kwargs.pop(k) for k in list(kwargs) if k in names})
    return Column(name, _string(spec), **_serial_kwargs(spec, kwargs))


def _string(spec: SerialSpec) -> sa.String:
    return sa.String(template_length(spec.template, spec.period))


def _serial_kwargs(spec: SerialSpec, kwargs: dict[str, Any]) -> dict[str, Any]:
    reserved = ("default", "insert_default", "server_default")
    return _filled_kwargs(
        kwargs, SERIAL_INFO_KEY, spec, "a serial column", "values come from the serial", reserved
    )


# snowflake ids ----------------------------------------------------------------------


def SnowflakeField(
    generator: Any = None, *, layout: str = "default", **mapped_column_kwargs: Any
) -> MappedColumn[Any]:
    """A ``BigInteger`` mapped column whose values are snowflake ids, taken at insert.

    ``generator`` is the `Snowflake` to use; None
    means one on the store ``install()`` gave the engine (else a ``SQLStore``
    on the bind's database) for layout ``layout`` (its ``name``), created on first insert
    and shared by every such column. Under ``install()`` a flush or bulk
    insert takes one ``next_many`` per statement; anything else (and an
    engine no ``install()`` covers) gets one id per row from the column's
    Python-side default, without a round trip; a value the user gave is
    kept. The other keyword arguments go to ``mapped_column``.
    """
    kwargs = _filled_kwargs(
        mapped_column_kwargs,
        SNOWFLAKE_INFO_KEY,
        SnowflakeSpec(generator, layout),
        "a snowflake column",
        "values are snowflake ids",
        RESERVED_KWARGS,
    )
    kwargs["autoincrement"] = False
    return mapped_column(sa.BigInteger, **kwargs)


__all__ = [
    "SequenceField",
    "SerialField",
    "SnowflakeField",
    "gapless_sequence_field",
    "sequence_column",
    "serial_column",
]
