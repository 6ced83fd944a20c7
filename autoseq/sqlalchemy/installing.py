"""``install()``: which sessions and engines get values for their generated columns.

An installation (`autoseq.sqlalchemy.registries.Installation`) is kept per
``Session`` class or sessionmaker, and per engine; the listeners
(`autoseq.sqlalchemy.listeners`) ask for the most specific one on every
insert. The asyncio counterparts (``AsyncSession``, ``async_sessionmaker``,
``async_scoped_session``, ``AsyncEngine``) stand for their sync side
(`sync_side`), where SQLAlchemy fires the events.
"""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from autoseq.errors import AutoseqError, InvalidSequenceConfig
from autoseq.lock import BufferPolicy
from autoseq.registry import SequenceRegistry
from autoseq.sqlalchemy.compat import engine_of
from autoseq.sqlalchemy.listeners import listen_once, watch_engine
from autoseq.sqlalchemy.registries import (
    Installation,
    class_installs,
    engine_installs,
    for_engine,
    for_session,
)
from autoseq.stores.base import SequenceStore


def install(
    target: Any,
    *,
    store: SequenceStore | None = None,
    registry: SequenceRegistry | None = None,
    auto_create: bool = True,
    policy: BufferPolicy | None = None,
) -> None:
    """Give every insert under ``target`` values for its sequence columns.

    ``target``: the ``Session`` class (every session, and Core on any engine),
    a ``Session`` subclass, a ``sessionmaker`` (its sessions, and its bound
    engine), a ``scoped_session``, or an ``Engine`` (Core on it, and sessions
    bound to it); or the asyncio counterparts ``AsyncSession``,
    ``async_sessionmaker``, ``async_scoped_session``, ``AsyncEngine``, which
    cover what their sync side does. With an async driver the store reserves
    through the matching sync driver (see `autoseq.stores.sql.store_url`).
    The most specific installation wins: session class or maker, then engine,
    then ``Session``. ``store`` / ``registry`` default to
    ``SQLStore`` on the bind's database; ``auto_create=False`` makes a missing
    ``sys_sequence`` row raise ``SequenceNotFound`` instead of creating it.
    Installing the same target again replaces its settings.
    """
    installation = Installation(store, registry, auto_create, policy)
    listen_once()
    target = sync_side(target)
    if store is None and registry is None:
        _check_bind_driver(target)
    if isinstance(target, scoped_session):
        target = target.session_factory
    if isinstance(target, sessionmaker):
        class_installs[target.class_] = installation
        bind = target.kw.get("bind")
        if isinstance(bind, (Engine, Connection)):
            engine = engine_of(bind)
            engine_installs.setdefault(engine, installation)
            watch_engine(engine)
    elif isinstance(target, type) and issubclass(target, Session):
        class_installs[target] = installation
    elif isinstance(target, (Engine, Connection)):
        engine = engine_of(target)
        engine_installs[engine] = installation
        watch_engine(engine)
    else:
        raise InvalidSequenceConfig(
            f"install() needs the Session class, a sessionmaker, a scoped_session or an "
            f"Engine (or their asyncio counterparts), got {type(target).__name__}"
        )


def uninstall(target: Any) -> None:
    """Undo ``install(target)`` (listeners stay, but no longer cover ``target``)."""
    target = sync_side(target)
    if isinstance(target, scoped_session):
        target = target.session_factory
    if isinstance(target, sessionmaker):
        installation = class_installs.pop(target.class_, None)
        bind = target.kw.get("bind")
        if isinstance(bind, (Engine, Connection)):
            engine = engine_of(bind)
            if installation is not None and engine_installs.get(engine) is installation:
                del engine_installs[engine]
    elif isinstance(target, type):
        class_installs.pop(target, None)
    else:
        engine_installs.pop(engine_of(target), None)


#: Per async_sessionmaker, the sessionmaker standing for it on the sync side.
_async_makers: weakref.WeakKeyDictionary[Any, sessionmaker[Session]] = weakref.WeakKeyDictionary()


def sync_side(target: Any) -> Any:
    """What an asyncio target stands for on the sync side, where SQLAlchemy fires events.

    An ``AsyncSession`` runs a sync ``Session`` (its ``sync_session_class``)
    and an ``AsyncEngine`` (``AsyncConnection``) a sync ``Engine``
    (``Connection``), so ``async_sessionmaker`` maps to a ``sessionmaker`` of
    that class on the sync bind, and so on. Other targets come back
    unchanged. Nothing asyncio is imported for them.
    """
    kind = type(target).__name__
    if kind == "async_scoped_session":
        target = target.session_factory
        kind = type(target).__name__
    if kind == "async_sessionmaker":
        bind = sync_side(target.kw.get("bind"))
        made = _async_makers.get(target)
        if made is None:
            base = target.kw.get("sync_session_class") or target.class_.sync_session_class
            made = sessionmaker(bind=bind, class_=base)
            # The maker's sessions run this very class from now on (sessionmaker
            # makes one of its own), so an installation on the maker covers them
            # and no other maker's: they would otherwise be plain Sessions.
            target.kw["sync_session_class"] = made.class_
            _async_makers[target] = made
        else:
            made.configure(bind=bind)
        return made
    sync_class = getattr(target, "sync_session_class", None) if isinstance(target, type) else None
    if isinstance(sync_class, type):
        return sync_class  # AsyncSession or a subclass
    for attribute in ("sync_session", "sync_connection", "sync_engine"):
        sync = getattr(target, attribute, None)  # AsyncSession, AsyncConnection, AsyncEngine
        if isinstance(sync, (Session, Connection, Engine)):
            return sync
    return target


def get_registry(target: Any) -> SequenceRegistry:
    """The registry that serves inserts under ``target`` (to read ``stats()``, count...).

    ``target``: a ``Session``, ``Engine`` or ``Connection``, or their asyncio
    counterparts.
    """
    target = sync_side(target)
    if isinstance(target, Session):
        engine = engine_of(target.get_bind())
        installation = for_session(target, engine)
    else:
        engine = engine_of(target)
        installation = for_engine(engine, None)
    if installation is None:
        raise AutoseqError(f"no install() covers {engine!r}; call autoseq.sqlalchemy.install()")
    return installation.registry_for(engine)


def _check_bind_driver(target: Any) -> None:
    """Fail now, naming the extra, when the default store could not load its driver."""
    from autoseq.stores.sql import check_driver

    if isinstance(target, scoped_session):
        target = target.session_factory
    bind = target.kw.get("bind") if isinstance(target, sessionmaker) else target
    if isinstance(bind, (Engine, Connection)):
        check_driver(engine_of(bind).url)


__all__ = ["get_registry", "install", "sync_side", "uninstall"]
