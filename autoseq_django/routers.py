"""``SequenceRouter``: sends ``SysSequence`` to ``AUTOSEQ["DATABASE"]``."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import models

from autoseq_django import conf


def is_sqlite_companion(alias: str) -> bool:
    """True when ``alias`` is a SQLite ``<db>.autoseq`` file (see ``sqlite_companion``)."""
    database = settings.DATABASES.get(alias, {})
    return "sqlite" in str(database.get("ENGINE", "")) and str(database.get("NAME", "")).endswith(
        ".autoseq"
    )


def _configured_database() -> str | None:
    """``AUTOSEQ["DATABASE"]``, or None while the setting is malformed.

    Django asks routers during its own system checks: raising here would
    turn check autoseq.E008, which names the typo, into a traceback.
    """
    try:
        return conf.get().database
    except ImproperlyConfigured:
        return None


def _main_of_companion(alias: str) -> str | None:
    """The alias whose SQLite file ``alias`` is the companion of (``TEST["MIRROR"]``)."""
    if not is_sqlite_companion(alias):
        return None
    database = settings.DATABASES[alias]
    mirror = (database.get("TEST") or {}).get("MIRROR")
    main = settings.DATABASES.get(mirror) if isinstance(mirror, str) else None
    if main is None or f"{main.get('NAME')}.autoseq" != str(database.get("NAME")):
        return None
    return str(mirror)


class SequenceRouter:
    """Routes ``SysSequence`` reads, writes and migrations to ``AUTOSEQ["DATABASE"]``.

    A SQLite companion database (``<db>.autoseq``) migrates only
    ``sys_sequence``: a migration of another app would hold the file's write
    lock while, say, a data migration needs a reservation from it. Anything
    else is left to the next router.
    """

    def _target(self, model: type[models.Model]) -> str | None:
        if model._meta.app_label != "autoseq":
            return None
        return _configured_database()

    def db_for_read(self, model: type[models.Model], **hints: Any) -> str | None:
        target = self._target(model)
        # A companion alias from sqlite_companion(): its main database's
        # connection attaches the file read-only, so reads go there. Tests
        # then need no access to the companion alias (which Django would
        # refuse, or lock at teardown when listed).
        return (_main_of_companion(target) or target) if target else None

    def db_for_write(self, model: type[models.Model], **hints: Any) -> str | None:
        return self._target(model)

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        if is_sqlite_companion(db):
            return app_label == "autoseq"
        if app_label == "autoseq" and db == _configured_database():
            return True
        return None
