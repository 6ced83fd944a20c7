"""SQLite: drop the empty ``sys_sequence`` that 0001 used to create in the main file.

A SQLite file's sequences have always lived in its companion
(``db.sqlite3.autoseq``); the main file's table stayed empty and now would
hide the companion, which Django's connections attach read-only. A table
holding rows (something else wrote there) is left alone. Going back
creates nothing: no code reads the main file's table.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def drop_unused_main_table(apps: Any, schema_editor: Any) -> None:
    from autoseq_django.sqlite import has_companion

    connection = schema_editor.connection
    if not has_companion(connection):
        return
    with connection.cursor() as cursor:
        if "sys_sequence" not in connection.introspection.table_names(cursor):
            return
        cursor.execute("SELECT COUNT(*) FROM main.sys_sequence")
        (count,) = cursor.fetchone()
        if count == 0:
            cursor.execute("DROP TABLE main.sys_sequence")


class Migration(migrations.Migration):
    dependencies = [("autoseq", "0002_syssequence_version")]

    operations = [
        migrations.RunPython(
            drop_unused_main_table,
            migrations.RunPython.noop,
            hints={"model_name": "syssequence"},
        ),
    ]
