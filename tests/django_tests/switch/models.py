"""No explicit key: ``default_auto_field`` gives every model a sequence key."""

from __future__ import annotations

from django.db import models


class Widget(models.Model):
    name = models.CharField(max_length=40)
