"""This process's stores and locks, one per connection alias and sequence.

A :class:`~autoseq.SequenceRegistry` on a
:class:`~autoseq.stores.MongoStore` per ``(db_alias, collection)`` shares
mongoengine's client for that alias and serves each sequence's values from
its :class:`~autoseq.SequenceLock`. When the alias is connected to a new
client (``disconnect()`` then ``connect()``), the next use builds a new store
on it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from mongoengine.connection import get_db

from autoseq.config import SequenceConfig
from autoseq.lock import BufferPolicy, SequenceLock
from autoseq.registry import SequenceRegistry
from autoseq.stores.mongo import MongoStore


class _Entry:
    __slots__ = ("client", "registry")

    def __init__(self, client: Any, registry: SequenceRegistry) -> None:
        self.client = client
        self.registry = registry


class Sequences:
    """A :class:`~autoseq.SequenceRegistry` per connection alias and collection."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._entries: dict[tuple[str, str], _Entry] = {}

    def _entry(self, alias: str, collection: str) -> _Entry:
        database = get_db(alias)
        entry = self._entries.get((alias, collection))
        if entry is not None and entry.client is database.client:
            return entry
        with self._guard:
            entry = self._entries.get((alias, collection))
            if entry is not None and entry.client is database.client:
                return entry
            if entry is not None:
                # The alias was reconnected: the old client may be closed,
                # so the old blocks are dropped rather than handed back.
                entry.registry.close_locks(release=False)
            entry = _Entry(database.client, SequenceRegistry(MongoStore(database, collection)))
            self._entries[(alias, collection)] = entry
            return entry

    def store(self, alias: str, collection: str) -> MongoStore:
        """The store of ``collection`` on mongoengine's connection ``alias``."""
        store = self._entry(alias, collection).registry.store
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
        return self._entry(alias, collection).registry.register(config, policy=policy, floor=floor)

    def peek(self, alias: str, collection: str, name: str) -> int | None:
        """The next value this process has buffered for ``name``, if any."""
        entry = self._entries.get((alias, collection))
        return entry.registry.peek(name) if entry is not None else None

    def forget(self, alias: str, collection: str, name: str) -> None:
        """Drop this process's buffered values of ``name`` (after its row was moved)."""
        entry = self._entries.get((alias, collection))
        if entry is not None:
            entry.registry.discard(name)

    def close(self) -> None:
        """Close every lock (handing unused tails back) and every store."""
        with self._guard:
            entries = list(self._entries.values())
            self._entries.clear()
        for entry in entries:
            entry.registry.close()

    def _after_fork_in_child(self) -> None:
        # A thread of the parent may have held the guard; the stores and
        # locks reset themselves through their own at-fork hooks.
        self._guard = threading.Lock()


sequences = Sequences()
os.register_at_fork(after_in_child=sequences._after_fork_in_child)
