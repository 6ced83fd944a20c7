"""``reset_sequences=True`` in a ``TransactionTestCase`` resets autoseq's sequences too.

Django resets the database's own sequences before each such test, so keys
start at 1 again; without this, sequence keys would keep growing. Only
test databases are touched: the hook is installed when Django migrates
databases while its test framework is loaded, and it wraps
``TransactionTestCase._reset_sequences``, which nothing else calls.
"""

from __future__ import annotations

import sys
from typing import Any

from django.apps import apps as global_apps
from django.db import router

from autoseq import maintenance as core
from autoseq_django import _compat

_installed = False


def install_when_testing() -> None:
    """Wrap ``TransactionTestCase._reset_sequences`` once, if Django's test framework is loaded."""
    global _installed
    testcases = sys.modules.get("django.test.testcases")
    if _installed or testcases is None:
        return
    _compat.wrap_reset_sequences(testcases, reset_sequences)
    _installed = True


def reset_sequences(using: str) -> list[str]:
    """Restart every sequence used in database ``using`` at its start (past rows still there).

    For test databases between tests: values go back, which is only safe
    when no other process holds blocks of these sequences. Returns the names.
    """
    from autoseq_django import catchup, sequences
    from autoseq_django.fields import sequence_fields
    from autoseq_django.maintenance import _has_table, columns_of

    by_name: dict[str, list[Any]] = {}
    for model in global_apps.get_models():
        if model._meta.proxy or not router.allow_migrate_model(using, model):
            continue
        if not _has_table(using, model):
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
