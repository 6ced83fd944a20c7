"""Worker-id leases for snowflake ids, kept in the store that holds ``sys_sequence``.

A snowflake generator must own its worker id alone: two generators on one id
issue the same ids. So ids are *leased*: a row per (name, worker id) in a
``sys_worker`` table (a collection on MongoDB, a hash on Redis) holds the
owner, when the lease expires and the last timestamp issued under it.

Every write is a compare-and-set. Taking an id succeeds only on a row that is
missing, released or expired, and only if nobody wrote it since it was read;
renewing and releasing succeed only while the row still names the caller as
owner (an owner string is new for every acquisition).

The timestamps are the generators' own milliseconds, the ones inside the
ids. A holder issues only timestamps below the ``expires_ms`` it wrote, and
a new owner starts above ``max(last_ms, expires_ms)`` of the row it took
(its ``floor_ms``): the two ranges of timestamps never meet, so takeover
cannot repeat an id even when the machines' clocks disagree.

Each name also has one *layout row*, worker id ``LAYOUT_ROW`` (-1): its
``owner`` holds the layout (epoch and bit widths), so generators of one name
cannot disagree on where the worker id sits in an id, and its
``expires_ms`` the time before which no lease of the name may issue. The row
is inserted if absent, atomically, so of two generators starting at once
with different layouts one records its own and the other is refused. A
fresh layout row is ready only one lease TTL after it was written: when the
table (collection, hash) was dropped and made again under a live holder,
that holder notices at its next heartbeat, or stops at its lease's expiry
at the latest, before anyone issues on the new table.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from autoseq.config import validate_name
from autoseq.stores.capabilities import LeasesWorkers


@dataclass(frozen=True, slots=True)
class WorkerLease:
    """One ``sys_worker`` row: who holds worker id ``worker`` of layout ``name``, until when.

    ``owner`` is None once released. ``floor_ms`` is set on a lease just
    acquired: earlier owners may have issued timestamps up to it, so the new
    owner issues only above it.
    """

    name: str
    worker: int
    owner: str | None
    expires_ms: int
    last_ms: int
    version: int
    floor_ms: int = 0

    def free_at(self, now_ms: int) -> bool:
        """True when the row may be taken: released, or expired before ``now_ms``."""
        return self.owner is None or self.expires_ms < now_ms

    @property
    def high_water_ms(self) -> int:
        """The highest timestamp the row's owners may have issued."""
        return max(self.last_ms, self.expires_ms)

    def held_fields(self) -> dict[str, Any]:
        """What an acquisition writes: ``owner``, ``expires_ms``, ``last_ms``, ``version``."""
        return {
            "owner": self.owner,
            "expires_ms": self.expires_ms,
            "last_ms": self.last_ms,
            "version": self.version,
        }


#: The worker id of a name's layout row (leases count from 0).
LAYOUT_ROW = -1


def layout_row(name: str, layout: str, now_ms: int, wait_ms: int) -> WorkerLease:
    """A new layout row: ``layout`` recorded at ``now_ms``, ready ``wait_ms`` later."""
    return WorkerLease(name, LAYOUT_ROW, layout, now_ms + wait_ms, now_ms, 0)


@runtime_checkable
class WorkerLeases(Protocol):
    """Lease operations on one store's ``sys_worker``; every write is a compare-and-set.

    * ``acquire_worker(name, owner, count, now_ms, ttl_ms)`` takes the lowest
      free worker id below ``count`` (missing, released, or expired before
      ``now_ms``) for ``owner`` until ``now_ms + ttl_ms`` and returns it with
      ``floor_ms`` set; None when all ``count`` are held.
    * ``renew_worker(lease, now_ms, ttl_ms, last_ms)`` extends a lease still
      held by ``lease.owner`` to ``max(now_ms + ttl_ms, lease.expires_ms)``,
      recording ``last_ms``; None when the row has another owner now.
    * ``release_worker(lease, last_ms)`` frees the row if still held, leaving
      ``last_ms`` for the next owner; returns whether it did.
    * ``claim_layout(name, layout, now_ms, wait_ms)`` records ``layout`` as
      ``name``'s unless a layout is recorded already (atomically: of two
      claims at once one wins) and returns the recorded layout row (see
      `layout_row`); a row it writes is ready ``wait_ms`` after ``now_ms``.
    * ``list_workers(name=None, *, layouts=False)`` every lease row (of one
      name), by name and id; layout rows only with ``layouts=True``.
    * Driver errors raise ``StoreUnavailable``.
    """

    def acquire_worker(
        self, name: str, owner: str, count: int, now_ms: int, ttl_ms: int
    ) -> WorkerLease | None: ...

    def renew_worker(
        self, lease: WorkerLease, now_ms: int, ttl_ms: int, last_ms: int
    ) -> WorkerLease | None: ...

    def release_worker(self, lease: WorkerLease, last_ms: int) -> bool: ...

    def claim_layout(self, name: str, layout: str, now_ms: int, wait_ms: int) -> WorkerLease: ...

    def list_workers(
        self, name: str | None = None, *, layouts: bool = False
    ) -> list[WorkerLease]: ...


def candidates(rows: dict[int, WorkerLease], count: int, now_ms: int) -> list[int]:
    """Worker ids worth trying: missing and free rows, lowest first, ahead of the clock last.

    A free row whose high water is in the future was used by a clock running
    ahead; its next owner would have to wait until then, so any other free
    id is better, and among those ahead the one that frees up first.
    """
    free = [w for w in range(count) if w not in rows or rows[w].free_at(now_ms)]

    def ahead(worker: int) -> int:
        row = rows.get(worker)
        return 0 if row is None else max(row.high_water_ms - now_ms, 0)

    return sorted(free, key=lambda w: (ahead(w), w))


def taken(
    row: WorkerLease | None, name: str, worker: int, owner: str, expires_ms: int
) -> WorkerLease:
    """The row as an acquisition writes it over ``row`` (None: a new row)."""
    if row is None:
        return WorkerLease(name, worker, owner, expires_ms, 0, 1, 0)
    return WorkerLease(
        name, worker, owner, expires_ms, row.last_ms, row.version + 1, row.high_water_ms
    )


class MemoryWorkers:
    """Leases in a dict: one process (tests, examples), beside a ``MemoryStore``."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, int], WorkerLease] = {}
        self._lock = threading.Lock()

    def acquire_worker(
        self, name: str, owner: str, count: int, now_ms: int, ttl_ms: int
    ) -> WorkerLease | None:
        validate_name(name)
        with self._lock:
            rows = {w: r for (n, w), r in self._rows.items() if n == name}
            for worker in candidates(rows, count, now_ms)[:1]:
                lease = taken(rows.get(worker), name, worker, owner, now_ms + ttl_ms)
                self._rows[name, worker] = replace(lease, floor_ms=0)
                return lease
        return None

    def renew_worker(
        self, lease: WorkerLease, now_ms: int, ttl_ms: int, last_ms: int
    ) -> WorkerLease | None:
        with self._lock:
            row = self._rows.get((lease.name, lease.worker))
            if row is None or row.owner != lease.owner:
                return None
            renewed = replace(
                row,
                expires_ms=max(now_ms + ttl_ms, row.expires_ms),
                last_ms=max(last_ms, row.last_ms),
                version=row.version + 1,
            )
            self._rows[lease.name, lease.worker] = renewed
            return renewed

    def release_worker(self, lease: WorkerLease, last_ms: int) -> bool:
        with self._lock:
            row = self._rows.get((lease.name, lease.worker))
            if row is None or row.owner != lease.owner:
                return False
            last = max(last_ms, row.last_ms)
            self._rows[lease.name, lease.worker] = replace(
                row, owner=None, expires_ms=last, last_ms=last, version=row.version + 1
            )
            return True

    def claim_layout(self, name: str, layout: str, now_ms: int, wait_ms: int) -> WorkerLease:
        validate_name(name)
        with self._lock:
            # the dict lives and dies with its holders: no older holder, no grace
            return self._rows.setdefault((name, LAYOUT_ROW), layout_row(name, layout, 0, 0))

    def list_workers(self, name: str | None = None, *, layouts: bool = False) -> list[WorkerLease]:
        with self._lock:
            rows = [
                r
                for r in self._rows.values()
                if (name is None or r.name == name) and (layouts or r.worker != LAYOUT_ROW)
            ]
        return sorted(rows, key=lambda r: (r.name, r.worker))

    def after_fork(self) -> None:
        self._lock = threading.Lock()


def worker_leases(store: Any) -> WorkerLeases:
    """The lease operations for ``store``, kept beside its ``sys_sequence``.

    A store that implements `WorkerLeases` itself is used as is; a
    store with the [`LeasesWorkers`][autoseq.stores.capabilities.LeasesWorkers]
    capability (every autoseq store, and any subclass of one) gives its own,
    one per store object, so a process shares one table handle.
    """
    if isinstance(store, WorkerLeases):
        return store
    if isinstance(store, LeasesWorkers):
        return store.worker_leases()
    from autoseq.errors import InvalidSnowflakeConfig

    raise InvalidSnowflakeConfig(
        f"{type(store).__name__} cannot lease worker ids: give a MemoryStore, SQLStore, "
        "MongoStore or RedisStore, or an object with the WorkerLeases methods "
        "(or a worker_leases() method returning one)"
    )


__all__ = [
    "LAYOUT_ROW",
    "MemoryWorkers",
    "WorkerLease",
    "WorkerLeases",
    "candidates",
    "layout_row",
    "worker_leases",
]
