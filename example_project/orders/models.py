"""An order: its key and its customer-facing number both come from sequences."""

from __future__ import annotations

from django.db import models

from autoseq_django.fields import SequenceField


class Order(models.Model):
    id = SequenceField(primary_key=True, batch_count=200)
    number = SequenceField(sequence="order_numbers", start=100_000, batch_count=500, unique=True)
    customer = models.CharField(max_length=60)
    total_cents = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"order {self.number}"
