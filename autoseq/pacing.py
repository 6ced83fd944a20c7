"""How big the next block is and when to try the store again: pure policies, no threads.

They take the time as an argument, so a test drives them with made-up
clocks. [`autoseq.lock.SequenceLock`][autoseq.lock.SequenceLock] calls them under its lock.
One of them is process-wide: `ReservationBudget`, the reservations a
second every sequence of the process shares (`shared_budget`, set with
`configure`), which stretches blocks when many sequences are active.
"""

from __future__ import annotations

import threading

from autoseq import _hooks
from autoseq.errors import InvalidSequenceConfig
from autoseq.stores.base import Block

#: The ceiling of adaptive block sizes when ``max_batch_count`` is None:
#: 2**24 (16,777,216) values. One process taking values at full speed in
#: memory (about 15 million a second on a small machine) then makes about
#: one reservation a second, where Leaf's ceiling of 1,000,000 made a dozen.
#: The price of a larger block: a process killed without ``close()``
#: (SIGKILL, a crash) skips what it held, up to two blocks (the current one
#: and the one prefetched), and processes sharing a sequence interleave in
#: runs of up to a block. Only a sequence taken that fast reaches it: blocks
#: are sized to last ``block_seconds`` at the observed rate.
DEFAULT_MAX_BATCH_COUNT = 2**24
#: On a short range a block holds at most 1/RANGE_SHARE of the sequence's
#: values (never less than ``batch_count``): a five-digit serial's 99,999
#: values then go out in blocks of at most 900 (``batch_count`` 100), so one
#: busy process cannot reserve what is left of the range while the others
#: get `SequenceExhausted`. A 64-bit range never
#: meets this cap; a nine-digit one meets it at about 10 million.
RANGE_SHARE = 100
#: Per reservation, a block grows at most this many times and shrinks to no
#: less than 1/_SHRINK of the previous one: a burst or a pause measured once
#: does not swing the size all the way.
_GROW = 16
_SHRINK = 4
#: Reservations a second the whole process aims to stay under (`configure`
#: changes it): with fewer than 200 sequences active (`block_seconds` 2.0)
#: it never binds. Ten thousand active sequences then make about 100
#: reservations a second, blocks lasting 100 s each, instead of 5,000 a
#: second, more than the prefetch pool's threads can make (each costs
#: a round trip and a millisecond or so of the process's CPU).
DEFAULT_RESERVATIONS_PER_SECOND = 100.0
#: The shortest period over which sequences that reserved count as active.
ACTIVE_WINDOW = 10.0
#: The budget stretches blocks only to a second or more: a sequence alone, or among
#: fewer than ``per_second`` active ones, keeps its own ``block_seconds`` even below a
#: second (a test, a latency-bound setup), exactly as without a budget.
LEAST_SECONDS = 1.0


class ReservationBudget:
    """Process-wide: how long blocks must last for the process to stay within ``per_second``.

    Each reservation a sequence makes says so (`reserved`); the sequences
    that reserved lately are the active ones, and `seconds` is how long
    each block must last for all of them together to make at most
    ``per_second`` reservations a second: active / ``per_second``, or 0
    below `LEAST_SECONDS`. A `BlockSizer` sizes for that whenever it is
    longer than its own ``block_seconds``, so one hot sequence (or a few
    hundred) is sized exactly as without a budget.

    Active means counted in the current period or the previous one; a
    period lasts `ACTIVE_WINDOW` or twice `seconds`, whichever is longer,
    so a sequence busy enough to reserve once a block (every `seconds`)
    is counted in every period, and one that stopped reserving drops out
    after two periods at most: idle sequences do not stretch the others'
    blocks for ever. A sequence too slow to need a block that often may
    be counted in one period and not the next: it then stretches the
    others less, as it costs the budget less. The bookkeeping is O(1) per
    reservation (each sizer keeps the number of the period it was last
    counted in), under a lock of its own, and never on the per-value path.
    """

    __slots__ = (
        "_counted",
        "_ends",
        "_guard",
        "_length",
        "_period",
        "_previous",
        "per_second",
        "seconds",
        "window",
    )

    def __init__(
        self, per_second: float = DEFAULT_RESERVATIONS_PER_SECOND, window: float = ACTIVE_WINDOW
    ) -> None:
        self.per_second = _checked_budget(per_second)
        self.window = window
        self._guard = threading.Lock()
        self._period = 0
        self._reset()

    def _reset(self) -> None:
        # The period number goes on increasing: a sizer counted before
        # keeps an older number and is counted again.
        self._period += 1
        self._ends = float("-inf")
        self._length = self.window
        self._counted = 0  # sequences counted in the current period
        self._previous = 0  # in the previous one
        #: How long blocks must last: active sequences / per_second.
        self.seconds = 0.0

    def reset(self) -> None:
        """Forget every active sequence (tests, and a forked child)."""
        with self._guard:
            self._reset()

    def after_fork_in_child(self) -> None:
        """A fresh lock and no active sequence: the parent's were counted for the parent."""
        self._guard = threading.Lock()
        self._reset()

    def change(self, per_second: float) -> None:
        """Aim at ``per_second`` reservations a second from the next reservation on."""
        with self._guard:
            self.per_second = _checked_budget(per_second)
            self._update()

    def active(self) -> int:
        """Sequences counted as active: the more of this period's and the previous one's."""
        return max(self._counted, self._previous)

    def reserved(self, counted_in: int, at: float) -> int:
        """Count a reservation at ``at`` by a sequence last counted in period ``counted_in``.

        Returns the period it is counted in now, for the sequence to keep.
        """
        with self._guard:
            if at >= self._ends:
                quiet = at >= self._ends + self._length  # a whole period with no reservation
                self._previous = 0 if quiet else self._counted
                self._counted = 0
                self._period += 1
                self._update()
                self._length = max(self.window, 2 * self.seconds)
                self._ends = at + self._length
            if counted_in != self._period:
                self._counted += 1
                self._update()
            return self._period

    def forget(self, counted_in: int, counted_before: int) -> None:
        """Stop counting a sequence closed for good, last counted in these two periods.

        A registry closed (its sequences never to reserve again here) then
        stops stretching the blocks of the sequences still serving at once,
        not two periods later.
        """
        with self._guard:
            period = self._period
            if counted_in == period:
                self._counted = max(0, self._counted - 1)
            if period - 1 in (counted_in, counted_before):
                self._previous = max(0, self._previous - 1)
            self._update()

    def _update(self) -> None:
        seconds = self.active() / self.per_second
        self.seconds = seconds if seconds >= LEAST_SECONDS else 0.0


def _checked_budget(per_second: float) -> float:
    if not per_second > 0:
        raise InvalidSequenceConfig(
            f"reservations_per_second={per_second}; use a number of reservations a second "
            f"above 0 (default {DEFAULT_RESERVATIONS_PER_SECOND:g})"
        )
    return float(per_second)


_budget = ReservationBudget()


def shared_budget() -> ReservationBudget:
    """The process's `ReservationBudget`, which every `autoseq.lock.SequenceLock` sizes with."""
    return _budget


def configure(reservations_per_second: float | None = None) -> ReservationBudget:
    """The process's budget, changed to ``reservations_per_second`` if given.

    Blocks of the active sequences are sized so that together they make
    at most about this many reservations a second (default
    `DEFAULT_RESERVATIONS_PER_SECOND`). Higher: smaller blocks when many
    sequences are busy (fewer values skipped after a kill, processes
    sharing a sequence interleave in shorter runs), more round trips and
    more of the prefetch pool's time. It does not bind while active
    sequences are fewer than the budget times ``block_seconds``.
    """
    if reservations_per_second is not None:
        _budget.change(reservations_per_second)
    return _budget


def _after_fork_in_child() -> None:
    _budget.after_fork_in_child()


_hooks.on_fork(after_in_child=_after_fork_in_child)


class BlockSizer:
    """Sizes blocks to last ``block_seconds`` at the rate values were taken lately.

    The rate is measured between reservations: the previous block's count
    over the time since it was reserved. Sizes are whole multiples of
    ``floor`` (``batch_count``), never above ``ceiling`` (the largest
    multiple of ``floor`` not above it, when it is not one itself); with
    ``adaptive`` off (``batch=False``) the size stays where it started.
    From ``floor`` a size reaches the ceiling in a few reservations (16
    times per step: 100 to 2**24 in five). `fit_range` lowers the
    ceiling to 1/`RANGE_SHARE` of a short range.

    With a ``budget`` (the process's `ReservationBudget`), blocks last
    the budget's `ReservationBudget.seconds` whenever that is longer than
    ``block_seconds``: many active sequences then share the process's
    reservations instead of each making one every ``block_seconds``. The
    growth cap is stretched alike (16 times the stretch per step), so a
    sequence among thousands reaches its stretched size in as many
    reservations as a lone one reaches its own: at scale every ramp step
    costs a reservation per sequence, thousands in all, which is what the
    budget is there to avoid.

    While the budget stretches blocks by a factor F (its seconds over
    ``block_seconds``), the smallest size is ``floor`` times F, 16 times
    at most (one step of the ramp), and a sequence's first block is that
    size. Why not larger: with no rate known, a larger guess would be held,
    and skipped after a kill, by sequences that take a few values (a
    tenant's table among thousands, say). Why not ``floor``: at scale a
    block of ``floor`` lasts a few passes of a caller serving every
    sequence in turn, and its pace, read while the store is busy with
    everyone's first block, is far below the real one, so the next blocks
    are sized too small and the ramp costs more reservations. In one run
    each at 10,000 sequences on SQLite, 200 passes after the first value
    of each: blocks of 200 to 1,000 with a smallest size of ``floor`` (the
    next 3 s served 0.16 million values/s), 1,600 to 5,000 with this one
    (3.8 million values/s). A sequence that stays slow then holds up to 16
    times ``floor`` while the budget binds, and reserves less often.
    Sequences started together (``SequenceRegistry.warm``) are counted
    first (`starting`), so every one of them starts at that size, not only
    those sized after the budget had counted enough of the others.
    """

    __slots__ = (
        "_counted_before",
        "_counted_in",
        "_latest_at",
        "_latest_count",
        "_latest_served",
        "adaptive",
        "block_seconds",
        "budget",
        "ceiling",
        "floor",
        "limit",
        "rate",
        "size",
    )

    def __init__(
        self,
        floor: int,
        *,
        adaptive: bool,
        block_seconds: float,
        max_batch_count: int | None,
        budget: ReservationBudget | None = None,
    ) -> None:
        self.floor = floor
        self.budget = budget
        self._counted_in = 0  # the budget's period this sequence was last counted in
        self._counted_before = 0  # and the one before that
        self.adaptive = adaptive
        self.block_seconds = block_seconds
        self.limit = max(max_batch_count or DEFAULT_MAX_BATCH_COUNT, floor)  # as configured
        self.ceiling = self.limit  # the limit, or less on a short range (fit_range)
        self.size = floor if adaptive else 1
        self.rate: float | None = None  # values per second, once two reservations were seen
        self._latest_at: float | None = None
        self._latest_count = 0
        self._latest_served: int | None = None

    def fit_range(self, values: int) -> None:
        """Cap sizes at 1/RANGE_SHARE of a range of ``values`` values, never below ``floor``.

        Called with the stored row's range after each reservation, so a
        change of ``end`` (``autoseq set``, the admin) moves the cap too.
        """
        floor = self.floor
        share = values // RANGE_SHARE // floor * floor
        self.ceiling = min(self.limit, max(floor, share))
        if self.adaptive and self.size > self.ceiling:
            self.size = max(floor, self.ceiling // floor * floor)

    def serving(self, served: int, seconds: float) -> None:
        """Before a rate is measured, resize from ``served`` values of a block in ``seconds``.

        The rate is measured between reservations, so the second block is
        reserved before any is known and would stay at ``floor``: 100
        values at 10,000 a second last 10 ms, less than one round trip to a
        store that answers in 20 ms, and the switch from it waited on the
        store even with prefetching. The pace of the first block, read at
        its prefetch point, sizes the second one (16 times at most).
        """
        if self.rate is None and served > 0 and seconds > 0:
            self._adapt(served / seconds)

    def reservation(self, shortfall: int, buffer_for: int = 0) -> int:
        """Whole blocks covering ``shortfall``, and ``buffer_for`` values if more.

        A caller asking for bulk after bulk (``next_many(1000)`` in a loop,
        say) would otherwise empty every block it is given and wait on the
        store at each call; a buffer of two bulks (``buffer_for``) lets every
        other call be served from memory while the next reservation is in
        flight.

        A sequence's first block is ``floor``, or up to 16 times it while
        the budget stretches blocks (see the class docstring).
        """
        if self._latest_at is None and self.adaptive:
            self._start_larger()
        size = self.size
        want = max(shortfall, buffer_for)
        return max(size, -(-want // size) * size)

    def reserved(self, count: int, at: float, served: int | None = None) -> None:
        """Record a reservation of ``count`` values made at ``at``; resize.

        ``served``: the values the sequence had handed out by ``at``, in all.
        Given, the rate is what was served between two reservations over the
        time between them, whatever the blocks' sizes. Without it, the
        previous block's ``count`` stands for what was served, which holds
        only while sizes stay put: with prefetching at 10% of a block, the
        reservation after a block grown 16 times comes when about a sixth
        of that block's count has been served, and the rate read so is six
        times the real one (and a quarter of it after a shrink). Ten
        thousand sequences under the budget swung between the two, blocks
        of 16,100 to 429,800 values for one and the same rate, and made
        more reservations than the budget (350-394 in a 2 s window against
        its 200; issue 34).
        """
        self._count(at)
        previous = self._latest_at
        self._latest_at = at
        if served is not None:
            before = self._latest_served
            self._latest_served = served
            if previous is not None and before is not None and at > previous and served > before:
                self.rate = (served - before) / (at - previous)
                self._adapt(self.rate)
        elif previous is not None and at > previous and self._latest_count:
            self.rate = self._latest_count / (at - previous)
            self._adapt(self.rate)
        self._latest_count = count

    def starting(self, at: float) -> None:
        """Count the sequence as active at ``at``, before its first reservation.

        For many sequences started together (``SequenceRegistry.warm``):
        each counted before any first block is sized, every first block is
        sized with the budget knowing how many start, instead of the first
        ones at ``floor`` while the budget has yet to count the others. The
        reservation that follows in the same period is not counted again.
        """
        self._count(at)

    def _count(self, at: float) -> None:
        if self.budget is not None:
            period = self.budget.reserved(self._counted_in, at)
            if period != self._counted_in:
                self._counted_before, self._counted_in = self._counted_in, period

    def stopped(self) -> None:
        """The sequence is closed: the budget no longer counts it as active."""
        if self.budget is not None:
            self.budget.forget(self._counted_in, self._counted_before)
            self._counted_in = self._counted_before = 0

    def _start_larger(self) -> None:
        self.size = self._least()

    def _least(self) -> int:
        """The smallest size: ``floor``, times the budget's stretch (16 at most) when it binds."""
        floor = self.floor
        budget = self.budget
        if budget is None or budget.seconds <= self.block_seconds:
            return floor
        times = min(_GROW, int(budget.seconds / self.block_seconds))
        return max(floor, min(floor * times, self.ceiling // floor * floor))

    def _adapt(self, rate: float) -> None:
        if not self.adaptive:
            return
        size = self.size
        floor = self.floor
        seconds = self.block_seconds
        grow: float = _GROW
        budget = self.budget
        if budget is not None and budget.seconds > seconds:
            grow *= budget.seconds / seconds
            seconds = budget.seconds
        wanted = min(max(rate * seconds, size / _SHRINK), size * grow, self.ceiling)
        # Whole multiples of batch_count, as a fixed-size caller would get;
        # rounded up, except at a ceiling that is not one (rounded down).
        top = self.ceiling // floor * floor
        self.size = max(self._least(), min(-(-int(wanted) // floor) * floor, top))


class Backoff:
    """Exponential back-off after failed reservations, reset by a success.

    While `waiting` says so, a caller with nothing in hand fails fast
    with the last error rather than queueing on a store known to be down.
    """

    __slots__ = ("delay", "error", "initial", "maximum", "retry_at")

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial = initial
        self.maximum = maximum
        self.delay = 0.0
        self.retry_at = 0.0
        self.error: BaseException | None = None

    def failed(self, error: BaseException, now: float) -> None:
        """Record ``error``: wait ``initial``, then twice as long each time, up to ``maximum``."""
        self.error = error
        self.delay = min(self.maximum, self.delay * 2 if self.delay else self.initial)
        self.retry_at = now + self.delay

    def succeeded(self) -> None:
        """Forget the failures: the store answers again."""
        self.error = None
        self.delay = 0.0
        self.retry_at = 0.0

    def waiting(self, now: float) -> bool:
        """Whether the back-off after the latest failure is still running at ``now``."""
        return now < self.retry_at


class LowRemainingAlarm:
    """Fires once, when reservations pass ``warn_share`` of a non-cycling sequence's range."""

    __slots__ = ("fired", "warn_share")

    def __init__(self, warn_share: float) -> None:
        self.warn_share = warn_share
        self.fired = False

    def check(self, block: Block) -> tuple[float, int] | None:
        """(share of the range reserved, values left after ``block``) the first time it passes."""
        row = block.row
        if row.cycle or self.fired:
            return None
        span = row.last_value - row.start
        used = (block.last - row.start) / span if span else 1.0
        if used < self.warn_share:
            return None
        self.fired = True
        return used, (row.last_value - block.last) // row.step
