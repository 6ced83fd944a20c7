"""The columns that draw from a sequence: which models, which fields, their ``max()``.

What the registry (`autoseq_django.registry`: a row created on first use
starts past ``max()`` of its columns), the catch-up after loaded keys, the
maintenance commands and the test helpers all ask. It sits below
`autoseq_django.fields`: a field is recognised by the `SequenceColumn` base
that `SequenceField` carries, so nothing here imports the field classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.db import models, router

from autoseq_django import databases
from autoseq_django.tables import has_table, table_names

if TYPE_CHECKING:
    from autoseq_django.fields import SequenceField


class SequenceColumn:
    """Base of every field filled from a sequence (`SequenceField` and its subclasses).

    Holds nothing: it lets the look-ups of this module, which sit below the
    field classes, tell those fields apart with ``isinstance``.
    """


@dataclass(frozen=True)
class ColumnMax:
    """``max()`` of one column that takes values from a sequence, in one database."""

    label: str
    database: str
    value: int | None


def sequence_fields(model: type[models.Model]) -> list[SequenceField]:
    """The concrete ``SequenceField`` columns of ``model``."""
    found = [f for f in model._meta.concrete_fields if isinstance(f, SequenceColumn)]
    return cast("list[SequenceField]", found)


def sequence_models(apps: Any = None) -> list[type[models.Model]]:
    """Every concrete model of ``apps`` (default: the project's) whose table may hold keys.

    Besides the installed apps' models: auto-created many-to-many tables and
    Django's ``django_migrations``, whose keys come from ``DEFAULT_AUTO_FIELD``
    too, so a project switching it keeps their sequences past their rows.
    """
    from django.apps import apps as global_apps
    from django.db.migrations.recorder import MigrationRecorder

    registry = apps or global_apps
    found = [m for m in registry.get_models(include_auto_created=True) if not m._meta.proxy]
    recorder = MigrationRecorder.Migration
    if all(m._meta.db_table != recorder._meta.db_table for m in found):
        found.append(recorder)
    return found


def users(name: str, apps: Any = None) -> list[SequenceField]:
    """Every ``SequenceField`` (of ``apps``, default the project's) drawing from ``name``."""
    return [
        field
        for model in sequence_models(apps)
        for field in sequence_fields(model)
        if field.sequence_name == name
    ]


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
    target = databases.url_key(sequence_alias)
    found: list[ColumnMax] = []
    for alias in settings.DATABASES:
        if databases.url_key(databases.sequence_database(alias)) != target:
            continue
        fields = [f for f in users(name) if router.allow_migrate_model(alias, f.model)]
        tables = table_names(alias) if fields else set()
        for field in fields:
            if has_table(alias, field.model, tables):
                label = f"{field.model._meta.label}.{field.name}"
                found.append(ColumnMax(label, alias, column_max(field, alias)))
    return found


def columns_floor(
    name: str, sequence_alias: str, column: Any = None, write_alias: str = ""
) -> int | None:
    """``max()`` of every column using ``name`` in the databases sharing its store.

    ``column``: a field whose model no app registry lists (one a migration
    built, say a renamed model's many-to-many table) counts too.
    """
    values = [c.value for c in columns_of(name, sequence_alias) if c.value is not None]
    if column is not None and column.model not in {field.model for field in users(name)}:
        top = column_max(column, write_alias)
        values += [] if top is None else [top]
    return max(values) if values else None
