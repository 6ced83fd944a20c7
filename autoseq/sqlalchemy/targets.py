"""What the SQLAlchemy listeners see of a generated column: a `Target`.

Every kind of generated column (a sequence key, a serial, a gapless key, a
snowflake id) reaches the listeners of [`autoseq.sqlalchemy`][autoseq.sqlalchemy] as a
``Target``: what its generator is called (gapless values are locked in name
order), whether its values are taken in the caller's transaction, how a bad
explicit value is refused, and ``take(n, connection)``. The listeners know
nothing else about the kinds: `kind_of` gives a column's subclass
(`SequenceTarget`, `SerialTarget`, `SnowflakeTarget`), read from its spec.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.schema import Column

from autoseq.errors import InvalidSequenceConfig
from autoseq.lock import SequenceLock
from autoseq.serial import Serial
from autoseq.sqlalchemy import serial, snowflake
from autoseq.sqlalchemy.registries import Installation, lock, next_many
from autoseq.sqlalchemy.specs import (
    INFO_KEY,
    SNOWFLAKE_INFO_KEY,
    SequenceSpec,
    SerialSpec,
    SnowflakeSpec,
    sequence_spec,
    serial_spec,
)


class Target:
    """One generated column of one statement or flush, on the store that serves it.

    ``key`` is the column's parameter key where the target fills rows (the
    attribute key on the ORM side, the column key on Core's). The value
    source is resolved on the first `take`, so rows that all carry
    explicit values cost no round trip.
    """

    __slots__ = ("_source", "bind", "column", "installation", "key")

    #: What the column takes its values from, for messages ("a sequence").
    what = "a generator"
    #: Whether the column can be served without an ``install()`` covering the bind.
    needs_install = True

    def __init__(
        self,
        key: str,
        column: Column[Any],
        installation: Installation | None,
        bind: Engine | Connection,
    ) -> None:
        self.key = key
        self.column = column
        self.installation = installation
        self.bind = bind
        self._source: Any = None

    @classmethod
    def name_of(cls, column: Column[Any]) -> str:
        """The name of the column's generator (gapless values are locked in name order)."""
        raise NotImplementedError

    @classmethod
    def in_transaction(cls, column: Column[Any]) -> bool:
        """Whether values are taken on the caller's connection, in its transaction (gapless)."""
        return False

    @classmethod
    def check_explicit(cls, value: object, column: Column[Any]) -> None:
        """Refuse an explicit value of the wrong type before it reaches the database."""
        check_int(value, column)

    def source(self) -> Any:
        """The generator serving this column (a lock, a serial, a snowflake), resolved once."""
        if self._source is None:
            self._source = self.resolve()
        return self._source

    def resolve(self) -> Any:
        """Find or create the generator serving this column (may reach the store)."""
        raise NotImplementedError

    def take(self, n: int, connection: Connection | None) -> list[Any]:
        """``n`` values for this column, in order; ``connection`` is used when in_transaction."""
        raise NotImplementedError


def check_int(value: object, column: Column[Any]) -> None:
    """Refuse an explicit key that is not an int before it reaches the database.

    Databases would store ``'abc'`` (SQLite) or round ``1.5`` up to a value
    the sequence will hand out later (PostgreSQL).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSequenceConfig(
            f"explicit value for {column.table.name}.{column.name} must be an int, got "
            f"{type(value).__name__} {value!r}; leave it unset (None) to take the next value"
        )


class SequenceTarget(Target):
    """A sequence column (``SequenceField``, ``sequence_column``): values from its lock."""

    __slots__ = ()
    what = "a sequence"

    @classmethod
    def name_of(cls, column: Column[Any]) -> str:
        spec = sequence_spec(column)
        assert spec is not None
        return spec.name_for(column)

    def resolve(self) -> SequenceLock:
        assert self.installation is not None
        return lock(self.installation, self.bind, self.column)

    def take(self, n: int, connection: Connection | None) -> list[Any]:
        return next_many(self.source(), n)


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
        spec = serial_spec(column)
        if spec is not None and spec.integer:
            check_int(value, column)
            return
        if not isinstance(value, str):
            raise InvalidSequenceConfig(
                f"explicit value for {column.table.name}.{column.name} must be a str, got "
                f"{type(value).__name__} {value!r}; leave it unset (None) to take the next serial"
            )

    def resolve(self) -> Serial:
        assert self.installation is not None
        return serial.serial_for(self.installation.registry_for(self.bind), self.column)

    def take(self, n: int, connection: Connection | None) -> list[Any]:
        return serial.take(self.source(), n, connection)


class SnowflakeTarget(Target):
    """A snowflake column (``SnowflakeField``): ids from its generator, no install needed."""

    __slots__ = ()
    what = "a snowflake generator"
    needs_install = False

    @staticmethod
    def _spec(column: Column[Any]) -> SnowflakeSpec:
        spec = column.info[SNOWFLAKE_INFO_KEY]
        assert isinstance(spec, SnowflakeSpec)
        return spec

    @classmethod
    def name_of(cls, column: Column[Any]) -> str:
        return cls._spec(column).layout

    def resolve(self) -> Any:
        spec = self._spec(self.column)
        if spec.generator is not None:
            return spec.generator
        return snowflake.snowflake_for(self.bind, spec.layout, self.installation)

    def take(self, n: int, connection: Connection | None) -> list[Any]:
        return [int(value) for value in self.source().next_many(n)]


def kind_of(column: Any) -> type[Target] | None:
    """The Target class of a generated column, or None for an ordinary one."""
    info = getattr(column, "info", None)
    if not info or not isinstance(column, Column):
        return None
    if isinstance(info.get(INFO_KEY), SequenceSpec):
        return SequenceTarget
    if isinstance(info.get(SNOWFLAKE_INFO_KEY), SnowflakeSpec):
        return SnowflakeTarget
    return SerialTarget if serial_spec(column) is not None else None


__all__ = [
    "SequenceTarget",
    "SerialTarget",
    "SnowflakeTarget",
    "Target",
    "check_int",
    "kind_of",
]
