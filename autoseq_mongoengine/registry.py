"""This process's stores and locks, one per connection alias and sequence.

A [`SequenceRegistry`][autoseq.registry.SequenceRegistry] on a
[`MongoStore`][autoseq.stores.mongo.MongoStore] per ``(db_alias, collection)`` shares
mongoengine's client for that alias and serves each sequence's values from
its [`SequenceLock`][autoseq.lock.SequenceLock]. When the alias is connected to a new
client (``disconnect()`` then ``connect()``), the next use builds a new store
on it.
"""

from __future__ import annotations

from collections.abc import Callable

from mongoengine.connection import get_db

from autoseq.config import SequenceConfig
from autoseq.lock import BufferPolicy, SequenceLock
from autoseq.registry import RegistryCache, SequenceRegistry
from autoseq.stores.mongo import MongoStore


class Sequences:
    """A `SequenceRegistry` per connection alias and collection."""

    def __init__(self) -> None:
        self._registries: RegistryCache[tuple[str, str]] = RegistryCache()

    def registry(self, alias: str, collection: str) -> SequenceRegistry:
        """The registry of ``collection`` on mongoengine's connection ``alias``."""
        database = get_db(alias)
        return self._registries.get(
            (alias, collection),
            lambda: SequenceRegistry(MongoStore(database, collection)),
            tag=database.client,
            # The alias was reconnected: the old client may be closed, so
            # the old blocks are dropped rather than handed back.
            on_stale=lambda old: old.close_locks(release=False),
        )

    def store(self, alias: str, collection: str) -> MongoStore:
        """The store of ``collection`` on mongoengine's connection ``alias``."""
        store = self.registry(alias, collection).store
        assert isinstance(store, MongoStore)
        return store

    def lock(
        self,
        alias: str,
        collection: str,
        config: SequenceConfig,
        policy: BufferPolicy | None,
        floor: Callable[[], int | None] | None = None,
    ) -> SequenceLock:
        """The lock serving ``config.name``, creating its row on first use (stored row wins).

        A row created here starts past ``floor()``, the largest value already
        stored in the documents (see ``SequenceRegistry.register``).
        """
        return self.registry(alias, collection).register(config, policy=policy, floor=floor)

    def peek(self, alias: str, collection: str, name: str) -> int | None:
        """The next value this process has buffered for ``name``, if any."""
        registry = self._registries.find((alias, collection))
        return registry.peek(name) if registry is not None else None

    def hand_back(self, alias: str, collection: str, name: str) -> None:
        """Close ``name``'s lock and hand its unused blocks back (compare-and-set).

        Waits for a prefetch in flight and cancels a queued one, so both the
        current and the prefetched block are known; they go back only when no
        one reserved after this process, else they stay gaps (safe).
        """
        registry = self._registries.find((alias, collection))
        if registry is not None:
            registry.discard(name, release=True)

    def forget(self, alias: str, collection: str, name: str) -> None:
        """Drop this process's buffered values of ``name`` (after its row was moved)."""
        registry = self._registries.find((alias, collection))
        if registry is not None:
            registry.discard(name)

    def close(self) -> None:
        """Close every lock (handing unused tails back) and every store."""
        self._registries.close_all()


sequences = Sequences()
