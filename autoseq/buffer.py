"""The values one process holds of one sequence: pure bookkeeping, no threads, no clock.

A :class:`Buffer` is the current block (``next .. last`` by ``step``) and
the reserved blocks queued behind it. It hands out a ``range`` iterator
over the run that may be served without a lock (:meth:`Buffer.arm`) and
takes it back to count what is left (:meth:`Buffer.settle`); the caller
(:class:`autoseq.lock.SequenceLock`) holds the iterator, so the hot path
is one attribute and one C-level step. Every method expects its caller to
serialise calls (the sequence's lock); none blocks or reads the time.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Iterable, Iterator

from autoseq.stores.base import Block

#: A run of values handed out: (first, last, step).
Run = tuple[int, int, int]


class Buffer:
    """Blocks in hand: take values in order, give a failed call's back, find the unused tail.

    ``prefetch_at``: share of a block served before :meth:`past_prefetch_point`
    says it is time to reserve the next one; ``None`` when nothing is
    prefetched (the fast path then runs to the end of every block).
    """

    __slots__ = (
        "_prefetch_at",
        "blocks",
        "fast_stop",
        "fast_until",
        "last",
        "latest",
        "next",
        "step",
    )

    def __init__(self, prefetch_at: float | None = None) -> None:
        self._prefetch_at = prefetch_at
        # While an armed iterator serves next..fast_until, ``next`` lags
        # behind it: settle() makes it exact again.
        self.next = 1
        self.last = 0
        self.step = 1
        self.fast_until = 0  # the last value the iterator may serve before the caller looks
        self.fast_stop: int | None = None  # one step past the armed iterator's last value
        self.blocks: deque[Block] = deque()  # reserved, not yet started
        self.latest: Block | None = None  # the latest reservation, whose row a tail goes back to

    # the lock-free run ------------------------------------------------------

    def arm(self) -> Iterator[int] | None:
        """An iterator over ``next .. fast_until`` (settled first), or None if that is empty."""
        if self.next > self.fast_until:
            return None
        self.fast_stop = self.fast_until + self.step
        return iter(range(self.next, self.fast_stop, self.step))

    def settle(self, fast: Iterator[int]) -> None:
        """Drain ``fast``, the iterator :meth:`arm` returned, and make ``next`` exact.

        The caller swaps its reference to ``fast`` out first: a thread that
        loaded the iterator before the swap takes its value in order, before
        or after this drain, so what the drain finds is exactly the unserved
        suffix and no value is both served and counted as left.
        """
        if self.fast_stop is None:
            return
        # deque(enumerate(...), maxlen=1) consumes the rest in one C call
        # (atomic under the GIL) and keeps only the count: no list of a
        # whole block. The last pair's index says how many were left.
        last = deque(enumerate(fast), maxlen=1)
        left = last[0][0] + 1 if last else 0
        self.next = self.fast_stop - left * self.step
        self.fast_stop = None

    def position(self, fast: Iterator[int]) -> int:
        """``next`` as the armed iterator has moved it (may lag a racing caller)."""
        if self.fast_stop is None:
            return self.next
        return self.fast_stop - operator.length_hint(fast) * self.step

    # what is in hand --------------------------------------------------------

    def current_left(self, position: int) -> int:
        """Values of the current block from ``position`` on."""
        return (self.last - position) // self.step + 1 if position <= self.last else 0

    def queued(self) -> int:
        """Values in the blocks queued behind the current one."""
        return sum(block.count for block in self.blocks)

    def peek(self, position: int) -> int | None:
        """The value served next, seen from ``position``; None if nothing is in hand."""
        if position <= self.last:
            return position
        if self.blocks:
            return self.blocks[0].first
        return None

    # serving (settled) ------------------------------------------------------

    def take(self, want: int) -> Run | None:
        """Up to ``want`` values from the current block, as a run; None if it is spent."""
        if self.next > self.last:
            return None
        have = (self.last - self.next) // self.step + 1
        stop = self.next + min(want, have) * self.step
        run = (self.next, stop - self.step, self.step)
        self.next = stop
        return run

    def start_next(self) -> bool:
        """Make the first queued block current; False if none is queued.

        With prefetching, the fast run stops at the prefetch point of the
        last block in hand, so the caller gets to look at reserving the next.
        """
        if not self.blocks:
            return False
        block = self.blocks.popleft()
        self.next, self.last, self.step = block.first, block.last, block.step
        if self._prefetch_at is not None and not self.blocks:
            used = max(1, int(block.count * self._prefetch_at))
            self.fast_until = min(block.last, block.first + (used - 1) * block.step)
        else:
            self.fast_until = block.last
        return True

    def past_prefetch_point(self) -> bool:
        """Whether the current block is used past its prefetch point and not spent."""
        return self.fast_until < self.next <= self.last

    def serve_to_end(self) -> None:
        """Let the fast run cover the current block to its end."""
        self.fast_until = self.last

    def look_again_soon(self) -> None:
        """After a failed prefetch: stop the fast run here so a later call tries again."""
        if self.next <= self.last:
            self.fast_until = self.next - self.step

    def add(self, block: Block) -> None:
        """Queue a reserved block behind the ones in hand."""
        self.blocks.append(block)

    def give_back(self, taken: Iterable[Run]) -> None:
        """Put runs a failed call took back in front, in order (settled).

        They were reserved for this process and nobody else can have them;
        dropping them would only leave a gap, so the next call serves them.
        """
        taken = list(taken)
        if not taken or self.latest is None:
            return
        row = self.latest.row
        name = self.latest.name
        if self.next <= self.last:
            self.blocks.appendleft(Block(name, self.next, self.last, self.step, row))
        for first, last, step in reversed(taken):
            self.blocks.appendleft(Block(name, first, last, step, row))
        self.next, self.last, self.fast_until = 1, 0, 0

    def clear(self) -> None:
        """Forget every value in hand (settled)."""
        self.next, self.last, self.fast_until = 1, 0, 0
        self.blocks.clear()

    def unused_tail(self) -> Block | None:
        """The unserved run that ends at the latest reservation, which may go back (settled).

        Unserved values, oldest first, are the rest of the current block and
        then the queued blocks; only a contiguous run ending where the latest
        reservation ends can be handed back by a compare-and-set.
        """
        latest = self.latest
        if latest is None:
            return None
        pieces: list[Run] = []
        if self.next <= self.last:
            pieces.append((self.next, self.last, self.step))
        pieces.extend((b.first, b.last, b.step) for b in self.blocks)
        if not pieces or pieces[-1][1] != latest.last:
            return None
        first = pieces[-1][0]
        for start, last, step in reversed(pieces[:-1]):
            if last + step != first:
                break
            first = start
        return Block(latest.name, first, latest.last, latest.step, latest.row)
