"""Add ``version`` to ``sys_sequence``: every write bumps it, every hand-back compares it.

The model is unmanaged, so the column is added by the store itself, and only
where it is missing (a SQLAlchemy service sharing the table may have added it
already). Rows that were there read as version 0. Going back leaves the
column: older code ignores it.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models


def add_version_column(apps: Any, schema_editor: Any) -> None:
    from autoseq_django import registry as sequences

    connection = schema_editor.connection
    sequences.store(connection.alias).create_table()
    if connection.vendor == "sqlite":
        # An in-memory database whose connections cannot attach their store
        # (BEGIN IMMEDIATE) keeps the empty table of 0001: give it the column
        # too, so SysSequence queries read it instead of failing.
        with connection.cursor() as cursor:
            cursor.execute("SELECT name FROM main.sqlite_master WHERE type = 'table'")
            if "sys_sequence" not in {row[0] for row in cursor.fetchall()}:
                return
            cursor.execute("PRAGMA main.table_info(sys_sequence)")
            if "version" in {row[1] for row in cursor.fetchall()}:
                return
        model = apps.get_model("autoseq", "SysSequence")
        schema_editor.add_field(model, model._meta.get_field("version"))


class Migration(migrations.Migration):
    dependencies = [("autoseq", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="syssequence",
            name="version",
            field=models.BigIntegerField(
                default=0, help_text="Bumped by every write; hand-backs compare it."
            ),
        ),
        migrations.RunPython(
            add_version_column,
            migrations.RunPython.noop,
            atomic=False,  # DDL: MySQL cannot run it inside a transaction
            hints={"model_name": "syssequence"},
        ),
    ]
