"""No explicit key: ``default_auto_field`` gives every model a sequence key."""

from __future__ import annotations

from django.db import models


class Widget(models.Model):
    name = models.CharField(max_length=40)


class Place(models.Model):
    """A multi-table parent: its key comes from the app's default_auto_field."""

    name = models.CharField(max_length=40)


class Restaurant(Place):
    """A multi-table child of ``Place``."""

    serves = models.CharField(max_length=40, default="")


class Tag(models.Model):
    """Linked to ``Post`` through an auto-created many-to-many table."""

    name = models.CharField(max_length=40, unique=True)


class Post(models.Model):
    """Its ``tags`` table is auto-created, keyed by the app's default_auto_field."""

    title = models.CharField(max_length=40)
    tags = models.ManyToManyField(Tag)
