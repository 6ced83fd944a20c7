"""The event listeners that fill generated columns on every insert path.

Where SQLAlchemy 2.x routes each path:

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
  was watched): the column's own Python default (`column_default`) takes
  ``next()`` per row.

Every kind of generated column reaches them as a `Target`
(`autoseq.sqlalchemy.targets`); which installation covers a session or an
engine is `autoseq.sqlalchemy.registries`'s to say.
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine, Result
from sqlalchemy.engine.default import DefaultExecutionContext
from sqlalchemy.orm import (
    InstanceState,
    Mapper,
    ORMExecuteState,
    Session,
    SessionTransaction,
    UOWTransaction,
    make_transient,
)
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.schema import Column

from autoseq import _hooks
from autoseq.errors import AutoseqError, UnsupportedInsert
from autoseq.sqlalchemy import compat
from autoseq.sqlalchemy.compat import engine_of
from autoseq.sqlalchemy.registries import (
    Installation,
    connection_installs,
    for_engine,
    for_session,
)
from autoseq.sqlalchemy.targets import Target, kind_of

_listening = False
_install_guard = threading.Lock()


def listen_once() -> None:
    """Listen on every ``Session`` (once per process; ``install()`` calls it)."""
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


def watch_engine(engine: Engine) -> None:
    """Fill Core inserts on ``engine`` (idempotent)."""
    if not event.contains(engine, "before_execute", _before_execute):
        event.listen(engine, "before_execute", _before_execute, retval=True)


# generated columns ------------------------------------------------------------
# Every kind of generated column (a sequence key, a serial, a gapless key, a
# snowflake id) reaches the listeners below as a Target (targets.kind_of):
# what its values are called (lock order), whether they are taken in the
# caller's transaction, how to refuse a bad explicit value, and
# take(n, connection). The listeners know nothing else about the kinds.


_Found = tuple[str, Column[Any], type[Target]]  # (parameter key, column, its kind)


def _mapper_columns(mapper: Mapper[Any]) -> list[_Found]:
    found: list[_Found] = []
    for prop in mapper.column_attrs:
        # A joined subclass's key property holds its own column and its
        # parent's; whichever is generated decides.
        for column in prop.columns:
            kind = kind_of(column)
            if kind is not None:
                assert isinstance(column, Column)
                found.append((prop.key, column, kind))
                break
    return found


def _table_columns(table: Any) -> list[_Found]:
    return [
        (column.key, column, kind)
        for column in getattr(table, "columns", ())
        if (kind := kind_of(column)) is not None
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
    found: list[_Found], installation: Installation | None, bind: Engine | Connection
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
        installation: Installation,
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
    engine = engine_of(session.get_bind(mapper=mapper))
    installation = for_session(session, engine)
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
    engine = engine_of(session.get_bind(mapper=mapper, clause=statement))
    installation = for_session(session, engine)
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
    installation = for_session(session, engine_of(connection))
    if installation is not None:
        # Core statements on the session's connection use the session's store.
        connection_installs[connection] = installation
        watch_engine(engine_of(connection))


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
    installation = for_engine(engine_of(connection), connection)
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


def column_default(context: DefaultExecutionContext) -> Any:
    """Python-side default of every generated column: one value for one row.

    The listeners fill whole statements; this serves what reaches Core
    without them (``insert().values(...)``, multi-row VALUES, a connection
    opened before the engine was watched).
    """
    column = compat.current_column(context)
    kind = kind_of(column)
    assert kind is not None
    statement = context.invoked_statement
    if isinstance(statement, Insert) and compat.is_from_select(statement):
        # Reached without the listener (an engine not watched yet); SQLAlchemy
        # wraps it in StatementError, but still before anything is written.
        raise UnsupportedInsert(column.table.name, column.key, kind.what)
    connection = context.root_connection
    engine = engine_of(connection)
    installation = for_engine(engine, connection)
    if installation is None and kind.needs_install:
        raise AutoseqError(
            f"column {column.table.name}.{column.key} takes its values from {kind.what}, "
            "but no install() covers this engine; call autoseq.sqlalchemy.install(Session) "
            "or install(engine) at start-up"
        )
    if installation is not None:
        watch_engine(engine)  # later multi-row statements get one take each
    return kind(column.key, column, installation, connection).take(1, connection)[0]


def _forget_after_fork() -> None:
    global _install_guard
    _install_guard = threading.Lock()


_hooks.on_fork(after_in_child=_forget_after_fork)


__all__ = ["column_default", "listen_once", "watch_engine"]
