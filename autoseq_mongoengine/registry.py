"""This process's stores and locks, one per connection alias and sequence.

A :class:`~autoseq.stores.MongoStore` per ``(db_alias, collection)`` shares
mongoengine's client for that alias, and a :class:`~autoseq.SequenceLock`
per sequence name serves the values. When the alias is connected to a new
client (``disconnect()`` then ``connect()``), the next use builds a new store
on it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from mongoengine.connection import get_db

from autoseq.config import SequenceConfig
from autoseq.lock import BufferPolicy, SequenceLock
from autoseq.stores.mongo import MongoStore


class _Entry:
    __slots__ = ("client", "locks", "store")

    def __init__(self, client: Any, store: MongoStore) -> None:
        self.client = client
        self.store = store
        self.locks: dict[str, SequenceLock] = {}


class Sequences:
    """Stores and locks of one process, keyed by alias, collection and name."""

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
                for lock in entry.locks.values():
                    lock.close(release=False)
            entry = _Entry(database.client, MongoStore(database, collection))
            self._entries[(alias, collection)] = entry
            return entry

    def store(self, alias: str, collection: str) -> MongoStore:
        """The store of ``collection`` on mongoengine's connection ``alias``."""
        return self._entry(alias, collection).store

    def lock(
        self, alias: str, collection: str, config: SequenceConfig, policy: BufferPolicy | None
    ) -> SequenceLock:
        """The lock serving ``config.name``, creating its row on first use (stored row wins)."""
        entry = self._entry(alias, collection)
        lock = entry.locks.get(config.name)
        if lock is not None:
            return lock
        row = entry.store.create(config)
        with self._guard:
            lock = entry.locks.get(config.name)
            if lock is None:
                lock = SequenceLock(
                    row.name,
                    entry.store,
                    batch=row.batch,
                    batch_count=row.batch_count,
                    policy=policy,
                )
                entry.locks[config.name] = lock
            return lock

    def peek(self, alias: str, collection: str, name: str) -> int | None:
        """The next value this process has buffered for ``name``, if any."""
        entry = self._entries.get((alias, collection))
        lock = entry.locks.get(name) if entry is not None else None
        if lock is None:
            return None
        return lock.peek()

    def forget(self, alias: str, collection: str, name: str) -> None:
        """Drop this process's buffered values of ``name`` (after its row was moved)."""
        with self._guard:
            entry = self._entries.get((alias, collection))
            lock = entry.locks.pop(name, None) if entry is not None else None
        if lock is not None:
            lock.close(release=False)

    def close(self) -> None:
        """Close every lock (handing unused tails back) and every store."""
        with self._guard:
            entries = list(self._entries.values())
            self._entries.clear()
        for entry in entries:
            for lock in entry.locks.values():
                lock.close()
            entry.store.close()

    def _after_fork_in_child(self) -> None:
        # A thread of the parent may have held the guard; the stores and
        # locks reset themselves through their own at-fork hooks.
        self._guard = threading.Lock()


sequences = Sequences()
os.register_at_fork(after_in_child=sequences._after_fork_in_child)
