"""The registry that serves a Django model's sequences, and the locks it hands out.

A row written to database ``W`` takes its values from the ``sys_sequence`` of
``sequence_database(W)`` (see `autoseq_django.databases`: ``AUTOSEQ["DATABASE"]``,
else a router's ``db_for_write(SysSequence)``, else ``W`` itself, per database
like ``AutoField``). That database is reached through an
[`autoseq.stores.SQLStore`][autoseq.stores.sql.SQLStore] on its own SQLAlchemy engine, never through
Django's connection, so a rollback of the caller's transaction never undoes a
reservation (and on SQLite the table lives in the companion file
``<NAME>.autoseq``; an in-memory database gets a shared-cache in-memory store
named after it, which Django's connections attach).
The URL is built from the alias's settings when used, so test databases set
up by Django's runner or pytest-django are the ones reached.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from django.db import router

from autoseq import SequenceConfig, SequenceLock, SequenceNotFound, SequenceRegistry
from autoseq.lock import DEFAULT_CLOSE_TIMEOUT
from autoseq.registry import RegistryCache
from autoseq_django import columns, conf, databases

# Where sequences live is `autoseq_django.databases`; its names stay reachable here.
from autoseq_django.databases import database_url as database_url
from autoseq_django.databases import memory_companion_name as memory_companion_name
from autoseq_django.databases import memory_companion_url as memory_companion_url
from autoseq_django.databases import sequence_database as sequence_database
from autoseq_django.databases import sqlite_in_memory as sqlite_in_memory
from autoseq_django.databases import url_key as url_key
from autoseq_django.routers import SequenceRouter

if TYPE_CHECKING:
    from autoseq.stores.sql import SQLStore

_registries: RegistryCache[str] = RegistryCache()  # by the database's URL
# Private in-memory stores outlive their registries: the in-memory database
# they serve lives as long as the process, and so must the rows.
_memory_stores: dict[str, SQLStore] = {}
# lock() by (id of the config, write alias): (generation, config, registry,
# lock). Finding a lock the long way costs microseconds (the connection's
# settings, the URL, the registry), which save() would pay on every row.
_found: dict[tuple[int, str], tuple[int, SequenceConfig, SequenceRegistry, SequenceLock]] = {}
# Bumped whenever what lock() finds may change: a reset (settings changed)
# and a connection opened (a test run renames its database before reopening).
_generation = 0


def changed() -> None:
    """Forget the locks `lock` found: the settings or a connection changed."""
    global _generation
    _generation += 1
    _found.clear()


def generation() -> int:
    """Bumped by `reset` and `changed`: what was looked up before may be stale."""
    return _generation


def registry(alias: str) -> SequenceRegistry:
    """The registry of the ``sys_sequence`` in database ``alias`` (one per database)."""
    url = url_key(alias)
    return _registries.get(url, lambda: _new_registry(url))


def _new_registry(url: str) -> SequenceRegistry:
    from autoseq.stores import SQLStore

    settings = conf.get()
    sql_store = _memory_stores.get(url) or SQLStore(url)
    if sql_store.url.query.get("mode") == "memory" or sql_store.url.database in (
        None,
        "",
        ":memory:",
    ):
        _memory_stores[url] = sql_store
    return SequenceRegistry(
        sql_store,
        policy=settings.buffer,
        auto_create=settings.auto_create,
        defaults=settings.sequence_config,
    )


def store(alias: str) -> SQLStore:
    """The store of the ``sys_sequence`` in database ``alias``."""
    found = registry(alias).store
    assert hasattr(found, "engine"), "autoseq_django registries always hold an SQLStore"
    return found  # type: ignore[return-value]


def lock(config: SequenceConfig, write_alias: str, column: Any = None) -> SequenceLock:
    """The lock serving ``config`` for rows written to ``write_alias``.

    With ``AUTO_CREATE`` a missing row is created from ``config`` (past
    ``max()`` of the columns using it, ``column`` among them: the field
    asking, whose model a migration may have built); without it
    ``SequenceNotFound`` says how to create it.
    """
    key = (id(config), write_alias)
    hit = _found.get(key)
    if (
        hit is not None
        and hit[0] == _generation
        and hit[1] is config
        and hit[2].find(config.name) is hit[3]  # not discarded since (see forget)
    ):
        return hit[3]
    generation = _generation
    sequence_alias = sequence_database(write_alias)
    found = registry(sequence_alias)
    if found.auto_create:
        served = found.register(
            config,
            floor=lambda: columns.columns_floor(config.name, sequence_alias, column, write_alias),
        )
    else:
        served = _get(found, config.name)
    if _routing_is_fixed():
        _found[key] = (generation, config, found, served)
    return served


def _routing_is_fixed() -> bool:
    """Whether the routers' answer for ``SysSequence`` changes only with the settings.

    Ours follows ``AUTOSEQ["DATABASE"]``; a project's router may answer
    differently from one call to the next (per tenant, say), so with one,
    every insert asks again.
    """
    return all(type(candidate) is SequenceRouter for candidate in router.routers)


def _get(found: SequenceRegistry, name: str) -> SequenceLock:
    try:
        return found.get(name)
    except SequenceNotFound:
        raise SequenceNotFound(
            name,
            "create it with `manage.py autoseq create "
            f"{name}` or set AUTOSEQ['AUTO_CREATE'] = True",
        ) from None


def forget(alias: str, name: str) -> None:
    """Drop this process's buffered values of ``name`` (after ``current`` was moved)."""
    registry(alias).discard(name)
    for field in columns.users(name):
        # A forced move back makes values below the old ``current`` new
        # again: keys written there must be noted (see autoseq_django.catchup).
        field._known.clear()


def disconnect_servers() -> None:
    """Close the idle server connections of every store (they reopen when needed).

    Called when Django opens a connection without a database, as it does just
    before dropping a test database, which would fail while we hold sessions
    on it. SQLite is left alone: an in-memory store would lose its rows.
    """
    for found in _registries.registries():
        sql_store = found.store
        if getattr(sql_store, "dialect", "sqlite") != "sqlite":
            sql_store.engine.dispose()  # type: ignore[attr-defined]


def reset() -> None:
    """Close every registry (their unused tails go back) and forget cached URLs.

    Private in-memory stores stay open for the next registry: their rows are
    the only record of what the in-memory database's rows were given.
    """
    changed()
    registries = _registries.clear()
    databases.forget_urls()
    kept = set(map(id, _memory_stores.values()))
    # One deadline for them all: each registry's own would add up.
    deadline = time.monotonic() + DEFAULT_CLOSE_TIMEOUT
    for found in registries:
        left = max(0.0, deadline - time.monotonic())
        if id(found.store) not in kept:
            found.close(timeout=left)
            continue
        found.close_locks(timeout=left)
