"""Snowflake ids: 64-bit, time-ordered keys made in memory, worker ids leased from a store.

Layout of an id (defaults in brackets), most significant bit first::

    0 | milliseconds since ``epoch`` [41] | worker id [10] | sequence [12]

The sign bit stays 0, so ids fit a signed 64-bit column and are positive.
Within one process ids only increase. Each generator leases its worker id
from the store (see `autoseq.workers`): a heartbeat thread renews the
lease, ids are issued only at timestamps below the expiry last written, and
a later owner of the same worker id starts above every timestamp an earlier
one could have used, so a worker id is never shared in time.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import socket
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Literal, NamedTuple

from autoseq import _hooks, signals
from autoseq.config import validate_name
from autoseq.errors import (
    ClockMovedBackwards,
    InvalidSequenceConfig,
    InvalidSnowflakeConfig,
    LeaseLost,
    StoreUnavailable,
    WorkersExhausted,
)
from autoseq.lock import DEFAULT_CLOSE_TIMEOUT, run_until
from autoseq.stores.base import check_many
from autoseq.workers import WorkerLease, WorkerLeases, worker_leases

log = logging.getLogger("autoseq")

#: The default epoch: ids count milliseconds from 2024-01-01 UTC.
DEFAULT_EPOCH = datetime(2024, 1, 1, tzinfo=UTC)
MS_PER_YEAR = 365.2425 * 86_400_000
POLICIES = ("wait", "fail", "borrow")
Policy = Literal["wait", "fail", "borrow"]


class SnowflakeParts(NamedTuple):
    """What an id holds: when it was made, by which worker id, its sequence in that millisecond."""

    timestamp: datetime
    worker: int
    sequence: int


def _epoch_ms(epoch: datetime | int) -> int:
    if isinstance(epoch, datetime):
        if epoch.tzinfo is None:
            raise InvalidSnowflakeConfig(
                f"epoch {epoch!r} has no time zone; give an aware datetime "
                "(datetime(2024, 1, 1, tzinfo=UTC))"
            )
        return int(epoch.timestamp() * 1000)
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise InvalidSnowflakeConfig(
            f"epoch {epoch!r} must be an aware datetime or milliseconds since 1970 (an int >= 0)"
        )
    return epoch


def _bits(label: str, bits: object) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 0 <= bits <= 22:
        raise InvalidSnowflakeConfig(f"{label}={bits!r}: give an int from 0 to 22")
    return bits


def _check_bits(worker: object, sequence: object) -> tuple[int, int]:
    worker_bits, sequence_bits = _bits("worker_bits", worker), _bits("sequence_bits", sequence)
    if 63 - worker_bits - sequence_bits < 35:
        raise InvalidSnowflakeConfig(
            f"worker_bits={worker_bits} + sequence_bits={sequence_bits} leave "
            f"{63 - worker_bits - sequence_bits} timestamp bits, under a year of milliseconds; "
            "keep worker_bits + sequence_bits at most 28"
        )
    return worker_bits, sequence_bits


def _number(label: str, value: object, low: float, high: float, unit: str = "seconds") -> float:
    """``value`` as a float if it is a real number from ``low`` to ``high`` (a bool is not)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise InvalidSnowflakeConfig(f"{label}={value!r}: give {unit} from {low:g} to {high:g}")
    return float(value)


def _check_clock(clock: object) -> Callable[[], float]:
    """``clock`` if calling it gives seconds since 1970 as a number."""
    reading = clock() if callable(clock) else None
    if isinstance(reading, bool) or not isinstance(reading, int | float):
        raise InvalidSnowflakeConfig(
            f"clock={clock!r}: give a function returning seconds since 1970 as a float "
            f"(like time.time); it gave {reading!r}"
        )
    return clock  # type: ignore[return-value]


def _check_name(name: object) -> str:
    try:
        return validate_name(name)
    except InvalidSequenceConfig as exc:
        raise InvalidSnowflakeConfig(f"snowflake name: {exc}") from exc


def decode(
    value: int,
    *,
    epoch: datetime | int = DEFAULT_EPOCH,
    worker_bits: int = 10,
    sequence_bits: int = 12,
) -> SnowflakeParts:
    """Split ``value`` into its timestamp, worker id and sequence (the layout must match)."""
    worker_bits, sequence_bits = _check_bits(worker_bits, sequence_bits)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**63:
        raise InvalidSnowflakeConfig(
            f"{value!r} is not a snowflake id: give an int from 1 to 2**63 - 1"
        )
    ms = (value >> (worker_bits + sequence_bits)) + _epoch_ms(epoch)
    return SnowflakeParts(
        datetime.fromtimestamp(ms / 1000, UTC),
        (value >> sequence_bits) & ((1 << worker_bits) - 1),
        value & ((1 << sequence_bits) - 1),
    )


class Snowflake:
    """A snowflake id generator whose worker id is leased from ``store``.

    ``name`` names the layout: generators sharing a name share its worker
    ids, so they must share ``epoch`` and the bit widths too; the lease
    store records them on first use and refuses a generator with others.
    ``lease_ttl`` (seconds) is how long a lease lives unrenewed; the
    heartbeat renews it every third of that. ``on_clock_backwards`` says
    what happens when the clock reads earlier than the last timestamp
    issued by more than ``max_backwards_wait`` seconds (a smaller step is
    always waited out): ``"wait"`` waits until it catches up, ``"fail"``
    raises [`ClockMovedBackwards`][autoseq.errors.ClockMovedBackwards], ``"borrow"`` keeps issuing
    on the last timestamp while its sequence lasts, then waits; neither waits
    longer than ``max_wait`` seconds: beyond it they raise
    ClockMovedBackwards too (a clock far behind is a fault to fix, not a
    day to sleep through). ``clock`` returns
    seconds since 1970 (injectable for tests). A warning and the
    ``snowflake_lifetime_low`` signal fire when fewer than ``warn_years``
    years of timestamp bits remain.
    """

    def __init__(
        self,
        store: object,
        *,
        name: str = "default",
        epoch: datetime | int = DEFAULT_EPOCH,
        worker_bits: int = 10,
        sequence_bits: int = 12,
        lease_ttl: float = 30.0,
        on_clock_backwards: Policy = "wait",
        max_backwards_wait: float = 0.005,
        max_wait: float = 60.0,
        clock: Callable[[], float] = time.time,
        warn_years: float = 10.0,
    ) -> None:
        # every argument is checked before the lease is taken: nothing to give back
        self.name = _check_name(name)
        self.worker_bits, self.sequence_bits = _check_bits(worker_bits, sequence_bits)
        if not isinstance(on_clock_backwards, str) or on_clock_backwards not in POLICIES:
            raise InvalidSnowflakeConfig(
                f"on_clock_backwards={on_clock_backwards!r}: give 'wait', 'fail' or 'borrow'"
            )
        self.lease_ttl = _number("lease_ttl", lease_ttl, 0.05, 86_400)
        self.max_backwards_wait = _number("max_backwards_wait", max_backwards_wait, 0, 60)
        self.max_wait = _number("max_wait", max_wait, self.max_backwards_wait, 86_400)
        self.warn_years = _number("warn_years", warn_years, 0, 10_000, "years")
        self.epoch_ms = _epoch_ms(epoch)
        self.on_clock_backwards = on_clock_backwards
        self.clock = _check_clock(clock)
        #: what the lease store records for ``name``: generators of one name share it
        self.layout = (
            f"epoch_ms={self.epoch_ms} worker_bits={self.worker_bits} "
            f"sequence_bits={self.sequence_bits}"
        )
        self._ns: Callable[[], int] = (
            time.time_ns if clock is time.time else (lambda: int(clock() * 1_000_000_000))
        )
        self._shift = self.worker_bits + self.sequence_bits
        self._max_seq = (1 << self.sequence_bits) - 1
        self._worker_count = 1 << self.worker_bits
        self.max_timestamp_ms = self.epoch_ms + (1 << (63 - self._shift)) - 1
        now = self._ns() // 1_000_000
        if now <= self.epoch_ms:
            raise InvalidSnowflakeConfig(
                f"epoch {self.epoch_ms} ms is not in the past (clock reads {now} ms); "
                "ids would not be positive: choose an earlier epoch"
            )
        if now > self.max_timestamp_ms:
            raise InvalidSnowflakeConfig(
                f"snowflake {name!r}: the timestamp bits ran out at {self.max_timestamp_ms} ms; "
                "choose a later epoch or fewer worker/sequence bits"
            )
        self._leases: WorkerLeases = worker_leases(store)
        self.store = store
        self._lifetime_checked = 0.0
        # before the lease: a warning turned into an error (-W error) leaves nothing held
        self._check_lifetime()
        self._lock = threading.Lock()
        # (the current millisecond's ids, the last id it may issue, that
        # millisecond): replaced whole, so a reader never mixes two of them
        self._state: tuple[Iterator[int], int, int] = (itertools.count(), -1, -1)
        self._limit = 0  # issue only timestamps below this: the lease's expiry
        self._worker_part = 0
        self._lease: WorkerLease | None = None
        self._lost = "no lease was taken yet"
        self._closed = False
        self._pid = os.getpid()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._renewed_mono = 0.0
        self._ready_ms = 0  # issue above this: a fresh lease table's grace (see workers)
        try:
            with self._lock:
                self._take_lease_now()
            _live.add(self)
        except BaseException:
            self.close()  # give back whatever was taken; close() tolerates no lease
            raise

    # public ----------------------------------------------------------------

    def next(self) -> int:
        """The next id: positive, below 2**63, greater than every id this process issued."""
        # Within a millisecond an id is one step of an itertools.count, which
        # the GIL makes atomic: no lock. The lock is taken once per
        # millisecond, where the lease, the clock and the state are checked.
        ts = self._ns() // 1_000_000
        ids, cap, last = self._state
        if ts == last:
            value = next(ids)
            if value <= cap:
                return value
        with self._lock:
            return self._next_slow()

    def next_many(self, n: int) -> list[int]:
        """``n`` ids in increasing order (several per millisecond at once)."""
        check_many(n)
        out: list[int] = []
        with self._lock:
            while len(out) < n:
                ts = self._ns() // 1_000_000
                ids, cap, last = self._state
                if ts == last:
                    for value in itertools.islice(ids, n - len(out)):
                        if value > cap:
                            break
                        out.append(value)
                    else:
                        continue
                out.append(self._next_slow())
        return out

    def decode(self, value: int) -> SnowflakeParts:
        """Split ``value`` (an id of this layout) into timestamp, worker id and sequence."""
        return decode(
            value,
            epoch=self.epoch_ms,
            worker_bits=self.worker_bits,
            sequence_bits=self.sequence_bits,
        )

    @property
    def worker_id(self) -> int | None:
        """The leased worker id, or None while no lease is held."""
        lease = self._lease
        return None if lease is None else lease.worker

    @property
    def lease(self) -> WorkerLease | None:
        """The lease held now (its expiry as last renewed), or None."""
        return self._lease

    @property
    def years_left(self) -> float:
        """Years until the timestamp bits run out."""
        return (self.max_timestamp_ms - self._ns() // 1_000_000) / MS_PER_YEAR

    def close(self, *, timeout: float = DEFAULT_CLOSE_TIMEOUT) -> None:
        """Stop the heartbeat and release the lease; ``next()`` raises afterwards.

        Takes at most ``timeout`` seconds: a release the store has not
        confirmed by then is logged and left to expire (``lease_ttl``), which
        is safe, since this generator makes no ID after it is closed.
        """
        deadline = time.monotonic() + timeout
        self._stop.set()
        heartbeat = self._heartbeat
        if heartbeat is not None and heartbeat is not threading.current_thread():
            # a renewal stuck on the store ends within its timeouts; exit need not wait longer
            heartbeat.join(timeout=min(self.lease_ttl, 10.0, _left(deadline)))
        with self._lock:
            lease, self._lease = self._lease, None
            self._revoke()
            self._closed = True
            self._lost = "the generator is closed; create a new Snowflake"
            last = self._state[2]
        _live.discard(self)
        if lease is not None and self._pid == os.getpid():
            self._release_by(lease, last, deadline)

    def _release_by(self, lease: WorkerLease, last: int, deadline: float) -> None:
        failed: list[BaseException] = []
        done: list[bool] = []

        def release() -> None:
            try:
                self._leases.release_worker(lease, last)
            except Exception as exc:  # noqa: BLE001 - logged below; the lease expires
                failed.append(exc)
            done.append(True)

        if not run_until(release, "autoseq-release-worker", deadline):
            release()  # no new thread at interpreter exit (3.12+)
        if failed or not done:
            why = failed[0] if failed else "no answer from the store in time"
            log.warning(
                "autoseq: worker %s of %r not released (%s); it frees itself in %ss",
                lease.worker,
                self.name,
                why,
                self.lease_ttl,
            )

    def __enter__(self) -> Snowflake:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # the slow path (lock held) ---------------------------------------------

    def _next_slow(self) -> int:
        # A timestamp read before the lock may be stale by now: read it again.
        ts = self._ns() // 1_000_000
        warned = False
        while True:
            ids, cap, last = self._state
            if self._ready_ms and ts >= self._ready_ms:
                self._ready_ms = 0
            if self._lease is not None and ts < self._ready_ms:
                # A fresh lease table's grace: a holder of the old table may
                # issue timestamps up to ready_ms, so this one issues above it
                # at once, moving on a millisecond when its sequence runs out.
                ts = max(self._ready_ms, last)
                if ts == last:
                    value = next(ids)
                    if value <= cap:
                        return value
                    ts = last + 1
            if self._lease is None:
                if self._closed or self._pid == os.getpid():
                    raise LeaseLost(self.name, None, self._lost)
                # A forked child takes a lease of its own, under the lock so
                # that its threads take one between them.
                self._take_lease_now()
            elif ts == last or (ts < last and self.on_clock_backwards == "borrow"):
                # the current millisecond, or borrowing it while the clock is behind
                value = next(ids)
                if value <= cap:
                    return value
            elif ts > last:
                if ts < self._limit:
                    value = ((ts - self.epoch_ms) << self._shift) | self._worker_part
                    self._state = (itertools.count(value + 1), value | self._max_seq, ts)
                    return value
                if ts > self.max_timestamp_ms:
                    raise InvalidSnowflakeConfig(
                        f"snowflake {self.name!r}: the timestamp bits ran out at "
                        f"{self.max_timestamp_ms} ms; move to a layout with a later epoch"
                    )
                if self._renew_now(ts):
                    continue  # the clock stepped forward past the lease: extended at once
                self._lose(
                    self._lease,
                    f"its lease expired at {self._limit} ms before the heartbeat could "
                    "renew it (the store did not answer in time)",
                )
                continue
            behind = last - ts
            if behind > self._longest_wait_ms:
                raise self._too_far_behind(self.worker_id or 0, behind)
            if behind > self.max_backwards_wait * 1000 and not warned:
                warned = True
                log.warning(
                    "autoseq: snowflake %r: clock %d ms behind the last timestamp; waiting",
                    self.name,
                    behind,
                )
            # sequence used up (behind == 0) or clock behind: wait, lock released
            self._pause(min(max(behind, 0) / 1000 + 0.0001, 0.05))
            ts = self._ns() // 1_000_000

    @property
    def _longest_wait_ms(self) -> float:
        """How far behind the clock may be and still be waited out under the policy."""
        if self.on_clock_backwards == "fail":
            return self.max_backwards_wait * 1000
        return self.max_wait * 1000

    def _too_far_behind(self, worker: int, behind: int) -> ClockMovedBackwards:
        if self.on_clock_backwards == "fail":
            return ClockMovedBackwards(self.name, worker, behind)
        return ClockMovedBackwards(
            self.name,
            worker,
            behind,
            f"That is longer than max_wait={self.max_wait:g}s, the most "
            f"on_clock_backwards={self.on_clock_backwards!r} waits. Fix the clock; a worker "
            "id last used by a clock far ahead is taken only when no other is free "
            "(see `autoseq workers`)",
        )

    def _renew_now(self, ts: int) -> bool:
        """Renew the lease from the caller's thread (lock held); False when that failed.

        A clock stepped forward past the lease's expiry, while the lease was
        confirmed under 2/3 of ``lease_ttl`` ago by the monotonic clock, is no
        reason to refuse calls until the next heartbeat: the store says at
        once whether the lease is still ours, and a renewal confirms it.
        """
        lease = self._lease
        sent = time.monotonic()
        if lease is None or sent - self._renewed_mono >= self.lease_ttl * 2 / 3:
            # Not a step: a healthy heartbeat confirms every third of lease_ttl,
            # so this one is failing; stop as the store expects, not wait on it.
            return False
        try:
            renewed = self._leases.renew_worker(lease, ts, self._ttl_ms, self._state[2])
        except StoreUnavailable as exc:
            log.warning("autoseq: snowflake %r renewal failed: %s", self.name, exc)
            return False
        if renewed is None:
            self._lose(lease, "its lease row is gone or another generator took it over")
            return False
        self._confirm(lease, renewed, sent)
        return True

    def _confirm(self, lease: WorkerLease, renewed: WorkerLease, sent: float) -> None:
        """Issue up to ``renewed``'s expiry, if ``lease`` is still the one held (lock held)."""
        if self._lease is lease:
            self._lease = renewed
            self._limit = min(renewed.expires_ms, self.max_timestamp_ms + 1)
            self._renewed_mono = sent

    def _pause(self, seconds: float) -> None:
        self._lock.release()
        try:
            time.sleep(seconds)
        finally:
            self._lock.acquire()

    # leases -----------------------------------------------------------------

    def _owner(self) -> str:
        return f"{socket.gethostname()[:120]}:{os.getpid()}:{uuid.uuid4().hex[:16]}"

    def _take_lease_now(self) -> None:
        """Lease a worker id and start the heartbeat (lock held; construction, forked child)."""
        lease = self._acquire()
        if lease is None:
            raise WorkersExhausted(self.name, self._worker_count)
        self._refuse_far_ahead(lease)
        self._install(lease)
        # only now: a child whose acquisition failed tries again on its next call
        self._pid = os.getpid()
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(
            target=self._beat, name=f"autoseq-snowflake-{self.name}", daemon=True
        )
        self._heartbeat.start()

    def _refuse_far_ahead(self, lease: WorkerLease) -> None:
        """Give ``lease`` back and raise if its timestamps start further ahead than may be waited.

        Free ids not ahead of the clock are taken first, so this is a worker
        id whose last holder's clock ran ahead, with no better one free.
        """
        behind = lease.floor_ms - self._ns() // 1_000_000
        if behind > self._longest_wait_ms:
            try:
                self._leases.release_worker(lease, lease.floor_ms)
            finally:
                raise self._too_far_behind(lease.worker, behind)

    def _claim_layout(self) -> None:
        """Record this layout for the name, or refuse if the store holds another one."""
        recorded = self._leases.claim_layout(
            self.name, self.layout, self._ns() // 1_000_000, self._ttl_ms
        )
        if recorded.owner != self.layout:
            raise InvalidSnowflakeConfig(
                f"snowflake {self.name!r} is recorded with layout {recorded.owner!r}, this "
                f"generator has {self.layout!r}: their ids would collide. Give the recorded "
                "epoch and bit widths, or a new name for the new layout"
            )
        now = self._ns() // 1_000_000
        # A grace still to come; once past it, a clock behind is a clock fault
        # again. One lease_ttl from now covers every older holder (the row is
        # not newer than now), so a row written by a clock far ahead is capped.
        ready = min(recorded.expires_ms, now + self._ttl_ms)
        self._ready_ms = ready if ready > now else 0

    def _acquire(self) -> WorkerLease | None:
        started = time.monotonic()
        self._claim_layout()
        now = self._ns() // 1_000_000
        # in a grace the lease must outlast the timestamps issued above ready_ms
        ttl_ms = self._ttl_ms + max(self._ready_ms - now, 0)
        lease = self._leases.acquire_worker(
            self.name, self._owner(), self._worker_count, now, ttl_ms
        )
        if lease is not None:
            self._renewed_mono = started
            signals.worker_lease_acquired.send(
                self, name=self.name, worker=lease.worker, floor_ms=lease.floor_ms
            )
        return lease

    @property
    def _ttl_ms(self) -> int:
        return int(self.lease_ttl * 1000)

    def _install(self, lease: WorkerLease) -> None:
        """Start issuing under ``lease`` (lock held)."""
        self._lease = lease
        self._worker_part = lease.worker << self.sequence_bits
        # Strictly above the floor and every id of this process: a new worker
        # id at an old timestamp could sort below ids already issued.
        ids, _, last = self._state
        self._state = (ids, -1, max(last, lease.floor_ms, self._ready_ms - 1))
        self._limit = min(lease.expires_ms, self.max_timestamp_ms + 1)

    def _revoke(self) -> None:
        """Issue nothing more until a lease is installed; the last timestamp is kept."""
        ids, _, last = self._state
        self._state = (ids, -1, last)
        self._limit = 0

    def _lose(self, lease: WorkerLease, reason: str) -> None:
        """Stop issuing under ``lease`` (lock held); the heartbeat looks for a new one."""
        if self._lease is lease:
            self._lease = None
            self._revoke()
            self._lost = reason
            log.error("autoseq: snowflake %r worker %s: %s", self.name, lease.worker, reason)
            signals.worker_lease_lost.send(self, name=self.name, worker=lease.worker, reason=reason)

    def _beat(self) -> None:
        interval = self.lease_ttl / 3
        delay = interval
        stop = self._stop
        while not stop.wait(delay):
            if self._pid != os.getpid():
                return
            delay = interval
            lease = self._lease
            try:
                if lease is None:
                    if self._closed:
                        return
                    fresh = self._reacquire()
                    if fresh is not None:
                        with self._lock:
                            if self._closed:
                                self._leases.release_worker(fresh, fresh.floor_ms)
                                return
                            self._install(fresh)
                    continue
                sent = time.monotonic()
                renewed = self._leases.renew_worker(
                    lease, self._ns() // 1_000_000, self._ttl_ms, self._state[2]
                )
            except StoreUnavailable as exc:
                log.warning("autoseq: snowflake %r heartbeat failed: %s", self.name, exc)
                delay = interval / 3
                lease = self._lease
                if lease is not None and time.monotonic() - self._renewed_mono >= self.lease_ttl:
                    with self._lock:
                        self._lose(lease, f"its lease was not renewed within lease_ttl ({exc})")
                continue
            with self._lock:
                if renewed is None:
                    self._lose(lease, "its lease row is gone or another generator took it over")
                else:
                    self._confirm(lease, renewed, sent)
            self._check_lifetime()

    def _reacquire(self) -> WorkerLease | None:
        """A new lease for the heartbeat, or None (the reason kept for ``next()`` to raise)."""
        try:
            fresh = self._acquire()
        except (InvalidSnowflakeConfig, ClockMovedBackwards) as exc:
            # the store records another layout now, say: keep refusing, keep looking
            self._lost = str(exc)
            return None
        if fresh is None:
            self._lost = str(WorkersExhausted(self.name, self._worker_count))
        return fresh

    def _end_date(self) -> str:
        try:
            return f"{datetime.fromtimestamp(self.max_timestamp_ms / 1000, UTC):%Y-%m-%d}"
        except (ValueError, OverflowError, OSError):
            return "past the year 9999"  # a datetime stops there; the bits do not

    def _check_lifetime(self) -> None:
        now = time.monotonic()
        if now < self._lifetime_checked:
            return
        self._lifetime_checked = now + 86_400
        left = self.years_left
        if left < self.warn_years:
            message = (
                f"snowflake {self.name!r}: {left:.1f} years of timestamp bits left "
                f"(until {self._end_date()}); plan a layout with a later epoch"
            )
            warnings.warn(message, RuntimeWarning, stacklevel=3)
            signals.snowflake_lifetime_low.send(
                self, name=self.name, years_left=left, threshold=self.warn_years
            )

    def _after_fork_in_child(self) -> None:
        # The parent's lease and heartbeat stay the parent's; the child leases
        # its own worker id on its first call.
        self._lock = threading.Lock()
        self._lease = None
        self._revoke()  # never continue the parent's millisecond
        self._heartbeat = None
        self._lost = "forked"
        after_fork = getattr(self._leases, "after_fork", None)
        if after_fork is not None:
            after_fork()


_live: weakref.WeakSet[Snowflake] = weakref.WeakSet()


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def close_generators(
    generators: list[Snowflake], *, timeout: float = DEFAULT_CLOSE_TIMEOUT
) -> None:
    """Close ``generators`` within ``timeout`` seconds in all (see `Snowflake.close`)."""
    deadline = time.monotonic() + timeout
    for generator in generators:
        generator.close(timeout=_left(deadline))


class SharedSnowflakes:
    """One [`Snowflake`][autoseq.snowflake.Snowflake] per store and layout, shared in this process.

    What the integrations' snowflake fields hold: ``get(store, layout)``
    makes the generator on first use (leasing its worker id once) and gives
    the same one after; ``close()`` closes all of them.
    """

    def __init__(self) -> None:
        self._made: dict[tuple[int, str], Snowflake] = {}
        self._guard = threading.Lock()
        _shared.add(self)

    def get(self, store: object, layout: str = "default") -> Snowflake:
        """The generator of ``layout`` leasing from ``store``."""
        key = (id(store), layout)
        found = self._made.get(key)
        if found is None:
            with self._guard:
                found = self._made.get(key)
                if found is None:
                    found = self._made[key] = Snowflake(store, name=layout)
        return found

    def close(self, *, timeout: float = DEFAULT_CLOSE_TIMEOUT) -> None:
        """Close every generator made (releasing its worker id), within ``timeout`` in all."""
        with self._guard:
            made = list(self._made.values())
            self._made.clear()
        if made:
            close_generators(made, timeout=timeout)

    def _after_fork_in_child(self) -> None:
        # A thread of the parent may have held the guard; the generators re-lease on their own.
        self._guard = threading.Lock()


_shared: weakref.WeakSet[SharedSnowflakes] = weakref.WeakSet()


def _close_all() -> None:
    close_generators(list(_live))


def _after_fork() -> None:
    for generator in list(_live):
        generator._after_fork_in_child()
    for shared in list(_shared):
        shared._after_fork_in_child()


_hooks.at_exit(_close_all)
_hooks.on_fork(after_in_child=_after_fork)

__all__ = [
    "DEFAULT_EPOCH",
    "ClockMovedBackwards",
    "LeaseLost",
    "SharedSnowflakes",
    "Snowflake",
    "SnowflakeParts",
    "WorkersExhausted",
    "close_generators",
    "decode",
]
