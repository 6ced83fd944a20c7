"""The app config: wires checks and signals; never touches a database in ``ready()``.

Django imports this module while it builds the app registry, before any
model exists, so the package's modules are imported inside the functions
here (``ready()`` and the signal handlers run once the models are loaded).
"""

from __future__ import annotations

import logging
from typing import Any

from django.apps import AppConfig
from django.core.signals import request_started, setting_changed
from django.db import DatabaseError, connections
from django.db.backends.signals import connection_created

from autoseq.errors import AutoseqError


class AutoseqConfig(AppConfig):
    """``"autoseq_django"`` in ``INSTALLED_APPS``; its label is ``autoseq``."""

    name = "autoseq_django"
    label = "autoseq"
    verbose_name = "Sequences"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.exceptions import ImproperlyConfigured

        from autoseq_django import checks, conf, doctor  # noqa: F401 - registers the checks

        setting_changed.connect(_settings_changed, dispatch_uid="autoseq-settings")
        _install_metrics()
        connection_created.connect(_connection_created, dispatch_uid="autoseq-nodb")
        from django.db.models.signals import post_migrate

        # Sent once per app: ours is enough, the plan covers every app.
        post_migrate.connect(_after_migrate, sender=self, dispatch_uid="autoseq-migrated")
        try:
            preload = conf.get().preload
        except ImproperlyConfigured:
            return  # check autoseq.E008 says what is wrong; the first use raises it
        if preload:
            request_started.connect(_preload_once, dispatch_uid="autoseq-preload")


def _install_metrics() -> None:
    """Count from start-up when the ``prometheus`` extra is installed (``autoseq_django.urls``)."""
    import importlib.util

    if importlib.util.find_spec("prometheus_client") is not None:
        from autoseq import metrics

        metrics.install()


def _settings_changed(setting: str, **kwargs: Any) -> None:
    if setting in ("AUTOSEQ", "DATABASES", "DATABASE_ROUTERS"):
        from autoseq_django import conf
        from autoseq_django import registry as sequences
        from autoseq_django.snowflake import close_generators

        conf.reset()
        # Before the stores close: each generator gives its worker id back
        # through its store, and none lives on (leased, renewing, connected)
        # on a store no registry holds any more.
        close_generators()
        sequences.reset()


def _connection_created(connection: Any, **kwargs: Any) -> None:
    from autoseq_django import registry as sequences
    from autoseq_django._compat import NO_DB_ALIAS
    from autoseq_django.catchup import guard_inserts

    # Its settings may have changed since it was last open (a test run
    # renames its database): find locks the long way once more.
    sequences.changed()
    if guard_inserts not in connection.execute_wrappers:
        # Permanent, unlike execute_wrapper(): an INSERT meeting a key another
        # process loaded drops the buffered block (see autoseq_django.catchup).
        connection.execute_wrappers.append(guard_inserts)
    if connection.alias == NO_DB_ALIAS:
        # Django is about to create or drop a (test) database: let go of ours.
        sequences.disconnect_servers()
    elif connection.vendor == "sqlite":
        from autoseq_django.sqlite import attach_companion, show_gapless_rows

        try:
            attach_companion(connection)
            show_gapless_rows(connection)
        except Exception as exc:  # noqa: BLE001 - a connection must open even so
            # Only SysSequence queries miss the rows; inserts never need them.
            logging.getLogger("autoseq_django").warning(
                "autoseq: cannot attach the sequences file to %r: %s", connection.alias, exc
            )


def _after_migrate(using: str, apps: Any = None, plan: Any = None, **kwargs: Any) -> None:
    """``post_migrate``: every sequence used in ``using`` moves past ``max()`` of its columns.

    Whoever declared the table: the project's models, auto-created
    many-to-many tables and ``django_migrations`` (a project switching
    ``DEFAULT_AUTO_FIELD`` gives them sequence keys over existing rows).
    Missing rows are created here, so a first insert reads no ``max()``
    inside the caller's operations. ``flush`` (no plan) skips it: its tables
    are empty.
    """
    from autoseq_django.maintenance import sync
    from autoseq_django.sqlite import attach_companion
    from autoseq_django.testing import install_when_testing

    # Outside the migrations' transaction now: SQLite can ATTACH the file
    # that migration 0001 created, so this connection sees its rows too.
    attach_companion(connections[using])
    install_when_testing()  # test databases are being set up
    if plan is None:
        return
    try:
        sync(using, apps=apps, create=True)
    except (AutoseqError, DatabaseError) as exc:
        # Not fatal to migrate: a row created on first use starts past max() too.
        logging.getLogger("autoseq_django").warning(
            "autoseq: could not move the sequences of database %r past their rows after "
            "migrate (%s); run `manage.py autoseq sync --database %s` once it is reachable",
            using,
            exc,
            using,
        )


def _preload_once(**kwargs: Any) -> None:
    from autoseq_django import preload

    request_started.disconnect(dispatch_uid="autoseq-preload")
    preload()
