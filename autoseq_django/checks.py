"""System checks of the ``AUTOSEQ`` setting and of the sequences as a whole.

Field-level problems (``autoseq.E001``-``E007``, ``E014``) are checked by
``SequenceField.check`` and ``SerialField.check`` (``E012``-``E015``); these
look across settings, routers and models.
None of them touches a database.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, router

from autoseq_django import conf, maintenance
from autoseq_django import registry as sequences
from autoseq_django.columns import sequence_fields
from autoseq_django.fields import SequenceField
from autoseq_django.models import SysSequence
from autoseq_django.snowflake import SnowflakeAutoField
from autoseq_django.sqlite import companion_path

logger = logging.getLogger("autoseq_django")


def _all_sequence_fields(app_configs: Any = None) -> list[SequenceField]:
    if app_configs is None:
        models = apps.get_models()
    else:
        models = [model for config in app_configs for model in config.get_models()]
    return [field for model in models if not model._meta.proxy for field in sequence_fields(model)]


@checks.register(checks.Tags.models)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``AUTOSEQ`` is valid, routed, and every sequence database can be reached."""
    try:
        current = conf.parse(getattr(settings, "AUTOSEQ", None))
    except ImproperlyConfigured as exc:
        return [
            checks.Error(str(exc), hint="Fix settings.AUTOSEQ.", id="autoseq.E008"),
        ]
    errors: list[checks.CheckMessage] = []
    if current.database and router.db_for_write(SysSequence) != current.database:
        errors.append(
            checks.Error(
                f"AUTOSEQ['DATABASE'] is {current.database!r} but SysSequence is routed to "
                f"{router.db_for_write(SysSequence)!r}: the admin would show another table.",
                hint="Add 'autoseq_django.routers.SequenceRouter' to DATABASE_ROUTERS.",
                id="autoseq.E010",
            )
        )
    holders = {sequences.sequence_database(alias) for alias in settings.DATABASES}
    for alias in sorted(holders):
        try:
            sequences.database_url(alias)
        except ImproperlyConfigured as exc:
            errors.append(checks.Error(str(exc), id="autoseq.E011"))
    return errors


@checks.register(checks.Tags.models)
def check_shared_sequences(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Fields that share a sequence name do not ask for different settings."""
    by_name: dict[str, list[SequenceField]] = defaultdict(list)
    for field in _all_sequence_fields(app_configs):
        by_name[field.sequence_name].append(field)
    errors: list[checks.CheckMessage] = []
    for name, fields in sorted(by_name.items()):
        first = fields[0]
        for other in fields[1:]:
            keys = set(first.sequence_options) | set(other.sequence_options)
            differ = sorted(
                k for k in keys if first.sequence_options.get(k) != other.sequence_options.get(k)
            )
            if differ:
                errors.append(
                    checks.Error(
                        f"Sequence {name!r} is used by {first.model._meta.label}.{first.name} "
                        f"and {other.model._meta.label}.{other.name} with different "
                        f"{', '.join(differ)}; only one row can exist.",
                        hint="Give both fields the same settings, or different sequence names.",
                        obj=other,
                        id="autoseq.E009",
                    )
                )
    return errors


@checks.register(checks.Tags.database)
def check_sqlite_admin(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """A SQLite file's own ``sys_sequence`` would hide the companion Django attaches.

    Migration 0003 drops that table when empty; one holding rows is left
    for the operator, and SysSequence queries and the admin would read it.
    """
    messages: list[checks.CheckMessage] = []
    for alias in databases or ():
        connection = connections[alias]
        path = companion_path(connection)
        if path is None:
            continue
        with connection.cursor() as cursor:
            if "sys_sequence" not in connection.introspection.table_names(cursor):
                continue
        messages.append(
            checks.Warning(
                f"SQLite database {alias!r} has a sys_sequence table of its own; its "
                f"sequences live in {path}, which SysSequence and the admin then cannot see.",
                hint="Run `manage.py migrate autoseq` (it drops the table when empty), or "
                "move its rows out and drop it: no process reserves from it.",
                id="autoseq.W001",
            )
        )
    return messages


@checks.register(checks.Tags.database)
def check_stored_rows(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Fields whose settings differ from their stored row (the row wins until applied).

    A database check: it reads ``sys_sequence``, so it runs with ``migrate``
    and ``check --database``, not on every command.
    """
    messages: list[checks.CheckMessage] = []
    fields = _all_sequence_fields(app_configs)
    for alias in databases or ():
        rows = _stored_rows(alias)
        seen: set[str] = set()
        for field in fields:
            row = rows.get(field.sequence_name)
            if (
                row is None
                or row.name in seen
                or not router.allow_migrate_model(alias, field.model)
            ):
                continue
            changes = maintenance.drift(field, row)
            if not changes:
                continue
            seen.add(row.name)
            wanted = field.sequence_config
            stored = row.as_row()
            differ = ", ".join(
                f"start={wanted.start} (stored current={row.next_value})"
                if key == "current"
                else f"{key}={getattr(wanted, key)!r} (stored {stored[key]!r})"
                for key in changes
            )
            messages.append(
                checks.Warning(
                    f"{field.model._meta.label}.{field.name} asks for {differ}, but sequence "
                    f"{row.name!r} in database {alias!r} keeps its stored settings.",
                    hint=(
                        f"Apply them with `manage.py autoseq apply {row.name} --database {alias}`."
                    ),
                    obj=field,
                    id="autoseq.W002",
                )
            )
    return messages


def _stored_rows(alias: str) -> dict[str, Any]:
    """The rows serving database ``alias``; none when they cannot be read yet."""
    try:
        store = sequences.store(sequences.sequence_database(alias))
        return {row.name: row for row in store.read_all()}
    except Exception as exc:  # noqa: BLE001 - before the first migrate there is no table
        logger.debug("autoseq: stored rows of %r not read: %s", alias, exc)
        return {}


def _autoseq_default_auto_field() -> str | None:
    """``DEFAULT_AUTO_FIELD`` when it names one of autoseq's key fields, else None."""
    from django.utils.module_loading import import_string

    path = getattr(settings, "DEFAULT_AUTO_FIELD", None)
    if not isinstance(path, str):
        return None
    try:
        chosen = import_string(path)
    except ImportError:
        return None  # Django's own check (models.E033 / fields.E010) names it
    ours = isinstance(chosen, type) and issubclass(chosen, (SequenceField, SnowflakeAutoField))
    return path if ours else None


@checks.register(checks.Tags.models)
def check_app_default_auto_field(
    app_configs: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """Apps whose ``AppConfig.default_auto_field`` hides an autoseq ``DEFAULT_AUTO_FIELD``.

    ``startapp`` writes ``default_auto_field = "django.db.models.BigAutoField"``
    into every new app, and that line wins over the setting. Django's own
    apps are left out: their migrations are shipped with ``AutoField``.
    """
    from django.apps import AppConfig

    wanted = _autoseq_default_auto_field()
    if wanted is None:
        return []
    messages: list[checks.CheckMessage] = []
    for config in app_configs or apps.get_app_configs():
        own = type(config).default_auto_field
        if own is AppConfig.default_auto_field or config.name.split(".")[0] in _LEFT_ALONE:
            continue
        if config.default_auto_field == wanted:
            continue
        where = f"{type(config).__module__}.{type(config).__qualname__}"
        messages.append(
            checks.Warning(
                f"App {config.label!r} keys its models with {config.default_auto_field!r}: "
                f"{where}.default_auto_field overrides DEFAULT_AUTO_FIELD = {wanted!r}.",
                hint=(
                    f"Delete the line `default_auto_field = {config.default_auto_field!r}` "
                    f"from {where} (then run makemigrations), or silence autoseq.W010 if "
                    "that app should keep its own keys."
                ),
                obj=type(config),
                id="autoseq.W010",
            )
        )
    return messages


#: Apps whose key fields are fixed by the migrations they ship.
_LEFT_ALONE = frozenset({"django", "autoseq_django"})
