"""``SequenceRegistry``: the named sequences of one store, one lock each."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterable
from operator import itemgetter
from typing import Any, Generic, TypeVar

from autoseq import _hooks
from autoseq.config import (
    SequenceConfig,
    config_from_values,
    configs_from_values,
    plainly_valid,
    validate_name,
)
from autoseq.errors import GaplessUnavailable, SequenceNotFound
from autoseq.lock import DEFAULT_CLOSE_TIMEOUT, BufferPolicy, SequenceLock, close_locks
from autoseq.stores.base import (
    Block,
    SequenceStore,
    check_configs,
    create_many,
    release_many,
    reserve_many,
)
from autoseq.stores.capabilities import ReadsRowValues


def opening_row(config: SequenceConfig, floor: int | None) -> SequenceConfig:
    """``config`` moved past ``floor`` (the largest key in use), for a row about to be created."""
    if floor is None or floor < config.next_value:
        return config
    # Keys past ``end`` leave the row exhausted: reservations then say so.
    return config.with_current(
        min(config.first_value_after(floor), config.last_value + config.step)
    )


#: Sequences `SequenceRegistry.warm` reserves for in one ``reserve_many`` call: few
#: round trips for ten thousand, and little memory held at once while they come back.
WARM_CHUNK = 1000


def _config(row: SequenceConfig | tuple[Any, ...]) -> SequenceConfig:
    """A row `SequenceRegistry.load` kept: built now from its checked tuple if need be."""
    return row if isinstance(row, SequenceConfig) else config_from_values(row)


def _gapless_refused(config: SequenceConfig) -> GaplessUnavailable:
    return GaplessUnavailable(
        f"sequence {config.name!r} is gapless: its values are taken one by one in "
        "the caller's transaction (Serial(..., gapless=True).next(connection), "
        "autoseq.gapless.take, or a gapless field), never served from a block by "
        "a SequenceLock, which would leave gaps"
    )


class SequenceRegistry:
    """Hands out a [`SequenceLock`][autoseq.lock.SequenceLock] per sequence name of ``store``.

    ``auto_create`` decides what ``get()`` does with a name that has no row:
    ``True`` creates it from ``defaults(name)`` (``SequenceConfig(name)``
    unless given), ``False`` raises ``SequenceNotFound``.
    """

    def __init__(
        self,
        store: SequenceStore,
        *,
        policy: BufferPolicy | None = None,
        auto_create: bool = False,
        defaults: Callable[[str], SequenceConfig] | None = None,
    ) -> None:
        self.store = store
        self.policy = policy or BufferPolicy()
        self.auto_create = auto_create
        self.defaults = defaults or SequenceConfig
        self._locks: dict[str, SequenceLock] = {}
        # Rows read by load() or created by register_many() whose lock is
        # built on first use (issue 34): ten thousand rows load without ten
        # thousand locks. A row is a SequenceConfig or, from load(), the
        # checked tuple it is built from on first use (`_config`).
        self._loaded: dict[str, SequenceConfig | tuple[Any, ...]] = {}
        self._guard = threading.Lock()

    def _lock_for(self, row: SequenceConfig, policy: BufferPolicy | None) -> SequenceLock:
        with self._guard:
            lock = self._locks.get(row.name)
            if lock is None:
                lock = SequenceLock(
                    row.name,
                    self.store,
                    batch=row.batch,
                    batch_count=row.batch_count,
                    policy=policy or self.policy,
                )
                lock.fit_range(row.range_size)
                self._locks[row.name] = lock
            self._loaded.pop(row.name, None)
            return lock

    def _known(self, name: str) -> SequenceLock | None:
        """The lock of ``name`` if it has one or `load()` read its row; no store read."""
        lock = self._locks.get(name)
        if lock is not None:
            return lock
        row = self._loaded.get(name)
        return None if row is None else self._lock_for(_config(row), None)

    def load(self) -> list[str]:
        """Read every row (app start-up); returns the names.

        Each row is validated now (a bad row raises its ``InvalidStoredRow``,
        naming it and the fix); its lock is built on first use (``get``,
        ``next``, ``find``...), from the row read here, without another read.
        On a store that reads rows as plain tuples (SQL), they are checked
        column by column and each ``SequenceConfig`` is built on first use:
        about the cost of the SELECT itself (issue 34).
        """
        store = self.store
        rows: list[Any]
        if isinstance(store, ReadsRowValues):
            rows = store.read_all_values()
            if plainly_valid(rows):
                names = list(map(itemgetter(0), rows))
            else:  # row by row: builds each, or raises for the first bad one
                rows = configs_from_values(rows)
                names = [row.name for row in rows]
        else:
            rows = store.read_all()
            names = [row.name for row in rows]
        with self._guard:
            locks = self._locks
            if locks:
                self._loaded.update(
                    (name, row) for name, row in zip(names, rows, strict=True) if name not in locks
                )
            else:
                self._loaded.update(zip(names, rows, strict=True))
        return names

    def register_many(self, configs: Iterable[SequenceConfig]) -> list[SequenceConfig]:
        """Create every row that does not exist, in one transaction where the store can.

        Returns the stored row of each config, in order: as with `register`,
        an existing row wins (it is returned, untouched) and a name given
        twice gets the row of its first config. Every config is checked
        before anything is written (a gapless one, or an item that is not a
        ``SequenceConfig``, raises and creates nothing); on a store with
        ``create_many`` (see `autoseq.stores.capabilities.CreatesMany`) the
        rows go in one transaction, else one ``create`` each. A lock is built
        on first use, with the registry's policy, as after `load`; a name
        that already has a lock keeps it. ``register(config, floor=...)`` is
        the way to create a row past the keys already in a table.
        """
        items = check_configs(configs, "register_many")
        for config in items:
            if config.gapless:
                raise _gapless_refused(config)
        rows = create_many(self.store, items)
        with self._guard:
            locks = self._locks
            self._loaded.update((row.name, row) for row in rows if row.name not in locks)
        return rows

    def warm(self, names: Iterable[str] | None = None) -> int:
        """Reserve the first block of many sequences in one round trip; returns how many.

        For start-up, after `load` or `register_many` (``names``: every
        sequence of the registry when None): each lock of ``names`` that has
        reserved nothing yet gets the block its first ``next()`` would have
        reserved, so first values come from memory instead of one round
        trip each (one ``reserve_many`` per `WARM_CHUNK` sequences). Each
        reservation is the store's compare-and-set, as ``reserve`` makes it
        (see `autoseq.stores.base.reserve_many`); a sequence the store leaves
        out (missing, exhausted, cycling, near its end, or a store without
        ``reserve_many``) reserves on first use as before. A block a lock no
        longer wants (it reserved meanwhile) is handed back. Raises
        ``StoreUnavailable`` if the store fails before any block came back.

        The process's reservation budget (`autoseq.pacing`) counts every
        sequence warmed as active before any first block is sized: with
        more than the budget times ``block_seconds`` of them (200 at the
        defaults), each first block is ``batch_count`` times their number
        over 200, at most 16 times (1,600 from 3,200 sequences on), never
        above ``max_batch_count`` nor 1/`autoseq.pacing.RANGE_SHARE` of a
        short range: the size a sequence started among as many active ones
        takes on first use. Fewer, and a lone sequence, start at
        ``batch_count``.
        """
        locks: dict[str, SequenceLock] = {}
        for name in self.names() if names is None else names:
            if name not in locks:
                locks[name] = self.get(name)
        # Every lock counted in the budget before any first block is sized: each is then
        # sized for all the sequences starting, not for those counted before it.
        starting = [lock for lock in locks.values() if lock.count_as_starting()]
        chosen = [(lock, count) for lock in starting if (count := lock.first_block_wanted())]
        warmed = 0
        for at in range(0, len(chosen), WARM_CHUNK):
            warmed += self._warm_chunk(chosen[at : at + WARM_CHUNK])
        return warmed

    def _warm_chunk(self, chosen: list[tuple[SequenceLock, int]]) -> int:
        """One ``reserve_many`` for ``chosen`` (lock, count) pairs; how many locks took theirs."""
        started = time.monotonic()
        blocks = reserve_many(self.store, [(lock.name, count) for lock, count in chosen])
        latency = time.monotonic() - started
        warmed = 0
        unused: list[Block] = []
        for (lock, _), block in zip(chosen, blocks, strict=True):
            if block is None:
                continue
            if lock.adopt(block, latency=latency, started=started):
                warmed += 1
            else:
                unused.append(block)
        if unused:
            release_many(self.store, unused)
        return warmed

    def register(
        self,
        config: SequenceConfig,
        *,
        policy: BufferPolicy | None = None,
        floor: Callable[[], int | None] | None = None,
    ) -> SequenceLock:
        """Create the row unless it exists (the stored row wins) and return its lock.

        ``floor`` returns the largest key already stored in the columns or
        fields that use the sequence (``max()``, None when empty). It is
        asked only when the row is missing, and a row created then starts
        past it: a table that has rows, a dropped ``sys_sequence`` or a lost
        SQLite companion never restart the sequence under existing keys.
        """
        if config.gapless:
            raise _gapless_refused(config)
        lock = self._known(config.name)
        if lock is not None:
            return lock
        if floor is None:
            return self._lock_for(self.store.create(config), policy)
        row = self.store.read(config.name)
        if row is None:
            row = self.store.create(opening_row(config, floor()))
        return self._lock_for(row, policy)

    def get(self, name: str) -> SequenceLock:
        """The lock of sequence ``name``, loading (or creating) its row on first use."""
        # a non-str name (an unhashable dict, say) goes to validate_name's message
        lock = self._known(name) if isinstance(name, str) else None
        if lock is not None:
            return lock
        validate_name(name)
        row = self.store.read(name)
        if row is None:
            if not self.auto_create:
                raise SequenceNotFound(name)
            row = self.store.create(self.defaults(name))
        return self._lock_for(row, None)

    def next(self, name: str) -> int:
        """The next value of sequence ``name``."""
        lock = self._locks.get(name) if isinstance(name, str) else None
        return (lock or self.get(name)).next()

    def next_many(self, name: str, n: int) -> list[int]:
        """``n`` values of sequence ``name`` (about n / block reservations)."""
        lock = self._locks.get(name) if isinstance(name, str) else None
        return (lock or self.get(name)).next_many(n)

    def find(self, name: str) -> SequenceLock | None:
        """The lock of ``name`` if this registry has one; never reads the store."""
        return self._known(name) if isinstance(name, str) else None

    def peek(self, name: str) -> int | None:
        """The value ``name``'s lock would serve next from memory; None if none or no lock.

        Never reads the store nor creates a lock: see
        [`SequenceLock.peek`][autoseq.lock.SequenceLock.peek].
        """
        lock = self._locks.get(name) if isinstance(name, str) else None
        return lock.peek() if lock is not None else None

    def names(self) -> list[str]:
        """Names with a lock in this registry, or a row read by `load()`."""
        with self._guard:
            return sorted(self._locks.keys() | self._loaded.keys())

    def stats(self) -> dict[str, dict[str, object]]:
        """``stats()`` of every lock, by name."""
        for row in list(self._loaded.values()):
            self._lock_for(_config(row), None)
        with self._guard:
            locks = list(self._locks.values())
        return {lock.name: lock.stats() for lock in locks}

    def discard(self, name: str, *, release: bool = False) -> bool:
        """Close and forget ``name``'s lock, so the next use reads its row again.

        For after ``current`` was moved by hand: the buffered values predate
        the move. ``release=False`` (the default) keeps them away from the
        store, since handing them back could undo the move. True if there
        was a lock.
        """
        with self._guard:
            lock = self._locks.pop(name, None)
            loaded = self._loaded.pop(name, None)
        if lock is not None:
            lock.close(release=release)
        return lock is not None or loaded is not None

    def close_locks(
        self, *, release: bool = True, timeout: float = DEFAULT_CLOSE_TIMEOUT
    ) -> list[tuple[str, Block]]:
        """Close every lock (handing unused tails back) and keep the store open.

        Takes at most ``timeout`` seconds whatever the number of locks; with
        the store down, the tails not handed back are logged in one line,
        left as gaps (safe) and returned as (name, tail) pairs.
        """
        with self._guard:
            locks = list(self._locks.values())
            self._locks.clear()
            self._loaded.clear()  # no lock, so nothing reserved: nothing to hand back
        return close_locks(locks, release=release, timeout=timeout)

    def close(
        self, *, release: bool = True, timeout: float = DEFAULT_CLOSE_TIMEOUT
    ) -> list[tuple[str, Block]]:
        """Close every lock within ``timeout`` seconds (see `close_locks`), then the store."""
        left = self.close_locks(release=release, timeout=timeout)
        self.store.close()
        return left


K = TypeVar("K", bound=Hashable)


class RegistryCache(Generic[K]):
    """This process's registries by a key (a URL, an alias), each built once on first use.

    What an integration keeps: ``get(key, build)`` returns the registry of
    ``key``, calling ``build()`` (under the cache's lock, so once) when there
    is none. A ``tag`` is what the registry was built on (a client): a
    registry cached with another tag is stale, handed to ``on_stale`` and
    built again. After ``fork()`` a child gets a new lock (the registries'
    locks and stores reset themselves).
    """

    def __init__(self) -> None:
        self._entries: dict[K, tuple[object, SequenceRegistry]] = {}
        self._guard = threading.Lock()
        _caches.add(self)

    def get(
        self,
        key: K,
        build: Callable[[], SequenceRegistry],
        *,
        tag: object = None,
        on_stale: Callable[[SequenceRegistry], object] | None = None,
    ) -> SequenceRegistry:
        """The registry of ``key``, built by ``build()`` if missing or stale."""
        entry = self._entries.get(key)
        if entry is not None and entry[0] is tag:
            return entry[1]
        with self._guard:
            entry = self._entries.get(key)
            if entry is not None and entry[0] is tag:
                return entry[1]
            if entry is not None and on_stale is not None:
                on_stale(entry[1])
            registry = build()
            self._entries[key] = (tag, registry)
            return registry

    def find(self, key: K) -> SequenceRegistry | None:
        """The registry of ``key`` if one was built (stale or not), else None."""
        entry = self._entries.get(key)
        return None if entry is None else entry[1]

    def registries(self) -> list[SequenceRegistry]:
        """Every registry cached now."""
        with self._guard:
            return [registry for _, registry in self._entries.values()]

    def clear(self) -> list[SequenceRegistry]:
        """Forget every registry and return them, unclosed (the caller decides how)."""
        with self._guard:
            registries = [registry for _, registry in self._entries.values()]
            self._entries.clear()
        return registries

    def close_all(self, *, timeout: float = DEFAULT_CLOSE_TIMEOUT) -> None:
        """Forget and close every registry: unused tails go back, stores close.

        Within ``timeout`` seconds in all, however many registries there are.
        """
        deadline = time.monotonic() + timeout
        for registry in self.clear():
            registry.close(timeout=max(0.0, deadline - time.monotonic()))

    def _after_fork_in_child(self) -> None:
        # A thread of the parent may have held the lock at fork.
        self._guard = threading.Lock()


_caches: weakref.WeakSet[RegistryCache[Any]] = weakref.WeakSet()


def _new_cache_locks_in_child() -> None:
    for cache in list(_caches):
        cache._after_fork_in_child()


_hooks.on_fork(after_in_child=_new_cache_locks_in_child)
