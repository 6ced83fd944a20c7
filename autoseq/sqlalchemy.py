"""SQLAlchemy integration: ``SequenceField`` columns and ``install()``.

Declare the column, call ``install()`` once, and every insert path gets the
next values of the column's sequence. Where SQLAlchemy 2.x routes each path:

* ``session.add()`` / ``add_all()`` + flush: a ``before_flush`` listener sets
  the attribute of every pending object that has none, taking one
  ``next_many`` per sequence per flush, so the ORM inserts known keys.
* ORM bulk ``session.execute(insert(Order), [dicts])`` (and any statement run
  through a session): ``do_orm_execute`` adds the missing keys to the
  parameter dicts before the ORM sees them.
* Core ``conn.execute(insert(table), [dicts])``: an engine ``before_execute``
  listener (``retval=True``) fills the parameter dicts, one ``next_many`` per
  sequence per statement.
* Anything else that reaches Core without a value (``insert().values(...)``,
  multi-row VALUES, legacy bulk methods, a connection opened before the engine
  was watched): the column's own Python default takes ``next()`` per row.

A value the user gave (not ``None``) is always kept. The default store is a
:class:`~autoseq.stores.SQLStore` on the bind's own database (one registry per
URL, cached); it commits each block in its own transaction, so a rollback of
the caller's transaction never hands a value out again.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine, Result
from sqlalchemy.engine.default import DefaultExecutionContext
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import (
    MappedColumn,
    Mapper,
    ORMExecuteState,
    Session,
    UOWTransaction,
    mapped_column,
    scoped_session,
    sessionmaker,
)
from sqlalchemy.orm.attributes import instance_state
from sqlalchemy.pool import NullPool
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.schema import Column
from sqlalchemy.util.concurrency import await_only, in_greenlet

from autoseq.config import MAX_VALUE, SequenceConfig, validate_name
from autoseq.errors import AutoseqError, InvalidSequenceConfig, SequenceNotFound
from autoseq.lock import BufferPolicy, SequenceLock
from autoseq.registry import SequenceRegistry
from autoseq.stores.base import SequenceStore

_T = TypeVar("_T")

log = logging.getLogger("autoseq")

#: Key in ``Column.info`` under which a column's sequence settings travel.
INFO_KEY = "autoseq"

_RESERVED_KWARGS = (
    "default",
    "default_factory",
    "insert_default",
    "server_default",
    "autoincrement",
)


@dataclass(frozen=True, slots=True)
class SequenceSpec:
    """The sequence settings a column carries in ``Column.info[INFO_KEY]``.

    ``sequence=None`` names the sequence after the column's table, resolved
    per column, so a mixin's column serves each table from its own sequence.
    """

    sequence: str | None = None
    start: int = 1
    end: int = MAX_VALUE
    step: int = 1
    batch: bool = True
    batch_count: int = 100
    cycle: bool = False

    def __post_init__(self) -> None:
        if self.sequence is not None:
            validate_name(self.sequence)
        self._config("placeholder")  # refuse bad settings at declaration time

    def _config(self, name: str) -> SequenceConfig:
        return SequenceConfig(
            name,
            start=self.start,
            end=self.end,
            step=self.step,
            batch=self.batch,
            batch_count=self.batch_count,
            cycle=self.cycle,
        )

    def config_for(self, column: Column[Any]) -> SequenceConfig:
        """The ``sys_sequence`` row this column's values come from."""
        if self.sequence is not None:
            return self._config(self.sequence)
        table = getattr(column, "table", None)
        if table is None:
            raise InvalidSequenceConfig(
                f"column {column.key!r} is not attached to a table, so its sequence "
                "cannot default to the table name; pass sequence='name'"
            )
        return self._config(str(table.name))


def SequenceField(
    sequence: str | None = None,
    *,
    start: int = 1,
    end: int = MAX_VALUE,
    step: int = 1,
    batch: bool = True,
    batch_count: int = 100,
    cycle: bool = False,
    gapless: bool = False,
    **mapped_column_kwargs: Any,
) -> MappedColumn[Any]:
    """A ``BigInteger`` mapped column filled from sequence ``sequence`` (default: the table).

    The remaining keyword arguments go to ``mapped_column`` (``primary_key``,
    ``unique``, ``index``, ``nullable``...). The column gets no database-side
    autoincrement: values always come from the sequence or from the user.
    ``gapless=True`` takes each value in the caller's transaction instead of
    from a block (docs/serials.md); it takes ``start`` and ``step`` only.
    """
    if gapless:
        if end != MAX_VALUE or cycle:
            raise InvalidSequenceConfig(
                "SequenceField(gapless=True) takes start and step only: end and cycle "
                "are not supported for gapless sequences"
            )
        from autoseq.serial_sqlalchemy import gapless_sequence_field

        return gapless_sequence_field(sequence, start=start, step=step, **mapped_column_kwargs)
    spec = SequenceSpec(sequence, start, end, step, batch, batch_count, cycle)
    return mapped_column(sa.BigInteger, **_column_kwargs(spec, mapped_column_kwargs))


def sequence_column(
    name: str,
    sequence: str | None = None,
    *,
    start: int = 1,
    end: int = MAX_VALUE,
    step: int = 1,
    batch: bool = True,
    batch_count: int = 100,
    cycle: bool = False,
    **column_kwargs: Any,
) -> Column[int]:
    """The Core counterpart of ``SequenceField``: ``Table("orders", md, sequence_column("id"))``."""
    spec = SequenceSpec(sequence, start, end, step, batch, batch_count, cycle)
    return Column(name, sa.BigInteger, **_column_kwargs(spec, column_kwargs))


def _column_kwargs(spec: SequenceSpec, kwargs: dict[str, Any]) -> dict[str, Any]:
    clash = [key for key in _RESERVED_KWARGS if key in kwargs]
    if clash:
        raise InvalidSequenceConfig(
            f"a sequence column sets {', '.join(clash)} itself (values come from the "
            "sequence); remove the argument (with MappedAsDataclass, pass init=False)"
        )
    kwargs = dict(kwargs)
    kwargs["info"] = {**kwargs.get("info", {}), INFO_KEY: spec}
    kwargs.setdefault("nullable", False)
    kwargs["autoincrement"] = False
    kwargs["insert_default"] = _column_default
    return kwargs


def sequence_spec(column: Any) -> SequenceSpec | None:
    """The ``SequenceSpec`` a column carries, or ``None`` for an ordinary column."""
    info = getattr(column, "info", None)
    spec = info.get(INFO_KEY) if info else None
    return spec if isinstance(spec, SequenceSpec) else None


# registries -----------------------------------------------------------------

_defaults: dict[tuple[str, BufferPolicy | None], SequenceRegistry] = {}
_defaults_guard = threading.Lock()


def default_registry(
    bind: Engine | Connection, policy: BufferPolicy | None = None
) -> SequenceRegistry:
    """The registry on ``SQLStore(<bind's engine>)``: one per database URL, cached."""
    from autoseq.stores.sql import SQLStore

    engine = _engine_of(bind)
    key = (engine.url.render_as_string(hide_password=False), policy)
    registry = _defaults.get(key)
    if registry is not None:
        return registry
    with _defaults_guard:
        registry = _defaults.get(key)
        if registry is None:
            registry = SequenceRegistry(SQLStore(engine), policy=policy)
            _defaults[key] = registry
        return registry


def close_registries() -> None:
    """Close every cached default registry (hands unused tails back); at shutdown, in tests."""
    with _defaults_guard:
        registries = list(_defaults.values())
        _defaults.clear()
    for registry in registries:
        registry.close()


class _Installation:
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
        floor = functools.partial(_column_floor, _engine_of(bind), column, config.name)
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


def _column_floor(engine: Engine, column: Column[Any], name: str) -> int | None:
    """``max()`` over every column of ``column``'s metadata using sequence ``name``.

    Asked once, when the sequence's row is missing, on a connection of its
    own outside the application's pool (never the caller's transaction, and
    never waiting for a pooled connection the caller holds). A table not
    created yet counts as empty; a private in-memory SQLite database cannot
    be read from another connection and is skipped (its rows vanish with it).
    """
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
    reader = sa.create_engine(engine.url, poolclass=NullPool)
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

_class_installs: weakref.WeakKeyDictionary[type, _Installation] = weakref.WeakKeyDictionary()
_engine_installs: weakref.WeakKeyDictionary[Engine, _Installation] = weakref.WeakKeyDictionary()
_connection_installs: weakref.WeakKeyDictionary[Connection, _Installation] = (
    weakref.WeakKeyDictionary()
)
_listening = False
_install_guard = threading.Lock()


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
    through the matching sync driver (see :func:`autoseq.stores.sql.store_url`).
    The most specific installation wins: session class or maker, then engine,
    then ``Session``. ``store`` / ``registry`` default to
    ``SQLStore`` on the bind's database; ``auto_create=False`` makes a missing
    ``sys_sequence`` row raise ``SequenceNotFound`` instead of creating it.
    Installing the same target again replaces its settings.
    """
    installation = _Installation(store, registry, auto_create, policy)
    _listen_once()
    target = _sync_side(target)
    if store is None and registry is None:
        _check_bind_driver(target)
    if isinstance(target, scoped_session):
        target = target.session_factory
    if isinstance(target, sessionmaker):
        _class_installs[target.class_] = installation
        bind = target.kw.get("bind")
        if isinstance(bind, (Engine, Connection)):
            engine = _engine_of(bind)
            _engine_installs.setdefault(engine, installation)
            _watch_engine(engine)
    elif isinstance(target, type) and issubclass(target, Session):
        _class_installs[target] = installation
    elif isinstance(target, (Engine, Connection)):
        engine = _engine_of(target)
        _engine_installs[engine] = installation
        _watch_engine(engine)
    else:
        raise InvalidSequenceConfig(
            f"install() needs the Session class, a sessionmaker, a scoped_session or an "
            f"Engine (or their asyncio counterparts), got {type(target).__name__}"
        )


def uninstall(target: Any) -> None:
    """Undo ``install(target)`` (listeners stay, but no longer cover ``target``)."""
    target = _sync_side(target)
    if isinstance(target, scoped_session):
        target = target.session_factory
    if isinstance(target, sessionmaker):
        installation = _class_installs.pop(target.class_, None)
        bind = target.kw.get("bind")
        if isinstance(bind, (Engine, Connection)):
            engine = _engine_of(bind)
            if installation is not None and _engine_installs.get(engine) is installation:
                del _engine_installs[engine]
    elif isinstance(target, type):
        _class_installs.pop(target, None)
    else:
        _engine_installs.pop(_engine_of(target), None)


def _sync_side(target: Any) -> Any:
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
        bind = target.kw.get("bind")
        return sessionmaker(
            bind=_sync_side(bind),
            class_=target.kw.get("sync_session_class") or target.class_.sync_session_class,
        )
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
    target = _sync_side(target)
    if isinstance(target, Session):
        engine = _engine_of(target.get_bind())
        installation = _for_session(target, engine)
    else:
        engine = _engine_of(target)
        installation = _for_engine(engine, None)
    if installation is None:
        raise AutoseqError(f"no install() covers {engine!r}; call autoseq.sqlalchemy.install()")
    return installation.registry_for(engine)


def _engine_of(bind: Any) -> Engine:
    engine = bind.engine if isinstance(bind, Connection) else bind
    # Engine.execution_options() makes a proxy that shares the engine's events.
    proxied: Engine = getattr(engine, "_proxied", engine)
    return proxied


def _for_session(session: Session, engine: Engine) -> _Installation | None:
    for cls in type(session).__mro__:
        if cls is Session:
            break
        installation = _class_installs.get(cls)
        if installation is not None:
            return installation
    return _engine_installs.get(engine) or _class_installs.get(Session)


def _for_engine(engine: Engine, connection: Connection | None) -> _Installation | None:
    installation = _connection_installs.get(connection) if connection is not None else None
    return installation or _engine_installs.get(engine) or _class_installs.get(Session)


def _listen_once() -> None:
    global _listening
    with _install_guard:
        if _listening:
            return
        event.listen(Session, "before_flush", _before_flush)
        event.listen(Session, "do_orm_execute", _do_orm_execute)
        event.listen(Session, "after_begin", _after_begin)
        _listening = True


def _watch_engine(engine: Engine) -> None:
    if not event.contains(engine, "before_execute", _before_execute):
        event.listen(engine, "before_execute", _before_execute, retval=True)


# what a statement or a mapper needs ---------------------------------------------

_Target = tuple[str, Column[Any]]  # (parameter key, sequence column)
#: Set while the ORM executes a statement whose rows _do_orm_execute filled.
_orm_filled: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "autoseq_orm_filled", default=False
)


def _mapper_targets(mapper: Mapper[Any]) -> list[_Target]:
    targets: list[_Target] = []
    for prop in mapper.column_attrs:
        for column in prop.columns:
            if isinstance(column, Column) and sequence_spec(column) is not None:
                targets.append((prop.key, column))
                break
    return targets


def _table_targets(table: Any) -> list[_Target]:
    return [
        (column.key, column)
        for column in getattr(table, "columns", ())
        if isinstance(column, Column) and sequence_spec(column) is not None
    ]


def _given_by_values(statement: Insert, key: str, column: Column[Any]) -> bool:
    """Whether ``insert().values(...)`` gives ``column``; a given literal is checked."""
    values: Mapping[Any, Any] = statement._values or {}
    for given, value in values.items():
        if isinstance(given, str):
            if given != key:
                continue
        elif given is not column and getattr(given, "key", None) != key:
            continue
        # A plain value arrives as a bound parameter; an SQL expression
        # (a subquery, a function) is the caller's to vouch for.
        if (
            isinstance(value, sa.BindParameter)
            and value.callable is None
            and value.value is not None
        ):
            _check_explicit(value.value, column)
        return True
    return False


def _fill(
    rows: Sequence[Mapping[str, Any]],
    targets: list[_Target],
    lock_of: Callable[[Column[Any]], SequenceLock],
) -> list[dict[str, Any]] | None:
    """Rows with every missing sequence value filled in, or None when none was missing.

    The caller's dicts are never written to (a list inserted twice must not
    carry the first insert's keys): a row that lacks a value is copied with
    it, a row that has every value is passed on as it is.
    """
    out: Sequence[Mapping[str, Any]] | None = None
    for key, column in targets:
        source = rows if out is None else out
        missing = 0
        for row in source:
            value = row.get(key)
            if value is None:
                missing += 1
            else:
                _check_explicit(value, column)
        if not missing:
            continue
        values = iter(_next_many(lock_of(column), missing))
        out = [row if row.get(key) is not None else {**row, key: next(values)} for row in source]
    return None if out is None else [row if isinstance(row, dict) else dict(row) for row in out]


def _check_explicit(value: object, column: Column[Any]) -> None:
    """Refuse an explicit key that is not an int before it reaches the database.

    Databases would store ``'abc'`` (SQLite) or round ``1.5`` up to a value
    the sequence will hand out later (PostgreSQL).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSequenceConfig(
            f"explicit value for {column.table.name}.{column.name} must be an int, got "
            f"{type(value).__name__} {value!r}; leave it unset (None) to take the next value"
        )


# listeners --------------------------------------------------------------------


def _before_flush(session: Session, _flush: UOWTransaction, _instances: object) -> None:
    wanted: dict[int, tuple[SequenceLock, list[tuple[dict[str, Any], str]]]] = {}
    binds: dict[Mapper[Any], tuple[Engine, _Installation | None]] = {}
    # Resolved once per flush, on the first row that needs a value: building
    # the config and looking the lock up per row would cost every add_all.
    locks: dict[tuple[Mapper[Any], str], SequenceLock] = {}
    pending = sorted(
        (instance_state(obj) for obj in session.new),
        key=lambda state: state.insert_order or 0,
    )
    targets_of: dict[Mapper[Any], list[_Target]] = {}
    for state in pending:
        mapper = state.mapper
        targets = targets_of.get(mapper)
        if targets is None:
            targets = targets_of[mapper] = _mapper_targets(mapper)
        if not targets:
            continue
        if mapper not in binds:
            engine = _engine_of(session.get_bind(mapper=mapper))
            binds[mapper] = (engine, _for_session(session, engine))
        engine, installation = binds[mapper]
        if installation is None:
            continue  # not ours to fill; the column default will say so
        values = state.dict
        for key, column in targets:
            if values.get(key) is not None:
                _check_explicit(values[key], column)
                continue
            lock = locks.get((mapper, key))
            if lock is None:
                lock = locks[mapper, key] = _lock(installation, engine, column)
            wanted.setdefault(id(lock), (lock, []))[1].append((values, key))
    for lock, slots in wanted.values():
        # Straight into the pending object's dict, which the INSERT reads:
        # a key is not a change to track (setattr's events and history cost
        # more than the rest of this listener).
        for (row, key), value in zip(slots, _next_many(lock, len(slots)), strict=True):
            row[key] = value


def _do_orm_execute(state: ORMExecuteState) -> Result[Any] | None:
    statement = state.statement
    if not isinstance(statement, Insert) or not state.parameters:
        return None
    if statement._multi_values or statement._select_names:
        return None
    mapper = state.bind_mapper if state.is_orm_statement else None
    targets = _mapper_targets(mapper) if mapper is not None else _table_targets(statement.table)
    targets = [t for t in targets if not _given_by_values(statement, *t)]
    if not targets:
        return None
    engine = _engine_of(state.session.get_bind(mapper=mapper, clause=statement))
    installation = _for_session(state.session, engine)
    if installation is None:
        return None
    parameters: Any = state.parameters
    many = isinstance(parameters, list)
    rows: list[Mapping[str, Any]] = list(parameters) if many else [parameters]
    filled = _fill(rows, targets, lambda column: _lock(installation, engine, column))
    if filled is None:
        return None
    # The Core insert the ORM emits for these rows would be checked again,
    # row by row, by _before_execute: every sequence column is filled now.
    token = _orm_filled.set(True)
    try:
        return state.invoke_statement(params=filled if many else filled[0])
    finally:
        _orm_filled.reset(token)


def _after_begin(session: Session, _transaction: object, connection: Connection) -> None:
    installation = _for_session(session, _engine_of(connection))
    if installation is not None:
        # Core statements on the session's connection use the session's store.
        _connection_installs[connection] = installation
        _watch_engine(_engine_of(connection))


def _before_execute(
    connection: Connection,
    statement: Any,
    multiparams: list[dict[str, Any]],
    params: dict[str, Any],
    _options: object,
) -> tuple[Any, list[dict[str, Any]], dict[str, Any]]:
    if not isinstance(statement, Insert) or statement._select_names or _orm_filled.get():
        return statement, multiparams, params
    # Computed even with no parameters: it checks the keys given by values().
    targets = [t for t in _table_targets(statement.table) if not _given_by_values(statement, *t)]
    if not targets or not (multiparams or params) or statement._multi_values:
        return statement, multiparams, params
    engine = _engine_of(connection)
    installation = _for_engine(engine, connection)
    if installation is None:
        return statement, multiparams, params
    rows = multiparams or [params]
    filled = _fill(rows, targets, lambda column: _lock(installation, connection, column))
    if filled is None:
        return statement, multiparams, params
    return (statement, filled, {}) if multiparams else (statement, [], filled[0])


def _column_default(context: DefaultExecutionContext) -> int:
    """Python-side default of every sequence column: ``next()`` for one row."""
    column: Any = context.current_column
    if getattr(column, "_is_multiparam_column", False):
        column = column.original
    connection = context.root_connection
    engine = _engine_of(connection)
    installation = _for_engine(engine, connection)
    if installation is None:
        raise AutoseqError(
            f"column {column.table.name}.{column.key} takes its values from a sequence, "
            "but no install() covers this engine; call autoseq.sqlalchemy.install(Session) "
            "or install(engine) at start-up"
        )
    _watch_engine(engine)  # later multi-row statements get one next_many each
    return _next_many(_lock(installation, connection, column), 1)[0]


# asyncio ------------------------------------------------------------------------
# Under AsyncSession / AsyncConnection, SQLAlchemy runs these listeners in a
# greenlet on the event loop's thread. A store round trip there would stall
# every task on the loop, so it is awaited in a worker thread instead: the
# greenlet yields to the loop until the values are in. Values already in
# memory are served in place (the usual case: blocks are prefetched).


def _lock(installation: _Installation, bind: Engine | Connection, column: Any) -> SequenceLock:
    if in_greenlet():
        known = installation.known_lock(bind, column)
        if known is not None:
            return known
        return _off_the_loop(installation.lock_for, bind, column)
    return installation.lock_for(bind, column)


def _next_many(lock: SequenceLock, n: int) -> list[int]:
    if in_greenlet() and lock.available() < n:
        return _off_the_loop(lock.next_many, n)
    return lock.next_many(n)


def _off_the_loop(fn: Callable[..., _T], *args: Any) -> _T:
    import asyncio

    result: _T = await_only(asyncio.to_thread(fn, *args))
    return result


def _forget_after_fork() -> None:
    global _defaults_guard, _install_guard
    _defaults_guard = threading.Lock()
    _install_guard = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)

# snowflake ids ------------------------------------------------------------------


def SnowflakeField(
    generator: Any = None, *, layout: str = "default", **mapped_column_kwargs: Any
) -> MappedColumn[Any]:
    """A ``BigInteger`` mapped column whose values are snowflake ids, taken at insert.

    ``generator`` is the :class:`~autoseq.snowflake.Snowflake` to use; None
    means one on the store ``install()`` gave the engine (else a ``SQLStore``
    on the bind's database) for layout ``layout`` (its ``name``), created on first insert
    and shared by every such column. The value is the column's Python-side
    default, so every insert path (flush, ORM bulk, Core executemany,
    multi-row VALUES) gets one per row without a round trip; a value the
    user gave is kept. The other keyword arguments go to ``mapped_column``.
    """
    kwargs = dict(mapped_column_kwargs)
    clash = [key for key in _RESERVED_KWARGS if key in kwargs]
    if clash:
        raise InvalidSequenceConfig(
            f"a snowflake column sets {', '.join(clash)} itself (values are snowflake ids); "
            "remove the argument"
        )
    kwargs.setdefault("nullable", False)
    kwargs["autoincrement"] = False

    def snowflake_default(context: DefaultExecutionContext) -> int:
        if generator is not None:
            return int(generator.next())
        return int(_snowflake_for(context.root_connection, layout).next())

    kwargs["insert_default"] = snowflake_default
    return mapped_column(sa.BigInteger, **kwargs)


_snowflakes: dict[tuple[int, str], Any] = {}
_snowflakes_guard = threading.Lock()


def _snowflake_for(connection: Connection, name: str) -> Any:
    """The shared generator of layout ``name`` on the store that serves ``connection``."""
    from autoseq.snowflake import Snowflake

    engine = _engine_of(connection)
    installation = _for_engine(engine, connection)
    registry = (
        installation.registry_for(connection) if installation else default_registry(connection)
    )
    key = (id(registry.store), name)
    generator = _snowflakes.get(key)
    if generator is None:
        with _snowflakes_guard:
            generator = _snowflakes.get(key)
            if generator is None:
                generator = _snowflakes[key] = Snowflake(registry.store, name=name)
    return generator


def close_snowflakes() -> None:
    """Close the generators ``SnowflakeField`` made (releasing their leases); tests, shutdown."""
    with _snowflakes_guard:
        generators = list(_snowflakes.values())
        _snowflakes.clear()
    for generator in generators:
        generator.close()


def _forget_snowflake_guard_after_fork() -> None:
    global _snowflakes_guard
    _snowflakes_guard = threading.Lock()  # the generators re-lease on their own


os.register_at_fork(after_in_child=_forget_snowflake_guard_after_fork)


__all__ = [
    "INFO_KEY",
    "SequenceField",
    "SequenceSpec",
    "SnowflakeField",
    "close_registries",
    "close_snowflakes",
    "default_registry",
    "get_registry",
    "include_sequence_table",
    "install",
    "sequence_column",
    "sequence_spec",
    "uninstall",
]


def _check_bind_driver(target: Any) -> None:
    """Fail now, naming the extra, when the default store could not load its driver."""
    from autoseq.stores.sql import check_driver

    if isinstance(target, scoped_session):
        target = target.session_factory
    bind = target.kw.get("bind") if isinstance(target, sessionmaker) else target
    if isinstance(bind, (Engine, Connection)):
        check_driver(_engine_of(bind).url)


# Alembic and create_all --------------------------------------------------------


def include_sequence_table(metadata: sa.MetaData, name: str = "sys_sequence") -> sa.Table:
    """Declare ``sys_sequence`` in ``metadata`` (idempotent) and return it.

    The one line an Alembic project adds beside its models: autogenerate then
    writes ``create_table('sys_sequence', ...)`` (every column, ``version``
    included) into the migration, adds a column a later autoseq needs to an
    older table, and never proposes to drop the table because the
    application's metadata no longer mentions it. ``metadata.create_all()``
    creates it too, and ``drop_all()`` drops it: see docs/sqlalchemy.md.
    """
    from autoseq.stores.sql import sequence_table

    existing = metadata.tables.get(name)
    if existing is not None:
        return existing
    return sequence_table(name, metadata)


# Serial columns (issue 14) live in their own module, re-exported here.
from autoseq.serial_sqlalchemy import SerialField, serial_column  # noqa: E402

__all__ += ["SerialField", "serial_column"]
