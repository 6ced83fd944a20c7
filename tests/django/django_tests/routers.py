"""A project router that keeps every sequence in the "sqlite" database."""

from __future__ import annotations

from typing import Any


class SequencesInSqlite:
    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return "sqlite" if model._meta.label == "autoseq.SysSequence" else None


class AppTo:
    """Sends every model of ``app_label`` to database ``alias`` (the admin follows it)."""

    def __init__(self, app_label: str, alias: str) -> None:
        self.app_label = app_label
        self.alias = alias

    def _route(self, model: Any, **hints: Any) -> str | None:
        return self.alias if model._meta.app_label == self.app_label else None

    db_for_read = _route
    db_for_write = _route

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        return True if obj1._meta.app_label == obj2._meta.app_label == self.app_label else None


class SequencesWhereTold:
    """Keeps the sequences in ``target``, which a test changes between inserts."""

    target = "sqlite"

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self.target if model._meta.label == "autoseq.SysSequence" else None
