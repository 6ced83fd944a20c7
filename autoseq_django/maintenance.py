"""Moving sequences safely: what the admin and ``manage.py autoseq`` share.

Every change goes through the store's own connection with a compare-and-set
on ``current``, so a reservation made meanwhile by another process is never
overwritten. ``current`` only moves forward unless forced (a running process
may hold a block below it), and never to a value at or below ``max()`` of a
column that uses the sequence, which would hand out existing keys again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.apps import apps as global_apps
from django.conf import settings
from django.db import connections, models, router

from autoseq import InvalidSequenceConfig, SequenceConfig, SequenceNotFound
from autoseq_django import sequences
from autoseq_django.fields import SequenceField, sequence_fields

#: Settings of a row that the admin and ``autoseq set`` may change.
CHANGEABLE = ("current", "end", "step", "batch", "batch_count", "cycle")
_CAS_ATTEMPTS = 20


@dataclass(frozen=True)
class ColumnMax:
    """``max()`` of one column that takes values from a sequence, in one database."""

    label: str
    database: str
    value: int | None


def users(name: str, apps: Any = None) -> list[SequenceField]:
    """Every ``SequenceField`` (of ``apps``, default the project's) drawing from ``name``."""
    registry = apps or global_apps
    return [
        field
        for model in registry.get_models()
        if not model._meta.proxy
        for field in sequence_fields(model)
        if field.sequence_name == name
    ]


def _has_table(alias: str, model: type[models.Model]) -> bool:
    connection = connections[alias]
    with connection.cursor() as cursor:
        names = {n.lower() for n in connection.introspection.table_names(cursor)}
    return model._meta.db_table.lower() in names


def column_max(field: SequenceField, alias: str) -> int | None:
    """``max()`` of ``field``'s column in database ``alias``."""
    model = field.model
    result = model._base_manager.using(alias).aggregate(top=models.Max(field.attname))
    value = result["top"]
    return None if value is None else int(value)


def columns_of(name: str, sequence_alias: str) -> list[ColumnMax]:
    """``max()`` of every column served by sequence ``name`` of ``sequence_alias``'s store.

    A column counts in each database whose rows draw from that same store
    (same ``sys_sequence``), where the router lets its model live and its
    table exists.
    """
    target = sequences._url_key(sequence_alias)
    found: list[ColumnMax] = []
    for alias in settings.DATABASES:
        if sequences._url_key(sequences.sequence_database(alias)) != target:
            continue
        for field in users(name):
            if router.allow_migrate_model(alias, field.model) and _has_table(alias, field.model):
                label = f"{field.model._meta.label}.{field.name}"
                found.append(ColumnMax(label, alias, column_max(field, alias)))
    return found


def first_value_after(row: SequenceConfig, value: int | None) -> int:
    """The first value of ``row``'s series (``start + k * step``) greater than ``value``."""
    if value is None or value < row.start:
        return row.start
    return row.start + ((value - row.start) // row.step + 1) * row.step


def _now() -> datetime:
    return datetime.now(UTC)


def _compare_and_set(sequence_alias: str, name: str, seen: int, values: dict[str, Any]) -> bool:
    import sqlalchemy as sa

    store = sequences.store(sequence_alias)
    table = store.table
    with store.engine.begin() as connection:
        result = connection.execute(
            sa.update(table)
            .where(table.c.name == name, table.c.current == seen)
            .values(**values, updated_at=_now())
        )
    return result.rowcount == 1


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
    unknown = sorted(set(changes) - set(CHANGEABLE))
    if unknown:
        raise InvalidSequenceConfig(
            f"cannot change {', '.join(unknown)}; changeable: {', '.join(CHANGEABLE)}"
        )
    merged = {**row.as_row(), **changes}
    if merged["current"] > merged["end"]:
        raise InvalidSequenceConfig(
            f"sequence {row.name!r}: current={merged['current']} is past end={merged['end']}; "
            "raise end first"
        )
    candidate = SequenceConfig(**merged)
    current = candidate.next_value
    if "current" in changes and current != row.next_value:
        if current < row.next_value and not force:
            raise InvalidSequenceConfig(
                f"sequence {row.name!r}: current may only move forward (stored: "
                f"{row.next_value}); running processes may hold the values below it. "
                "Stop them and use `manage.py autoseq set --force` to move it back."
            )
        for column in columns if columns is not None else columns_of(row.name, sequence_alias):
            if column.value is not None and current <= column.value:
                raise InvalidSequenceConfig(
                    f"sequence {row.name!r}: current={current} is not past max({column.label})"
                    f"={column.value} in database {column.database!r}; use "
                    f"{first_value_after(candidate, column.value)} or more"
                )
    return candidate


def change(
    sequence_alias: str, name: str, changes: dict[str, Any], *, force: bool = False
) -> SequenceConfig:
    """Apply ``changes`` to row ``name`` (validated, compare-and-set) and return the row."""
    columns = columns_of(name, sequence_alias) if "current" in changes else []
    for _ in range(_CAS_ATTEMPTS):
        row = read(sequence_alias, name)
        candidate = validate_change(sequence_alias, row, changes, force=force, columns=columns)
        values = {key: getattr(candidate, key) for key in CHANGEABLE if key != "current"}
        values["current"] = candidate.next_value
        if _compare_and_set(sequence_alias, name, row.next_value, values):
            sequences.forget(sequence_alias, name)
            return read(sequence_alias, name)
    raise InvalidSequenceConfig(
        f"sequence {name!r} kept moving while being changed ({_CAS_ATTEMPTS} attempts); "
        "try again when it is less busy"
    )


def advance_past(sequence_alias: str, config: SequenceConfig, value: int | None) -> tuple[int, int]:
    """Move ``current`` of ``config.name`` past ``value`` (never back); (old, new) current.

    A missing row is created from ``config`` when there is something to move
    past; with nothing (``value`` None) it is left to be created on first use.
    """
    store = sequences.store(sequence_alias)
    row = store.read(config.name)
    if row is None:
        if value is None:
            return config.next_value, config.next_value
        row = store.create(config)
    for _ in range(_CAS_ATTEMPTS):
        target = first_value_after(row, value)
        if target <= row.next_value:
            return row.next_value, row.next_value
        if target > row.last_value and not row.cycle:
            raise InvalidSequenceConfig(
                f"sequence {row.name!r}: the column already holds {value}, past the last "
                f"value {row.last_value} (end={row.end}); raise end first"
            )
        if _compare_and_set(sequence_alias, row.name, row.next_value, {"current": target}):
            sequences.forget(sequence_alias, row.name)
            return row.next_value, target
        row = read(sequence_alias, row.name)
    raise InvalidSequenceConfig(f"sequence {row.name!r} kept moving while being synced")


@dataclass(frozen=True)
class SyncResult:
    """What ``sync`` did to one sequence."""

    name: str
    columns: tuple[str, ...]
    column_max: int | None
    old: int
    new: int


def sync(
    database: str, *, names: Iterable[str] | None = None, apps: Any = None
) -> list[SyncResult]:
    """Move each sequence used in ``database`` past ``max()`` of its columns there.

    ``apps`` is the model registry to look in (a migration passes its own).
    """
    wanted = set(names) if names is not None else None
    registry = apps or global_apps
    by_name: dict[str, list[SequenceField]] = {}
    for model in registry.get_models():
        if model._meta.proxy or not router.allow_migrate_model(database, model):
            continue
        if not _has_table(database, model):
            continue
        for field in sequence_fields(model):
            if wanted is None or field.sequence_name in wanted:
                by_name.setdefault(field.sequence_name, []).append(field)
    if wanted:
        missing = sorted(wanted - set(by_name))
        if missing:
            raise SequenceNotFound(
                missing[0], f"no model in database {database!r} uses it (known: {sorted(by_name)})"
            )
    sequence_alias = sequences.sequence_database(database)
    results = []
    for name, fields in sorted(by_name.items()):
        values = [column_max(field, database) for field in fields]
        present = [v for v in values if v is not None]
        top = max(present) if present else None
        old, new = advance_past(sequence_alias, fields[0].sequence_config, top)
        labels = tuple(f"{f.model._meta.label}.{f.name}" for f in fields)
        results.append(SyncResult(name, labels, top, old, new))
    return results
