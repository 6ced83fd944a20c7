"""What the SQLAlchemy listeners see of a generated column: a `Target`.

Every kind of generated column (a sequence key, a serial, a gapless key, a
snowflake id) reaches the listeners of [`autoseq.sqlalchemy`][autoseq.sqlalchemy] as a
``Target``: what its generator is called (gapless values are locked in name
order), whether its values are taken in the caller's transaction, how a bad
explicit value is refused, and ``take(n, connection)``. The listeners know
nothing else about the kinds; each kind is a subclass beside its field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.schema import Column

from autoseq.errors import InvalidSequenceConfig

if TYPE_CHECKING:
    from autoseq.sqlalchemy import _Installation


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
        installation: _Installation | None,
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
