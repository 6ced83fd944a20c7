"""``reset_sequences=True`` in a ``TransactionTestCase`` resets autoseq's sequences too.

Django resets the database's own sequences before each such test, so keys
start at 1 again; without this, sequence keys would keep growing. Only
test databases are touched: the hook is installed when Django migrates
databases while its test framework is loaded, and it wraps
``TransactionTestCase._reset_sequences``, which nothing else calls.

The flush that ends each ``TransactionTestCase`` also deletes the rows that
django-sequences' API (``get_next_value`` and co.) created in the flushed
test database, as django-sequences' own table is flushed: tests written for
it start each test from ``initial_value``. Rows of model fields stay (see
``SysSequence``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from django.db import router

from autoseq import maintenance as core
from autoseq_django import _compat, catchup
from autoseq_django import registry as sequences
from autoseq_django.columns import columns_of, sequence_fields, sequence_models, users
from autoseq_django.tables import has_table, table_names

_installed = False


def install_when_testing() -> None:
    """Wrap ``TransactionTestCase._reset_sequences`` once, if Django's test framework is loaded."""
    global _installed
    testcases = sys.modules.get("django.test.testcases")
    if _installed or testcases is None:
        return
    _compat.wrap_reset_sequences(testcases, reset_sequences)
    _compat.wrap_fixture_teardown(testcases, forget_api_rows)
    _installed = True


#: Rows django-sequences' API used while testing: (write alias, name, gapless) ->
#: the API's own ``delete`` (passed in, so this module need not import the API's).
_api_rows: dict[tuple[str, str, bool], Callable[..., object]] = {}


def note_api_row(alias: str, name: str, gapless: bool, delete: Callable[..., object]) -> None:
    """Remember a row django-sequences' API used, so a test flush deletes it (tests only)."""
    if _installed:
        _api_rows[(alias, name, gapless)] = delete


def forget_api_rows(using: str) -> list[str]:
    """Delete the API's rows of test database ``using`` (not those a model field uses)."""
    deleted = []
    for row in sorted(r for r in _api_rows if r[0] == using):
        delete = _api_rows.pop(row)
        alias, name, gapless = row
        if not users(name):
            delete(name, using=alias, gapless=gapless)
            deleted.append(name)
    return deleted


def reset_sequences(using: str) -> list[str]:
    """Restart every sequence used in database ``using`` at its start (past rows still there).

    For test databases between tests: values go back, which is only safe
    when no other process holds blocks of these sequences. Returns the names.
    """
    by_name: dict[str, list[Any]] = {}
    tables = table_names(using)
    for model in sequence_models():
        if not router.allow_migrate_model(using, model):
            continue
        if not has_table(using, model, tables):
            continue
        for field in sequence_fields(model):
            by_name.setdefault(field.sequence_name, []).append(field)
            field._known.pop(using, None)
    catchup.forget(using)
    sequence_alias = sequences.sequence_database(using)
    store = sequences.store(sequence_alias)
    for name in sorted(by_name):
        row = store.read(name)
        if row is None:
            continue
        # Every database drawing from this store counts, not only ``using``.
        tops = [c.value for c in columns_of(name, sequence_alias) if c.value is not None]
        target = row.first_value_after(max(tops) if tops else None)
        if target != row.next_value:
            core.set_current(store, name, target, force=True, floor=max(tops) if tops else None)
        sequences.forget(sequence_alias, name)
    return sorted(by_name)
