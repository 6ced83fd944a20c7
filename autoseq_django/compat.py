"""django-sequences' public API: ``get_next_value``, ``get_next_values``, ``get_last_value``,
``delete`` and ``Sequence``, with its arguments (``initial_value``, ``reset_value``,
``using``, ``nowait``).

Code written for django-sequences keeps its calls. By default the values
come from autoseq's blocks (the row named ``sequence_name`` in
``sys_sequence``): unique and increasing, cheap under load, and a rollback
or a process exit skips values. ``gapless=True`` gives django-sequences' own
semantics: each value is taken in the caller's transaction (``atomic()``
joined, or one of its own in autocommit), holding the row's lock until it
ends, so a rollback gives the number back and committed values have no gap;
``nowait=True`` then raises ``DatabaseError`` at once when another
transaction holds the row. ``autoseq_django.django_sequences`` is this API
with ``gapless=True`` by default: django-sequences' behaviour, import for
import. (Django's private internals are `autoseq_django._compat`'s alone.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from autoseq import InvalidSequenceConfig, SequenceConfig, SequenceLock, SequenceNotFound
from autoseq_django import conf, testing
from autoseq_django import registry as sequences
from autoseq_django.serials import (
    create_row_here,
    gapless_row,
    restart_untouched_row,
    take_gapless_values,
    watch_transaction,
)

_configs: dict[tuple[str, int, int | None], tuple[conf.AutoseqSettings, SequenceConfig]] = {}


def _config(name: str, initial_value: int, reset_value: int | None) -> SequenceConfig:
    settings = conf.get()
    key = (name, initial_value, reset_value)
    cached = _configs.get(key)
    if cached is None or cached[0] is not settings:
        if len(_configs) > 1024:
            _configs.clear()
        cached = _configs[key] = (settings, _build(settings, name, initial_value, reset_value))
    return cached[1]


def _build(
    settings: conf.AutoseqSettings, name: str, initial_value: int, reset_value: int | None
) -> SequenceConfig:
    if reset_value is None:
        return settings.sequence_config(name, start=initial_value)
    if not isinstance(reset_value, int) or reset_value <= initial_value:
        raise InvalidSequenceConfig(
            f"sequence {name!r}: reset_value={reset_value!r} must be an int greater than "
            f"initial_value={initial_value!r}"
        )
    # django-sequences goes back to initial_value on reaching reset_value.
    return settings.sequence_config(name, start=initial_value, end=reset_value - 1, cycle=True)


def _lock(
    sequence_name: str, initial_value: int, reset_value: int | None, using: str | None
) -> SequenceLock:
    config = _config(sequence_name, initial_value, reset_value)
    alias = using or DEFAULT_DB_ALIAS
    testing.note_api_row(alias, sequence_name, False, delete)
    return sequences.lock(config, alias)


def get_next_value(
    sequence_name: str = "default",
    initial_value: int = 1,
    reset_value: int | None = None,
    *,
    nowait: bool = False,
    using: str | None = None,
    gapless: bool = False,
) -> int:
    """The next value of ``sequence_name``, created at ``initial_value`` on first use.

    With ``reset_value`` the sequence goes back to ``initial_value`` when it
    would reach ``reset_value``. ``using`` is the database whose sequences
    serve it (``AUTOSEQ["DATABASE"]`` and routers apply, as for fields).
    A stored row wins over the arguments. ``gapless=True`` takes the value
    in the caller's transaction, as django-sequences does; ``nowait`` then
    raises ``DatabaseError`` when another transaction holds the row (from
    blocks nothing waits for the caller's row locks, so it changes nothing).
    """
    if gapless:
        return _gapless(sequence_name, initial_value, reset_value, using, 1, nowait)[0]
    return _lock(sequence_name, initial_value, reset_value, using).next()


def get_next_values(
    batch_size: int,
    sequence_name: str = "default",
    initial_value: int = 1,
    reset_value: int | None = None,
    *,
    nowait: bool = False,
    using: str | None = None,
    gapless: bool = False,
) -> list[int]:
    """``batch_size`` values of ``sequence_name`` in increasing order (one reservation at most).

    django-sequences returns a ``range``; these values are a list because a
    batch that starts in one block and ends in the next need not be
    contiguous. ``gapless=True``: consecutive values taken in the caller's
    transaction. A ``batch_size`` of 0 returns ``[]`` and changes nothing.
    """
    if batch_size == 0:
        return []
    if gapless:
        return _gapless(sequence_name, initial_value, reset_value, using, batch_size, nowait)
    return _lock(sequence_name, initial_value, reset_value, using).next_many(batch_size)


def get_last_value(
    sequence_name: str = "default", *, using: str | None = None, gapless: bool = False
) -> int | None:
    """The last value of ``sequence_name``, None when it has no row or gave nothing yet.

    ``gapless=True``: the last value taken, as the caller's transaction sees
    it (django-sequences' meaning). From blocks: the last value reserved by
    any process, which is at or above every value handed out (a process may
    still hold values below it).
    """
    alias = using or DEFAULT_DB_ALIAS
    if gapless:
        found = gapless_row(sequence_name, connections[alias])
        if found is None or not _taken_from(found):
            return None  # no row, or one nothing was taken from
        return int(found["current"]) - int(found["step"])
    row = sequences.store(sequences.sequence_database(alias)).read(sequence_name)
    if row is None or row.next_value == row.start:
        return None
    return row.next_value - row.step


def delete(
    sequence_name: str = "default", *, using: str | None = None, gapless: bool = False
) -> bool:
    """Delete the row of ``sequence_name``; True if there was one.

    The next value starts again at ``initial_value``, so only delete a
    sequence whose values nothing keeps. ``gapless=True`` deletes in the
    caller's transaction (a rollback brings the row back); otherwise the
    store's own transaction, and this process's buffered values are dropped.
    """
    alias = using or DEFAULT_DB_ALIAS
    if gapless:
        with transaction.atomic(using=alias, savepoint=False):
            return gapless_row(sequence_name, connections[alias], delete=True) is not None
    sequence_alias = sequences.sequence_database(alias)
    sequences.registry(sequence_alias).discard(sequence_name)
    return sequences.store(sequence_alias).delete(sequence_name)


class Sequence:
    """django-sequences' ``Sequence``: one named sequence and its arguments, iterable.

    ``reset_value`` at or below ``initial_value`` is refused here
    (``InvalidSequenceConfig``, a ``ValueError``). ``gapless`` as for the
    functions.
    """

    def __init__(
        self,
        sequence_name: str = "default",
        initial_value: int = 1,
        reset_value: int | None = None,
        *,
        using: str | None = None,
        gapless: bool = False,
    ) -> None:
        if reset_value is not None:
            _build(conf.get(), sequence_name, initial_value, reset_value)
        self.sequence_name = sequence_name
        self.initial_value = initial_value
        self.reset_value = reset_value
        self.using = using
        self.gapless = gapless

    def get_last_value(self) -> int | None:
        """The last value (see `get_last_value`)."""
        return get_last_value(self.sequence_name, using=self.using, gapless=self.gapless)

    def get_next_value(self, *, nowait: bool = False) -> int:
        """The next value (see `get_next_value`)."""
        return get_next_value(
            self.sequence_name,
            self.initial_value,
            self.reset_value,
            nowait=nowait,
            using=self.using,
            gapless=self.gapless,
        )

    def get_next_values(self, batch_size: int, *, nowait: bool = False) -> list[int]:
        """``batch_size`` next values (see `get_next_values`)."""
        return get_next_values(
            batch_size,
            self.sequence_name,
            self.initial_value,
            self.reset_value,
            nowait=nowait,
            using=self.using,
            gapless=self.gapless,
        )

    def delete(self) -> bool:
        """Delete the row (see `delete`)."""
        return delete(self.sequence_name, using=self.using, gapless=self.gapless)

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        return self.get_next_value()


def _gapless(
    sequence_name: str,
    initial_value: int,
    reset_value: int | None,
    using: str | None,
    count: int,
    nowait: bool,
) -> list[int]:
    config = _config(sequence_name, initial_value, reset_value)
    alias = using or DEFAULT_DB_ALIAS
    connection = connections[alias]
    testing.note_api_row(alias, sequence_name, True, delete)
    # django-sequences' transaction: the caller's when there is one, else its own.
    with transaction.atomic(using=alias, savepoint=False):
        if nowait and _taken_from(gapless_row(sequence_name, connection)):
            # A row nothing was taken from does not exist for django-sequences:
            # its callers wait for whoever is creating it, so only a row in use
            # is locked without waiting.
            gapless_row(sequence_name, connection, nowait=True)
        seen = _last_config.get((alias, sequence_name))
        if seen is None or seen[0] is not config or seen[1].given_back():
            # Other arguments than last time, or last time rolled back: a row
            # nothing was taken from takes them, as a new row would.
            restart_untouched_row(config, connection)
            _last_config[alias, sequence_name] = (config, watch_transaction(connection))
        try:
            return take_gapless_values(config, connection, count)
        except SequenceNotFound:
            if connection.vendor == "sqlite" or gapless_row(sequence_name, connection):
                raise
            # Deleted in this very transaction (delete() then get_next_value()).
            create_row_here(config, connection)
            return take_gapless_values(config, connection, count)


def _taken_from(row: Any) -> bool:
    return row is not None and int(row["version"]) > 0


#: The arguments each gapless name was last taken with, by (alias, name), and
#: that transaction's token (a rollback undid what was checked then).
_last_config: dict[tuple[str, str], tuple[SequenceConfig, Any]] = {}
