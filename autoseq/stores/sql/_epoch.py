"""PostgreSQL: the epoch record, and the one-time treatment a new primary gets before serving.

Under asynchronous replication a promoted standby may lack the last
reservations the old primary committed and handed out. A process that saw
them skips past them (its fence), but a process that never did (a fresh
one, or one whose own reservations all replicated) would be handed them
again. So the store keeps an epoch record beside ``sys_sequence``
(``sys_epoch``, else ``<table>_epoch``): one row holding the system
identifier and WAL timeline of the primary the rows were last written on.
It replicates with the rows, so a promoted standby carries the old
primary's epoch; its timeline is new.

Every new connection of the store reads the record (one round trip,
beside the identity query already made there; never per reservation).
When the server it reached is another primary than the recorded one,
before anything is served from it, the connection runs the failover
treatment in one transaction, guarded by ``SELECT ... FOR UPDATE`` on the
record and a compare of its content (so exactly one process treats a
failover; the others wait on the row, then see it done):

* every ``sys_sequence`` row's ``current`` moves forward by a skip
  margin (its ``version`` bumped, so maintenance's compare-and-set sees
  the write); see `margin`;
* every live-looking snowflake worker lease (held, expired less than an
  estimated ``lease_ttl`` ago) expires no sooner than one ``lease_ttl``
  after the treatment, so a fresh process cannot take a worker id whose
  holder's renewals were lost while that holder still issues;
* the record takes the new primary's identity.

The record is created by ``SQLStore.create_table()`` (and the worker
table's, for snowflake leases alone), and lazily by the first connection
that finds the sequence or worker table without it (a deployment
made by an older autoseq, or by a migration that created the table only).
A failover before the record exists is not treated: there is nothing to
compare with.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql.base import PGDialect

from autoseq.config import SequenceConfig, utc_now
from autoseq.errors import InvalidSequenceConfig, InvalidStoredRow
from autoseq.pacing import DEFAULT_MAX_BATCH_COUNT, RANGE_SHARE
from autoseq.stores.sql._statements import sqlstate
from autoseq.stores.sql.workers import worker_table_name
from autoseq.workers import LAYOUT_ROW

log = logging.getLogger("autoseq")

#: Blocks of a row's largest block skipped at a failover (``SQLStore(failover_skip_blocks=)``).
DEFAULT_SKIP_BLOCKS = 16
#: A lease's ``lease_ttl`` is read from its row as ``expires_ms - last_ms`` (never
#: below the real one: a renewal writes ``now + ttl`` and a ``last_ms`` not after
#: ``now``); a row that has not issued lately reads longer, so the push is capped.
LEASE_PUSH_CAP_MS = 600_000

_UNDEFINED_TABLE = "42P01"
# Table names in the statements below are validated identifiers (``validate_table_name``)
# quoted by the dialect's preparer, never input: hence the S608 exemptions.


def epoch_table_name(sequence_table: str) -> str:
    """``sys_epoch`` beside ``sys_sequence``, else ``<table>_epoch`` (cut to 63 characters)."""
    if sequence_table == "sys_sequence":
        return "sys_epoch"
    return f"{sequence_table[:57]}_epoch"


def epoch_table(name: str = "sys_epoch", metadata: sa.MetaData | None = None) -> sa.Table:
    """The epoch record's table as SQLAlchemy Core sees it (one row, ``id`` 1).

    Declared beside ``sys_sequence`` for Alembic and ``create_all()``
    (`autoseq.sqlalchemy`); the store creates it from this same definition.
    Outside PostgreSQL it stays empty.
    """
    return sa.Table(
        name,
        metadata if metadata is not None else sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("system_identifier", sa.String(32), nullable=False),
        sa.Column("timeline", sa.String(8), nullable=False),
        sa.Column("treated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("treatments", sa.BigInteger, nullable=False, server_default="0"),
    )


def validate_skip_blocks(value: object) -> int:
    """Return ``value`` if it is a whole number of blocks, 0 or more, else raise."""
    if type(value) is not int or value < 0:
        raise InvalidSequenceConfig(
            f"failover_skip_blocks={value!r}; use a whole number of blocks, 0 or more "
            f"(default {DEFAULT_SKIP_BLOCKS}; 0 skips nothing at a failover)"
        )
    return value


def largest_block(row: SequenceConfig) -> int:
    """The most values one reservation of ``row`` takes under the default `BufferPolicy`.

    Blocks grow to last ``block_seconds`` at the rate values are taken, up
    to `DEFAULT_MAX_BATCH_COUNT`, and to no more than 1/`RANGE_SHARE` of a
    short range, never below ``batch_count``.
    """
    floor = row.batch_count  # a lock may take blocks whatever the row's batch flag says
    return max(floor, min(DEFAULT_MAX_BATCH_COUNT, row.range_size // RANGE_SHARE))


def margin(row: SequenceConfig, skip_blocks: int) -> int:
    """Values of ``row`` a failover treatment skips: ``skip_blocks`` of its largest blocks.

    What a lost replication window can have handed out is at most the
    blocks reserved on the old primary during the standby's lag. The
    largest block (2**24 values on a 64-bit range) lasts about a second
    of one process taking values at full speed in memory, so 16 of them
    cover a lag of about 16 s of such a process (16/N s of N of them), and
    far longer at the rates applications take keys; 2**28 values, nothing
    beside 2**63. A short range gets 1/100 of its values per block.
    """
    return skip_blocks * largest_block(row)


@dataclass(frozen=True)
class Skip:
    """What a treatment did to one row: ``skipped`` values, ``short`` if it wanted more."""

    name: str
    skipped: int
    wanted: int
    current: int

    @property
    def short(self) -> bool:
        """The range had fewer values left than the margin (the row is now at its end)."""
        return self.skipped < self.wanted


@dataclass
class Treatment:
    """A failover treatment this connection ran: from which primary to which, and what moved."""

    was: tuple[str, str]
    now: tuple[str, str]
    skips: list[Skip] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    leases: int = 0


class Epoch:
    """The epoch record of one store's tables, and the treatment of a new primary."""

    def __init__(
        self,
        sequence_table: str,
        skip_blocks: int,
        lock_timeout_ms: int,
        level: str | None,
        quote: Callable[[str], str] = lambda name: name,
    ) -> None:
        # quoted as SQLAlchemy quotes them when it creates the tables
        self.sequence_table = quote(sequence_table)
        self.table = quote(epoch_table_name(sequence_table))
        self.worker_table = quote(worker_table_name(sequence_table))
        self._create = str(
            sa.schema.CreateTable(
                epoch_table(epoch_table_name(sequence_table)), if_not_exists=True
            ).compile(dialect=PGDialect())  # type: ignore[no-untyped-call]
        )
        self.skip_blocks = skip_blocks
        self.lock_timeout_ms = lock_timeout_ms
        self.level = level
        self._warned = False

    def check(self, cursor: Any, identity: tuple[str, str]) -> Treatment | None:
        """On a new autocommit connection to primary ``identity``: treat it if it is a new one.

        Returns the treatment this call ran, or None (same primary, record
        made now, no sequence table yet, or another process treated it).
        """
        try:
            cursor.execute(f"SELECT system_identifier, timeline FROM {self.table} WHERE id = 1")  # noqa: S608
            row = cursor.fetchone()
        except Exception as exc:  # noqa: BLE001 - the driver's error, read by its SQLSTATE
            if sqlstate(exc) == _UNDEFINED_TABLE:
                self.record_or_warn(cursor, identity, if_used=True)
            else:
                self._warn_once(f"cannot read the epoch record {self.table}: {exc}")
            return None
        if row is None:
            self.record_or_warn(cursor, identity)
            return None
        if tuple(row) == identity:
            return None
        return self._treat(cursor, identity)

    def record_or_warn(self, cursor: Any, identity: tuple[str, str], **how: bool) -> None:
        """`record`, or a warning (once) where the store may not create or write it."""
        try:
            self.record(cursor, identity, **how)
        except Exception as exc:  # noqa: BLE001 - no right to create it: serve, unprotected
            self._warn_once(f"cannot create the epoch record {self.table}: {exc}")

    def _warn_once(self, problem: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "%s; a failover to an asynchronous standby is not treated (values the old "
                "primary served may be served again): run `autoseq init` as a user that may "
                "create tables, or create the table as docs/scaling.md shows",
                problem,
            )

    def recorded(self, connection: Any) -> bool:
        """Whether the record exists (a DBAPI connection to the primary; for ``doctor``)."""
        cursor = connection.cursor()
        try:
            return self._exists(cursor, self.table)
        finally:
            cursor.close()

    def record(self, cursor: Any, identity: tuple[str, str], *, if_used: bool = False) -> None:
        """Create the record unless made (``if_used``: where rows or leases exist).

        An existing record is left as it is: only a treatment changes it.
        """
        if not self._exists(cursor, self.table):  # made by a migration: no CREATE right needed
            if if_used and not (
                self._exists(cursor, self.sequence_table) or self._exists(cursor, self.worker_table)
            ):
                return  # nothing to protect yet: create_table() records it
            cursor.execute(self._create)
        cursor.execute(
            f"INSERT INTO {self.table} (id, system_identifier, timeline) VALUES (1, %s, %s) "  # noqa: S608
            "ON CONFLICT (id) DO NOTHING",
            identity,
        )

    def _treat(self, cursor: Any, identity: tuple[str, str]) -> Treatment | None:
        cursor.execute("BEGIN")
        try:
            treatment = self._treat_in_transaction(cursor, identity)
            cursor.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(Exception):  # a dead connection has nothing to roll back
                cursor.execute("ROLLBACK")
            raise
        return treatment

    def _treat_in_transaction(self, cursor: Any, identity: tuple[str, str]) -> Treatment | None:
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", (str(self.lock_timeout_ms),))
        if self.level is not None:
            cursor.execute("SELECT set_config('synchronous_commit', %s, true)", (self.level,))
        cursor.execute(
            f"SELECT system_identifier, timeline FROM {self.table} WHERE id = 1 FOR UPDATE"  # noqa: S608
        )
        row = cursor.fetchone()
        if row is None or tuple(row) == identity:
            return None  # another process treated it while this one waited on the row
        treatment = Treatment(was=(row[0], row[1]), now=identity)
        self._skip_rows(cursor, treatment)
        treatment.leases = self._push_leases(cursor)
        cursor.execute(
            f"UPDATE {self.table} SET system_identifier = %s, timeline = %s, "  # noqa: S608
            "treated_at = now(), treatments = treatments + 1 WHERE id = 1",
            identity,
        )
        return treatment

    @staticmethod
    def _exists(cursor: Any, table: str) -> bool:
        cursor.execute("SELECT to_regclass(%s)", (table,))
        (found,) = cursor.fetchone()
        return found is not None

    def _skip_rows(self, cursor: Any, treatment: Treatment) -> None:
        table = self.sequence_table
        if not self._exists(cursor, table):
            return  # leases only (snowflake ids)
        cursor.execute(
            f'SELECT name, start, "end", step, current, batch, batch_count, cycle, version '  # noqa: S608
            f"FROM {table} ORDER BY name FOR UPDATE"
        )
        columns = [column[0] for column in cursor.description]
        rows = [dict(zip(columns, values, strict=True)) for values in cursor.fetchall()]
        now = utc_now()
        for stored in rows:
            try:
                row = SequenceConfig.from_row(stored)
            except InvalidStoredRow:
                treatment.unreadable.append(str(stored["name"]))
                continue
            wanted = margin(row, self.skip_blocks)
            left = row.values_left
            if wanted == 0 or left == 0:
                continue  # nothing to skip, or nothing left to serve before a cycle
            skipped = min(wanted, left)
            current = row.next_value + skipped * row.step
            cursor.execute(
                f"UPDATE {table} SET current = %s, version = version + 1, updated_at = %s "  # noqa: S608
                "WHERE name = %s AND version = %s",
                (current, now, row.name, stored["version"]),
            )
            treatment.skips.append(Skip(row.name, skipped, wanted, current))

    def _push_leases(self, cursor: Any) -> int:
        """Every live-looking lease expires no sooner than one estimated ``lease_ttl`` from now."""
        if not self._exists(cursor, self.worker_table):
            return 0
        ttl = f"LEAST(expires_ms - last_ms, {LEASE_PUSH_CAP_MS})"
        now_ms = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
        cursor.execute(
            f"UPDATE {self.worker_table} SET expires_ms = {now_ms} + {ttl}, "  # noqa: S608
            "version = version + 1 "
            f"WHERE owner IS NOT NULL AND worker <> {LAYOUT_ROW} AND expires_ms > last_ms "
            f"AND expires_ms + {ttl} > {now_ms} AND expires_ms < {now_ms} + {ttl}"
        )
        return int(cursor.rowcount or 0)
