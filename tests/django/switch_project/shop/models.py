"""Models with no explicit key: ``DEFAULT_AUTO_FIELD`` keys them and their link table."""

from __future__ import annotations

from django.db import models


class Tag(models.Model):
    name = models.CharField(max_length=40, unique=True)


class Post(models.Model):
    title = models.CharField(max_length=40)
    tags = models.ManyToManyField(Tag)


class Place(models.Model):
    name = models.CharField(max_length=40)


class Restaurant(Place):
    serves = models.CharField(max_length=40, default="")
