"""A table that started with AutoField and moved to SequenceField (migrations 0001, 0002)."""

from __future__ import annotations

from django.db import models

from autoseq_django.fields import SequenceField


class Ticket(models.Model):
    id = SequenceField(primary_key=True)
    title = models.CharField(max_length=40)
