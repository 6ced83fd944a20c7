"""The store protocol and the reservation arithmetic every store shares."""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from autoseq import _hooks
from autoseq.config import MAX_VALUE, SequenceConfig, validate_name
from autoseq.errors import InvalidCount, InvalidSequenceConfig, SequenceExhausted


@dataclass(frozen=True, slots=True)
class Block:
    """Values ``first, first + step, ..., last`` reserved for one process.

    ``row`` is the stored row as the reservation left it (its ``version``
    is the one this reservation wrote); ``cycled`` says the reservation
    wrapped from ``end`` back to ``start``; ``failover`` says the store
    found itself talking to another primary than at its previous
    reservation, which may not know the blocks reserved before.
    """

    name: str
    first: int
    last: int
    step: int
    row: SequenceConfig
    cycled: bool = False
    failover: bool = False

    @property
    def count(self) -> int:
        """How many values the block holds."""
        return (self.last - self.first) // self.step + 1

    def values(self) -> range:
        """The block's values, in order."""
        return range(self.first, self.last + 1, self.step)

    @property
    def version(self) -> int:
        """The row version this reservation produced; a hand-back compares it."""
        return self.row.version


def check_count(count: object, what: str = "reserve") -> int:
    """Return ``count`` if it is an int from 1 to 2**63 - 1, else raise ``InvalidCount``.

    Every store calls it before touching the row, so a fractional, boolean or
    oversized count is refused as bad input, never half-applied nor reported
    as an outage.
    """
    if isinstance(count, bool) or not isinstance(count, int):
        raise InvalidCount(
            f"cannot {what} {count!r} values: the count must be an int, got {type(count).__name__}"
        )
    if not 1 <= count <= MAX_VALUE:
        raise InvalidCount(f"cannot {what} {count} values; ask for 1 to 2**63 - 1")
    return count


#: The most values one call hands back as a list (``next_many``, a gapless
#: take): a list of them costs about 36 bytes each, so larger bulks are
#: asked for in chunks.
MAX_MANY = 10_000_000


def check_many(count: object, what: str = "next_many") -> int:
    """Return ``count`` if it is an int from 0 to `MAX_MANY`, else raise ``InvalidCount``.

    For the calls that return their values as a list: checked before
    anything is written, so a count too large to hold in memory is refused
    as bad input instead of failing with ``MemoryError`` after a write.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise InvalidCount(f"{what} needs an int count of 0 or more, got {count!r}")
    if count > MAX_MANY:
        raise InvalidCount(
            f"{what}({count}) would build a list of {count:,} values; ask for at most "
            f"{MAX_MANY:,} per call (call it in chunks)"
        )
    return count


def plan_reservation(row: SequenceConfig, count: int) -> tuple[Block, int]:
    """Choose the next block of at most ``count`` values of ``row``.

    Returns the block and the new ``current`` to store. Pure arithmetic, so
    every store reserves exactly the same ranges; the store's job is only to
    apply it atomically (one transaction, a row lock or a compare-and-set).
    """
    check_count(count)
    first = row.next_value
    cycled = False
    if first > row.last_value:
        if not row.cycle:
            raise SequenceExhausted(row.name, first, row.end)
        first = row.start
        cycled = True
    last = min(first + (count - 1) * row.step, row.last_value)
    new_current = last + row.step
    after = row.with_current(new_current).replace_version(row.version + 1)
    block = Block(row.name, first, last, row.step, after, cycled)
    return block, new_current


@runtime_checkable
class SequenceStore(Protocol):
    """Where ``sys_sequence`` rows live; a store is one file of autoseq.

    Contract (`autoseq.testing.contract` checks it against every store):

    * ``reserve(name, count)`` atomically takes the next ``count`` values
      (fewer only at ``end``) in the store's own transaction, committed before
      it returns, and returns them as a [`Block`][autoseq.stores.base.Block]. Two reservations,
      from any thread, process or machine, never overlap. It raises
      ``SequenceNotFound``, ``SequenceExhausted`` (no ``cycle``),
      ``StoreUnavailable`` (driver errors, with the cause chained).
    * ``create(config)`` inserts the row unless one exists and returns the
      stored row: the existing row wins, so racing creators agree.
    * ``read(name)`` returns the row or ``None``; ``read_all()`` every row.
    * ``update(config)`` overwrites a row's settings (``SequenceNotFound``
      when missing); tests and first set-up only, maintenance uses
      ``compare_and_set``.
    * Every write bumps the row's ``version`` by one; a row stored before
      versions existed reads as version 0.
    * ``compare_and_set(row, version)`` writes every setting of ``row``
      (``start``, ``end``, ``step``, ``current``, ``batch``, ``batch_count``,
      ``cycle``) only if the stored row still has ``version``, and returns
      the stored row (at ``version + 1``), else ``None``. A client that
      re-sends the write after a lost reply finds another version and
      changes nothing. ``SequenceNotFound`` when the row is missing.
    * ``release(block)`` hands an unused block back: a compare-and-set of
      ``current = block.first`` at ``block.version``, so only when nobody
      wrote the row since that reservation; returns whether it did.
    * ``after_fork()`` drops connections inherited from a parent process;
      ``close()`` releases the store's resources.
    """

    def create(self, config: SequenceConfig) -> SequenceConfig: ...

    def read(self, name: str) -> SequenceConfig | None: ...

    def read_all(self) -> list[SequenceConfig]: ...

    def update(self, config: SequenceConfig) -> SequenceConfig: ...

    def reserve(self, name: str, count: int) -> Block: ...

    def release(self, block: Block) -> bool: ...

    def compare_and_set(self, row: SequenceConfig, version: int) -> SequenceConfig | None: ...

    def after_fork(self) -> None: ...

    def close(self) -> None: ...


def release_many(store: SequenceStore, blocks: list[Block]) -> list[bool]:
    """``store.release`` of each block, in one transaction where the store can.

    Each hand-back stays the compare-and-set of `SequenceStore.release`;
    a store without ``release_many`` (see
    `autoseq.stores.capabilities.ReleasesMany`) gets one call each.
    """
    from autoseq.stores.capabilities import ReleasesMany

    if isinstance(store, ReleasesMany):
        return store.release_many(blocks)
    return [store.release(block) for block in blocks]


def check_configs(configs: object, what: str = "create_many") -> list[SequenceConfig]:
    """``configs`` as a list if every item is a ``SequenceConfig``, else ``InvalidSequenceConfig``.

    Checked before a store writes anything, so a bad item leaves no row half-created.
    """
    if isinstance(configs, (str, bytes, SequenceConfig)) or not isinstance(configs, Iterable):
        raise InvalidSequenceConfig(
            f"{what} needs a list of SequenceConfig, got {type(configs).__name__} {configs!r}"
        )
    items = list(configs)
    for index, config in enumerate(items):
        if not isinstance(config, SequenceConfig):
            raise InvalidSequenceConfig(
                f"{what}: item {index} is {type(config).__name__} {config!r}, not a "
                "SequenceConfig; build each with SequenceConfig(name, ...). Nothing was created"
            )
    return items


def first_configs(configs: list[SequenceConfig]) -> dict[str, SequenceConfig]:
    """The first of ``configs`` of each name, in order: what ``create_many`` writes."""
    firsts: dict[str, SequenceConfig] = {}
    for config in configs:
        firsts.setdefault(config.name, config)
    return firsts


def create_many(store: SequenceStore, configs: list[SequenceConfig]) -> list[SequenceConfig]:
    """``store.create`` of each config, in one transaction where the store can.

    Returns the stored rows in order: an existing row wins (as in
    `SequenceStore.create`) and a name given twice gets the row of its
    first config. Every item is checked before anything is written; a store
    without ``create_many`` (see `autoseq.stores.capabilities.CreatesMany`)
    gets one ``create`` each.
    """
    from autoseq.stores.capabilities import CreatesMany

    items = check_configs(configs)
    if isinstance(store, CreatesMany):
        return store.create_many(items)
    return [store.create(config) for config in items]


def check_requests(requests: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    """``requests`` as a list of (name, count), each checked, before anything is written."""
    items = list(requests)
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise InvalidCount(f"reserve_many needs (name, count) pairs, got {item!r}")
        validate_name(item[0])
        check_count(item[1])
    return items


def reserve_many(store: SequenceStore, requests: list[tuple[str, int]]) -> list[Block | None]:
    """A block of each ``(name, count)``, in one round trip where the store can.

    Each is the reservation `SequenceStore.reserve` would make (committed
    before it returns, never overlapping another); None where the store
    reserved nothing for that row: a store without ``reserve_many`` (see
    `autoseq.stores.capabilities.ReservesMany`) answers None for all, and
    one that has it may answer None for a row it leaves to ``reserve``
    (missing, exhausted, cycling, near its end). The caller then reserves
    that one alone, where ``reserve`` raises what applies.
    """
    from autoseq.stores.capabilities import ReservesMany

    items = check_requests(requests)
    if not items:
        return []
    if isinstance(store, ReservesMany):
        return store.reserve_many(items)
    return [None] * len(items)


_forkable: weakref.WeakSet[SequenceStore] = weakref.WeakSet()


def reset_after_fork(store: SequenceStore) -> None:
    """Have ``store.after_fork()`` called in every child process forked from now on."""
    _forkable.add(store)


def _after_fork_in_child() -> None:
    for store in list(_forkable):
        store.after_fork()


_hooks.on_fork(after_in_child=_after_fork_in_child)
