"""Keeping sequences ahead of keys they did not hand out.

Keys written with their own values (``loaddata``, a bulk load with
explicit keys, ``Order(id=5000).save()``) and rows a migration converts
from ``AutoField`` would otherwise meet the sequence later, as an
``IntegrityError`` on some insert. So:

* A unique sequence column remembers, per database, the largest value it
  knows to be safe: every value it was handed, and below ``current`` after
  a catch-up. Writing a value above that (one comparison per row, no I/O)
  notes it; the noted maximum is applied once, when the writing
  transaction commits (in autocommit: at once), or before the same thread
  takes its next value of that sequence, whichever comes first. Applying
  it is two reads of the row and, when behind, one compare-and-set through
  [`autoseq.maintenance`][autoseq.maintenance]; values this process holds in memory up to
  the loaded key are skipped. A loaddata of 10,000 rows costs one catch-up.
* After ``migrate``, every sequence used in the database moves past
  ``max()`` of its columns (the switch from ``BigAutoField``, say), auto-created
  many-to-many tables and ``django_migrations`` included (the ``post_migrate``
  handler in `autoseq_django.apps`, through `autoseq_django.maintenance.sync`).

Values that another process already holds in memory are its own; the
first INSERT there that meets a loaded key fails once, with a message to
retry, and drops that process's buffered values, so the retry and every
later insert take values past the loaded keys (``guard_inserts``).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, transaction

from autoseq import SequenceNotFound
from autoseq import maintenance as core
from autoseq_django import _compat
from autoseq_django import registry as sequences
from autoseq_django.columns import sequence_fields, sequence_models

if TYPE_CHECKING:
    from autoseq_django.fields import SequenceField

logger = logging.getLogger("autoseq_django")

# Per thread: a value is noted by the thread whose transaction writes it,
# and applied when that transaction commits or that thread takes its next
# value. Another thread applying half of a statement's keys (the first rows
# compiled so far) would move the sequence into the rest of them.
#: The pending values of a thread, by (write alias, id(field)).
_Pending = dict[tuple[str, int], tuple["SequenceField", str, int]]


class _Local(threading.local):
    # A class default: pending() runs before every take, and a missing
    # attribute of a thread-local costs an AttributeError each time.
    pending: _Pending | None = None
    #: Values of the statement being compiled, noted when it runs (note_written).
    statement: _Pending | None = None


_local = _Local()


def _pending() -> _Pending:
    found = _local.pending
    if found is None:
        found = _local.pending = {}
    return found


def note(field: SequenceField, alias: str, value: int) -> None:
    """Remember that ``value`` was written to ``field``'s column in database ``alias``."""
    if not _keep(field, alias, value):
        return
    connection = connections[alias]
    if not connection.in_atomic_block:
        flush()  # autocommit: the statement is its own transaction
    elif not _compat.on_commit_pending(connection, _flush_on_commit):
        transaction.on_commit(_flush_on_commit, using=alias)


def note_written(field: SequenceField, alias: str, value: int) -> None:
    """Like `note`, once the statement being compiled runs (``guard_inserts``).

    A bulk whose first INSERT takes the values of the whole bulk takes them
    before that statement's given keys count: moved past those first, its
    values would meet keys given in its later statements.
    """
    statement = _local.statement
    if statement is None:
        statement = _local.statement = {}
    key = (alias, id(field))
    found = statement.get(key)
    if found is None or found[2] < value:
        statement[key] = (field, alias, value)


def _note_statement() -> None:
    statement = _local.statement
    _local.statement = None
    for field, alias, value in statement.values() if statement else ():
        note(field, alias, value)


def _keep(field: SequenceField, alias: str, value: int) -> bool:
    pending_values = _pending()
    key = (alias, id(field))
    found = pending_values.get(key)
    if found is not None and found[2] >= value:
        return False
    pending_values[key] = (field, alias, value)
    return True


def pending() -> bool:
    """True when this thread noted a value still to apply (checked before each take)."""
    return bool(_local.pending)


def flush(sequence: str | None = None) -> None:
    """Move sequences past the values this thread noted, skipping buffered ones.

    ``sequence``: only that sequence's values. A take flushes its own only:
    an INSERT compiles row by row, and another column's take in the middle
    of it must not apply the keys of the rows compiled so far alone.
    """
    pending_values = _pending()
    keys = [
        key
        for key, (field, _, _) in pending_values.items()
        if sequence is None or field.sequence_name == sequence
    ]
    items = [pending_values.pop(key) for key in keys]
    for done, (field, alias, value) in enumerate(items):
        try:
            _catch_up(sequences, field, alias, value)
        except BaseException:
            for rest in items[done:]:  # the next take or commit tries again
                _keep(*rest)
            raise


def _catch_up(sequences: Any, field: SequenceField, alias: str, value: int) -> None:
    config = field.sequence_config
    if config.cycle:
        return  # values repeat by design; nothing to stay ahead of
    if config.gapless:
        # No block to take from: serving one would leave the gaps gapless forbids.
        return
    try:
        lock = sequences.lock(config, alias)  # a missing row starts past every column
    except SequenceNotFound:
        return  # AUTO_CREATE off and no row: nothing hands these values out
    sequence_alias = sequences.sequence_database(alias)
    registry = sequences.registry(sequence_alias)
    row = registry.store.read(config.name)
    if row is None:
        return
    if value < row.start or value > row.last_value:
        return  # outside what the sequence can ever hand out: no collision to prevent
    row = core.sync(registry.store, config.name, value)
    # The buffer would serve the value again: take what it holds up to there,
    # one value at a time, so nothing new is reserved for it. Not discard():
    # other threads may be taking values from this very lock.
    held = lock.peek()
    while held is not None and held <= value:
        lock.next()
        held = lock.peek()
    safe = (held if held is not None else row.next_value) - 1
    field._known[alias] = max(field._known.get(alias, safe), safe)


def _flush_on_commit() -> None:
    try:
        flush()
    except Exception as exc:  # noqa: BLE001 - the caller's rows are committed already
        # flush() kept the values: the next take in this process tries again.
        logger.warning("autoseq: could not move a sequence past loaded keys yet: %s", exc)


def forget(alias: str) -> None:
    """Drop what this thread noted for database ``alias`` (its sequences were reset)."""
    pending_values = _pending()
    for key in [key for key in pending_values if key[0] == alias]:
        del pending_values[key]


# Keys another process loads -------------------------------------------------
#
# A process holding a block in memory cannot see keys that another process
# loads into it (loaddata, explicit keys): the loader's catch-up moves the
# stored ``current`` past them, but the held block predates it. PostgreSQL
# sequences with CACHE > 1 have the same blind spot (setval is not seen by
# sessions until their cache runs out). So the first INSERT that collides
# with such a key drops this process's buffered values of that sequence and
# says to retry; the retry takes a fresh block past the loaded keys.

#: Per thread, by id(field): the field, the instances its last take filled and
#: their values. Held until the thread's next statement that is not an INSERT
#: (a bulk's INSERTs follow one another), so no per-row bookkeeping is needed.
_filled = threading.local()
_Given = dict[int, tuple["SequenceField", list[Any], list[int]]]
_INSERT_INTO = re.compile(r"\s*INSERT\s+(?:IGNORE\s+)?INTO\s+([`\"\[]?)([^\s`\"\]]+)", re.I)


def filled(field: SequenceField, instances: list[Any], values: list[int]) -> None:
    """Remember that ``field`` just gave ``values`` to ``instances`` (undone on a collision)."""
    by_field: _Given | None = getattr(_filled, "by_field", None)
    if by_field is None:
        by_field = _filled.by_field = {}
    by_field[id(field)] = (field, instances, values)


def _fields_of_table(table: str) -> list[SequenceField]:
    return [
        field
        for model in sequence_models()
        if model._meta.db_table == table
        for field in sequence_fields(model)
        if field.unique and not field.gapless
    ]


def _names_column(field: SequenceField, table: str, message: str) -> bool:
    """True when a unique-violation ``message`` names ``field``'s column (or key)."""
    column = field.column
    patterns = (f"{table}.{column}", f"({column})=", f"'{column}'", f".{column}'")
    return any(p in message for p in patterns) or (field.primary_key and "PRIMARY" in message)


def _values(params: Any, many: bool) -> set[Any]:
    rows = params if many else [params]
    found: set[Any] = set()
    for row in rows or ():
        if isinstance(row, dict):
            row = row.values()
        for value in row or ():
            # PostgreSQL bulks bind one array per column (INSERT ... UNNEST).
            values = value if isinstance(value, list | tuple) else (value,)
            # int subclasses too: psycopg's Int8 wraps the values Django binds.
            found.update(int(v) for v in values if isinstance(v, int))
    return found


def _unsaved(field: SequenceField, instances: list[Any], values: list[int]) -> list[Any]:
    """The instances still being inserted that hold the value ``field`` gave them."""
    attname = field.attname
    return [
        obj
        for obj, value in zip(instances, values, strict=True)
        if obj._state.adding and getattr(obj, attname) == value
    ]


def collided(alias: str, sql: str, params: Any, many: bool, error: BaseException) -> str | None:
    """After an INSERT failed with ``error``: drop buffered values it may have met; a hint.

    None unless the error names a sequence column and the statement carried
    values this thread took from that sequence (a key the caller chose that
    exists already is the caller's own conflict). Else the buffered values
    of each such sequence are dropped (the next take reserves a fresh
    block, past keys loaded meanwhile), the instances whose values came
    from it lose them again (so a retry takes new ones), and the returned
    text says so.
    """
    match = _INSERT_INTO.match(sql)
    if match is None:
        return None
    by_field = getattr(_filled, "by_field", None)
    if not by_field:
        return None
    table = match.group(2)
    message = str(error)
    fields = [
        f for f in _fields_of_table(table) if id(f) in by_field and _names_column(f, table, message)
    ]
    if not fields:
        return None
    sent = _values(params, many)
    names: list[str] = []
    for field in fields:
        if field.sequence_config.cycle:
            continue
        _, instances, values = by_field[id(field)]
        unsaved = _unsaved(field, instances, values)
        if not sent.intersection(getattr(obj, field.attname) for obj in unsaved):
            continue
        sequences.forget(sequences.sequence_database(alias), field.sequence_name)
        names.append(field.sequence_name)
        del by_field[id(field)]
        for obj in unsaved:
            setattr(obj, field.attname, None)
    if not names:
        return None
    listed = ", ".join(map(repr, names))
    return (
        f"autoseq: a value of sequence {listed} is already taken in {table}, most likely by "
        "a key another process loaded (loaddata, explicit keys) into a block this process "
        "held. This process dropped its buffered values of that sequence: retry the save "
        "(in a new transaction) and it gets a value past the loaded keys."
    )


def clear_after_insert(attname: str, instances: list[Any]) -> None:
    """Empty ``attname`` of ``instances`` once the INSERT being compiled has run.

    For ``bulk_create(ignore_conflicts=True)``: no row says which of them a
    conflict skipped, so none keeps a key, as with ``BigAutoField``.
    """
    _filled.clear_after = (attname, instances)


def _clear_inserted() -> None:
    found = getattr(_filled, "clear_after", None)
    if found is not None:
        _filled.clear_after = None
        attname, instances = found
        for obj in instances:
            setattr(obj, attname, None)


def return_keys_of_insert(field: SequenceField, rows: Sequence[Any], filled: list[Any]) -> None:
    """Give ``filled`` the keys their rows really have once the INSERT being compiled has run.

    For ``bulk_create(update_conflicts=True)`` where the database returns
    rows from a bulk INSERT: the statement (its rows are ``rows``, in order)
    gets a ``RETURNING`` of the key, and each object in ``filled`` takes the
    key of its row, the old one where a conflict updated an existing row,
    as Django sets ``BigAutoField`` keys. A value taken for it and left
    unused is a gap.
    """
    _filled.returning = (field, rows, {id(obj) for obj in filled})


def _returning_sql(connection: Any, sql: str, params: Any, many: bool) -> tuple[str, Any, Any]:
    """``sql`` with the RETURNING of the key asked for (return_keys_of_insert), if any."""
    found = getattr(_filled, "returning", None)
    if found is None:
        return sql, params, None
    _filled.returning = None
    match = None if many else _INSERT_INTO.match(sql)
    if match is None or match.group(2) != found[0].model._meta.db_table:
        return sql, params, None  # not the statement compiled (it failed before running)
    r_sql, r_params = connection.ops.return_insert_columns([found[0]])
    if not r_sql:
        return sql, params, None
    return f"{sql} {r_sql}", (*params, *r_params), found


def _set_returned_keys(found: Any, cursor: Any) -> None:
    field, rows, filled = found
    returned = cursor.fetchall()
    keys = [row[0] for row in returned] if len(returned) == len(rows) else None
    for i, obj in enumerate(rows):
        if id(obj) in filled:
            setattr(obj, field.attname, None if keys is None else keys[i])


def guard_inserts(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    """A Django execute wrapper: an INSERT that meets a loaded key recovers on retry."""
    if _local.statement:
        _note_statement()
    sql, params, returning = _returning_sql(context["connection"], sql, params, many)
    try:
        result = execute(sql, params, many, context)
    except IntegrityError as exc:
        _filled.clear_after = None
        hint = collided(context["connection"].alias, sql, params, many, exc)
        if hint is None:
            raise
        raise type(exc)(f"{exc}\n{hint}") from exc
    except BaseException:
        _filled.clear_after = None  # the rows were not inserted: they keep their keys
        raise
    if getattr(_filled, "by_field", None) and not _INSERT_INTO.match(sql):
        _filled.by_field = {}  # the inserts that used them are over
    _clear_inserted()
    if returning is not None:
        _set_returned_keys(returning, context["cursor"])
    return result
