"""Where a Django model's sequences live, and the registry that serves them.

A row written to database ``W`` takes its values from the ``sys_sequence`` of
``sequence_database(W)``: ``AUTOSEQ["DATABASE"]`` if set, else the alias a
router's ``db_for_write(SysSequence)`` names, else ``W`` itself (per database,
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

import importlib.util
import os
import time
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections, router

from autoseq import SequenceConfig, SequenceLock, SequenceNotFound, SequenceRegistry
from autoseq.lock import DEFAULT_CLOSE_TIMEOUT
from autoseq.registry import RegistryCache
from autoseq_django import conf

if TYPE_CHECKING:
    from sqlalchemy.engine.url import URL

    from autoseq.stores.sql import SQLStore

# Django-only connection options that mean nothing to a DBAPI driver.
_DJANGO_ONLY_OPTIONS = frozenset(
    {
        "isolation_level",
        "assume_role",
        "server_side_binding",
        "pool",
        "cursor_factory",
        "context",
        "init_command",
        "transaction_mode",
        "timeout",
    }
)

_registries: RegistryCache[str] = RegistryCache()  # by the database's URL
# Private in-memory stores outlive their registries: the in-memory database
# they serve lives as long as the process, and so must the rows.
_memory_stores: dict[str, SQLStore] = {}
_urls: dict[tuple[Any, ...], str] = {}
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


def sqlite_in_memory(name: object) -> bool:
    """True when a SQLite ``NAME`` is an in-memory database (tests, ``:memory:``)."""
    text = os.fspath(name) if isinstance(name, os.PathLike) else str(name or "")
    return text in ("", ":memory:") or "mode=memory" in text


def memory_companion_name(alias: str, name: object) -> str:
    """The shared-cache name of the in-memory store of an in-memory SQLite database.

    Named after the database (``file:memorydb_default?mode=memory&cache=shared``,
    Django's test database, gives ``memorydb_default.autoseq``) so that Django's
    connections can attach it (``autoseq_django.sqlite``); in-memory databases
    live in one process, and so does this name.
    """
    text = os.fspath(name) if isinstance(name, os.PathLike) else str(name or "")
    base = text[len("file:") :].split("?", 1)[0] if text.startswith("file:") else ""
    base = base.strip("/") or f"autoseq_memory_{alias}"
    return f"file:{base}.autoseq"


def memory_companion_url(alias: str, name: object) -> URL:
    """The SQLAlchemy URL of the in-memory store of in-memory database ``alias``."""
    from sqlalchemy.engine.url import URL

    return URL.create(
        "sqlite",
        database=memory_companion_name(alias, name),
        query={"mode": "memory", "cache": "shared", "uri": "true"},
    )


def database_url(alias: str) -> URL:
    """The SQLAlchemy URL of Django database ``alias`` (``AUTOSEQ["URLS"]`` wins)."""
    from sqlalchemy.engine.url import URL, make_url

    override = conf.get().urls.get(alias)
    if override:
        return make_url(override)
    connection = connections[alias]
    settings_dict = connection.settings_dict
    options = {
        key: str(value)
        for key, value in (settings_dict.get("OPTIONS") or {}).items()
        if key not in _DJANGO_ONLY_OPTIONS and isinstance(value, (str, int)) and value != ""
    }
    port = int(settings_dict["PORT"]) if settings_dict.get("PORT") else None
    common: dict[str, Any] = {
        "username": settings_dict.get("USER") or None,
        "password": settings_dict.get("PASSWORD") or None,
        "host": settings_dict.get("HOST") or None,
        "port": port,
    }
    vendor = connection.vendor
    if vendor == "sqlite":
        name = settings_dict.get("NAME")
        if sqlite_in_memory(name):
            return memory_companion_url(alias, name)
        path = os.fspath(name or "")
        if path.startswith("file:"):
            path = path[len("file:") :].split("?", 1)[0]
        return URL.create("sqlite", database=os.path.abspath(path))
    if vendor == "postgresql":
        driver = "psycopg" if importlib.util.find_spec("psycopg") else "psycopg2"
        return URL.create(
            f"postgresql+{driver}",
            database=settings_dict.get("NAME") or None,
            query=options,
            **common,
        )
    if vendor == "mysql":
        driver = "pymysql" if importlib.util.find_spec("pymysql") else "mysqldb"
        query = {key: options[key] for key in ("charset", "unix_socket") if key in options}
        query.setdefault("charset", "utf8mb4")
        if common["host"] and str(common["host"]).startswith("/"):
            query["unix_socket"] = str(common.pop("host"))
        return URL.create(
            f"mysql+{driver}", database=settings_dict.get("NAME") or None, query=query, **common
        )
    raise ImproperlyConfigured(
        f"autoseq_django cannot reach database {alias!r} (vendor {vendor!r}); it supports "
        "SQLite, PostgreSQL and MySQL/MariaDB. Set AUTOSEQ['URLS'] = "
        f"{{{alias!r}: '<SQLAlchemy URL>'}} to name the database yourself."
    )


def sequence_database(write_alias: str) -> str:
    """The alias whose ``sys_sequence`` serves rows written to ``write_alias``."""
    chosen = conf.get().database
    if chosen:
        return chosen
    from autoseq_django.models import SysSequence

    for candidate in router.routers:
        method = getattr(candidate, "db_for_write", None)
        if method is not None:
            alias = method(SysSequence)
            if alias:
                return str(alias)
    return write_alias


def _url_key(alias: str) -> str:
    settings_dict = connections[alias].settings_dict
    key = (
        alias,
        settings_dict.get("ENGINE"),
        str(settings_dict.get("NAME")),
        settings_dict.get("HOST"),
        settings_dict.get("PORT"),
        settings_dict.get("USER"),
        conf.get().urls.get(alias),
    )
    url = _urls.get(key)
    if url is None:
        url = database_url(alias).render_as_string(hide_password=False)
        _urls[key] = url
    return url


def generation() -> int:
    """Bumped by `reset` and `changed`: what was looked up before may be stale."""
    return _generation


def registry(alias: str) -> SequenceRegistry:
    """The registry of the ``sys_sequence`` in database ``alias`` (one per database)."""
    url = _url_key(alias)
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
            config, floor=lambda: _columns_floor(config.name, sequence_alias, column, write_alias)
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
    from autoseq_django.routers import SequenceRouter

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


def _columns_floor(
    name: str, sequence_alias: str, column: Any = None, write_alias: str = ""
) -> int | None:
    """``max()`` of every column using ``name`` in the databases sharing its store.

    ``column``: a field whose model no app registry lists (one a migration
    built, say a renamed model's many-to-many table) counts too.
    """
    from autoseq_django.maintenance import column_max, columns_of, users

    values = [c.value for c in columns_of(name, sequence_alias) if c.value is not None]
    if column is not None and column.model not in {field.model for field in users(name)}:
        top = column_max(column, write_alias)
        values += [] if top is None else [top]
    return max(values) if values else None


def forget(alias: str, name: str) -> None:
    """Drop this process's buffered values of ``name`` (after ``current`` was moved)."""
    registry(alias).discard(name)
    from autoseq_django.maintenance import users

    for field in users(name):
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
    _urls.clear()
    kept = set(map(id, _memory_stores.values()))
    # One deadline for them all: each registry's own would add up.
    deadline = time.monotonic() + DEFAULT_CLOSE_TIMEOUT
    for found in registries:
        left = max(0.0, deadline - time.monotonic())
        if id(found.store) not in kept:
            found.close(timeout=left)
            continue
        found.close_locks(timeout=left)
