"""What ``autoseq doctor`` checks on a ``SQLStore``: the SQLite companion file and
whether a failover could repeat values (PostgreSQL)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from autoseq.stores.capabilities import replication_check

if TYPE_CHECKING:
    from autoseq.stores.sql import SQLStore

#: (level, check, message): a doctor finding.
Finding = tuple[str, str, str]


def findings(store: SQLStore) -> list[Finding]:
    """The store's own findings, in the order doctor reports them."""
    return [*_companion(store), *replication_check(store)]


def _companion(store: SQLStore) -> list[Finding]:
    files = store.sqlite_files()
    if files is None:
        return []
    application, companion = files
    has_app, has_companion = os.path.exists(application), os.path.exists(companion)
    if has_app and has_companion:
        return [
            (
                "ok",
                "companion",
                f"sequences live in {companion}; back it up with {application}, the database "
                "first and this file second (a newer companion only leaves a gap)",
            )
        ]
    if has_app:
        return [
            (
                "warning",
                "companion",
                f"{companion} is missing beside {application}: no sequence has reserved yet, "
                "or the database was copied or restored without it (then every sequence "
                "starts again at start; `autoseq sync` each one past its column's max before "
                "writing)",
            )
        ]
    if has_companion:
        return [
            (
                "warning",
                "companion",
                f"{companion} exists but {application} does not: is --url the right database?",
            )
        ]
    return [("warning", "companion", f"neither {application} nor {companion} exists")]
