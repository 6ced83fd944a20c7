"""SQLAlchemy integration: ``SequenceField`` columns and ``install()``.

Declare the column, call ``install()`` once, and every insert path gets the
next values of the column's sequence. Where SQLAlchemy 2.x routes each path:

* ``session.add()`` / ``add_all()`` + flush: a ``before_flush`` listener sets
  the attribute of every pending object that has none, taking one
  ``next_many`` per sequence per flush, so the ORM inserts known keys.
* ORM bulk ``session.execute(insert(Order), [dicts])``: ``do_orm_execute``
  works out which columns need values, and the values go into the row
  copies the ORM makes for its Core insert (never into the caller's dicts,
  and with no copy of our own).
  Any other statement run through a session (one row, joined inheritance)
  gets the missing keys added to copies of the rows that lack them.
* Core ``conn.execute(insert(table), [dicts])``: an engine ``before_execute``
  listener (``retval=True``) fills the parameter dicts, one ``next_many`` per
  sequence per statement.
* Anything else that reaches Core without a value (``insert().values(...)``,
  multi-row VALUES, legacy bulk methods, a connection opened before the engine
  was watched): the column's own Python default takes ``next()`` per row.

Every kind of generated column (``SequenceField``, ``SerialField``,
``SnowflakeField``) is filled by these same listeners. A value the user
gave (not ``None``) is always kept. The default store is a
[`SQLStore`][autoseq.stores.sql.SQLStore] on the bind's own database (one
registry per URL, cached); it commits each block in its own transaction, so a
rollback of the caller's transaction never hands a value out again.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import sys
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
    InstanceState,
    MappedColumn,
    Mapper,
    ORMExecuteState,
    Session,
    SessionTransaction,
    UOWTransaction,
    make_transient,
    mapped_column,
    scoped_session,
    sessionmaker,
)
from sqlalchemy.pool import NullPool
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.schema import Column

from autoseq import _hooks
from autoseq import _sqlalchemy_compat as compat
from autoseq._sqlalchemy_target import Target
from autoseq.config import MAX_VALUE, SequenceConfig, validate_name
from autoseq.errors import (
    AutoseqError,
    InvalidSequenceConfig,
    SequenceNotFound,
    UnsupportedInsert,
)
from autoseq.lock import BufferPolicy, SequenceLock
from autoseq.registry import RegistryCache, SequenceRegistry
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

    def name_for(self, column: Column[Any]) -> str:
        """The name of the sequence this column's values come from."""
        if self.sequence is not None:
            return self.sequence
        table = getattr(column, "table", None)
        if table is None:
            raise InvalidSequenceConfig(
                f"column {column.key!r} is not attached to a table, so its sequence "
                "cannot default to the table name; pass sequence='name'"
            )
        return str(table.name)

    def config_for(self, column: Column[Any]) -> SequenceConfig:
        """The ``sys_sequence`` row this column's values come from."""
        return _spec_config(self, self.name_for(column))


@functools.lru_cache(maxsize=4096)
def _spec_config(spec: SequenceSpec, name: str) -> SequenceConfig:
    # Asked on every flush: a SequenceConfig validates all its settings when
    # built, which cost more than the rest of the listener (both are frozen).
    return spec._config(name)


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
    A primary key is ``INTEGER`` on SQLite, where that makes it the rowid.
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
    return mapped_column(
        _key_type(mapped_column_kwargs), **_column_kwargs(spec, mapped_column_kwargs)
    )


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
    return Column(name, _key_type(column_kwargs), **_column_kwargs(spec, column_kwargs))


#: ``BIGINT``, but ``INTEGER`` on SQLite: there an ``INTEGER PRIMARY KEY`` is the
#: rowid, one B-tree per row, where a ``BIGINT`` key adds a unique index (both
#: hold 64 bits). Alembic keeps an older ``BIGINT`` key as it is (see
#: ``autoseq.alembic.keep_sqlite_integer_keys``).
_ROWID_KEY = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _key_type(column_kwargs: Mapping[str, Any]) -> sa.types.TypeEngine[int]:
    """The type of a sequence column: ``_ROWID_KEY`` for a primary key, else ``BigInteger``."""
    return _ROWID_KEY if column_kwargs.get("primary_key") else sa.BigInteger()


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

_defaults: RegistryCache[tuple[str, BufferPolicy | None]] = RegistryCache()


def default_registry(
    bind: Engine | Connection, policy: BufferPolicy | None = None
) -> SequenceRegistry:
    """The registry on ``SQLStore(<bind's engine>)``: one per database URL, cached."""
    from autoseq.stores.sql import SQLStore

    engine = _engine_of(bind)
    key = (engine.url.render_as_string(hide_password=False), policy)
    return _defaults.get(key, lambda: SequenceRegistry(SQLStore(engine), policy=policy))


def close_registries() -> None:
    """Close every cached default registry (hands unused tails back); at shutdown, in tests."""
    _defaults.close_all()


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
    through the matching sync driver (see `autoseq.stores.sql.store_url`).
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


#: Per async_sessionmaker, the sessionmaker standing for it on the sync side.
_async_makers: weakref.WeakKeyDictionary[Any, sessionmaker[Session]] = weakref.WeakKeyDictionary()


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
        bind = _sync_side(target.kw.get("bind"))
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
    return compat.engine_of(bind)


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
        # Fired for the objects a rollback (of a transaction or a savepoint)
        # turns back into transient ones: the rows whose INSERT it undid.
        event.listen(Session, "persistent_to_transient", _drop_given_back)
        event.listen(Session, "pending_to_transient", _drop_given_back)
        event.listen(Session, "after_commit", _forget_committed)
        event.listen(Session, "after_transaction_end", _release_uncommitted)
        _listening = True


def _watch_engine(engine: Engine) -> None:
    if not event.contains(engine, "before_execute", _before_execute):
        event.listen(engine, "before_execute", _before_execute, retval=True)


# generated columns ------------------------------------------------------------
# Every kind of generated column (a sequence key, a serial, a gapless key, a
# snowflake id) reaches the listeners below as a Target: what its values are
# called (lock order), whether they are taken in the caller's transaction,
# how to refuse a bad explicit value, and take(n, connection). The listeners
# know nothing else about the kinds.


class _SequenceTarget(Target):
    __slots__ = ()
    what = "a sequence"

    @classmethod
    def name_of(cls, column: Column[Any]) -> str:
        spec = sequence_spec(column)
        assert spec is not None
        return spec.name_for(column)

    def resolve(self) -> SequenceLock:
        assert self.installation is not None
        return _lock(self.installation, self.bind, self.column)

    def take(self, n: int, connection: Connection | None) -> list[Any]:
        return _next_many(self.source(), n)


def _kind_of(column: Any) -> type[Target] | None:
    """The Target class of a generated column, or None for an ordinary one."""
    info = getattr(column, "info", None)
    if not info or not isinstance(column, Column):
        return None
    if isinstance(info.get(INFO_KEY), SequenceSpec):
        return _SequenceTarget
    if isinstance(info.get(SNOWFLAKE_INFO_KEY), SnowflakeSpec):
        return _SnowflakeTarget
    return SerialTarget if serial_spec(column) is not None else None


_Found = tuple[str, Column[Any], type[Target]]  # (parameter key, column, its kind)


def _mapper_columns(mapper: Mapper[Any]) -> list[_Found]:
    found: list[_Found] = []
    for prop in mapper.column_attrs:
        # A joined subclass's key property holds its own column and its
        # parent's; whichever is generated decides.
        for column in prop.columns:
            kind = _kind_of(column)
            if kind is not None:
                assert isinstance(column, Column)
                found.append((prop.key, column, kind))
                break
    return found


def _table_columns(table: Any) -> list[_Found]:
    return [
        (column.key, column, kind)
        for column in getattr(table, "columns", ())
        if (kind := _kind_of(column)) is not None
    ]


def _given_by_values(statement: Insert, found: _Found) -> bool:
    """Whether ``insert().values(...)`` gives the column; a given literal is checked."""
    key, column, kind = found
    for given, value in compat.insert_values(statement).items():
        if isinstance(given, str):
            if given != key:
                continue
        elif given is not column and getattr(given, "key", None) != key:
            continue
        # A plain value arrives as a bound parameter; an SQL expression
        # (a subquery, a function) or a callable parameter (evaluated at
        # execution) is the caller's to vouch for.
        if (
            isinstance(value, sa.BindParameter)
            and value.callable is None
            and value.value is not None
        ):
            kind.check_explicit(value.value, column)
        return True
    return False


def _targets(
    found: list[_Found], installation: _Installation | None, bind: Engine | Connection
) -> list[Target]:
    # Gapless values are taken in one order (by name) by every writer, so
    # none waits in a cycle; the order is harmless for the others.
    made = [kind(key, column, installation, bind) for key, column, kind in found]
    return sorted(made, key=lambda target: type(target).name_of(target.column))


def _take(target: Target, n: int, connection: Callable[[], Connection]) -> list[Any]:
    # A gapless take needs the statement's own connection, asked for only then.
    gapless = type(target).in_transaction(target.column)
    return target.take(n, connection() if gapless else None)


def _fill(
    rows: Sequence[Mapping[str, Any]],
    targets: list[Target],
    connection: Callable[[], Connection],
    *,
    owned: bool = False,
) -> list[Mapping[str, Any]] | None:
    """Fill every row lacking a value of a target; None when no row lacked one.

    ``owned=False``: the rows are the caller's, never written to (a list
    inserted twice must not carry the first insert's keys): a row that
    lacks a value is copied with it, the others are passed on as they are.
    ``owned=True``: the rows are SQLAlchemy's own copies
    (`compat.orm_bulk_mapper`) and get the values in place.
    """
    out: list[Mapping[str, Any]] | None = None
    copied: set[int] = set()
    for target in targets:
        key = target.key
        column = target.column
        kind = type(target)
        source = rows if out is None else out
        if owned and key not in source[0]:
            # SQLAlchemy runs together only rows with the same keys: none has it.
            for row, value in zip(source, _take(target, len(source), connection), strict=True):
                row[key] = value  # type: ignore[index]
            continue
        missing: list[int] = []
        for i, row in enumerate(source):
            value = row.get(key)
            if value is None:
                missing.append(i)
            else:
                kind.check_explicit(value, column)
        if not missing:
            continue
        values = _take(target, len(missing), connection)
        if owned:
            for i, value in zip(missing, values, strict=True):
                source[i][key] = value  # type: ignore[index]
            continue
        if out is None:
            out = list(rows)
        for i, value in zip(missing, values, strict=True):
            if i in copied:
                out[i][key] = value  # type: ignore[index]
            else:
                out[i] = {**out[i], key: value}
                copied.add(i)
    return out


# listeners --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _OrmInsert:
    """Set while the ORM runs a statement of ``do_orm_execute``'s.

    ``mapper`` None: the rows were filled already, the Core insert the ORM
    emits is not checked again. Otherwise the ORM bulk insert of a
    single-table ``mapper``: ``targets`` fill SQLAlchemy's own row copies
    when it emits the Core insert (`compat.orm_bulk_mapper`).
    """

    mapper: Mapper[Any] | None = None
    targets: tuple[Target, ...] = ()


_FILLED = _OrmInsert()
_orm_insert: contextvars.ContextVar[_OrmInsert | None] = contextvars.ContextVar(
    "autoseq_orm_insert", default=None
)


class _Slots:
    """One generated column of one mapper in a flush: the rows that lack its value."""

    __slots__ = ("column", "engine", "installation", "key", "kind", "rows")

    def __init__(
        self,
        found: _Found,
        engine: Engine,
        installation: _Installation,
    ) -> None:
        self.key, self.column, self.kind = found
        self.engine = engine
        self.installation = installation
        self.rows: list[dict[str, Any]] = []


def _flush_plan(session: Session, mapper: Mapper[Any]) -> list[_Slots] | None:
    """The generated columns of ``mapper`` this session fills; None when there are none."""
    found = _mapper_columns(mapper)
    if not found:
        return None
    engine = _engine_of(session.get_bind(mapper=mapper))
    installation = _for_session(session, engine)
    if installation is None:
        return None  # not ours to fill; the column default will say so
    if compat.in_greenlet():
        # Under asyncio, check out the connection the flush needs anyway
        # first: the checkout awaits, so the keys are taken when the task
        # resumes with its connection, as Identity() takes them in the
        # database, and not all in the one pass of the loop where every
        # task reaches its first flush.
        session.connection(bind_arguments={"mapper": mapper})
    return [_Slots(f, engine, installation) for f in found]


def _before_flush(session: Session, _flush: UOWTransaction, _instances: object) -> None:
    # Per row only what must be per row: read the key, note the row when it
    # is missing. Generators are resolved after, once per column that needs
    # values (rows that all carry explicit values cost no round trip).
    plans: dict[Mapper[Any], list[_Slots] | None] = {}
    for state in compat.pending_states(session):
        mapper = state.mapper
        try:
            plan = plans[mapper]
        except KeyError:
            plan = plans[mapper] = _flush_plan(session, mapper)
        if plan is None:
            continue
        values = state.dict
        for slots in plan:
            value = values.get(slots.key)
            if value is None:
                slots.rows.append(values)
            else:
                slots.kind.check_explicit(value, slots.column)
    # One take per generator per flush, even when models share it.
    wanted: dict[int, list[tuple[Target, Mapper[Any], _Slots]]] = {}
    for mapper, plan in plans.items():
        for slots in plan or ():
            if slots.rows:
                target = slots.kind(slots.key, slots.column, slots.installation, slots.engine)
                wanted.setdefault(id(target.source()), []).append((target, mapper, slots))
    groups = list(wanted.values())
    if len(groups) > 1:
        # Gapless values are taken in one order (by name) by every writer.
        groups.sort(key=lambda members: type(members[0][0]).name_of(members[0][0].column))
    for members in groups:
        target, mapper, slots = members[0]
        connection = (
            session.connection(bind_arguments={"mapper": mapper})
            if type(target).in_transaction(target.column)
            else None
        )
        if len(members) == 1:
            # Straight into the pending object's dict, which the INSERT reads:
            # a key is not a change to track (setattr's events and history cost
            # more than the rest of this listener).
            key, rows = slots.key, slots.rows
            for row, value in zip(rows, target.take(len(rows), connection), strict=True):
                row[key] = value
            if connection is not None:
                _note_given(session, [(row, key) for row in rows])
            continue
        # Models sharing a generator: their rows get values in the order added.
        pairs = _shared_in_order(session, members)
        for (row, key), value in zip(pairs, target.take(len(pairs), connection), strict=True):
            row[key] = value
        if connection is not None:
            _note_given(session, pairs)


#: Per object, the gapless values a flush gave it, as ``(attribute key, value)``.
_given: weakref.WeakKeyDictionary[InstanceState[Any], list[tuple[str, Any]]] = (
    weakref.WeakKeyDictionary()
)
#: Per root session transaction, the objects given gapless values in it.
_given_in: weakref.WeakKeyDictionary[SessionTransaction, list[InstanceState[Any]]] = (
    weakref.WeakKeyDictionary()
)


def _note_given(session: Session, pairs: list[tuple[dict[str, Any], str]]) -> None:
    """Remember which gapless values these pending rows got, so a rollback can take them back."""
    states = {id(state.dict): state for state in compat.pending_states(session)}
    transaction = session.get_transaction()
    holders = _given_in.setdefault(transaction, []) if transaction is not None else []
    for row, key in pairs:
        state = states[id(row)]
        given = _given.get(state)
        if given is None:
            given = _given[state] = []
            holders.append(state)
        given.append((key, row[key]))


def _take_back(state: InstanceState[Any]) -> bool:
    """Take the gapless values a flush gave ``state`` off it; whether there were any.

    Their transaction ended without committing, which gave them back to the
    sequence and so to the next writer: kept, a retry would insert them
    again (a repeated number, or a key that is someone else's row). Values
    the user set, or changed since, are left alone.
    """
    given = _given.pop(state, None)
    values = state.dict
    taken = False
    for key, value in given or ():
        if values.get(key) is value:
            del values[key]
            taken = True
    return taken


def _drop_given_back(session: Session, instance: object) -> None:
    # A rollback (of the transaction or a savepoint) makes the objects whose
    # INSERT it undid transient again; an expunge does too, while the
    # transaction, still open, holds their values.
    state = sa.inspect(instance)
    transaction = session.get_nested_transaction() or session.get_transaction()
    if state in _given and (transaction is None or not transaction.is_active):
        _take_back(state)


def _forget_committed(session: Session) -> None:
    # Fired for a savepoint's release too: only the root's commit is final.
    transaction = session.get_transaction()
    if transaction is not None and session.get_nested_transaction() is None:
        for state in _given_in.pop(transaction, ()):
            _given.pop(state, None)


def _release_uncommitted(session: Session, transaction: SessionTransaction) -> None:
    # A root transaction that ends uncommitted and was not rolled back by the
    # session (Session.close() discards it): its objects are detached with
    # keys whose rows are gone, and a retry's add() would insert nothing.
    if transaction.parent is not None:
        return
    for state in _given_in.pop(transaction, ()):
        if state.detached and _take_back(state):
            instance = state.obj()
            if instance is not None:
                make_transient(instance)
        elif state.transient:
            _take_back(state)


def _shared_in_order(
    session: Session, members: list[tuple[Target, Mapper[Any], _Slots]]
) -> list[tuple[dict[str, Any], str]]:
    """The rows of several columns that share a generator, in the order they were added."""
    keys: dict[int, list[str]] = {}  # a model may have two columns on one generator
    for _target, _mapper, slots in members:
        for row in slots.rows:
            keys.setdefault(id(row), []).append(slots.key)
    pairs: list[tuple[dict[str, Any], str]] = []
    for state in compat.pending_states(session):
        row = state.dict
        pairs.extend((row, key) for key in keys.get(id(row), ()))
    return pairs


def _do_orm_execute(state: ORMExecuteState) -> Result[Any] | None:
    statement = state.statement
    if not isinstance(statement, Insert) or not state.parameters:
        return None
    if compat.is_multi_values(statement) or compat.is_from_select(statement):
        return None
    mapper = state.bind_mapper if state.is_orm_statement else None
    found = _mapper_columns(mapper) if mapper is not None else _table_columns(statement.table)
    found = [f for f in found if not _given_by_values(statement, f)]
    if not found:
        return None
    session = state.session
    engine = _engine_of(session.get_bind(mapper=mapper, clause=statement))
    installation = _for_session(session, engine)
    if installation is None:
        return None
    parameters: Any = state.parameters
    many = isinstance(parameters, list)
    if many and mapper is not None and len(mapper.tables) == 1:
        # The ORM copies these rows before the Core insert: the values go
        # into its copies there (_before_execute), keyed as its columns are.
        columns = [(column.key, column, kind) for _key, column, kind in found]
        plan = _OrmInsert(mapper, tuple(_targets(columns, installation, engine)))
        token = _orm_insert.set(plan)
        try:
            return state.invoke_statement()
        finally:
            _orm_insert.reset(token)
    rows: list[Mapping[str, Any]] = parameters if many else [parameters]
    filled = _fill(
        rows,
        _targets(found, installation, engine),
        lambda: session.connection(bind_arguments={"mapper": mapper, "clause": statement}),
    )
    if filled is None:
        return None
    compat.replace_parameters(state, filled if many else filled[0])
    # The Core insert the ORM emits for these rows would be checked again,
    # row by row, by _before_execute: every generated column is filled now.
    token = _orm_insert.set(_FILLED)
    try:
        return state.invoke_statement()
    finally:
        _orm_insert.reset(token)


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
) -> tuple[Any, list[Any], dict[str, Any]]:
    if not isinstance(statement, Insert):
        return statement, multiparams, params
    orm = _orm_insert.get()
    if orm is not None:
        if orm.mapper is not None and compat.orm_bulk_mapper(statement) is orm.mapper:
            _fill(multiparams or [params], list(orm.targets), lambda: connection, owned=True)
        return statement, multiparams, params
    if compat.is_from_select(statement):
        _refuse_shared_defaults(statement)
        return statement, multiparams, params
    # Computed even with no parameters: it checks the keys given by values().
    found = [f for f in _table_columns(statement.table) if not _given_by_values(statement, f)]
    if not found or not (multiparams or params) or compat.is_multi_values(statement):
        return statement, multiparams, params
    installation = _for_engine(_engine_of(connection), connection)
    if installation is None:
        return statement, multiparams, params
    rows = multiparams or [params]
    filled = _fill(rows, _targets(found, installation, connection), lambda: connection)
    if filled is None:
        return statement, multiparams, params
    return (statement, filled, {}) if multiparams else (statement, [], filled[0])  # type: ignore[return-value]


def _refuse_shared_defaults(statement: Insert) -> None:
    """Refuse ``insert().from_select()`` that leaves a generated column to its default.

    SQLAlchemy evaluates a Python-side default once for the whole statement
    and binds it into the SELECT, so every selected row would get one value.
    """
    if not statement.include_insert_from_select_defaults:
        return  # the column is left to the database (NULL or a server default)
    names = set(compat.from_select_names(statement))
    for key, column, kind in _table_columns(statement.table):
        if key not in names:
            raise UnsupportedInsert(column.table.name, key, kind.what)


def _column_default(context: DefaultExecutionContext) -> Any:
    """Python-side default of every generated column: one value for one row.

    The listeners fill whole statements; this serves what reaches Core
    without them (``insert().values(...)``, multi-row VALUES, a connection
    opened before the engine was watched).
    """
    column = compat.current_column(context)
    kind = _kind_of(column)
    assert kind is not None
    statement = context.invoked_statement
    if isinstance(statement, Insert) and compat.is_from_select(statement):
        # Reached without the listener (an engine not watched yet); SQLAlchemy
        # wraps it in StatementError, but still before anything is written.
        raise UnsupportedInsert(column.table.name, column.key, kind.what)
    connection = context.root_connection
    engine = _engine_of(connection)
    installation = _for_engine(engine, connection)
    if installation is None and kind.needs_install:
        raise AutoseqError(
            f"column {column.table.name}.{column.key} takes its values from {kind.what}, "
            "but no install() covers this engine; call autoseq.sqlalchemy.install(Session) "
            "or install(engine) at start-up"
        )
    if installation is not None:
        _watch_engine(engine)  # later multi-row statements get one take each
    return kind(column.key, column, installation, connection).take(1, connection)[0]


# asyncio ------------------------------------------------------------------------
# Under AsyncSession / AsyncConnection, SQLAlchemy runs these listeners in a
# greenlet on the event loop's thread. A store round trip there would stall
# every task on the loop, so it is awaited in a worker thread instead: the
# greenlet yields to the loop until the values are in. Values already in
# memory are served in place (the usual case: blocks are prefetched).


def _lock(installation: _Installation, bind: Engine | Connection, column: Any) -> SequenceLock:
    # A lock set up already is one dict lookup away (every flush after the first).
    known = installation.known_lock(bind, column)
    if known is not None:
        return known
    if compat.in_greenlet():
        return _off_the_loop(installation.lock_for, bind, column)
    return installation.lock_for(bind, column)


def _next_many(lock: SequenceLock, n: int) -> list[int]:
    if compat.in_greenlet() and lock.available() < n:
        return _off_the_loop(lock.next_many, n)
    return lock.next_many(n)


def _off_the_loop(fn: Callable[..., _T], *args: Any) -> _T:
    import asyncio

    result: _T = compat.await_only(asyncio.to_thread(fn, *args))
    return result


def _forget_after_fork() -> None:
    global _install_guard
    _install_guard = threading.Lock()


_hooks.on_fork(after_in_child=_forget_after_fork)

# snowflake ids ------------------------------------------------------------------

#: Key in ``Column.info`` under which a snowflake column's settings travel.
SNOWFLAKE_INFO_KEY = "autoseq_snowflake"


@dataclass(frozen=True, slots=True)
class SnowflakeSpec:
    """What a ``SnowflakeField`` was declared with: its generator, or the layout to lease."""

    generator: Any = None
    layout: str = "default"


def SnowflakeField(
    generator: Any = None, *, layout: str = "default", **mapped_column_kwargs: Any
) -> MappedColumn[Any]:
    """A ``BigInteger`` mapped column whose values are snowflake ids, taken at insert.

    ``generator`` is the `Snowflake` to use; None
    means one on the store ``install()`` gave the engine (else a ``SQLStore``
    on the bind's database) for layout ``layout`` (its ``name``), created on first insert
    and shared by every such column. Under ``install()`` a flush or bulk
    insert takes one ``next_many`` per statement; anything else (and an
    engine no ``install()`` covers) gets one id per row from the column's
    Python-side default, without a round trip; a value the user gave is
    kept. The other keyword arguments go to ``mapped_column``.
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
    spec = SnowflakeSpec(generator, layout)
    kwargs["info"] = {**kwargs.get("info", {}), SNOWFLAKE_INFO_KEY: spec}
    kwargs["insert_default"] = _column_default
    return mapped_column(sa.BigInteger, **kwargs)


class _SnowflakeTarget(Target):
    __slots__ = ()
    what = "a snowflake generator"
    needs_install = False

    @staticmethod
    def _spec(column: Column[Any]) -> SnowflakeSpec:
        spec = column.info[SNOWFLAKE_INFO_KEY]
        assert isinstance(spec, SnowflakeSpec)
        return spec

    @classmethod
    def name_of(cls, column: Column[Any]) -> str:
        return cls._spec(column).layout

    def resolve(self) -> Any:
        spec = self._spec(self.column)
        if spec.generator is not None:
            return spec.generator
        return _snowflake_for(self.bind, spec.layout, self.installation)

    def take(self, n: int, connection: Connection | None) -> list[Any]:
        return [int(value) for value in self.source().next_many(n)]


_snowflakes: dict[tuple[int, str], Any] = {}
_snowflakes_guard = threading.Lock()


def _snowflake_for(bind: Engine | Connection, name: str, installation: _Installation | None) -> Any:
    """The shared generator of layout ``name`` on the store that serves ``bind``."""
    from autoseq.snowflake import Snowflake

    registry = installation.registry_for(bind) if installation else default_registry(bind)
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
    if generators:
        from autoseq.snowflake import close_generators

        close_generators(generators)  # within one deadline in all


def _forget_snowflake_guard_after_fork() -> None:
    global _snowflakes_guard
    _snowflakes_guard = threading.Lock()  # the generators re-lease on their own


_hooks.on_fork(after_in_child=_forget_snowflake_guard_after_fork)


__all__ = [
    "INFO_KEY",
    "SequenceField",
    "SequenceSpec",
    "SnowflakeField",
    "application_tables",
    "close_registries",
    "close_snowflakes",
    "default_registry",
    "get_registry",
    "include_sequence_table",
    "include_worker_table",
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


#: Key in ``MetaData.info``: the store tables the user named with the helpers below.
_NAMED_KEY = "autoseq_named_tables"
#: Key in ``Table.info`` of a store table: "declared" by a column itself, or "named" by the user.
_STORE_KEY = "autoseq_store_table"


def _declare_store_tables(column: Column[Any], table: Any) -> None:
    """Declare ``sys_sequence`` / ``sys_worker`` where a generated column joins a table.

    So that Alembic autogenerate and ``create_all()`` see the tables the store
    makes at run time without a line of the user's (issue 31), and
    ``sys_sequence_gapless`` for a gapless column (where SQLite keeps its rows,
    in the application's file; it stays empty on a server). Listening on
    every ``Column`` (not on each field's) also covers the copies a mixin or
    ``Table.to_metadata()`` makes. Only the default names: a store on another
    table is declared with the helpers below, which then take the default one back.
    """
    kind = _kind_of(column)
    metadata = getattr(table, "metadata", None)
    if kind is None or not isinstance(metadata, sa.MetaData):
        return
    named = metadata.info.get(_NAMED_KEY, {})
    if kind is _SnowflakeTarget:
        if "worker" not in named:
            _declare(metadata, "sys_worker", _worker_table)
    elif "sequence" not in named:
        _declare(metadata, "sys_sequence", _sequence_table)
        spec = serial_spec(column)
        if spec is not None and spec.gapless:  # SQLite keeps these rows in the app's file
            _declare(metadata, "sys_sequence_gapless", _sequence_table)


event.listen(Column, "after_parent_attach", _declare_store_tables)


def _declare(
    metadata: sa.MetaData, name: str, build: Callable[[str, sa.MetaData], sa.Table]
) -> None:
    if name not in metadata.tables:
        build(name, metadata).info[_STORE_KEY] = "declared"
        _guard_drops(name)


def _guard_drops(name: str) -> None:
    # Only when Alembic runs (its env.py imports the models): importing it
    # otherwise would cost every application that never migrates.
    if "alembic" in sys.modules:
        from autoseq.alembic import guard_autogenerated_drops, keep_sqlite_integer_keys

        keep_sqlite_integer_keys(lambda column: sequence_spec(column) is not None)
        guard_autogenerated_drops(name)


def _include(
    metadata: sa.MetaData,
    kind: str,
    name: str,
    default: str,
    build: Callable[[str, sa.MetaData], sa.Table],
) -> sa.Table:
    """Declare the user's table ``name``; a default one a column declared earlier goes."""
    metadata.info.setdefault(_NAMED_KEY, {})[kind] = name
    declared = metadata.tables.get(default)
    if name != default and declared is not None and declared.info.get(_STORE_KEY) == "declared":
        metadata.remove(declared)
    table = metadata.tables.get(name)
    if table is None:
        table = build(name, metadata)
        table.info[_STORE_KEY] = "named"
        _guard_drops(name)
    return table


def application_tables(metadata: sa.MetaData) -> list[sa.Table]:
    """``metadata``'s tables without the store's own (``sys_sequence``, ``sys_worker``...).

    For a test suite that empties its database with
    ``metadata.drop_all(engine, tables=application_tables(metadata))`` and
    must keep the sequence rows (a shared database, a live registry).
    """
    return [table for table in metadata.sorted_tables if _STORE_KEY not in table.info]


def include_sequence_table(metadata: sa.MetaData, name: str = "sys_sequence") -> sa.Table:
    """Declare ``sys_sequence`` in ``metadata`` (idempotent) and return it.

    A ``SequenceField``, ``SerialField`` or ``sequence_column`` declares the
    default ``sys_sequence`` by itself; call this for a store on another table
    (``SQLStore(table=...)``), whose name it takes instead. Alembic autogenerate then
    writes ``create_table('sys_sequence', ...)`` (every column, ``version``
    included) into the migration, adds a column a later autoseq needs to an
    older table, and never proposes to drop the table because the
    application's metadata no longer mentions it. ``metadata.create_all()``
    creates it too, and ``drop_all()`` drops it: see docs/sqlalchemy.md.
    """
    return _include(metadata, "sequence", name, "sys_sequence", _sequence_table)


def include_worker_table(metadata: sa.MetaData, name: str = "sys_worker") -> sa.Table:
    """Declare ``sys_worker``, the snowflake worker leases, in ``metadata`` (idempotent).

    A ``SnowflakeField`` declares the default ``sys_worker`` by itself; call
    this for leases on another table, whose name it takes instead (Alembic
    would otherwise propose ``drop_table`` for it, and running that under
    live generators costs every one of them its lease). The name is
    ``sys_worker`` beside ``sys_sequence``, else ``<table>_worker``
    (`autoseq.stores.sql.workers.worker_table_name`).
    """
    return _include(metadata, "worker", name, "sys_worker", _worker_table)


def _sequence_table(name: str, metadata: sa.MetaData) -> sa.Table:
    from autoseq.stores.sql import sequence_table

    return sequence_table(name, metadata)


def _worker_table(name: str, metadata: sa.MetaData) -> sa.Table:
    from autoseq.stores.sql.workers import worker_table

    return worker_table(name, metadata)


# Serial columns (issue 14) live in their own module, re-exported here.
from autoseq.serial_sqlalchemy import (  # noqa: E402
    SerialField,
    SerialTarget,
    serial_column,
    serial_spec,
)

__all__ += ["SerialField", "serial_column"]
