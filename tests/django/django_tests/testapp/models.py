"""Models of the autoseq_django tests."""

from __future__ import annotations

from django.db import models

from autoseq_django.fields import SequenceField


class Order(models.Model):
    """Sequence primary key (sequence "testapp_order") and a shared ticket sequence."""

    id = SequenceField(primary_key=True, batch_count=50)
    ticket_no = SequenceField(sequence="tickets", start=1000)
    note = models.CharField(max_length=40, default="")


class Line(models.Model):
    """An ordinary BigAutoField table with a sequence column (not unique)."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, null=True)
    code = SequenceField(sequence="line_codes", step=10, batch_count=20)


class Invoice(models.Model):
    """Tiny blocks, to cross many block boundaries in a few rows."""

    id = SequenceField(primary_key=True, batch_count=7)
    amount = models.IntegerField(default=0)


class Baseline(models.Model):
    """The same shape as Invoice with Django's own key, for comparisons."""

    id = models.BigAutoField(primary_key=True)
    amount = models.IntegerField(default=0)


class BaselineTag(models.Model):
    """Django's own key and a unique name: what bulk_create's upserts leave on objects."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=40, unique=True)


class Parcel(models.Model):
    """A key with no sequence arguments: everything from AUTOSEQ["DEFAULTS"]."""

    id = SequenceField(primary_key=True)


class OrderItem(models.Model):
    """Rows edited inline under their Order in the admin; a sequence key of their own."""

    id = SequenceField(primary_key=True)
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="items")
    sku = models.CharField(max_length=20)


class Coupon(models.Model):
    """A key sequence that ends early: keys past its end are somebody else's range."""

    id = SequenceField(primary_key=True, end=10**6)


# Serials (issue 14) ---------------------------------------------------------------
from autoseq_django.fields import SerialField  # noqa: E402


class Ticket(models.Model):
    """A daily order-style serial beside a sequence key."""

    id = SequenceField(primary_key=True)
    number = SerialField("ORD-{date:%Y%m%d}-{n:05d}", period="day", batch_count=5, unique=True)


class Receipt(models.Model):
    """A gapless yearly serial, as invoices need."""

    number = SerialField("RC-{date:%Y}-{n:06d}", period="year", gapless=True, unique=True)
    amount = models.IntegerField(default=0)


class Voucher(models.Model):
    """A gapless integer key: taken in the caller's atomic(), given back on rollback."""

    id = SequenceField(primary_key=True, gapless=True)
    amount = models.IntegerField(default=0)


class Slip(models.Model):
    """Gapless columns with no unique index (issue 29), beside a key that is never reused.

    Not Django's AutoField: on SQLite its AUTOINCREMENT counter rolls back
    too, so Django's own retry would update another writer's row.
    """

    id = SequenceField(primary_key=True)
    number = SerialField("SL-{n:05d}", gapless=True)
    seq_no = SequenceField(sequence="slip_seq", gapless=True)
    note = models.CharField(max_length=20, default="")
