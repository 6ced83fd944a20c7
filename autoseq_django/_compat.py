"""Every use autoseq_django makes of Django's private internals, in one place.

Django documents no way for a field to see the whole INSERT it is part of,
to find its own ``on_commit`` callbacks, or to hook the test runner's
sequence reset, so these helpers reach into undocumented attributes. Tested
with Django 5.2 (5.2.19); a Django release that renames one of them breaks
only this module. (``Model._meta`` and ``_base_manager`` are documented
API and used where needed.) Not to be confused with `autoseq_django.compat`,
django-sequences' public API: this module is the boundary to Django's
internals, as ``autoseq_mongoengine._compat`` is to mongoengine's.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

from django.db.backends.base.base import NO_DB_ALIAS as NO_DB_ALIAS


def insert_rows(query: Any) -> Sequence[Any] | None:
    """Every model instance of the INSERT ``query`` (Django's ``InsertQuery.objs``), if known.

    The compiler resolves a field's value with its ``InsertQuery``, whose
    ``objs`` are all the rows of the statement: a bulk is served by one
    ``next_many()``.
    """
    objs: Sequence[Any] | None = getattr(query, "objs", None)
    return objs


def ignores(query: Any) -> bool:
    """True for the INSERT of ``bulk_create(ignore_conflicts=True)`` (its ``on_conflict``)."""
    from django.db.models.constants import OnConflict

    return getattr(query, "on_conflict", None) == OnConflict.IGNORE


def upserts(query: Any) -> bool:
    """True for the INSERT of ``bulk_create(update_conflicts=True)`` (its ``on_conflict``)."""
    from django.db.models.constants import OnConflict

    return getattr(query, "on_conflict", None) == OnConflict.UPDATE


#: Per connection: its ``run_on_commit`` list, how many entries of it were
#: read, and the ids of their callbacks (all alive: the list holds them).
_seen: weakref.WeakKeyDictionary[Any, tuple[list[Any], int, set[int]]] = weakref.WeakKeyDictionary()


def on_commit_ids(connection: Any) -> set[int]:
    """The ids of the callbacks ``connection`` runs if its transaction commits.

    Read incrementally: Django only appends to ``run_on_commit``, and
    replaces the list whenever a transaction or savepoint ends, so asking
    once per save of a long transaction costs one pass over the list in
    all, not one each.
    """
    hooks = connection.run_on_commit
    seen = _seen.get(connection)
    if seen is None or seen[0] is not hooks or len(hooks) < seen[1]:
        seen = (hooks, 0, set())
    hooks_list, known, ids = seen
    if len(hooks) != known:
        ids.update(id(entry[1]) for entry in hooks[known:])
        _seen[connection] = (hooks_list, len(hooks), ids)
    return ids


def on_commit_pending(connection: Any, func: Callable[[], None]) -> bool:
    """True when ``func`` is already registered with ``on_commit`` on ``connection``."""
    return id(func) in on_commit_ids(connection)


def wrap_reset_sequences(testcases: Any, after: Callable[[str], object]) -> None:
    """Run ``after(db_name)`` whenever ``TransactionTestCase._reset_sequences`` has run."""
    test_case: Any = testcases.TransactionTestCase
    original = test_case._reset_sequences

    def _reset_sequences(db_name: str) -> None:
        original(db_name)
        after(db_name)

    test_case._reset_sequences = staticmethod(_reset_sequences)


def wrap_fixture_teardown(testcases: Any, after: Callable[[str], object]) -> None:
    """Run ``after(db_name)`` for each database a ``TransactionTestCase`` has just flushed."""
    test_case: Any = testcases.TransactionTestCase
    original = test_case._fixture_teardown

    def _fixture_teardown(self: Any) -> None:
        original(self)
        for db_name in self._databases_names(include_mirrors=False):
            after(db_name)

    test_case._fixture_teardown = _fixture_teardown
