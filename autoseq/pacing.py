"""How big the next block is and when to try the store again: pure policies, no threads.

Both take the time as an argument, so a test drives them with made-up
clocks. [`autoseq.lock.SequenceLock`][autoseq.lock.SequenceLock] calls them under its lock.
"""

from __future__ import annotations

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
    """

    __slots__ = (
        "_latest_at",
        "_latest_count",
        "adaptive",
        "block_seconds",
        "ceiling",
        "floor",
        "limit",
        "rate",
        "size",
    )

    def __init__(
        self, floor: int, *, adaptive: bool, block_seconds: float, max_batch_count: int | None
    ) -> None:
        self.floor = floor
        self.adaptive = adaptive
        self.block_seconds = block_seconds
        self.limit = max(max_batch_count or DEFAULT_MAX_BATCH_COUNT, floor)  # as configured
        self.ceiling = self.limit  # the limit, or less on a short range (fit_range)
        self.size = floor if adaptive else 1
        self.rate: float | None = None  # values per second, once two reservations were seen
        self._latest_at: float | None = None
        self._latest_count = 0

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
        """
        size = self.size
        want = max(shortfall, buffer_for)
        return max(size, -(-want // size) * size)

    def reserved(self, count: int, at: float) -> None:
        """Record a reservation of ``count`` values that started at ``at``; resize."""
        previous = self._latest_at
        self._latest_at = at
        if previous is not None and at > previous and self._latest_count:
            self.rate = self._latest_count / (at - previous)
            self._adapt(self.rate)
        self._latest_count = count

    def _adapt(self, rate: float) -> None:
        if not self.adaptive:
            return
        size = self.size
        floor = self.floor
        wanted = min(max(rate * self.block_seconds, size / _SHRINK), size * _GROW, self.ceiling)
        # Whole multiples of batch_count, as a fixed-size caller would get;
        # rounded up, except at a ceiling that is not one (rounded down).
        top = self.ceiling // floor * floor
        self.size = max(floor, min(-(-int(wanted) // floor) * floor, top))


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
