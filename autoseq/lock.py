"""``SequenceLock``: one sequence's blocks, served from memory under its own lock.

Serving follows Meituan Leaf's segment mode: values come from the current
block; once a share of it is used, a worker of the process's shared pool
(`autoseq.prefetch`, a few threads for every sequence) reserves the
next block, so the switch to it does not wait on the store. Block sizes adapt to
the consumption rate, store outages are ridden out on what is buffered, and
``close()`` hands an untouched tail back to the store.

The parts: `autoseq.buffer.Buffer` keeps the blocks in hand (pure
bookkeeping), `autoseq.pacing.BlockSizer` and
`autoseq.pacing.Backoff` decide how much to reserve and when to try
again, and [`SequenceLock`][autoseq.lock.SequenceLock] owns the lock, the condition variable
callers wait on (made only while one waits), the store round trips and the
prefetch task it hands the pool.

The fast path takes no lock where the interpreter has a GIL: the values
the current block may serve before the slow path must look (the prefetch
point, or the block's end) sit in a ``range`` iterator, and advancing it is
one C call, atomic under the GIL, so two threads can never get one value.
The lock is taken to switch blocks. Whoever holds the lock and needs to
know exactly what is still unserved first swaps the iterator out and
ends it (`SequenceLock._settle`), counting what it had left in one
C call whatever the block's size (`autoseq.buffer.cut`): every value
then belongs either to a caller that took it or to the count, never to
both, and threads that meet the slow path one after another each pay a
constant cost. Without a GIL (free-threaded builds) the iterator is
advanced under the lock.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from autoseq import _hooks, prefetch, signals
from autoseq.buffer import Buffer, Run
from autoseq.errors import (
    AutoseqError,
    InvalidSequenceConfig,
    ReservationConflict,
    SequenceExhausted,
    StoreUnavailable,
)
from autoseq.pacing import (
    DEFAULT_MAX_BATCH_COUNT,
    Backoff,
    BlockSizer,
    LowRemainingAlarm,
    shared_budget,
)
from autoseq.stores.base import (
    MAX_MANY,
    Block,
    SequenceStore,
    check_many,
    release_many,
    reserve_many,
)
from autoseq.stores.capabilities import ReservesMany

__all__ = [
    "DEFAULT_CLOSE_TIMEOUT",
    "DEFAULT_MAX_BATCH_COUNT",
    "GIL",
    "MAX_MANY",
    "BufferPolicy",
    "SequenceLock",
    "close_locks",
]

log = logging.getLogger("autoseq")


@dataclass(frozen=True, slots=True)
class BufferPolicy:
    """How a [`SequenceLock`][autoseq.lock.SequenceLock] buffers values; not part of the stored row.

    ``prefetch_at``: share of the current block used before the next one is
    reserved in the background (Leaf uses 0.1). ``block_seconds``: how long
    a block should last at the rate values were taken lately; each
    reservation is sized for that (at most 16 times the previous size up,
    a quarter of it down), or longer when many sequences are active (the
    process's reservation budget, `autoseq.pacing.configure`), never
    below ``batch_count`` nor above
    ``max_batch_count`` (``None``: `DEFAULT_MAX_BATCH_COUNT`, 2**24,
    about one reservation a second for a process taking values at full
    speed; Leaf caps at 1,000,000; equal to batch_count turns growth off).
    Larger blocks mean fewer round trips, but a SIGKILLed process skips
    what it held, up to two blocks (the current one and the prefetched
    one), and processes sharing a sequence interleave in runs of up to a
    block. ``grow_within`` / ``shrink_after`` are deprecated and
    ignored (sizing by a multiple was replaced by sizing by time).
    ``retry_initial`` / ``retry_max``: back-off (seconds) after a failed
    reservation, during which an empty buffer fails fast. ``warn_share``:
    share of a non-cycling range reserved before ``low_remaining`` is sent.
    """

    prefetch: bool = True
    prefetch_at: float = 0.1
    max_batch_count: int | None = None
    block_seconds: float = 2.0
    grow_within: float | None = None
    shrink_after: float | None = None
    retry_initial: float = 0.05
    retry_max: float = 5.0
    wait_timeout: float = 30.0
    warn_share: float = 0.9

    def __post_init__(self) -> None:
        if not 0.0 <= self.prefetch_at <= 1.0:
            raise InvalidSequenceConfig(
                f"prefetch_at={self.prefetch_at}; use a share between 0.0 and 1.0"
            )
        if self.max_batch_count is not None and self.max_batch_count < 1:
            raise InvalidSequenceConfig(
                f"max_batch_count={self.max_batch_count}; use 1 or more, or None"
            )
        if not 0.0 < self.retry_initial <= self.retry_max:
            raise InvalidSequenceConfig(
                "retry_initial must be above 0 and not above retry_max "
                f"(got {self.retry_initial} and {self.retry_max})"
            )
        if not 0.0 < self.warn_share <= 1.0:
            raise InvalidSequenceConfig(f"warn_share={self.warn_share}; use a share in (0, 1]")
        if not self.block_seconds > 0.0:
            raise InvalidSequenceConfig(
                f"block_seconds={self.block_seconds}; use a duration above 0 seconds"
            )
        if self.grow_within is not None or self.shrink_after is not None:
            warnings.warn(
                "BufferPolicy(grow_within=..., shrink_after=...) is ignored: blocks are now "
                "sized to last block_seconds at the observed rate; pass block_seconds instead",
                DeprecationWarning,
                stacklevel=3,
            )


_locks: weakref.WeakSet[SequenceLock] = weakref.WeakSet()
#: Whether advancing an iterator is atomic between threads (a GIL build).
GIL = bool(getattr(sys, "_is_gil_enabled", lambda: True)())
_EMPTY: Iterator[int] = iter(())
#: Reservations tried before giving up on a row that keeps going back.
_FENCE_TRIES = 5


@dataclass(slots=True)
class _Tally:
    """What happened so far, for [`SequenceLock.stats`][autoseq.lock.SequenceLock.stats]."""

    reservations: int = 0
    reserved_values: int = 0
    last_latency: float | None = None
    row: Any = None  # the row as the latest reservation left it
    waits: int = 0  # times a caller found the buffer empty and waited on the store


class SequenceLock:
    """Serves one sequence's values, reserving blocks from ``store`` as needed.

    Thread-safe; one lock per sequence, so a slow reservation of one sequence
    never delays another. ``next()`` on a full buffer takes no lock at all
    (one step of a range iterator; see the module docstring).
    """

    # Thousands of idle sequences each hold one (issue 34): no per-instance dict.
    __slots__ = (
        "__weakref__",
        "_alarm",
        "_backoff",
        "_batch",
        "_buffer",
        "_closed",
        "_cond",
        "_demand",
        "_fast",
        "_floor",
        "_high",
        "_loading",
        "_lock",
        "_pid",
        "_queued",
        "_serving_since",
        "_sizer",
        "_stop_waiting",
        "_tally",
        "_turns",
        "_waiters",
        "name",
        "policy",
        "store",
    )

    def __init__(
        self,
        name: str,
        store: SequenceStore,
        *,
        batch: bool = True,
        batch_count: int = 100,
        policy: BufferPolicy | None = None,
    ) -> None:
        self.name = name
        self.store = store
        self.policy = policy or BufferPolicy()
        self._batch = batch
        self._floor = batch_count
        self._reset_state()
        _locks.add(self)

    # state ----------------------------------------------------------------

    def _reset_state(self) -> None:
        policy = self.policy
        self._lock = threading.Lock()
        # Made by the first caller that has to wait and dropped when the last one
        # leaves (`_wait`): a Condition costs about 1 KB (its deque of waiters, two
        # bound methods), held by every idle sequence of thousands otherwise.
        self._cond: threading.Condition | None = None
        self._waiters = 0
        self._pid = os.getpid()
        # The buffer's armed run, read without the lock by next(); kept here
        # rather than on the buffer so the hot path is one attribute lookup.
        self._fast: Iterator[int] = _EMPTY
        prefetching = self._batch and policy.prefetch
        self._buffer = Buffer(policy.prefetch_at if prefetching else None)
        self._sizer = BlockSizer(
            self._floor,
            adaptive=self._batch,
            block_seconds=policy.block_seconds,
            max_batch_count=policy.max_batch_count,
            budget=shared_budget(),
        )
        # Made by a failed reservation, dropped by the next success: a sequence whose
        # store answers holds none (thousands of idle sequences, issue 34).
        self._backoff: Backoff | None = None
        # batch=False callers, in arrival order, made on first use (a list: an empty deque
        # costs 760 bytes a sequence, a list 56, and the line is short)
        self._turns: list[object] | None = None
        self._loading = False
        self._closed = False
        self._demand = 1  # values the latest call that reached the slow path asked for
        self._serving_since = 0.0  # when the current block began to be served (monotonic)
        # The prefetch task queued on the shared pool and not started yet:
        # a caller whose block runs out first takes it back (sets None).
        self._queued: object | None = None
        # True while stop() waits for a reservation in flight: the block it
        # brings is then part of the tail handed back, not a gap.
        self._stop_waiting = False
        self._tally = _Tally()
        self._high: int | None = None  # the highest value reserved here: the fence
        self._alarm = LowRemainingAlarm(policy.warn_share)

    def _after_fork_in_child(self) -> None:
        # The parent's blocks belong to the parent; serving them here would
        # duplicate its values. Locks may have been held by a thread that
        # does not exist in the child, so they are replaced too. The range
        # cap (fit_range) is the row's, as true in the child as it was.
        ceiling = self._sizer.ceiling
        self._reset_state()
        self._sizer.ceiling = ceiling

    @contextlib.contextmanager
    def _unlocked(self) -> Iterator[None]:
        """Let the lock go for a store round trip (lock held), and take it back."""
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()

    def _wait(self, timeout: float) -> bool:
        """Wait (lock held) until `_notify_all` or ``timeout`` seconds; False on timeout.

        ``threading.Condition.wait`` on the sequence's lock. The condition is
        made here and dropped by the last waiter to leave: every wait and
        every notify holds the lock, so a notify sees the condition of every
        caller waiting then.
        """
        cond = self._cond
        if cond is None:
            cond = self._cond = threading.Condition(self._lock)
        self._waiters += 1
        try:
            return cond.wait(timeout)
        finally:
            self._waiters -= 1
            if not self._waiters:
                self._cond = None

    def _notify_all(self) -> None:
        """Wake every caller in `_wait` (lock held); nothing to do when none waits."""
        if self._cond is not None:
            self._cond.notify_all()

    # serving --------------------------------------------------------------

    def next(self) -> int:
        """The next value of the sequence."""
        for value in self._fast:  # one C-level step of a range iterator: atomic under the GIL
            return value
        return self._take(1)[0]

    def _next_locked(self) -> int:
        with self._lock:
            for value in self._fast:
                return value
        return self._take(1)[0]

    if not GIL:  # pragma: no cover - free-threaded CPython only
        next = _next_locked

    def _arm(self) -> None:
        """Let the fast path serve the buffer's fast run (lock held, settled)."""
        if self._pid == os.getpid():
            fast = self._buffer.arm()
            if fast is not None:
                self._fast = fast

    def _settle(self) -> None:
        """Stop the fast path and make the buffer exact (lock held).

        The iterator is swapped out before the buffer ends it; see
        `autoseq.buffer.Buffer.settle`.
        """
        if self._buffer.fast_stop is None:
            return
        fast, self._fast = self._fast, _EMPTY
        self._buffer.settle(fast)

    def _position(self) -> int:
        """The next unserved value as the fast path has moved it (lock held)."""
        return self._buffer.position(self._fast)

    def next_many(self, n: int) -> list[int]:
        """``n`` values in increasing order (unless the sequence cycles).

        A shortfall is reserved in one round trip rounded up to whole
        blocks, so a bulk of N values costs about N / block reservations.
        """
        if check_many(n) == 0:
            return []
        return self._take(n)

    def peek(self) -> int | None:
        """The value ``next()`` would serve now from memory, without taking it; None if none.

        Read under the sequence's lock, so it is a value this process really
        holds (another thread may take it right after).
        """
        with self._lock:
            if self._pid != os.getpid():
                return None  # the parent's blocks are not this process's
            return self._buffer.peek(self._position())

    def available(self) -> int:
        """How many values ``next_many()`` can serve now from memory, with no round trip."""
        with self._lock:
            if self._pid != os.getpid():
                return 0
            return self._buffer.current_left(self._position()) + self._buffer.queued()

    def _take(self, n: int) -> list[int]:
        out: list[int] = []
        taken: list[Run] = []  # the runs in ``out``, to give back on failure
        if GIL and n > 1:
            # What the fast path holds, without the lock: one C call takes a
            # contiguous run, atomic under the GIL.
            out = list(itertools.islice(self._fast, n))
            if out:
                taken.append((out[0], out[-1], out[1] - out[0] if len(out) > 1 else 1))
                if len(out) == n:
                    return out
        with self._lock:
            forked = self._pid != os.getpid()
            if not forked:
                try:
                    self._take_into(n, out, taken)
                except BaseException:
                    self._settle()
                    if self._pid == os.getpid():
                        self._buffer.give_back(taken)
                    raise
                self._maybe_prefetch(len(out))
                self._arm()
        if forked:  # pragma: no cover - the at-fork hook resets first
            self._after_fork_in_child()
            return self._take(n)
        return out

    def _take_into(self, n: int, out: list[int], taken: list[Run]) -> None:
        if self._closed:
            raise AutoseqError(f"sequence {self.name!r}: the lock is closed")
        self._demand = n
        buffer = self._buffer
        deadline = time.monotonic() + self.policy.wait_timeout
        while len(out) < n:
            # The lock may have been let go (a reservation, a wait) and
            # another caller may have armed the fast path meanwhile.
            self._settle()
            run = buffer.take(n - len(out))
            if run is not None:
                first, last, step = run
                out.extend(range(first, last + step, step))
                taken.append(run)
                continue
            if buffer.start_next():
                self._serving_since = time.monotonic()
                continue
            if not self._batch:
                own = self._reserve_in_turn(n - len(out))
                out.extend(own.values())
                taken.append((own.first, own.last, own.step))
                continue
            self._tally.waits += 1
            if self._loading:
                if not self._wait(max(0.0, deadline - time.monotonic())):
                    raise self._timed_out("block")
                continue
            self._reserve_now(n - len(out))

    def _timed_out(self, what: str) -> StoreUnavailable:
        return StoreUnavailable(
            f"sequence {self.name!r}: no {what} arrived within {self.policy.wait_timeout}s",
            name=self.name,
            operation="reserve",
            reason="timeout",
        )

    def _maybe_prefetch(self, taken: int) -> None:
        """Past the prefetch point, wake the worker; ``taken``: values this call took."""
        buffer = self._buffer
        if not buffer.past_prefetch_point():
            return
        now = time.monotonic()
        if self._backoff is not None and self._backoff.waiting(now):
            return  # store failing: look again on a later call, after the back-off
        # Past the prefetch point: from here on serve fast until the block
        # ends, and wake the worker once if nothing is buffered or loading.
        buffer.serve_to_end()
        if buffer.blocks or self._loading or self._queued is not None or self._closed:
            return
        # The pace of earlier calls only: one call's bulk, or the value of the
        # call that started the block, says nothing about a rate.
        self._sizer.serving(max(0, buffer.served() - taken), now - self._serving_since)
        ticket = object()
        self._queued = ticket
        if not prefetch.shared().submit(_Prefetch(self, ticket)):
            # No worker thread could start: the caller that empties the
            # block reserves inline, as without prefetching.
            self._queued = None

    def _reserve_in_turn(self, shortfall: int) -> Block:
        """``batch=False``: reserve the caller's own values, callers served first come first.

        One reservation stays in flight per sequence, but the turn passes in
        arrival order: otherwise the thread that just reserved wins the lock
        back every time and starves the others. The wait timeout counts from
        the last time the line moved, so a long line is not a store outage.
        """
        turns = self._turns
        if turns is None:
            turns = self._turns = []
        turn = object()
        turns.append(turn)
        try:
            head = turns[0]
            deadline = time.monotonic() + self.policy.wait_timeout
            while turns[0] is not turn or self._loading:
                if not self._wait(max(0.0, deadline - time.monotonic())):
                    raise self._timed_out("value")
                if turns[0] is not head:
                    head = turns[0]
                    deadline = time.monotonic() + self.policy.wait_timeout
            return self._reserve_now(shortfall)
        finally:
            turns.remove(turn)
            self._notify_all()

    def _reserve_now(self, shortfall: int) -> Block:
        """Reserve on the caller's thread; called with the lock held, let go meanwhile.

        With ``batch`` the block goes to the shared buffer; without, the
        values are all the caller's and it takes them from the result.
        """
        now = time.monotonic()
        backoff = self._backoff
        if backoff is not None and backoff.waiting(now) and backoff.error is not None:
            raise StoreUnavailable(
                f"sequence {self.name!r}: store unavailable ({backoff.error}); "
                f"retrying in {backoff.retry_at - now:.2f}s",
                name=self.name,
                operation="reserve",
                reason="backing off",
            ) from backoff.error
        count = self._sizer.reservation(shortfall, self._bulk_buffer())
        self._queued = None  # a prefetch still waiting for a worker would come too late
        self._loading = True
        try:
            with self._unlocked():
                block = self._reserve(count, prefetch=False)
        except BaseException as exc:
            self._loading = False
            self._notify_all()
            if isinstance(exc, StoreUnavailable):
                signals.store_unavailable.send(self, name=self.name, error=exc)
            raise
        self._loading = False
        if self._batch:
            self._buffer.add(block)
        self._notify_all()
        return block

    def _bulk_buffer(self) -> int:
        """Values to hold beyond a shortfall: two of the latest bulks, when prefetching."""
        return 2 * self._demand if self._batch and self.policy.prefetch else 0

    def _reserve(self, count: int, *, prefetch: bool) -> Block:
        """One store round trip, outside the lock; records what happened."""
        started = time.monotonic()
        try:
            block = self._fenced(self.store.reserve(self.name, count), count)
        except (SequenceExhausted, StoreUnavailable) as exc:
            failed = self._store_failed(exc)
            if failed is exc:
                raise
            raise failed from exc
        self._reserved(block, time.monotonic() - started, started, prefetch=prefetch)
        return block

    def _store_failed(self, exc: SequenceExhausted | StoreUnavailable) -> AutoseqError:
        """Signal or record a failed reservation; the error to raise, naming the sequence."""
        if isinstance(exc, SequenceExhausted):
            signals.sequence_exhausted.send(self, name=self.name, current=exc.current, end=exc.end)
            return exc
        self._note_failure(exc)
        if isinstance(exc, ReservationConflict) and exc.name == self.name:
            return exc  # it already names this sequence and says what to do
        return type(exc)(
            f"sequence {self.name!r}: store unavailable ({exc})",
            name=self.name,
            operation=exc.operation,
            reason=exc.reason,
        )

    def _reserved(self, block: Block, latency: float, started: float, *, prefetch: bool) -> None:
        """Account for a block the store just gave: pacing, signals, the low-range warning."""
        self._note_success(block, latency, started)
        signals.block_reserved.send(
            self,
            name=self.name,
            first=block.first,
            last=block.last,
            count=block.count,
            latency=latency,
            prefetch=prefetch,
        )
        if block.cycled:
            signals.sequence_cycled.send(
                self, name=self.name, start=block.row.start, end=block.row.end
            )
        self._check_low_remaining(block)

    def _fenced(self, block: Block, count: int) -> Block:
        """``block``, or one reserved after it, above every value this process reserved before.

        A block at or below them means the row went back: the store failed
        over to a replica that had not received the latest reservations
        (or was restored). Its values may be ones this process served, so
        they are skipped, not served: the row is moved past them with a
        compare-and-set and the reservation is made again. A cycling row
        wraps on purpose and is left alone.
        """
        failover = False
        for _ in range(_FENCE_TRIES):
            failover = failover or block.failover
            high = self._high
            if high is None or block.cycled or block.row.cycle or block.first > high:
                if failover:
                    signals.store_failover.send(self, name=self.name, first=block.first)
                    block = replace(block, failover=True)
                return block
            log.warning(
                "sequence %r: the store handed out %d..%d again, at or below %d already "
                "reserved here (a failover to a replica that missed writes?); skipping past it",
                self.name,
                block.first,
                block.last,
                high,
            )
            signals.row_went_back.send(self, name=self.name, first=block.first, high=high)
            ahead = block.row.with_current(max(high, block.last) + block.step)
            self.store.compare_and_set(ahead, block.version)
            block = self.store.reserve(self.name, count)
        raise StoreUnavailable(
            f"sequence {self.name!r}: the store kept handing out values at or below {high} "
            f"already reserved by this process ({_FENCE_TRIES} tries); is another client "
            "moving the row back? Check it with `autoseq doctor`",
            name=self.name,
            operation="reserve",
            reason="row went back",
        )

    def _note_failure(self, exc: BaseException) -> None:
        with self._lock:
            if self._backoff is None:
                self._backoff = Backoff(self.policy.retry_initial, self.policy.retry_max)
            self._backoff.failed(exc, time.monotonic())

    def _note_success(self, block: Block, latency: float, started: float) -> None:
        with self._lock:
            self._backoff = None  # the store answers: the next failure starts afresh
            tally = self._tally
            # Served so far, the new block not yet counted nor in hand: the
            # sizer's rate is what was served between reservations.
            buffer = self._buffer
            served = tally.reserved_values - buffer.current_left(self._position())
            served -= buffer.queued()
            tally.reservations += 1
            tally.reserved_values += block.count
            tally.last_latency = latency
            tally.row = block.row
            if block.failover:
                # Blocks reserved on the old primary may be unknown to the
                # new one, which can hand them to another process.
                self._settle()
                self._buffer.clear()
            self._high = (
                block.last if block.cycled or self._high is None else max(self._high, block.last)
            )
            self._buffer.latest = block
            self._sizer.fit_range(block.row.range_size)
            self._sizer.reserved(block.count, started + latency, served)

    def _check_low_remaining(self, block: Block) -> None:
        passed = self._alarm.check(block)
        if passed is None:
            return
        used, remaining = passed
        log.warning(
            "sequence %r has reserved %.1f%% of its range; %d values left before end=%d",
            self.name,
            used * 100,
            remaining,
            block.row.end,
        )
        signals.low_remaining.send(self, name=self.name, remaining=remaining, used_share=used)

    # first blocks reserved for many locks at once (SequenceRegistry.warm) -----

    def first_block_wanted(self) -> int:
        """How many values this lock's first reservation would take; 0 if it wants none.

        0 once it has reserved (or is reserving), when closed, in a forked
        child, and without ``batch`` (each caller reserves its own values).
        """
        with self._lock:
            if not self._first_block_open():
                return 0
            return self._sizer.reservation(1, self._bulk_buffer())

    def count_as_starting(self) -> bool:
        """Count this lock in the process's reservation budget as about to take its first block.

        False, counting nothing, when it wants none (see `first_block_wanted`).
        ``SequenceRegistry.warm`` counts every lock it starts before sizing
        any first block, so each is sized for as many active sequences.
        """
        with self._lock:
            if not self._first_block_open():
                return False
            self._sizer.starting(time.monotonic())
            return True

    def fit_range(self, values: int) -> None:
        """Cap blocks at 1/`autoseq.pacing.RANGE_SHARE` of a range of ``values`` values.

        Each reservation does it from the row it returns; the registry does
        it from the row it built the lock from, so a first block larger than
        ``batch_count`` (many sequences active) respects a short range too.
        """
        with self._lock:
            self._sizer.fit_range(values)

    def _first_block_open(self) -> bool:
        """Whether a first block from elsewhere may still be served (held: ``_lock``)."""
        return (
            self._batch
            and not self._closed
            and not self._loading
            and not self._tally.reservations
            and self._pid == os.getpid()
        )

    def adopt(self, block: Block, *, latency: float = 0.0, started: float | None = None) -> bool:
        """Serve ``block``, reserved for this sequence elsewhere, as the lock's first block.

        What ``SequenceRegistry.warm`` calls after reserving the first blocks
        of many sequences in one round trip: the block is recorded and
        signalled as any reservation of the lock (``block_reserved`` with
        ``prefetch=True``). False, leaving ``block`` to the caller (to hand
        back), when the lock reserved meanwhile or wants none (see
        `first_block_wanted`).
        """
        with self._lock:
            if block.name != self.name or not self._first_block_open():
                return False
            self._loading = True  # a caller arriving now waits for this block
        try:
            block = self._fenced(block, block.count)  # nothing reserved here before: no store call
            at = time.monotonic() if started is None else started
            self._reserved(block, latency, at, prefetch=True)
        finally:
            with self._lock:
                self._loading = False
                self._buffer.add(block)
                self._notify_all()
        return True

    # prefetch, on the shared pool ---------------------------------------------

    def _prefetch(self, ticket: object) -> None:
        """Reserve the next block on a worker of `autoseq.prefetch.shared`.

        Does nothing when ``ticket`` is no longer the one queued: a caller
        took the task back and reserved inline, or the lock closed.
        """
        count = self._prefetch_begins(ticket)
        if not count:
            return
        try:
            block = self._reserve(count, prefetch=True)
        except Exception as exc:  # noqa: BLE001 - reported, retried later
            self._prefetch_failed(exc)
            return
        self._prefetch_arrived(block)

    def _prefetch_begins(self, ticket: object) -> int:
        """The values the prefetch of ``ticket`` reserves, now loading; 0 if it is not to run."""
        with self._lock:
            if self._queued is not ticket:
                return 0
            self._queued = None
            if self._closed or self._pid != os.getpid():
                self._notify_all()
                return 0
            self._loading = True
            return self._sizer.reservation(0, self._bulk_buffer())

    def _prefetched(self, count: int, block: Block | None, latency: float, started: float) -> None:
        """Take ``block``, reserved with other sequences' prefetches (`_prefetch_together`),
        or reserve ``count`` alone when the store left this row out (None)."""
        try:
            if block is None:
                block = self._reserve(count, prefetch=True)
            else:
                block = self._fenced(block, count)
                self._reserved(block, latency, started, prefetch=True)
        except (SequenceExhausted, StoreUnavailable) as exc:
            self._prefetch_failed(exc if block is None else self._store_failed(exc))
            return
        except Exception as exc:  # noqa: BLE001 - reported, retried later
            self._prefetch_failed(exc)
            return
        self._prefetch_arrived(block)

    def _prefetch_failed(self, exc: Exception) -> None:
        signals.prefetch_failed.send(self, name=self.name, error=exc)
        with self._lock:
            self._loading = False
            self._settle()
            if isinstance(exc, StoreUnavailable):
                # Let a caller past the prefetch point try again once
                # the back-off is over; exhaustion is for the caller
                # that empties the block to meet.
                self._buffer.look_again_soon()
            self._notify_all()

    def _prefetch_arrived(self, block: Block) -> None:
        with self._lock:
            self._loading = False
            if self._closed:
                # stop() still waiting: queued for its tail (never served);
                # it gave up waiting: a gap, never served.
                if self._stop_waiting:
                    self._buffer.add(block)
            else:
                buffer = self._buffer
                buffer.add(block)
                if buffer.fast_until != buffer.last:
                    self._settle()
                    buffer.serve_to_end()
                    self._arm()
            self._notify_all()

    # introspection and shutdown -------------------------------------------

    def stats(self) -> dict[str, Any]:
        """What an operator wants to see about this sequence, as plain data."""
        with self._lock:
            left = self._buffer.current_left(self._position())
            buffered = self._buffer.queued()
            tally = self._tally
            rate = self._sizer.rate
            row = tally.row
            eta: float | None = None
            end_left: int | None = None
            if row is not None and not row.cycle:
                unreserved = row.values_left
                end_left = unreserved + left + buffered
                if rate:
                    eta = end_left / rate
            error = self._store_error()
            return {
                "name": self.name,
                "current_block_left": left,
                "next_block_left": buffered,
                "block_size": self._sizer.size,
                "reservations": tally.reservations,
                "caller_waits": tally.waits,
                "reserved_values": tally.reserved_values,
                "served_values": tally.reserved_values - left - buffered,
                "last_latency": tally.last_latency,
                "consumption_rate": rate,
                "values_until_end": end_left,
                "seconds_until_end": eta,
                "loading": self._loading or self._queued is not None,
                "store_error": None if error is None else str(error),
            }

    def _store_error(self) -> BaseException | None:
        """The store's latest error, until a reservation succeeds again."""
        backoff = self._backoff
        return None if backoff is None else backoff.error

    def close(self, *, release: bool = True, wait: bool = True) -> bool:
        """Stop the worker and hand back the unused tail; True if handed back.

        The tail goes back only when no one reserved after this process
        (compare-and-set on ``current``), so a restart continues without a gap.
        ``wait=False`` does not wait for a reservation in flight (and then
        hands nothing back, since the store may be ahead of what is known).
        To close many locks within one deadline, use `close_locks`.
        """
        tail = self.stop(wait_until=time.monotonic() + self.policy.wait_timeout if wait else 0.0)
        if not release or tail is None:
            return False
        try:
            return self.hand_back(tail)
        except AutoseqError:
            return False

    def stop(self, *, wait_until: float = 0.0) -> Block | None:
        """Close without a store round trip; the unused tail to hand back, if known.

        Waits until ``wait_until`` (monotonic) for a reservation in flight;
        if it is still in flight, None: the store may be ahead of what is
        known, and a block it brings later is dropped, never served.
        """
        if not self._shut():
            return None
        return self._tail(wait_until)

    def _shut(self) -> bool:
        """Serve and prefetch no more, without waiting; False if already closed.

        A prefetch queued and not started yet never starts. `close_locks`
        shuts every lock first, so the shared pool's workers stop reserving
        blocks for locks about to close while it collects the tails.
        """
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            self._queued = None  # a prefetch not started yet never starts
            self._sizer.stopped()
            # A block in flight that lands before `_tail` is done waiting
            # joins the tail (handed back), never served.
            self._stop_waiting = True
            return True

    def _tail(self, wait_until: float) -> Block | None:
        """The unused tail of a shut lock, once no reservation is in flight (see `stop`)."""
        with self._lock:
            try:
                while self._loading and self._pid == os.getpid():
                    if not self._wait(max(0.0, wait_until - time.monotonic())):
                        break
            finally:
                self._stop_waiting = False
            self._settle()
            tail = None if self._loading else self._buffer.unused_tail()
            self._buffer.clear()
        return tail

    def hand_back(self, tail: Block) -> bool:
        """Compare-and-set ``tail`` back to the store; True if it went.

        Called after [`stop`][autoseq.lock.SequenceLock.stop].
        """
        released = self.store.release(tail)
        if released:
            signals.block_released.send(self, name=self.name, first=tail.first, count=tail.count)
        return released


#: Tails named in the shutdown's one log line; the rest are counted.
_LOGGED = 20
#: Tails handed back in one transaction at shutdown (the deadline is checked between).
_CHUNK = 500
#: Seconds a whole shutdown (every lock of a registry, or of the process) may take.
DEFAULT_CLOSE_TIMEOUT = 5.0


def close_locks(
    locks: list[SequenceLock],
    *,
    release: bool = True,
    wait: bool = True,
    timeout: float = DEFAULT_CLOSE_TIMEOUT,
) -> list[tuple[str, Block]]:
    """Close ``locks`` within ``timeout`` seconds in all; the tails not handed back.

    Hand-backs run one after another in a daemon thread that is waited for
    until the deadline only. After a store fails one (or the deadline
    passes) the tails left for it are not tried: each stays a gap, which
    is safe, and they are logged in one line. A hand-back still in flight
    at the deadline is a compare-and-set, so whether it lands or not no
    value can be handed out twice.
    """
    deadline = time.monotonic() + timeout
    # Every lock shut first, then the tails collected: while a lock is
    # being waited for, the pool's workers no longer reserve blocks for
    # the locks after it (each a round trip, then a tail to hand back).
    shut = [lock for lock in locks if lock._shut()]
    tails = []
    for lock in shut:
        tail = lock._tail(deadline if wait else 0.0)
        if release and tail is not None:
            tails.append((lock, tail))
    if not tails:
        return []
    handing = _HandBacks(tails, deadline)
    if not run_until(handing.run, "autoseq-hand-back", deadline):
        handing.run()  # no new thread at interpreter exit (3.12+): one failure still ends it
    left = handing.stop()
    if left:
        shown = ", ".join(f"{name} {block.first}..{block.last}" for name, block in left[:_LOGGED])
        more = f" and {len(left) - _LOGGED} more" if len(left) > _LOGGED else ""
        log.warning(
            "shutdown: %d unused tail(s) not handed back (left as gaps, safe): %s%s",
            len(left),
            shown,
            more,
        )
    return left


def run_until(task: Callable[[], None], name: str, deadline: float) -> bool:
    """Run ``task`` on a daemon thread waited for until ``deadline``; False if none could start.

    At interpreter exit (Python 3.12+) no thread can start: the caller then
    runs ``task`` itself.
    """
    thread = threading.Thread(target=task, name=name, daemon=True)
    try:
        thread.start()
    except RuntimeError:
        return False
    thread.join(max(0.0, deadline - time.monotonic()))
    return True


class _HandBacks:
    """The hand-backs of one shutdown, run by one thread, given up at a deadline.

    The tails of one store go back `_CHUNK` at a time through
    `autoseq.stores.base.release_many`: one transaction per chunk on
    a store that can, so ten thousand tails cost a few commits.
    """

    def __init__(self, tails: list[tuple[SequenceLock, Block]], deadline: float) -> None:
        self._tails = tails
        self._deadline = deadline
        self._done: set[int] = set()  # indexes handed back, or refused by the compare-and-set
        self._guard = threading.Lock()
        self._stopped = False

    def run(self) -> None:
        by_store: dict[int, list[int]] = {}
        for index, (lock, _) in enumerate(self._tails):
            by_store.setdefault(id(lock.store), []).append(index)
        for indexes in by_store.values():
            for start in range(0, len(indexes), _CHUNK):
                with self._guard:
                    if self._stopped or time.monotonic() >= self._deadline:
                        return
                if not self._hand_back(indexes[start : start + _CHUNK]):
                    break  # a failing store: its tails left stay gaps

    def _hand_back(self, indexes: list[int]) -> bool:
        store = self._tails[indexes[0]][0].store
        blocks = [self._tails[index][1] for index in indexes]
        try:
            released = release_many(store, blocks)
        except Exception:  # noqa: BLE001 - a failing store: its tails stay gaps
            return False
        for index, went in zip(indexes, released, strict=True):
            if went:
                lock, tail = self._tails[index]
                signals.block_released.send(
                    lock, name=lock.name, first=tail.first, count=tail.count
                )
        with self._guard:
            self._done.update(indexes)
        return True

    def stop(self) -> list[tuple[str, Block]]:
        """Give up what is not done; the (name, tail) pairs not handed back."""
        with self._guard:
            self._stopped = True
            return [
                (lock.name, tail)
                for index, (lock, tail) in enumerate(self._tails)
                if index not in self._done
            ]


def _after_fork_in_child() -> None:
    for lock in list(_locks):
        lock._after_fork_in_child()


def _close_all_at_exit() -> None:
    # Best effort: hand back what is unused unless the store is failing, and
    # never wait for a reservation in flight, so exit is never held up long.
    locks = list(_locks)
    failing = [lock for lock in locks if lock._store_error() is not None]
    with contextlib.suppress(Exception):  # the interpreter is exiting
        close_locks(failing, release=False, wait=False)
        close_locks([lock for lock in locks if lock not in failing], wait=False)


_hooks.on_fork(after_in_child=_after_fork_in_child)
_hooks.at_exit(_close_all_at_exit)


#: Whether a store class has ``reserve_many``, found once per class: the runtime
#: ``Protocol`` check takes tens of microseconds, and a prefetch is made on the caller's
#: thread at its prefetch point (issue 5's p99.9 went from 108-114 to 160-174 us with the
#: check made on each). A class whose instances differ (a wrapper forwarding through
#: ``__getattr__``) is judged by its first: batched wrongly, `reserve_many` in
#: `autoseq.stores.base` answers None for each row and each is reserved alone.
_RESERVES_MANY: dict[type, bool] = {}


def _reserves_many(store: object) -> bool:
    kind = type(store)
    known = _RESERVES_MANY.get(kind)
    if known is None:
        known = _RESERVES_MANY[kind] = isinstance(store, ReservesMany)
    return known


class _Prefetch:
    """A prefetch task for the shared pool: reserve ``lock``'s next block.

    Tasks with the same ``batch_key`` (one store that reserves many rows in
    one round trip) may be run together by a worker that finds several
    queued (`PrefetchPool` calls `run_together`): at scale, when thousands of
    sequences reach their prefetch points at once (10,000 taken round-robin
    reach them together), each round trip then reserves for hundreds of
    them instead of one.
    """

    __slots__ = ("batch_key", "lock", "ticket")

    def __init__(self, lock: SequenceLock, ticket: object) -> None:
        self.lock = lock
        self.ticket = ticket
        store = lock.store
        self.batch_key: object | None = store if _reserves_many(store) else None

    def __call__(self) -> None:
        self.lock._prefetch(self.ticket)

    def run_together(self, tasks: list[_Prefetch]) -> None:
        """Run ``tasks`` (this one among them, all of one store) with one ``reserve_many``.

        Each lock still decides whether its prefetch runs (a caller may have
        taken it back) and how many values it wants; a row the store leaves
        out is reserved alone, and a failure of the whole call is each
        lock's failure, as if its own reservation had failed.
        """
        wanted: list[tuple[SequenceLock, int]] = []
        for task in tasks:
            count = task.lock._prefetch_begins(task.ticket)
            if count:
                wanted.append((task.lock, count))
        if not wanted:
            return
        if len(wanted) == 1:
            lock, count = wanted[0]
            lock._prefetched(count, None, 0.0, 0.0)
            return
        started = time.monotonic()
        try:
            blocks = reserve_many(self.lock.store, [(lock.name, n) for lock, n in wanted])
        except Exception as exc:  # noqa: BLE001 - each lock reports it as its own
            for lock, _ in wanted:
                error = lock._store_failed(exc) if isinstance(exc, StoreUnavailable) else exc
                lock._prefetch_failed(error)
            return
        latency = time.monotonic() - started
        for (lock, count), block in zip(wanted, blocks, strict=True):
            lock._prefetched(count, block, latency, started)
