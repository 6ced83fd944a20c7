"""``SequenceLock``: one sequence's blocks, served from memory under its own lock.

Serving follows Meituan Leaf's segment mode: values come from the current
block; once a share of it is used, a background worker reserves the next
block, so the switch to it does not wait on the store. Block sizes adapt to
the consumption rate, store outages are ridden out on what is buffered, and
``close()`` hands an untouched tail back to the store.

The fast path takes no lock where the interpreter has a GIL: the values
the current block may serve before the slow path must look (the prefetch
point, or the block's end) sit in a ``range`` iterator, and advancing it is
one C call, atomic under the GIL, so two threads can never get one value.
The lock is taken to switch blocks. Whoever holds the lock and needs to
know exactly what is still unserved first swaps the iterator out and
drains it (:meth:`SequenceLock._settle`): every value then belongs either
to a caller that took it or to the drain, never to both. Without a GIL
(free-threaded builds) the iterator is advanced under the lock.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import operator
import os
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from autoseq import signals
from autoseq.errors import (
    AutoseqError,
    InvalidCount,
    InvalidSequenceConfig,
    SequenceExhausted,
    StoreUnavailable,
)
from autoseq.stores.base import Block, SequenceStore

log = logging.getLogger("autoseq")


@dataclass(frozen=True, slots=True)
class BufferPolicy:
    """How a :class:`SequenceLock` buffers values; not part of the stored row.

    ``prefetch_at``: share of the current block used before the next one is
    reserved in the background (Leaf uses 0.1). ``block_seconds``: how long
    a block should last at the rate values were taken lately; each
    reservation is sized for that (at most 16 times the previous size up,
    a quarter of it down), never below ``batch_count`` nor above
    ``max_batch_count`` (``None``: :data:`DEFAULT_MAX_BATCH_COUNT`, Leaf's
    ceiling of 1,000,000; equal to batch_count turns growth off). Larger
    blocks mean fewer round trips, but a SIGKILLed process skips up to a
    block's worth of values, and processes sharing a sequence interleave
    in larger runs. ``grow_within`` / ``shrink_after`` are deprecated and
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


#: The ceiling of adaptive block sizes when ``max_batch_count`` is None
#: (Leaf's): at full speed in memory, a few reservations per second.
DEFAULT_MAX_BATCH_COUNT = 1_000_000
#: Per reservation, a block grows at most this many times and shrinks to no
#: less than 1/_SHRINK of the previous one: a burst or a pause measured once
#: does not swing the size all the way.
_GROW = 16
_SHRINK = 4

_locks: weakref.WeakSet[SequenceLock] = weakref.WeakSet()
#: Whether advancing an iterator is atomic between threads (a GIL build).
GIL = bool(getattr(sys, "_is_gil_enabled", lambda: True)())
_EMPTY: Iterator[int] = iter(())
#: The most values one ``next_many`` call returns: a list of them costs about
#: 36 bytes each, so larger bulks are asked for in chunks.
MAX_MANY = 10_000_000


class SequenceLock:
    """Serves one sequence's values, reserving blocks from ``store`` as needed.

    Thread-safe; one lock per sequence, so a slow reservation of one sequence
    never delays another. ``next()`` on a full buffer takes no lock at all
    (one step of a range iterator; see the module docstring).
    """

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
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pid = os.getpid()
        # The block being served: _next.._last by _step. _fast_until is the
        # last value the fast path may serve before the slow path looks at
        # prefetching (equal to _last once a prefetch is in hand). While
        # _fast serves _next.._fast_until, _next lags behind it: _settle()
        # makes it exact again (under the lock).
        self._next = 1
        self._last = 0
        self._step = 1
        self._fast_until = 0
        self._fast: Iterator[int] = _EMPTY
        self._fast_stop: int | None = None  # one step past _fast's last value, if armed
        self._blocks: deque[Block] = deque()  # reserved, not yet started
        self._turns: deque[object] = deque()  # batch=False callers, in arrival order
        self._loading = False
        self._closed = False
        self._error: BaseException | None = None
        self._retry_at = 0.0
        self._backoff = 0.0
        self._block_size = self._floor if self._batch else 1
        self._demand = 1  # values the latest call that reached the slow path asked for
        self._worker: threading.Thread | None = None
        self._wake = threading.Event()
        self._reservations = 0
        self._reserved_values = 0
        self._last_latency: float | None = None
        self._last_reserved_at: float | None = None
        self._rate: float | None = None
        self._row: Any = None
        self._warned = False
        self._latest: Block | None = None
        self._latest_count = 0
        self._waits = 0  # times a caller found the buffer empty and waited on the store

    def _after_fork_in_child(self) -> None:
        # The parent's blocks belong to the parent; serving them here would
        # duplicate its values. Locks may have been held by a thread that
        # does not exist in the child, so they are replaced too.
        self._reset_state()

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
        """Let the fast path serve ``_next.._fast_until`` (lock held, settled)."""
        if self._next <= self._fast_until and self._pid == os.getpid():
            self._fast_stop = self._fast_until + self._step
            self._fast = iter(range(self._next, self._fast_stop, self._step))

    def _settle(self) -> None:
        """Stop the fast path and make ``_next`` exact (lock held).

        The iterator is swapped out first, then drained: a caller that
        loaded it just before the swap takes its value in order, before or
        after the drain, so what the drain finds is exactly the unserved
        suffix and nothing is both served and counted as left.
        """
        if self._fast_stop is None:
            return
        fast, self._fast = self._fast, _EMPTY
        # deque(enumerate(...), maxlen=1) consumes the rest in one C call
        # (atomic under the GIL) and keeps only the count: no list of a
        # whole block. The last pair's index says how many were left.
        last = deque(enumerate(fast), maxlen=1)
        left = last[0][0] + 1 if last else 0
        self._next = self._fast_stop - left * self._step
        self._fast_stop = None

    def _position(self) -> int:
        """``_next`` as the fast path has moved it (lock held; may lag a racing caller)."""
        if self._fast_stop is None:
            return self._next
        left = operator.length_hint(self._fast)
        return self._fast_stop - left * self._step

    def next_many(self, n: int) -> list[int]:
        """``n`` values in increasing order (unless the sequence cycles).

        A shortfall is reserved in one round trip rounded up to whole
        blocks, so a bulk of N values costs about N / block reservations.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidCount(f"next_many needs an int count of 0 or more, got {n!r}")
        if n > MAX_MANY:
            raise InvalidCount(
                f"next_many({n}) would build a list of {n:,} values; ask for at most "
                f"{MAX_MANY:,} per call (call it in chunks)"
            )
        if n == 0:
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
            position = self._position()
            if position <= self._last:
                return position
            if self._blocks:
                return self._blocks[0].first
        return None

    def available(self) -> int:
        """How many values ``next_many()`` can serve now from memory, with no round trip."""
        with self._lock:
            if self._pid != os.getpid():
                return 0
            position = self._position()
            left = (self._last - position) // self._step + 1 if position <= self._last else 0
            return left + sum(block.count for block in self._blocks)

    def _take(self, n: int) -> list[int]:
        out: list[int] = []
        taken: list[tuple[int, int, int]] = []  # the runs in ``out``, to give back on failure
        if GIL and n > 1:
            # What the fast path holds, without the lock: one C call takes a
            # contiguous run, atomic under the GIL.
            out = list(itertools.islice(self._fast, n))
            if out:
                taken.append((out[0], out[-1], out[1] - out[0] if len(out) > 1 else 1))
                if len(out) == n:
                    return out
        with self._cond:
            forked = self._pid != os.getpid()
            if not forked:
                try:
                    self._take_into(n, out, taken)
                except BaseException:
                    self._give_back(taken)
                    raise
                self._maybe_prefetch()
                self._arm()
        if forked:  # pragma: no cover - the at-fork hook resets first
            self._after_fork_in_child()
            return self._take(n)
        return out

    def _give_back(self, taken: list[tuple[int, int, int]]) -> None:
        """Put values a failed call took back in front of the buffer, in order.

        They were reserved for this process and nobody else can have them;
        dropping them would only leave a gap, so the next call serves them.
        """
        self._settle()
        if not taken or self._pid != os.getpid() or self._latest is None:
            return
        row = self._latest.row
        if self._next <= self._last:
            self._blocks.appendleft(Block(self.name, self._next, self._last, self._step, row))
        for first, last, step in reversed(taken):
            self._blocks.appendleft(Block(self.name, first, last, step, row))
        self._next, self._last, self._fast_until = 1, 0, 0

    def _take_into(self, n: int, out: list[int], taken: list[tuple[int, int, int]]) -> None:
        if self._closed:
            raise AutoseqError(f"sequence {self.name!r}: the lock is closed")
        self._demand = n
        deadline = time.monotonic() + self.policy.wait_timeout
        while len(out) < n:
            # The lock may have been let go (a reservation, a wait) and
            # another caller may have armed the fast path meanwhile.
            self._settle()
            if self._next <= self._last:
                want = n - len(out)
                have = (self._last - self._next) // self._step + 1
                k = min(want, have)
                stop = self._next + k * self._step
                out.extend(range(self._next, stop, self._step))
                taken.append((self._next, stop - self._step, self._step))
                self._next = stop
                continue
            if self._blocks:
                self._start_block(self._blocks.popleft())
                continue
            if not self._batch:
                own = self._reserve_in_turn(n - len(out))
                out.extend(own.values())
                taken.append((own.first, own.last, own.step))
                continue
            if self._loading:
                self._waits += 1
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    raise StoreUnavailable(
                        f"sequence {self.name!r}: no block arrived within "
                        f"{self.policy.wait_timeout}s",
                        name=self.name,
                    )
                continue
            self._waits += 1
            self._reserve_now(n - len(out))

    def _start_block(self, block: Block) -> None:
        self._next, self._last, self._step = block.first, block.last, block.step
        if self._batch and self.policy.prefetch and not self._blocks:
            used = max(1, int(block.count * self.policy.prefetch_at))
            self._fast_until = min(block.last, block.first + (used - 1) * block.step)
        else:
            self._fast_until = block.last

    def _maybe_prefetch(self) -> None:
        if self._next <= self._fast_until or self._next > self._last:
            return
        if time.monotonic() < self._retry_at:
            return  # store failing: look again on a later call, after the back-off
        # Past the prefetch point: from here on serve fast until the block
        # ends, and wake the worker once if nothing is buffered or loading.
        self._fast_until = self._last
        if self._blocks or self._loading or self._closed:
            return
        self._loading = True
        self._ensure_worker()
        self._wake.set()

    def _reserve_in_turn(self, shortfall: int) -> Block:
        """``batch=False``: reserve the caller's own values, callers served first come first.

        One reservation stays in flight per sequence, but the turn passes in
        arrival order: otherwise the thread that just reserved wins the lock
        back every time and starves the others. The wait timeout counts from
        the last time the line moved, so a long line is not a store outage.
        """
        turn = object()
        self._turns.append(turn)
        try:
            head = self._turns[0]
            deadline = time.monotonic() + self.policy.wait_timeout
            while self._turns[0] is not turn or self._loading:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    raise StoreUnavailable(
                        f"sequence {self.name!r}: no value arrived within "
                        f"{self.policy.wait_timeout}s",
                        name=self.name,
                    )
                if self._turns[0] is not head:
                    head = self._turns[0]
                    deadline = time.monotonic() + self.policy.wait_timeout
            return self._reserve_now(shortfall)
        finally:
            self._turns.remove(turn)
            self._cond.notify_all()

    def _reserve_now(self, shortfall: int) -> Block:
        """Reserve on the caller's thread; called with the lock held.

        With ``batch`` the block goes to the shared buffer; without, the
        values are all the caller's and it takes them from the result.
        """
        now = time.monotonic()
        if now < self._retry_at and self._error is not None:
            raise StoreUnavailable(
                f"sequence {self.name!r}: store unavailable ({self._error}); "
                f"retrying in {self._retry_at - now:.2f}s",
                name=self.name,
            ) from self._error
        count = self._reservation_size(shortfall)
        self._loading = True
        self._lock.release()
        try:
            block = self._reserve(count, prefetch=False)
        except BaseException as exc:
            self._lock.acquire()
            self._loading = False
            self._cond.notify_all()
            if isinstance(exc, StoreUnavailable):
                signals.store_unavailable.send(self, name=self.name, error=exc)
            raise
        self._lock.acquire()
        self._loading = False
        if self._batch:
            self._blocks.append(block)
        self._cond.notify_all()
        return block

    def _reservation_size(self, shortfall: int) -> int:
        """Whole blocks covering ``shortfall``; with prefetching, two of the latest bulks too.

        A caller asking for bulk after bulk (``next_many(1000)`` in a loop,
        say) would otherwise empty every block it is given and wait on the
        store at each call; a buffer of two bulks lets every other call be
        served from memory while the next reservation is in flight.
        """
        size = self._block_size
        want = shortfall
        if self._batch and self.policy.prefetch:
            want = max(want, 2 * self._demand)
        return max(size, -(-want // size) * size)

    def _reserve(self, count: int, *, prefetch: bool) -> Block:
        """One store round trip, outside the lock; records what happened."""
        started = time.monotonic()
        try:
            block = self.store.reserve(self.name, count)
        except SequenceExhausted as exc:
            signals.sequence_exhausted.send(self, name=self.name, current=exc.current, end=exc.end)
            raise
        except StoreUnavailable as exc:
            self._note_failure(exc)
            if exc.name == self.name and str(exc).startswith(f"sequence {self.name!r}"):
                raise
            raise type(exc)(
                f"sequence {self.name!r}: store unavailable ({exc})", name=self.name
            ) from exc
        latency = time.monotonic() - started
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
        return block

    def _note_failure(self, exc: BaseException) -> None:
        with self._lock:
            self._error = exc
            self._backoff = min(
                self.policy.retry_max,
                self._backoff * 2 if self._backoff else self.policy.retry_initial,
            )
            self._retry_at = time.monotonic() + self._backoff

    def _note_success(self, block: Block, latency: float, started: float) -> None:
        with self._lock:
            previous = self._last_reserved_at
            self._error = None
            self._backoff = 0.0
            self._retry_at = 0.0
            self._reservations += 1
            self._reserved_values += block.count
            self._last_latency = latency
            self._last_reserved_at = started
            self._row = block.row
            self._latest = block
            if previous is not None and started > previous and self._latest_count:
                self._rate = self._latest_count / (started - previous)
                self._adapt(self._rate)
            self._latest_count = block.count

    def _adapt(self, rate: float) -> None:
        """Size the next blocks to last ``block_seconds`` at ``rate`` values per second."""
        if not self._batch:
            return
        ceiling = max(self.policy.max_batch_count or DEFAULT_MAX_BATCH_COUNT, self._floor)
        wanted = rate * self.policy.block_seconds
        size = self._block_size
        wanted = min(max(wanted, size / _SHRINK), size * _GROW, ceiling)
        # Whole multiples of batch_count, as a fixed-size caller would get.
        self._block_size = max(self._floor, -(-int(wanted) // self._floor) * self._floor)

    def _check_low_remaining(self, block: Block) -> None:
        row = block.row
        if row.cycle or self._warned:
            return
        span = row.last_value - row.start
        used = (block.last - row.start) / span if span else 1.0
        if used >= self.policy.warn_share:
            self._warned = True
            remaining = (row.last_value - block.last) // row.step
            log.warning(
                "sequence %r has reserved %.1f%% of its range; %d values left before end=%d",
                self.name,
                used * 100,
                remaining,
                row.end,
            )
            signals.low_remaining.send(self, name=self.name, remaining=remaining, used_share=used)

    # background worker ------------------------------------------------------

    def _ensure_worker(self) -> None:
        worker = self._worker
        if worker is None or not worker.is_alive():
            self._worker = threading.Thread(
                target=self._work, name=f"autoseq-prefetch-{self.name}", daemon=True
            )
            self._worker.start()

    def _work(self) -> None:
        wake = self._wake
        while True:
            wake.wait()
            wake.clear()
            with self._lock:
                if self._closed or self._pid != os.getpid():
                    self._loading = False
                    self._cond.notify_all()
                    return
                count = self._reservation_size(0)
            try:
                block = self._reserve(count, prefetch=True)
            except Exception as exc:  # noqa: BLE001 - reported, retried later
                signals.prefetch_failed.send(self, name=self.name, error=exc)
                with self._lock:
                    self._loading = False
                    self._settle()
                    if isinstance(exc, StoreUnavailable) and self._next <= self._last:
                        # Let a caller past the prefetch point try again once
                        # the back-off is over; exhaustion is for the caller
                        # that empties the block to meet.
                        self._fast_until = self._next - self._step
                    self._cond.notify_all()
                continue
            with self._lock:
                self._loading = False
                self._blocks.append(block)
                if self._fast_until != self._last:
                    self._settle()
                    self._fast_until = self._last
                    self._arm()
                self._cond.notify_all()

    # introspection and shutdown -------------------------------------------

    def stats(self) -> dict[str, Any]:
        """What an operator wants to see about this sequence, as plain data."""
        with self._lock:
            position = self._position()
            left = (self._last - position) // self._step + 1 if position <= self._last else 0
            buffered = sum(block.count for block in self._blocks)
            row = self._row
            eta: float | None = None
            end_left: int | None = None
            if row is not None and not row.cycle:
                unreserved = max(0, (row.last_value - row.next_value) // row.step + 1)
                end_left = unreserved + left + buffered
                if self._rate:
                    eta = end_left / self._rate
            return {
                "name": self.name,
                "current_block_left": left,
                "next_block_left": buffered,
                "block_size": self._block_size,
                "reservations": self._reservations,
                "caller_waits": self._waits,
                "reserved_values": self._reserved_values,
                "served_values": self._reserved_values - left - buffered,
                "last_latency": self._last_latency,
                "consumption_rate": self._rate,
                "values_until_end": end_left,
                "seconds_until_end": eta,
                "loading": self._loading,
                "store_error": None if self._error is None else str(self._error),
            }

    def close(self, *, release: bool = True, wait: bool = True) -> bool:
        """Stop the worker and hand back the unused tail; True if handed back.

        The tail goes back only when no one reserved after this process
        (compare-and-set on ``current``), so a restart continues without a gap.
        ``wait=False`` does not wait for a reservation in flight (and then
        hands nothing back, since the store may be ahead of what is known).
        """
        with self._cond:
            if self._closed:
                return False
            self._closed = True
            deadline = time.monotonic() + self.policy.wait_timeout
            while wait and self._loading and self._pid == os.getpid():
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    break
            self._wake.set()
            self._settle()
            tail = self._unused_tail()
            self._next, self._last, self._fast_until = 1, 0, 0
            self._blocks.clear()
        if not release or tail is None:
            return False
        try:
            released = self.store.release(tail)
        except AutoseqError:
            return False
        if released:
            signals.block_released.send(self, name=self.name, first=tail.first, count=tail.count)
        return released

    def _unused_tail(self) -> Block | None:
        latest = self._latest
        if latest is None or self._loading:
            return None
        # Unserved values, oldest first: the rest of the current block, then
        # the buffered blocks. Only a run that ends at the latest reservation
        # and is contiguous can go back.
        pieces: list[tuple[int, int, int]] = []
        if self._next <= self._last:
            pieces.append((self._next, self._last, self._step))
        pieces.extend((b.first, b.last, b.step) for b in self._blocks)
        if not pieces or pieces[-1][1] != latest.last:
            return None
        first = pieces[-1][0]
        for start, last, step in reversed(pieces[:-1]):
            if last + step != first:
                break
            first = start
        return Block(self.name, first, latest.last, latest.step, latest.row)


def _after_fork_in_child() -> None:
    for lock in list(_locks):
        lock._after_fork_in_child()


def _close_all_at_exit() -> None:
    # Best effort: hand back what is unused unless the store is failing, and
    # never wait for a reservation in flight, so exit is never held up long.
    for lock in list(_locks):
        with contextlib.suppress(Exception):  # the interpreter is exiting
            lock.close(release=lock._error is None, wait=False)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_all_at_exit)
