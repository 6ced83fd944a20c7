"""Which tables a Django database has: the lowest layer of the Django package.

Imports nothing of ``autoseq_django``, so every module above (maintenance,
testing, the sync after ``migrate``) can ask without an import cycle.
"""

from __future__ import annotations

from django.db import connections, models


def table_names(alias: str) -> set[str]:
    """The tables of database ``alias``, lower-cased (one introspection query)."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        return {n.lower() for n in connection.introspection.table_names(cursor)}


def has_table(alias: str, model: type[models.Model], tables: set[str] | None = None) -> bool:
    """Whether ``model``'s table exists in database ``alias``.

    ``tables``: the names `table_names` gave already (saves the query).
    """
    return model._meta.db_table.lower() in (table_names(alias) if tables is None else tables)
