"""The documented move from AutoField: AlterField, then sync the sequence past max(id)."""

from django.db import migrations

import autoseq_django
import autoseq_django.fields


class Migration(migrations.Migration):
    dependencies = [("legacy", "0001_initial"), ("autoseq", "0001_initial")]
    operations = [
        migrations.AlterField(
            model_name="ticket",
            name="id",
            field=autoseq_django.fields.SequenceField(primary_key=True, serialize=False),
        ),
        migrations.RunPython(autoseq_django.sync_sequences, migrations.RunPython.noop),
    ]
