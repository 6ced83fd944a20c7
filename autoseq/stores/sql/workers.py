"""Worker leases in a ``sys_worker`` table beside a ``SQLStore``'s ``sys_sequence``.

The table lives where the store keeps its own (the companion file on SQLite)
and is reached through the store's engine and transactions, so a lease write
never joins an application transaction. Its name is ``sys_worker`` beside
``sys_sequence``, else ``<table>_worker``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from autoseq.config import validate_name
from autoseq.errors import StoreUnavailable
from autoseq.stores.sql._engine import reconnecting
from autoseq.stores.sql._statements import make_names_binary, name_type
from autoseq.workers import LAYOUT_ROW, WorkerLease, candidates, layout_row, taken

if TYPE_CHECKING:
    from autoseq.stores.sql import SQLStore


def worker_table_name(sequence_table: str) -> str:
    """``sys_worker`` beside ``sys_sequence``, else ``<table>_worker`` (cut to 63 characters)."""
    if sequence_table == "sys_sequence":
        return "sys_worker"
    return f"{sequence_table[:56]}_worker"


def worker_table(name: str = "sys_worker", metadata: sa.MetaData | None = None) -> sa.Table:
    """The ``sys_worker`` table as SQLAlchemy Core sees it."""
    return sa.Table(
        name,
        metadata if metadata is not None else sa.MetaData(),
        sa.Column("name", name_type(), primary_key=True),
        sa.Column("worker", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("owner", sa.String(255), nullable=True),
        sa.Column("expires_ms", sa.BigInteger, nullable=False),
        sa.Column("last_ms", sa.BigInteger, nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
    )


class SQLWorkers:
    """`WorkerLeases` on a ``SQLStore``'s database."""

    def __init__(self, store: SQLStore, table: str | None = None) -> None:
        self.store = store
        self.table = worker_table(table or worker_table_name(store.table_name))
        self._ready = False

    def create_table(self) -> None:
        """Create ``sys_worker`` unless it exists (safe when processes race)."""
        try:
            with self.store._gate.passage(), self.store._deadline():
                self.table.create(self.store.engine, checkfirst=True)
        except SQLAlchemyError as exc:
            try:
                exists = sa.inspect(self.store.engine).has_table(self.table.name)
            except SQLAlchemyError:
                exists = False
            if not exists:
                raise self._fail(exc, "creating the worker table", None) from exc
        if self.store.dialect in ("mysql", "mariadb"):
            try:
                with self.store._transaction() as connection:
                    make_names_binary(connection, self.table.name, self.store.statement_timeout / 2)
            except SQLAlchemyError as exc:
                what = "giving the worker table's names a binary collation (needs ALTER)"
                raise self._fail(exc, what, None) from exc
        self.store._record_epoch()  # PostgreSQL: leases are kept at a failover (see _epoch)
        self._ready = True

    def drop_table(self) -> None:
        """Drop ``sys_worker`` (tests)."""
        self.table.drop(self.store.engine, checkfirst=True)
        self._ready = False

    def _fail(self, exc: BaseException, what: str, name: str | None) -> StoreUnavailable:
        return self.store._translate(exc, "lease", what, name)

    def _read(self, connection: Any, name: str | None, layouts: bool = False) -> list[WorkerLease]:
        t = self.table
        query = sa.select(t).order_by(t.c.name, t.c.worker)
        if not layouts:
            query = query.where(t.c.worker != LAYOUT_ROW)
        if name is not None:
            query = query.where(t.c.name == name)
        return [_lease(row) for row in connection.execute(query).mappings()]

    @reconnecting
    def acquire_worker(
        self, name: str, owner: str, count: int, now_ms: int, ttl_ms: int
    ) -> WorkerLease | None:
        validate_name(name)
        if not self._ready:
            self.create_table()
        t = self.table
        try:
            for _ in range(8):  # a reread after losing every race seen
                with self.store._connection() as connection:
                    rows = {r.worker: r for r in self._read(connection, name)}
                for worker in candidates(rows, count, now_ms):
                    row = rows.get(worker)
                    lease = taken(row, name, worker, owner, now_ms + ttl_ms)
                    values = lease.held_fields()
                    if row is None:
                        try:
                            with self.store._transaction() as connection:
                                connection.execute(
                                    sa.insert(t).values(name=name, worker=worker, **values)
                                )
                        except IntegrityError:
                            continue  # another generator created it first
                        return lease
                    with self.store._transaction() as connection:
                        result = connection.execute(
                            sa.update(t)
                            .where(t.c.name == name, t.c.worker == worker)
                            .where(t.c.version == row.version)
                            .values(values)
                        )
                    if result.rowcount == 1:
                        return lease
                if not candidates(rows, count, now_ms):
                    return None
        except DBAPIError as exc:
            raise self._fail(exc, f"leasing a worker id of snowflake {name!r}", name) from exc
        return None

    @reconnecting
    def renew_worker(
        self, lease: WorkerLease, now_ms: int, ttl_ms: int, last_ms: int
    ) -> WorkerLease | None:
        t = self.table
        expires = max(now_ms + ttl_ms, lease.expires_ms)
        last = max(last_ms, lease.last_ms)
        renewed = self._update_held(
            lease,
            f"renewing worker {lease.worker}",
            # never shortened: a renewal sent later may already have extended it
            expires_ms=sa.case((t.c.expires_ms > expires, t.c.expires_ms), else_=expires),
            last_ms=sa.case((t.c.last_ms > last, t.c.last_ms), else_=last),
        )
        if not renewed:
            return None
        return WorkerLease(lease.name, lease.worker, lease.owner, expires, last, lease.version + 1)

    @reconnecting
    def release_worker(self, lease: WorkerLease, last_ms: int) -> bool:
        last = max(last_ms, lease.last_ms)
        return self._update_held(
            lease, f"releasing worker {lease.worker}", owner=None, expires_ms=last, last_ms=last
        )

    def _update_held(self, lease: WorkerLease, what: str, **values: Any) -> bool:
        """Write ``values`` to ``lease``'s row if ``lease.owner`` still holds it (a new version)."""
        t = self.table
        try:
            with self.store._transaction() as connection:
                result = connection.execute(
                    sa.update(t)
                    .where(t.c.name == lease.name, t.c.worker == lease.worker)
                    .where(t.c.owner == lease.owner)
                    .values(**values, version=t.c.version + 1)
                )
        except DBAPIError as exc:
            raise self._fail(exc, what, lease.name) from exc
        return result.rowcount == 1

    @reconnecting
    def claim_layout(self, name: str, layout: str, now_ms: int, wait_ms: int) -> WorkerLease:
        validate_name(name)
        if not self._ready:
            self.create_table()
        t = self.table
        fresh = layout_row(name, layout, now_ms, wait_ms)
        try:
            for _ in range(3):
                with self.store._connection() as connection:
                    found = connection.execute(
                        sa.select(t).where(t.c.name == name, t.c.worker == LAYOUT_ROW)
                    ).mappings()
                    for row in found:
                        return _lease(row)
                try:
                    with self.store._transaction() as connection:
                        connection.execute(
                            sa.insert(t).values(
                                name=name,
                                worker=LAYOUT_ROW,
                                owner=layout,
                                expires_ms=fresh.expires_ms,
                                last_ms=fresh.last_ms,
                                version=fresh.version,
                            )
                        )
                except IntegrityError:
                    continue  # another generator recorded its layout first: read it
                return fresh
        except DBAPIError as exc:
            self._ready = False  # the table may have been dropped: make it again next time
            raise self._fail(exc, f"recording the layout of snowflake {name!r}", name) from exc
        raise self._fail(
            RuntimeError("the layout row kept vanishing"), "recording the layout", name
        )

    @reconnecting
    def list_workers(self, name: str | None = None, *, layouts: bool = False) -> list[WorkerLease]:
        try:
            if not sa.inspect(self.store.engine).has_table(self.table.name):
                return []
            with self.store._connection() as connection:
                return self._read(connection, name, layouts)
        except DBAPIError as exc:
            raise self._fail(exc, "listing worker leases", name) from exc


def _lease(row: Any) -> WorkerLease:
    return WorkerLease(
        row["name"],
        int(row["worker"]),
        row["owner"],
        int(row["expires_ms"]),
        int(row["last_ms"]),
        int(row["version"]),
    )
