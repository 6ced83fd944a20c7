"""What a generated column was declared with, carried in its ``Column.info``.

A sequence column carries a `SequenceSpec` under `INFO_KEY`, a serial column
(or a gapless integer key) a `SerialSpec` under `SERIAL_INFO_KEY`, a snowflake
column a `SnowflakeSpec` under `SNOWFLAKE_INFO_KEY`. Everything else in the
integration finds a column's kind through these: the declarations
(`autoseq.sqlalchemy.columns`) write them, the targets and listeners read them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy.sql.schema import Column

from autoseq.config import MAX_VALUE, SequenceConfig, validate_name
from autoseq.errors import InvalidSequenceConfig
from autoseq.serial import SerialOptions

#: Key in ``Column.info`` under which a column's sequence settings travel.
INFO_KEY = "autoseq"
#: Key in ``Column.info`` under which a serial column's settings travel.
SERIAL_INFO_KEY = "autoseq_serial"
#: Key in ``Column.info`` under which a snowflake column's settings travel.
SNOWFLAKE_INFO_KEY = "autoseq_snowflake"

#: The ``mapped_column`` / ``Column`` arguments a sequence or snowflake column sets itself.
RESERVED_KWARGS = (
    "default",
    "default_factory",
    "insert_default",
    "server_default",
    "autoincrement",
)


@dataclass(frozen=True, slots=True)
class SequenceSpec:
    """The sequence settings a column carries in ``Column.info[INFO_KEY]``.

    ``sequence=None`` names the sequence after the column's table, resolved
    per column, so a mixin's column serves each table from its own sequence.
    """

    sequence: str | None = None
    start: int = 1
    end: int = MAX_VALUE
    step: int = 1
    batch: bool = True
    batch_count: int = 100
    cycle: bool = False

    def __post_init__(self) -> None:
        if self.sequence is not None:
            validate_name(self.sequence)
        self._config("placeholder")  # refuse bad settings at declaration time

    def _config(self, name: str) -> SequenceConfig:
        return SequenceConfig(
            name,
            start=self.start,
            end=self.end,
            step=self.step,
            batch=self.batch,
            batch_count=self.batch_count,
            cycle=self.cycle,
        )

    def name_for(self, column: Column[Any]) -> str:
        """The name of the sequence this column's values come from."""
        if self.sequence is not None:
            return self.sequence
        return _table_name(column, "its sequence cannot default to the table name")

    def config_for(self, column: Column[Any]) -> SequenceConfig:
        """The ``sys_sequence`` row this column's values come from."""
        return _spec_config(self, self.name_for(column))


def _table_name(column: Column[Any], unnamed: str) -> str:
    """The name of ``column``'s table; ``unnamed`` says what fails when it has none."""
    table = getattr(column, "table", None)
    if table is None:
        raise InvalidSequenceConfig(
            f"column {column.key!r} is not attached to a table, so {unnamed}; pass sequence='name'"
        )
    return str(table.name)


@functools.lru_cache(maxsize=4096)
def _spec_config(spec: SequenceSpec, name: str) -> SequenceConfig:
    # Asked on every flush: a SequenceConfig validates all its settings when
    # built, which cost more than the rest of the listener (both are frozen).
    return spec._config(name)


def sequence_spec(column: Any) -> SequenceSpec | None:
    """The ``SequenceSpec`` a column carries, or ``None`` for an ordinary column."""
    info = getattr(column, "info", None)
    spec = info.get(INFO_KEY) if info else None
    return spec if isinstance(spec, SequenceSpec) else None


@dataclass(frozen=True)
class SerialSpec(SerialOptions):
    """What a serial column was declared with; ``sequence=None`` means ``<table>.<column>``."""

    sequence: str | None = None
    #: A gapless integer sequence column (``SequenceField(gapless=True)``), not a string.
    integer: bool = False

    def __post_init__(self) -> None:
        if self.sequence is not None:
            validate_name(self.sequence)
        self.check("placeholder")  # refuse a bad template or setting where the column is declared

    def name_for(self, column: Column[Any]) -> str:
        """The serial's name: ``sequence``, else ``<table>.<column>``."""
        if self.sequence is not None:
            return self.sequence
        table = _table_name(column, "its serial cannot be named after it")
        return table if self.integer else f"{table}.{column.key}"


def serial_spec(column: Any) -> SerialSpec | None:
    """The ``SerialSpec`` a column carries, or ``None``."""
    info = getattr(column, "info", None)
    spec = info.get(SERIAL_INFO_KEY) if info else None
    return spec if isinstance(spec, SerialSpec) else None


@dataclass(frozen=True, slots=True)
class SnowflakeSpec:
    """What a ``SnowflakeField`` was declared with: its generator, or the layout to lease."""

    generator: Any = None
    layout: str = "default"


def snowflake_spec(column: Any) -> SnowflakeSpec | None:
    """The ``SnowflakeSpec`` a column carries, or ``None``."""
    info = getattr(column, "info", None)
    spec = info.get(SNOWFLAKE_INFO_KEY) if info else None
    return spec if isinstance(spec, SnowflakeSpec) else None


__all__ = [
    "INFO_KEY",
    "RESERVED_KWARGS",
    "SERIAL_INFO_KEY",
    "SNOWFLAKE_INFO_KEY",
    "SequenceSpec",
    "SerialSpec",
    "SnowflakeSpec",
    "sequence_spec",
    "serial_spec",
    "snowflake_spec",
]
