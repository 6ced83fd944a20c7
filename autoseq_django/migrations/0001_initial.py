"""Create ``sys_sequence`` unless it exists (a SQLAlchemy service may have made it first).

Going back leaves the table in place: dropping it would restart every
sequence at ``start`` under rows that already hold those values.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models


def create_table_if_missing(apps: Any, schema_editor: Any) -> None:
    model = apps.get_model("autoseq", "SysSequence")
    connection = schema_editor.connection
    from autoseq_django.sqlite import has_companion

    companion = connection.vendor == "sqlite" and str(
        connection.settings_dict.get("NAME") or ""
    ).endswith(".autoseq")
    # A SQLite file's sequences live in its companion, which Django's
    # connections attach: a table here would only hide it.
    if not companion and not has_companion(connection):
        with connection.cursor() as cursor:
            existing = {name.lower() for name in connection.introspection.table_names(cursor)}
        if model._meta.db_table.lower() not in existing:
            schema_editor.create_model(model)
    if connection.vendor == "sqlite":
        # The store keeps SQLite sequences in <NAME>.autoseq (or private
        # memory) and creates that file in WAL mode, which lets Django's own
        # connection read it without ever blocking a reservation.
        from autoseq_django import registry as sequences

        sequences.store(connection.alias).create_table()


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="SysSequence",
            fields=[
                ("name", models.CharField(max_length=191, primary_key=True, serialize=False)),
                ("start", models.BigIntegerField()),
                ("end", models.BigIntegerField()),
                ("step", models.BigIntegerField()),
                (
                    "current",
                    models.BigIntegerField(help_text="The next value no process has reserved yet."),
                ),
                ("batch", models.BooleanField()),
                ("batch_count", models.IntegerField()),
                ("cycle", models.BooleanField()),
                ("updated_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "sequence",
                "db_table": "sys_sequence",
                "ordering": ("name",),
                "managed": False,
            },
        ),
        migrations.RunPython(
            create_table_if_missing,
            migrations.RunPython.noop,
            atomic=False,  # DDL: MySQL cannot run it inside a transaction
            hints={"model_name": "syssequence"},
        ),
    ]
