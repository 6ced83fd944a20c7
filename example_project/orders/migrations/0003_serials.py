import django.db.models.deletion
from django.db import migrations, models

import autoseq_django.fields


class Migration(migrations.Migration):
    dependencies = [
        ("orders", "0002_shipment"),
    ]

    operations = [
        migrations.AddField(
            model_name="order",
            name="reference",
            field=autoseq_django.fields.SerialField(
                max_length=18,
                null=True,
                period="day",
                template="ORD-{date:%Y%m%d}-{n:05d}",
                unique=True,
            ),
        ),
        migrations.CreateModel(
            name="Invoice",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "number",
                    autoseq_django.fields.SerialField(
                        gapless=True,
                        max_length=15,
                        period="year",
                        template="INV-{date:%Y}-{n:06d}",
                        unique=True,
                    ),
                ),
                ("total_cents", models.IntegerField()),
                (
                    "order",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="invoice",
                        to="orders.order",
                    ),
                ),
            ],
        ),
    ]
