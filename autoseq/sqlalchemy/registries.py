"""Which registry serves a bind: ``install()``'s decisions and the default registries.

An `Installation` is what one ``install()`` call decided (store, auto-creation,
buffering); `class_installs`, `engine_installs` and `connection_installs` say
which installation covers a session class, an engine, a session's connection,
and `for_session` / `for_engine` pick the most specific. A sequence column's
lock comes from here (`lock`), with the floor a new row starts past
(`column_floor`), and under asyncio the round trip is awaited off the loop.
"""

from __future__ import annotations

import functools
import logging
import weakref
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool
from sqlalchemy.sql.schema import Column

from autoseq.errors import InvalidSequenceConfig, SequenceNotFound
from autoseq.lock import BufferPolicy, SequenceLock
from autoseq.registry import RegistryCache, SequenceRegistry
from autoseq.sqlalchemy import compat
from autoseq.sqlalchemy.specs import sequence_spec
from autoseq.stores.base import SequenceStore

log = logging.getLogger("autoseq")

_defaults: RegistryCache[tuple[str, BufferPolicy | None]] = RegistryCache()


def default_registry(
    bind: Engine | Connection, policy: BufferPolicy | None = None
) -> SequenceRegistry:
    """The registry on ``SQLStore(<bind's engine>)``: one per database URL, cached."""
    # The SQL store (and its dialects) loads only for the default store: an
    # application that installs another store never imports it.
    from autoseq.stores.sql import SQLStore

    engine = compat.engine_of(bind)
    key = (engine.url.render_as_string(hide_password=False), policy)
    return _defaults.get(key, lambda: SequenceRegistry(SQLStore(engine), policy=policy))


def close_registries() -> None:
    """Close every cached default registry (hands unused tails back); at shutdown, in tests."""
    _defaults.close_all()


class Installation:
    """What one ``install()`` call decided: which store, auto-creation, buffering."""

    def __init__(
        self,
        store: SequenceStore | None,
        registry: SequenceRegistry | None,
        auto_create: bool,
        policy: BufferPolicy | None,
    ) -> None:
        if store is not None and registry is not None:
            raise InvalidSequenceConfig(
                "install() takes store= or registry=, not both (a registry has its store)"
            )
        if registry is None and store is not None:
            registry = SequenceRegistry(store, policy=policy)
        self.registry = registry
        self.auto_create = auto_create
        self.policy = policy

    def registry_for(self, bind: Engine | Connection) -> SequenceRegistry:
        return self.registry or default_registry(bind, self.policy)

    def known_lock(self, bind: Engine | Connection, column: Column[Any]) -> SequenceLock | None:
        """``column``'s lock if it was already set up (no round trip); else None."""
        spec = sequence_spec(column)
        assert spec is not None
        return self.registry_for(bind).find(spec.config_for(column).name)

    def lock_for(self, bind: Engine | Connection, column: Column[Any]) -> SequenceLock:
        spec = sequence_spec(column)
        assert spec is not None
        config = spec.config_for(column)
        registry = self.registry_for(bind)
        floor = functools.partial(column_floor, compat.engine_of(bind), column, config.name)
        if self.auto_create and registry.auto_create:
            # the field's settings, not the registry's defaults
            return registry.register(config, floor=floor)
        try:
            return registry.get(config.name)  # reads first: no failed INSERT in server logs
        except SequenceNotFound:
            if not self.auto_create:
                raise SequenceNotFound(
                    config.name,
                    f"column {column.table.name}.{column.key} uses it and install() was "
                    f"called with auto_create=False; create it (`autoseq create {config.name}`)",
                ) from None
            return registry.register(config, floor=floor)


def column_floor(engine: Engine, column: Column[Any], name: str) -> int | None:
    """``max()`` over every column of ``column``'s metadata using sequence ``name``.

    Asked once, when the sequence's row is missing, on a connection of its
    own outside the application's pool (never the caller's transaction, and
    never waiting for a pooled connection the caller holds). A table not
    created yet counts as empty; a private in-memory SQLite database cannot
    be read from another connection and is skipped (its rows vanish with it).

    It reads the bind's database whatever store serves the sequence (a
    `MemoryStore` or a Redis store included), so it does not go through the
    store's `ReadsColumnMax` capability, which reads the store's own database.
    """
    from autoseq.stores.sql import sync_driver_url

    if engine.dialect.name == "sqlite" and (engine.url.database or ":memory:") == ":memory:":
        return None
    users = [
        candidate
        for table in (column.table.metadata.tables.values() if column.table is not None else [])
        for candidate in table.columns
        if (spec := sequence_spec(candidate)) is not None
        and spec.config_for(candidate).name == name
    ] or [column]
    top: int | None = None
    # The sync driver: an asyncio one (asyncpg) works only inside SQLAlchemy's
    # greenlet, and this may run in a worker thread off the event loop.
    reader = sa.create_engine(sync_driver_url(engine.url), poolclass=NullPool)
    try:
        with reader.connect() as connection:
            for user in users:
                try:
                    with connection.begin():
                        value = connection.execute(sa.select(sa.func.max(user))).scalar()
                except SQLAlchemyError:
                    continue  # its table does not exist (yet) in this database
                if value is not None and (top is None or int(value) > top):
                    top = int(value)
    except SQLAlchemyError as exc:
        log.warning("sequence %r: could not read max() of its columns (%s)", name, exc)
    finally:
        reader.dispose()
    return top


# which installation covers a session, a connection, an engine ------------------

#: Per ``Session`` class (or a sessionmaker's class), its installation.
class_installs: weakref.WeakKeyDictionary[type, Installation] = weakref.WeakKeyDictionary()
#: Per engine, its installation.
engine_installs: weakref.WeakKeyDictionary[Engine, Installation] = weakref.WeakKeyDictionary()
#: Per connection a covered session began on, the session's installation.
connection_installs: weakref.WeakKeyDictionary[Connection, Installation] = (
    weakref.WeakKeyDictionary()
)


def for_session(session: Session, engine: Engine) -> Installation | None:
    """The installation covering ``session`` on ``engine``: its class, the engine, ``Session``."""
    for cls in type(session).__mro__:
        if cls is Session:
            break
        installation = class_installs.get(cls)
        if installation is not None:
            return installation
    return engine_installs.get(engine) or class_installs.get(Session)


def for_engine(engine: Engine, connection: Connection | None) -> Installation | None:
    """The installation covering Core on ``connection``: its session's, else the engine's."""
    installation = connection_installs.get(connection) if connection is not None else None
    return installation or engine_installs.get(engine) or class_installs.get(Session)


# asyncio --------------------------------------------------------------------------
# Under AsyncSession / AsyncConnection, SQLAlchemy runs the listeners in a
# greenlet on the event loop's thread. A store round trip there would stall
# every task on the loop, so it is awaited in a worker thread instead
# (`compat.off_the_loop`). Values already in memory are served in place (the
# usual case: blocks are prefetched).


def lock(installation: Installation, bind: Engine | Connection, column: Any) -> SequenceLock:
    """The lock of sequence column ``column``, set up on first use."""
    # A lock set up already is one dict lookup away (every flush after the first).
    known = installation.known_lock(bind, column)
    if known is not None:
        return known
    if compat.in_greenlet():
        return compat.off_the_loop(installation.lock_for, bind, column)
    return installation.lock_for(bind, column)


def next_many(lock: SequenceLock, n: int) -> list[int]:
    """``lock.next_many(n)``, awaited off the loop under asyncio when it needs the store."""
    if compat.in_greenlet() and lock.available() < n:
        return compat.off_the_loop(lock.next_many, n)
    return lock.next_many(n)


__all__ = [
    "Installation",
    "class_installs",
    "close_registries",
    "column_floor",
    "connection_installs",
    "default_registry",
    "engine_installs",
    "for_engine",
    "for_session",
    "lock",
    "next_many",
]
