"""An order: its key and its customer-facing number come from sequences, its reference
is a daily serial (ORD-YYYYMMDD-NNNNN); an invoice is numbered gapless per year
(INV-YYYY-NNNNNN, taken in the invoice's own transaction); a shipment's key is a
snowflake id (64-bit, time-ordered, no round trip per row)."""

from __future__ import annotations

from django.db import models

from autoseq_django.fields import SequenceField, SerialField, SnowflakeField


class Order(models.Model):
    id = SequenceField(primary_key=True, batch_count=200)
    number = SequenceField(sequence="order_numbers", start=100_000, batch_count=500, unique=True)
    # Served from blocks like the keys: fast, gaps possible; restarts at 1 each day.
    reference = SerialField("ORD-{date:%Y%m%d}-{n:05d}", period="day", unique=True, null=True)
    customer = models.CharField(max_length=60)
    total_cents = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"order {self.number}"


class Shipment(models.Model):
    id = SnowflakeField(primary_key=True)
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="shipments")
    carrier = models.CharField(max_length=30)

    def __str__(self) -> str:
        return f"shipment {self.id}"


class Invoice(models.Model):
    # Gapless: taken inside the save's atomic() block, given back if it rolls back.
    number = SerialField("INV-{date:%Y}-{n:06d}", period="year", gapless=True, unique=True)
    order = models.OneToOneField(Order, on_delete=models.CASCADE, related_name="invoice")
    total_cents = models.IntegerField()

    def __str__(self) -> str:
        return f"invoice {self.number}"
