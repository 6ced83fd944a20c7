"""Moving sequences safely: what the admin and ``manage.py autoseq`` share.

This module only finds what Django knows (the models and columns using a
sequence, ``max()`` of each, which database holds which ``sys_sequence``);
every write goes through [`autoseq.maintenance`][autoseq.maintenance], a compare-and-set on
the row's version in the store's own connection. So a reservation made
meanwhile by another process is never overwritten, ``current`` only moves
forward unless forced (a running process may hold a block below it), and
never to a value at or below ``max()`` of a column that uses the sequence.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import router

from autoseq import SequenceConfig, SequenceNotFound
from autoseq import maintenance as core
from autoseq.errors import ValueMovesBackward
from autoseq_django import registry as sequences
from autoseq_django.columns import (
    ColumnMax,
    column_max,
    columns_of,
    sequence_fields,
    sequence_models,
)
from autoseq_django.columns import (
    users as users,
)
from autoseq_django.tables import has_table, table_names

if TYPE_CHECKING:
    from autoseq_django.fields import SequenceField

#: Settings of a row that the admin and ``autoseq set`` may change.
CHANGEABLE = core.CHANGEABLE


first_value_after = core.first_value_after


def _floor(columns: list[ColumnMax]) -> int | None:
    values = [column.value for column in columns if column.value is not None]
    return max(values) if values else None


def _check_columns(row: SequenceConfig, changes: dict[str, Any], columns: list[ColumnMax]) -> None:
    """Name the column whose keys a new ``current`` would hand out again."""
    current = changes.get("current")
    if current is None or current == row.next_value:
        return
    for column in columns:
        if column.value is not None and current <= column.value:
            raise ValueMovesBackward(
                f"sequence {row.name!r}: current={current} is not past max({column.label})"
                f"={column.value} in database {column.database!r}; use "
                f"{row.first_value_after(column.value)} or more"
            )


def read(sequence_alias: str, name: str) -> SequenceConfig:
    """The stored row of ``name`` (``SequenceNotFound`` when missing)."""
    row = sequences.store(sequence_alias).read(name)
    if row is None:
        raise SequenceNotFound(name, "create it with `manage.py autoseq create`")
    return row


def validate_change(
    sequence_alias: str,
    row: SequenceConfig,
    changes: dict[str, Any],
    *,
    force: bool = False,
    columns: list[ColumnMax] | None = None,
) -> SequenceConfig:
    """The row after ``changes``, or ``InvalidSequenceConfig`` saying why it cannot be."""
    if columns is None:
        columns = columns_of(row.name, sequence_alias) if "current" in changes else []
    try:
        planned = core.planned_change(row, force=force, **changes)
    except ValueMovesBackward as exc:
        raise ValueMovesBackward(f"{exc} (`manage.py autoseq set NAME VALUE --force`)") from None
    _check_columns(row, changes, columns)
    return planned or row


def change(
    sequence_alias: str, name: str, changes: dict[str, Any], *, force: bool = False
) -> SequenceConfig:
    """Apply ``changes`` to row ``name`` (validated, compare-and-set) and return the row."""
    columns = columns_of(name, sequence_alias) if "current" in changes else []
    store = sequences.store(sequence_alias)
    validate_change(
        sequence_alias, read(sequence_alias, name), changes, force=force, columns=columns
    )
    stored = core.change(store, name, force=force, floor=_floor(columns), **changes)
    sequences.forget(sequence_alias, name)
    return stored


def advance_past(
    sequence_alias: str, config: SequenceConfig, value: int | None, *, create: bool = False
) -> tuple[int, int]:
    """Move ``current`` of ``config.name`` past ``value`` (never back); (old, new) current.

    A missing row is created from ``config`` when there is something to move
    past, or with ``create``; else it is left to be created on first use.
    """
    store = sequences.store(sequence_alias)
    before = store.read(config.name)
    if before is None and value is None and not create:
        return config.next_value, config.next_value
    row, _ = core.adopt(store, config, value)
    sequences.forget(sequence_alias, row.name)
    old = before.next_value if before is not None else config.next_value
    return old, row.next_value


@dataclass(frozen=True)
class SyncResult:
    """What ``sync`` did to one sequence."""

    name: str
    columns: tuple[str, ...]
    column_max: int | None
    old: int
    new: int


def sync(
    database: str, *, names: Iterable[str] | None = None, apps: Any = None, create: bool = False
) -> list[SyncResult]:
    """Move each sequence used in ``database`` past ``max()`` of its columns there.

    ``apps`` is the model registry to look in (a migration passes its own).
    ``create``: missing rows of empty tables are created too (``migrate`` does,
    so a first insert reads no ``max()`` inside the caller's operations).
    """
    wanted = set(names) if names is not None else None
    by_name = _fields_by_name(database, apps, wanted, table_names(database))
    if wanted:
        by_name = {name: fields for name, fields in by_name.items() if name in wanted}
    sequence_alias = sequences.sequence_database(database)
    results = []
    for name, fields in sorted(by_name.items()):
        values = [column_max(field, database) for field in fields]
        present = [v for v in values if v is not None]
        top = max(present) if present else None
        config = fields[0].sequence_config
        make = create and not config.gapless and sequences.registry(sequence_alias).auto_create
        old, new = advance_past(sequence_alias, config, top, create=make)
        labels = tuple(f"{f.model._meta.label}.{f.name}" for f in fields)
        results.append(SyncResult(name, labels, top, old, new))
    return results


def _fields_by_name(
    database: str, apps: Any, wanted: set[str] | None, tables: set[str] | None = None
) -> dict[str, list[SequenceField]]:
    """The sequence fields of the models migrated to ``database``, by sequence name.

    With ``tables``, only models whose table is among them. A name of
    ``wanted`` that no field uses raises ``SequenceNotFound``.
    """
    by_name: dict[str, list[SequenceField]] = {}
    for model in sequence_models(apps):
        if not router.allow_migrate_model(database, model):
            continue
        if tables is not None and not has_table(database, model, tables):
            continue
        for field in sequence_fields(model):
            by_name.setdefault(field.sequence_name, []).append(field)
    if wanted:
        missing = sorted(wanted - set(by_name))
        if missing:
            used = ", ".join(sorted(by_name)) or "none"
            raise SequenceNotFound(
                missing[0],
                f"no model in database {database!r} uses it; sequences used there: {used}",
            )
    return by_name


def drift(field: SequenceField, row: SequenceConfig) -> dict[str, Any]:
    """What ``row`` needs to match ``field``'s settings: ``maintenance.change`` arguments.

    ``start`` is fixed once a row exists; a field asking for a later start
    moves ``current`` up to it (forward only). Empty when they agree.
    """
    wanted = field.sequence_config
    changes: dict[str, Any] = {
        key: getattr(wanted, key)
        for key in ("end", "step", "batch", "batch_count", "cycle")
        if getattr(wanted, key) != getattr(row, key)
    }
    if wanted.start > row.next_value:
        grid = SequenceConfig(**(row.as_row() | changes | {"current": None}))
        changes["current"] = grid.first_value_from(wanted.start)
    return changes


@dataclass(frozen=True)
class ApplyResult:
    """What ``apply`` did to one sequence: ``{setting: (stored, now)}``."""

    name: str
    columns: tuple[str, ...]
    changed: dict[str, tuple[Any, Any]]
    #: False when no row is stored yet (the field creates it on first use).
    stored: bool = True


def apply(
    database: str, *, names: Iterable[str] | None = None, apps: Any = None
) -> list[ApplyResult]:
    """Write the settings of the fields used in ``database`` to their stored rows.

    A field's ``end``, ``step``, ``batch``, ``batch_count``, ``cycle`` and a
    later ``start`` are applied with [`change`][autoseq_django.maintenance.change] (forward only,
    never at or below a column's ``max()``). Rows not created yet are left to be
    created from the fields on first use.
    """
    wanted = set(names) if names is not None else None
    by_name = _fields_by_name(database, apps, wanted)
    sequence_alias = sequences.sequence_database(database)
    store = sequences.store(sequence_alias)
    results = []
    for name, fields in sorted(by_name.items()):
        if wanted is not None and name not in wanted:
            continue
        row = store.read(name)
        labels = tuple(f"{f.model._meta.label}.{f.name}" for f in fields)
        if row is None:
            results.append(ApplyResult(name, labels, {}, stored=False))
            continue
        changes = drift(fields[0], row)
        if changes:
            after = change(sequence_alias, name, changes)
            before_row, after_row = row.as_row(), after.as_row()
            changed = {
                key: (before_row[key], after_row[key])
                for key in changes
                if before_row[key] != after_row[key]
            }
        else:
            changed = {}
        results.append(ApplyResult(name, labels, changed))
    return results
