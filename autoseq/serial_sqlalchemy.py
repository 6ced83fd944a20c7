"""SQLAlchemy ``SerialField``: a string column filled with :class:`~autoseq.Serial` values.

Re-exported by :mod:`autoseq.sqlalchemy`; the same ``install()`` decides the
store. Every insert path that gives ``SequenceField`` its values gives a
serial column its own, the same way: ``before_flush`` (one ``next_many`` per
serial per flush), ``do_orm_execute`` (ORM bulk), an engine ``before_execute``
listener (Core executemany) and the column's Python default (anything else,
one row at a time). A value the user set is kept. With ``gapless=True`` the
values are taken at flush or insert on the session's or statement's own
connection, several serials in one flush in name order
(:func:`autoseq.gapless.lock_order`).
"""

from __future__ import annotations

import contextvars
import functools
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine, Result
from sqlalchemy.engine.default import DefaultExecutionContext
from sqlalchemy.orm import (
    MappedColumn,
    Mapper,
    ORMExecuteState,
    Session,
    UOWTransaction,
    mapped_column,
)
from sqlalchemy.orm.attributes import instance_state
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.schema import Column

from autoseq.config import validate_name
from autoseq.errors import AutoseqError, InvalidSequenceConfig
from autoseq.registry import SequenceRegistry
from autoseq.serial import Serial, _Template
from autoseq.stores.memory import MemoryStore

#: Key in ``Column.info`` under which a serial column's settings travel.
SERIAL_INFO_KEY = "autoseq_serial"


@dataclass(frozen=True)
class SerialSpec:
    """What a serial column was declared with; ``sequence=None`` means ``<table>.<column>``."""

    template: str
    sequence: str | None = None
    period: str | None = None
    tz: str | tzinfo = "UTC"
    start: int = 1
    step: int = 1
    batch_count: int = 100
    gapless: bool = False
    cycle: bool = False
    clock: Callable[[], datetime] | None = None
    #: A gapless integer sequence column (``SequenceField(gapless=True)``), not a string.
    integer: bool = False

    def __post_init__(self) -> None:
        if self.sequence is not None:
            validate_name(self.sequence)
        # refuse a bad template or setting where the column is declared
        self.build(SequenceRegistry(MemoryStore()), "placeholder", gapless=False)

    def build(
        self, registry: SequenceRegistry, name: str, *, gapless: bool | None = None
    ) -> Serial:
        """The :class:`Serial` of this column on ``registry``."""
        return Serial(
            registry,
            name,
            self.template,
            period=self.period,
            tz=self.tz,
            start=self.start,
            step=self.step,
            batch_count=self.batch_count,
            gapless=self.gapless if gapless is None else gapless,
            cycle=self.cycle,
            clock=self.clock,
        )

    def name_for(self, column: Column[Any]) -> str:
        """The serial's name: ``sequence``, else ``<table>.<column>``."""
        if self.sequence is not None:
            return self.sequence
        table = getattr(column, "table", None)
        if table is None:
            raise InvalidSequenceConfig(
                f"column {column.key!r} is not attached to a table, so its serial cannot be "
                "named after it; pass sequence='name'"
            )
        return str(table.name) if self.integer else f"{table.name}.{column.key}"


def SerialField(
    template: str,
    *,
    sequence: str | None = None,
    period: str | None = None,
    tz: str | tzinfo = "UTC",
    start: int = 1,
    step: int = 1,
    batch_count: int = 100,
    gapless: bool = False,
    cycle: bool = False,
    clock: Callable[[], datetime] | None = None,
    **mapped_column_kwargs: Any,
) -> MappedColumn[Any]:
    """A ``String`` mapped column filled from a :class:`~autoseq.Serial` at insert.

    Its length fits the longest serial the template makes. The remaining
    keyword arguments go to ``mapped_column`` (``unique``, ``index``...).
    """
    spec = SerialSpec(
        template, sequence, period, tz, start, step, batch_count, gapless, cycle, clock
    )
    return mapped_column(_string(spec), **_column_kwargs(spec, mapped_column_kwargs))


def gapless_sequence_field(
    sequence: str | None = None, *, start: int = 1, step: int = 1, **mapped_column_kwargs: Any
) -> MappedColumn[Any]:
    """``SequenceField(gapless=True)``: a ``BigInteger`` taken in the caller's transaction.

    The sequence (default: the table's name) is a row like any other; each
    value is taken at flush or insert on the session's or statement's own
    connection, as gapless serials are (:mod:`autoseq.gapless`).
    """
    spec = SerialSpec("{n}", sequence, start=start, step=step, gapless=True, integer=True)
    kwargs = _column_kwargs(spec, mapped_column_kwargs)
    kwargs["autoincrement"] = False
    return mapped_column(sa.BigInteger, **kwargs)


def serial_column(name: str, template: str, **kwargs: Any) -> Column[str]:
    """The Core counterpart of ``SerialField``: ``Table(..., serial_column("number", "N{n}"))``."""
    names = SerialSpec.__dataclass_fields__
    spec = SerialSpec(template, **{k: kwargs.pop(k) for k in list(kwargs) if k in names})
    return Column(name, _string(spec), **_column_kwargs(spec, kwargs))


def _string(spec: SerialSpec) -> sa.String:
    return sa.String(_Template(spec.template, spec.period).max_length)


def _column_kwargs(spec: SerialSpec, kwargs: dict[str, Any]) -> dict[str, Any]:
    clash = [key for key in ("default", "insert_default", "server_default") if key in kwargs]
    if clash:
        raise InvalidSequenceConfig(
            f"a serial column sets {', '.join(clash)} itself (values come from the serial); "
            "remove the argument"
        )
    kwargs = dict(kwargs)
    kwargs["info"] = {**kwargs.get("info", {}), SERIAL_INFO_KEY: spec}
    kwargs.setdefault("nullable", False)
    kwargs["insert_default"] = _column_default
    _listen_once()
    return kwargs


def serial_spec(column: Any) -> SerialSpec | None:
    """The ``SerialSpec`` a column carries, or ``None``."""
    info = getattr(column, "info", None)
    spec = info.get(SERIAL_INFO_KEY) if info else None
    return spec if isinstance(spec, SerialSpec) else None


# serials per registry -------------------------------------------------------------

_serials: dict[tuple[int, str], tuple[SequenceRegistry, Serial]] = {}
_guard = threading.Lock()
#: The integer-key serials (``SequenceField(gapless=True)``) and their column.
_integer_serials: weakref.WeakKeyDictionary[Serial, Column[Any]] = weakref.WeakKeyDictionary()


def _serial_for(registry: SequenceRegistry, column: Column[Any]) -> Serial:
    spec = serial_spec(column)
    assert spec is not None
    name = spec.name_for(column)
    key = (id(registry), name)
    found = _serials.get(key)
    if found is not None and found[0] is registry:
        return found[1]
    with _guard:
        found = _serials.get(key)
        if found is None or found[0] is not registry:
            found = (registry, spec.build(registry, name))
            _serials[key] = found
            if spec.integer:
                _integer_serials[found[1]] = column
        return found[1]


def _installation(session: Session | None, engine: Engine, connection: Connection | None) -> Any:
    from autoseq import sqlalchemy as integration

    if session is not None:
        return integration._for_session(session, engine)
    return integration._for_engine(engine, connection)


def _engine_of(bind: Any) -> Engine:
    from autoseq import sqlalchemy as integration

    return integration._engine_of(bind)


def _check_explicit(value: object, column: Column[Any]) -> None:
    spec = serial_spec(column)
    if spec is not None and spec.integer:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidSequenceConfig(
                f"explicit value for {column.table.name}.{column.name} must be an int, got "
                f"{type(value).__name__} {value!r}; leave it unset (None) to take the next value"
            )
        return
    if not isinstance(value, str):
        raise InvalidSequenceConfig(
            f"explicit value for {column.table.name}.{column.name} must be a str, got "
            f"{type(value).__name__} {value!r}; leave it unset (None) to take the next serial"
        )


def _take(serial: Serial, count: int, connection: Any) -> list[Any]:
    column = _integer_serials.get(serial)
    if column is not None and serial.gapless:
        # An integer key: a row created now starts past the keys already stored.
        from autoseq import gapless
        from autoseq import sqlalchemy as integration

        bound = gapless.connection_of(connection, serial.name)
        store = gapless.check_store(serial.store, serial.name)
        engine = integration._engine_of(bound)
        floor = functools.partial(integration._column_floor, engine, column, serial.name)
        return gapless.take(bound, store, serial.row_config(None), count, floor)
    values = serial.next_many(count, connection) if serial.gapless else serial.next_many(count)
    if column is not None:
        return [int(value) for value in values]
    return values


# listeners ------------------------------------------------------------------------

_listening = False


def _listen_once() -> None:
    global _listening
    with _guard:
        if _listening:
            return
        event.listen(Session, "before_flush", _before_flush)
        event.listen(Session, "do_orm_execute", _do_orm_execute)
        event.listen(Session, "after_begin", _after_begin)
        _listening = True


def _watch_engine(engine: Engine) -> None:
    if not event.contains(engine, "before_execute", _before_execute):
        event.listen(engine, "before_execute", _before_execute, retval=True)


_Target = tuple[str, Column[Any]]
#: Set while the ORM executes a statement whose rows _do_orm_execute filled.
_orm_filled: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "autoseq_serial_orm_filled", default=False
)


def _mapper_targets(mapper: Mapper[Any]) -> list[_Target]:
    return [
        (prop.key, column)
        for prop in mapper.column_attrs
        for column in prop.columns[:1]
        if isinstance(column, Column) and serial_spec(column) is not None
    ]


def _table_targets(table: Any) -> list[_Target]:
    return [
        (column.key, column)
        for column in getattr(table, "columns", ())
        if isinstance(column, Column) and serial_spec(column) is not None
    ]


def _before_flush(session: Session, _flush: UOWTransaction, _instances: object) -> None:
    wanted: dict[int, tuple[Serial, Mapper[Any], list[tuple[object, str]]]] = {}
    pending = sorted(
        ((instance_state(obj), obj) for obj in session.new),
        key=lambda pair: pair[0].insert_order or 0,
    )
    resolved: dict[tuple[Mapper[Any], str], Serial | None] = {}
    # Looked up once per mapper per flush: a flush of rows without serial
    # columns then costs one dict lookup per row.
    targets_of: dict[Mapper[Any], list[_Target]] = {}
    for state, obj in pending:
        mapper = state.mapper
        targets = targets_of.get(mapper)
        if targets is None:
            targets = targets_of[mapper] = _mapper_targets(mapper)
        for key, column in targets:
            value = state.dict.get(key)
            if value is not None:
                _check_explicit(value, column)
                continue
            if (mapper, key) not in resolved:
                engine = _engine_of(session.get_bind(mapper=mapper))
                installation = _installation(session, engine, None)
                resolved[mapper, key] = (
                    None
                    if installation is None
                    else _serial_for(installation.registry_for(engine), column)
                )
            serial = resolved[mapper, key]
            if serial is None:
                continue  # not ours to fill; the column default will say so
            wanted.setdefault(id(serial), (serial, mapper, []))[2].append((obj, key))
    # Gapless rows are locked in one order by every writer, so none waits in a cycle.
    for serial, mapper, slots in sorted(wanted.values(), key=lambda item: item[0].name):
        connection = (
            session.connection(bind_arguments={"mapper": mapper}) if serial.gapless else None
        )
        for (obj, key), value in zip(slots, _take(serial, len(slots), connection), strict=True):
            setattr(obj, key, value)


def _fill(
    rows: Sequence[Mapping[str, Any]],
    targets: list[_Target],
    serial_of: Callable[[Column[Any]], Serial],
    connection: Callable[[], Any],
) -> list[dict[str, Any]] | None:
    out: list[dict[str, Any]] | None = None
    ordered = sorted(
        ((key, column, serial_of(column)) for key, column in targets),
        key=lambda item: item[2].name,
    )
    for key, column, serial in ordered:
        missing = []
        for i, row in enumerate(rows):
            value = row.get(key)
            if value is None:
                missing.append(i)
            else:
                _check_explicit(value, column)
        if not missing:
            continue
        if out is None:
            out = [dict(row) for row in rows]
        values = _take(serial, len(missing), connection() if serial.gapless else None)
        for i, value in zip(missing, values, strict=True):
            out[i][key] = value
    return out


def _given_by_values(statement: Insert, key: str, column: Column[Any]) -> bool:
    values: Mapping[Any, Any] = statement._values or {}
    for given, value in values.items():
        if (isinstance(given, str) and given == key) or (
            not isinstance(given, str) and (given is column or getattr(given, "key", None) == key)
        ):
            if isinstance(value, sa.BindParameter) and value.value is not None:
                _check_explicit(value.value, column)
            return True
    return False


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
    session = state.session
    engine = _engine_of(session.get_bind(mapper=mapper, clause=statement))
    installation = _installation(session, engine, None)
    if installation is None:
        return None
    registry = installation.registry_for(engine)
    parameters: Any = state.parameters
    many = isinstance(parameters, list)
    rows: list[Mapping[str, Any]] = list(parameters) if many else [parameters]
    filled = _fill(
        rows,
        targets,
        lambda column: _serial_for(registry, column),
        lambda: session.connection(bind_arguments={"mapper": mapper, "clause": statement}),
    )
    if filled is None:
        return None
    # The Core insert the ORM emits for these rows would be checked again,
    # row by row, by _before_execute: every serial column is filled now.
    token = _orm_filled.set(True)
    try:
        return state.invoke_statement(params=filled if many else filled[0])
    finally:
        _orm_filled.reset(token)


def _after_begin(session: Session, _transaction: object, connection: Connection) -> None:
    if _installation(session, _engine_of(connection), None) is not None:
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
    targets = [t for t in _table_targets(statement.table) if not _given_by_values(statement, *t)]
    if not targets or not (multiparams or params) or statement._multi_values:
        return statement, multiparams, params
    engine = _engine_of(connection)
    installation = _installation(None, engine, connection)
    if installation is None:
        return statement, multiparams, params
    registry = installation.registry_for(connection)
    rows = multiparams or [params]
    filled = _fill(rows, targets, lambda column: _serial_for(registry, column), lambda: connection)
    if filled is None:
        return statement, multiparams, params
    return (statement, filled, {}) if multiparams else (statement, [], filled[0])


def _column_default(context: DefaultExecutionContext) -> Any:
    """Python-side default of every serial column: one serial for one row."""
    column: Any = context.current_column
    if getattr(column, "_is_multiparam_column", False):
        column = column.original
    connection = context.root_connection
    engine = _engine_of(connection)
    installation = _installation(None, engine, connection)
    if installation is None:
        raise AutoseqError(
            f"column {column.table.name}.{column.key} takes its values from a serial, "
            "but no install() covers this engine; call autoseq.sqlalchemy.install(Session) "
            "or install(engine) at start-up"
        )
    _watch_engine(engine)  # later executemany statements get one next_many each
    serial = _serial_for(installation.registry_for(connection), column)
    return _take(serial, 1, connection)[0]


__all__ = [
    "SERIAL_INFO_KEY",
    "SerialField",
    "SerialSpec",
    "gapless_sequence_field",
    "serial_column",
    "serial_spec",
]
