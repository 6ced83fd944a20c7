"""PostgreSQL: commits durable where a failover can reach, and noticing a new primary.

Every transaction and reservation of the store's engine sets
``synchronous_commit`` for itself (``"on"`` by default; ``SET LOCAL``, so a
pooler's shared server connection keeps nothing): a server or role configured with ``off``
acknowledges a commit before it is on disk, so even one server repeats
values after a crash, and with a synchronous standby ``on`` also waits for
the standby to have the commit before the reservation is handed out.

A commit whose wait for the synchronous standby was cancelled still
commits locally; the server only says so in a WARNING ("canceling wait for
synchronous replication ... committed locally, might not have been
replicated"). The store's connections collect warnings per thread (the
driver delivers a notice in the thread running the statement), so a
reservation can tell whether its own commit drew one.

Each new connection also reads which server it reached: the cluster's
system identifier and its current WAL timeline. A promoted standby has the
same identifier and a new timeline, so a change means a failover. The same
connection then compares it with the epoch record the rows carry
(`autoseq.stores.sql._epoch`): a new primary gets its failover treatment
there, before the connection serves anything.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from autoseq.errors import InvalidSequenceConfig
from autoseq.stores.sql._epoch import Epoch, Treatment

log = logging.getLogger("autoseq")

#: ``synchronous_commit`` levels a store may ask for; ``None`` leaves the server's own.
SYNCHRONOUS_COMMIT = ("on", "remote_apply", "remote_write", "local")

_IDENTITY = (
    "SELECT system_identifier::text, CASE WHEN pg_is_in_recovery() THEN NULL "
    "ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END FROM pg_control_system()"
)


def validate_synchronous_commit(value: object) -> str | None:
    """Return ``value`` if it is a level of `SYNCHRONOUS_COMMIT` or None, else raise."""
    if value is None or value in SYNCHRONOUS_COMMIT:
        return value
    raise InvalidSequenceConfig(
        f"synchronous_commit={value!r}; use one of {', '.join(SYNCHRONOUS_COMMIT)} "
        "(on: durable on disk and on a synchronous standby), or None to keep the server's"
    )


class _Warnings(threading.local):
    collected: list[str] | None = None


class Replication:
    """Session set-up, commit warnings and the primary's identity for one PostgreSQL engine."""

    def settings(self) -> dict[str, str]:
        """The parameters each transaction of the store sets for itself."""
        level = self.synchronous_commit
        return {} if level is None else {"synchronous_commit": level}

    def __init__(
        self,
        engine: Engine,
        synchronous_commit: str | None,
        epoch: Epoch | None = None,
        on_treated: Callable[[Treatment], None] | None = None,
    ) -> None:
        self.synchronous_commit = synchronous_commit
        self.primary: tuple[str, str] | None = None
        self.epoch = epoch
        self._on_treated = on_treated
        self._changed = False
        self._guard = threading.Lock()
        self._warnings = _Warnings()
        event.listen(engine, "connect", self._connect)

    def _connect(self, dbapi_connection: Any, _record: Any) -> None:
        self._collect_warnings(dbapi_connection)
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        try:
            cursor = dbapi_connection.cursor()
            identity = self._note_identity(cursor)
            if identity is not None and self.epoch is not None:
                self._check_epoch(cursor, identity)
            cursor.close()
        finally:
            dbapi_connection.autocommit = autocommit

    def _check_epoch(self, cursor: Any, identity: tuple[str, str]) -> None:
        """Treat a new primary before this connection serves (an error fails the connection)."""
        assert self.epoch is not None
        treatment = self.epoch.check(cursor, identity)
        if treatment is None:
            return
        with self._guard:
            self._changed = True  # this process's buffered blocks came from the old primary
        if self._on_treated is not None:
            self._on_treated(treatment)

    def record_epoch(self, dbapi_connection: Any) -> None:
        """Record the primary ``dbapi_connection`` reached as the epoch, unless one is recorded.

        Run by ``create_table()`` (in autocommit); a standby or a look-alike
        server (no identity) records nothing, and a store without the right
        to create it warns once and serves on.
        """
        if self.epoch is None:
            return
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        cursor = dbapi_connection.cursor()
        try:
            identity = self._note_identity(cursor)
            if identity is not None:
                self.epoch.record_or_warn(cursor, identity)
        finally:
            cursor.close()
            dbapi_connection.autocommit = autocommit

    def _note_identity(self, cursor: Any) -> tuple[str, str] | None:
        try:
            cursor.execute(_IDENTITY)
            system, timeline = cursor.fetchone()
        except Exception as exc:  # noqa: BLE001 - no such function (a look-alike server), or no right
            log.debug("cannot tell which PostgreSQL primary this is: %s", exc)
            return None
        if timeline is None:
            return None
        with self._guard:
            if self.primary is not None and self.primary != (system, timeline):
                log.warning(
                    "PostgreSQL primary changed (system %s timeline %s, was %s timeline %s): "
                    "a failover; blocks reserved before are dropped",
                    system,
                    timeline,
                    *self.primary,
                )
                self._changed = True
            self.primary = (system, timeline)
        return (system, timeline)

    def failed_over(self) -> bool:
        """Whether a connection reached another primary since the last call."""
        with self._guard:
            changed, self._changed = self._changed, False
        return changed

    def _collect_warnings(self, dbapi_connection: Any) -> None:
        if hasattr(dbapi_connection, "add_notice_handler"):  # psycopg 3
            dbapi_connection.add_notice_handler(self._on_notice)
        elif isinstance(getattr(dbapi_connection, "notices", None), list):  # psycopg2
            dbapi_connection.notices = _Notices(self._warnings)

    def _on_notice(self, diagnostic: Any) -> None:
        severity = getattr(diagnostic, "severity_nonlocalized", None) or diagnostic.severity
        if severity == "WARNING":
            self._note_warning(f"{diagnostic.message_primary} {diagnostic.message_detail or ''}")

    def _note_warning(self, text: str) -> None:
        collected = self._warnings.collected
        if collected is not None:
            collected.append(text.strip())

    @contextmanager
    def watching(self) -> Iterator[list[str]]:
        """The warnings the server sends this thread inside, committing included."""
        collected: list[str] = []
        self._warnings.collected = collected
        try:
            yield collected
        finally:
            self._warnings.collected = None


_STANDBYS = "SELECT application_name, sync_state FROM pg_stat_replication"
_SERVER_LEVEL = "SELECT reset_val FROM pg_settings WHERE name = 'synchronous_commit'"
_REPEATS = (
    "a failover to one of them can hand out again values served from a block it had not "
    "received yet, to another process"
)
_TREATED = (
    "a failover to one of them is treated before the new primary serves: every row moves "
    "forward by {blocks} of its largest blocks and live worker leases are kept a lease_ttl, "
    "so no process repeats a value unless the lost window served more than that margin "
    "(SQLStore(failover_skip_blocks=...))"
)


def findings(
    connection: Any, level: str | None, epoch: Epoch | None = None
) -> list[tuple[str, str]]:
    """(level, message) pairs: could a failover or a crash repeat values on this server?

    ``connection`` is a DBAPI connection to the primary, ``level`` the
    store's ``synchronous_commit``, ``epoch`` its epoch record (which a
    failover to an asynchronous standby is treated by).
    """
    cursor = connection.cursor()
    cursor.execute(_STANDBYS)
    standbys = cursor.fetchall()
    cursor.execute(_SERVER_LEVEL)
    (server_level,) = cursor.fetchone()
    cursor.close()
    found: list[tuple[str, str]] = []
    effective = server_level if level is None else level
    if effective == "off":
        found.append(
            (
                "error",
                "synchronous_commit=off for the store's sessions (the server's or role's "
                "setting): a crash loses acknowledged reservations and values repeat; pass "
                'SQLStore(synchronous_commit="on") (the default)',
            )
        )
    states = [state for _name, state in standbys]
    if standbys and all(state is None for state in states):
        found.append(
            (
                "warning",
                f"{len(standbys)} standby(s) stream from this server but their sync_state is "
                "hidden from this user; grant it pg_monitor so doctor can tell whether a "
                "failover could repeat values",
            )
        )
    elif states and not any(state in ("sync", "quorum") for state in states):
        recorded = epoch is not None and epoch.recorded(connection)
        if recorded and epoch is not None and epoch.skip_blocks > 0:
            what = _TREATED.format(blocks=epoch.skip_blocks)
        elif recorded:
            what = f"{_REPEATS} (SQLStore(failover_skip_blocks=0) skips nothing at a failover)"
        else:
            what = (
                f"{_REPEATS}, and there is no epoch record to notice the failover by "
                "(create the sequence table with `autoseq init` or SQLStore.create_table())"
            )
        found.append(
            (
                "warning",
                f"{len(states)} asynchronous standby(s) and no synchronous one: {what}. "
                "Make one synchronous (synchronous_standby_names = 'ANY 1 (...)'): autoseq "
                "then waits for it at every reservation and nothing is skipped",
            )
        )
    elif states and effective == "local":
        found.append(
            (
                "warning",
                'a synchronous standby, but SQLStore(synchronous_commit="local") does not '
                f'wait for it: {_REPEATS}; use "on"',
            )
        )
    elif states and effective != "off":
        found.append(
            (
                "ok",
                f"reservations wait for the synchronous standby (synchronous_commit={effective})",
            )
        )
    return found


class _Notices:
    """psycopg2's ``connection.notices``: keeps the warnings for the thread that runs."""

    def __init__(self, warnings: _Warnings) -> None:
        self._warnings = warnings

    def append(self, notice: str) -> None:
        if notice.startswith("WARNING") and self._warnings.collected is not None:
            self._warnings.collected.append(notice.strip())
