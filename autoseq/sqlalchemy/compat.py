"""Every SQLAlchemy internal the integration relies on, in one place.

The modules of [`autoseq.sqlalchemy`][autoseq.sqlalchemy] use public
SQLAlchemy API only, except through the functions here: each names the
private or semi-private attribute it reads and why no public one serves.
When SQLAlchemy changes one of them, this is the file to fix, and
``tests/sqlalchemy/test_sqlalchemy.py`` (the ORM bulk insert tests: the caller's dicts
are never written to, mixed explicit and missing keys) is what fails.

Tested with SQLAlchemy 2.1.9 (the version ``pip show sqlalchemy`` reports in
the development environment) and 2.0.58 (the newest of the 2.0 series, the
floor ``pyproject.toml`` declares): the SQLAlchemy tests of the suite pass
on both.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.engine.default import DefaultExecutionContext
from sqlalchemy.orm import Mapper, ORMExecuteState, Session
from sqlalchemy.orm.state import InstanceState
from sqlalchemy.sql.dml import Insert
from sqlalchemy.util import concurrency
from sqlalchemy.util.concurrency import await_only

_T = TypeVar("_T")

__all__ = [
    "await_only",
    "current_column",
    "engine_of",
    "from_select_names",
    "in_greenlet",
    "insert_values",
    "is_from_select",
    "is_multi_values",
    "off_the_loop",
    "orm_bulk_mapper",
    "pending_states",
    "replace_parameters",
]


def engine_of(bind: Engine | Connection) -> Engine:
    """The engine behind ``bind``; ``Engine.execution_options()`` proxies resolve to it.

    The proxy (``OptionEngine``) shares the engine's events and pool; its
    ``_proxied`` is the only way back to the engine that installations key on.
    """
    engine = bind.engine if isinstance(bind, Connection) else bind
    proxied: Engine = getattr(engine, "_proxied", engine)
    return proxied


def insert_values(statement: Insert) -> Mapping[Any, Any]:
    """What ``insert().values(...)`` gave (column or key -> value): ``_values``."""
    values: Mapping[Any, Any] | None = statement._values
    return values or {}


def _greenlet_installed() -> bool:
    try:
        return importlib.util.find_spec("greenlet") is not None
    except (ImportError, ValueError):
        return False


def in_greenlet() -> bool:
    """Whether this runs in the greenlet of SQLAlchemy's asyncio bridge.

    SQLAlchemy 2.1 no longer installs greenlet, and its ``in_greenlet()``
    then raises ImportError: without greenlet there is no asyncio bridge, so
    nothing runs in one (``pip install "autoseq[sqlalchemy]"`` alone).
    """
    return _GREENLET and concurrency.in_greenlet()


_GREENLET = _greenlet_installed()


def off_the_loop(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` in a worker thread, awaited from SQLAlchemy's asyncio greenlet.

    Under ``AsyncSession`` / ``AsyncConnection`` the listeners run in a
    greenlet on the event loop's thread; a store round trip there would stall
    every task on the loop, so the greenlet yields to the loop until the
    thread is done (``await_only``, SQLAlchemy's bridge). Call it only when
    `in_greenlet` is true.
    """
    result: _T = await_only(asyncio.to_thread(fn, *args))
    return result


def is_multi_values(statement: Insert) -> bool:
    """Whether the statement is a multi-row ``values([...])`` (``_multi_values``)."""
    return bool(statement._multi_values)


def is_from_select(statement: Insert) -> bool:
    """Whether the statement is ``insert().from_select(...)`` (``_select_names``)."""
    return bool(statement._select_names)


def from_select_names(statement: Insert) -> list[str]:
    """The column keys ``insert().from_select(names, ...)`` was given (``_select_names``)."""
    return list(statement._select_names or ())


def current_column(context: DefaultExecutionContext) -> Any:
    """The column whose Python default is being called, unwrapped from a multi-row VALUES copy.

    ``current_column`` is documented on the context; the per-row copies of
    a multi-values insert are private ``_multiparam_column`` objects whose
    ``original`` is the real column.
    """
    column: Any = context.current_column
    if getattr(column, "_is_multiparam_column", False):
        column = column.original
    return column


def pending_states(session: Session) -> Iterator[InstanceState[Any]]:
    """The states of ``session.new`` in the order they were added (``insert_order``).

    Keys are handed out in that order, so they ascend as the rows were
    added. ``InstanceState.insert_order`` is semi-private, and so is
    ``Session._new`` (read instead of ``session.new``, which builds an
    ``IdentitySet`` of the objects on every flush); ``state.dict`` and
    ``state.mapper`` are public.
    """
    return iter(sorted(session._new, key=_insert_order))


def _insert_order(state: InstanceState[Any]) -> int:
    return state.insert_order or 0


def replace_parameters(state: ORMExecuteState, parameters: Any) -> None:
    """Run ``state``'s statement with ``parameters`` instead of the caller's.

    ``invoke_statement(params=...)`` would merge them into copies of the
    caller's rows (two more dict copies a row); the session reads
    ``state.parameters`` back after the hooks, so setting it costs nothing.
    """
    state.parameters = parameters


def orm_bulk_mapper(statement: Any) -> Mapper[Any] | None:
    """The mapper of an ORM bulk insert's Core statement, when its rows are SQLAlchemy's own.

    ``session.execute(insert(Model), [dicts])`` copies every dict
    (``bulk_persistence._bulk_insert``: ``[dict(m) for m in mappings]``)
    and builds a fresh parameter dict a row from the copy
    (``persistence._collect_insert_commands``); it groups consecutive rows
    with the same keys into one ``connection.execute()`` and annotates that
    statement with ``_emit_insert_mapper``. Those dicts belong to
    SQLAlchemy and are thrown away after the statement, so a value can go
    straight into them. Only a single-table mapper qualifies: joined
    inheritance copies keys between tables through the mapping, which a
    value written here would miss.
    """
    annotations = getattr(statement, "_annotations", None)
    mapper = annotations.get("_emit_insert_mapper") if annotations else None
    if mapper is None or len(mapper.tables) != 1:
        return None
    return mapper  # type: ignore[no-any-return]
