"""Every use autoseq_django makes of Django's private internals, in one place.

Django documents no way for a field to see the whole INSERT it is part of,
to find its own ``on_commit`` callbacks, or to hook the test runner's
sequence reset, so these helpers reach into undocumented attributes. Tested
with Django 5.2 (5.2.19); a Django release that renames one of them breaks
only this module. (``Model._meta`` and ``_base_manager`` are documented
API and used where needed.)
"""

from __future__ import annotations

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


def on_commit_pending(connection: Any, func: Callable[[], None]) -> bool:
    """True when ``func`` is already registered with ``on_commit`` on ``connection``."""
    return any(entry[1] is func for entry in connection.run_on_commit)


def wrap_reset_sequences(testcases: Any, after: Callable[[str], object]) -> None:
    """Run ``after(db_name)`` whenever ``TransactionTestCase._reset_sequences`` has run."""
    test_case: Any = testcases.TransactionTestCase
    original = test_case._reset_sequences

    def _reset_sequences(db_name: str) -> None:
        original(db_name)
        after(db_name)

    test_case._reset_sequences = staticmethod(_reset_sequences)
