"""A project router that keeps every sequence in the "sqlite" database."""

from __future__ import annotations

from typing import Any


class SequencesInSqlite:
    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return "sqlite" if model._meta.label == "autoseq.SysSequence" else None
