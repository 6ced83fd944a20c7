"""The values one process holds of one sequence: pure bookkeeping, no threads, no clock.

A `Buffer` is the current block (``next .. last`` by ``step``) and
the reserved blocks queued behind it. It hands out a ``range`` iterator
over the run that may be served without a lock (`Buffer.arm`) and
takes it back to count what is left (`Buffer.settle`, in constant
time whatever the block's size); the caller
([`autoseq.lock.SequenceLock`][autoseq.lock.SequenceLock]) holds the iterator, so the hot path
is one attribute and one C-level step. Every method expects its caller to
serialise calls (the sequence's lock); none blocks or reads the time.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Iterator
from typing import Protocol, cast

from autoseq.stores.base import Block

#: A run of values handed out: (first, last, step).
Run = tuple[int, int, int]


class _RangeIterator(Protocol):
    """What `cut` uses of a ``range`` iterator: its length hint and its pickle state."""

    def __length_hint__(self) -> int: ...

    def __setstate__(self, state: int, /) -> None: ...


def cut(fast: Iterator[int], length: int) -> int:
    """End ``fast``, an iterator over a ``range`` of ``length`` values, and say what it had left.

    Constant time, whatever the length: the length hint reads what is left
    and ``__setstate__`` (the pickle hook) moves the iterator to its end,
    a position past it being clipped to it (``length`` is the end in the
    absolute positions of Python 3.11 and at least what is left in the
    relative ones of later versions; ``sys.maxsize`` would fall short of a
    range longer than that, and overflow the iterator of a short one). Both
    run in one C-level call (``starmap`` over C functions: no bytecode, and
    no allocation that could start a collection, between them), so under
    the GIL no other thread takes a value between the count and the end.
    Walking the rest instead, as a drain would, cost a second per block of
    16 million values for every thread that met the slow path while a long
    run was armed.
    """
    ranged = cast(_RangeIterator, fast)
    left, _ = itertools.starmap(
        operator.call, ((ranged.__length_hint__,), (ranged.__setstate__, length))
    )
    return cast(int, left)


class Buffer:
    """Blocks in hand: take values in order, give a failed call's back, find the unused tail.

    ``prefetch_at``: share of a block served before `past_prefetch_point`
    says it is time to reserve the next one; ``None`` when nothing is
    prefetched (the fast path then runs to the end of every block).
    """

    __slots__ = (
        "_prefetch_at",
        "blocks",
        "fast_length",
        "fast_stop",
        "fast_until",
        "first",
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
        self.first = 1  # where the current block started
        self.fast_until = 0  # the last value the iterator may serve before the caller looks
        self.fast_stop: int | None = None  # one step past the armed iterator's last value
        self.fast_length = 0  # how many values the armed iterator started with
        # Reserved, not yet started: one or two blocks, so a list (an empty deque costs
        # 760 bytes a sequence, a list 56; 10,000 sequences hold one each).
        self.blocks: list[Block] = []
        self.latest: Block | None = None  # the latest reservation, whose row a tail goes back to

    # the lock-free run ------------------------------------------------------

    def arm(self) -> Iterator[int] | None:
        """An iterator over ``next .. fast_until`` (settled first), or None if that is empty."""
        if self.next > self.fast_until:
            return None
        self.fast_stop = self.fast_until + self.step
        # Not len(): a run past 2**63 values is still a range, not a C size.
        self.fast_length = (self.fast_until - self.next) // self.step + 1
        return iter(range(self.next, self.fast_stop, self.step))

    def settle(self, fast: Iterator[int]) -> None:
        """End ``fast``, the iterator `arm` returned, and make ``next`` exact.

        The caller swaps its reference to ``fast`` out first: a thread that
        loaded the iterator before the swap takes its value in order, before
        or after the `cut`, so what the cut counts is exactly the
        unserved suffix and no value is both served and counted as left.
        Constant time: many threads meeting the slow path of a block of
        millions each settle it in turn.
        """
        if self.fast_stop is None:
            return
        self.next = self.fast_stop - cut(fast, self.fast_length) * self.step
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

    def served(self) -> int:
        """Values of the current block served so far (settled)."""
        return (self.next - self.first) // self.step

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
        block = self.blocks.pop(0)
        self.next, self.last, self.step = block.first, block.last, block.step
        self.first = block.first
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
            self.blocks.insert(0, Block(name, self.next, self.last, self.step, row))
        for first, last, step in reversed(taken):
            self.blocks.insert(0, Block(name, first, last, step, row))
        self.next, self.last, self.fast_until, self.first = 1, 0, 0, 1

    def clear(self) -> None:
        """Forget every value in hand (settled)."""
        self.next, self.last, self.fast_until, self.first = 1, 0, 0, 1
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
