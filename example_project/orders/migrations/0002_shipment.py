import django.db.models.deletion
from django.db import migrations, models

import autoseq_django.fields


class Migration(migrations.Migration):
    dependencies = [
        ("orders", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Shipment",
            fields=[
                (
                    "id",
                    autoseq_django.fields.SnowflakeField(primary_key=True, serialize=False),
                ),
                ("carrier", models.CharField(max_length=30)),
                (
                    "order",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="shipments",
                        to="orders.order",
                    ),
                ),
            ],
        ),
    ]
