"""MariaDB/MySQL: sequence names compare byte for byte, as on every other database.

The server's default collations fold case and accents, so ``orders`` and
``Orders`` (or ``cafe`` and ``café``) were one ``sys_sequence`` row, and the
second sequence silently took the first one's values. The model is
unmanaged and the store owns the schema, so the store alters the ``name``
columns of ``sys_sequence`` and of the worker-lease table (when it exists)
to ``utf8mb4_bin``; no two stored rows can collide, since the old collation
had already made them one. Nothing to do on PostgreSQL and SQLite, whose
comparisons are binary already. Going back leaves the collation: older code
works with it.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def make_names_binary(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    from autoseq.stores.sql import make_names_binary
    from autoseq.stores.sql.workers import worker_table_name
    from autoseq_django import registry as sequences

    store = sequences.store(connection.alias)
    store.create_table()  # makes sys_sequence's names binary
    with store.engine.begin() as sql:
        make_names_binary(sql, worker_table_name(store.table_name), store.statement_timeout / 2)


class Migration(migrations.Migration):
    dependencies = [("autoseq", "0003_sqlite_companion_only")]

    operations = [
        migrations.RunPython(
            make_names_binary,
            migrations.RunPython.noop,
            atomic=False,  # DDL: MySQL cannot run it inside a transaction
            hints={"model_name": "syssequence"},
        ),
    ]
