from django.db import migrations, models

import autoseq_django.fields


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                (
                    "id",
                    autoseq_django.fields.SequenceField(
                        batch_count=200, primary_key=True, serialize=False
                    ),
                ),
                (
                    "number",
                    autoseq_django.fields.SequenceField(
                        batch_count=500, sequence="order_numbers", start=100000, unique=True
                    ),
                ),
                ("customer", models.CharField(max_length=60)),
                ("total_cents", models.IntegerField()),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "ordering": ("-id",),
            },
        ),
    ]
