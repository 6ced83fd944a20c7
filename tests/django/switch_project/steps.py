"""``python steps.py before|after``: write rows, print what the database holds as JSON."""

from __future__ import annotations

import json
import sys

import django

django.setup()

from shop.models import Place, Post, Restaurant, Tag  # noqa: E402


def before() -> None:
    """With BigAutoField: 9 links, 3 places (one a restaurant)."""
    tags = [Tag.objects.create(name=f"old{i}") for i in range(3)]
    for i in range(3):
        Post.objects.create(title=f"old{i}").tags.set(tags)
    for i in range(2):
        Place.objects.create(name=f"place{i}")
    Restaurant.objects.create(name="old restaurant", serves="soup")


def after() -> None:
    """With SequenceAutoField: 7 new links, a restaurant for an old place and a new one."""
    new_tags = [Tag.objects.create(name=f"new{i}") for i in range(4)]
    Post.objects.create(title="new").tags.set(
        [*Tag.objects.filter(name__startswith="old"), *new_tags]
    )
    Tag.objects.bulk_create([Tag(name=f"bulk{i}") for i in range(5)])
    place = Place.objects.get(name="place0")
    Restaurant.objects.create(place_ptr=place, name=place.name, serves="pizza")
    Restaurant.objects.create(name="new restaurant", serves="tea")


def raw() -> None:
    """Rows far ahead written behind the ORM's back (a restored dump, another tool)."""
    from django.db import connection
    from django.utils import timezone

    post, tag = Post.objects.get(title="old0"), Tag.objects.create(name="raw")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_migrations (id, app, name, applied) VALUES (%s, %s, %s, %s)",
            [10**6, "shop", "9999_restored", timezone.now()],
        )
        cursor.execute(
            "INSERT INTO shop_post_tags (id, post_id, tag_id) VALUES (%s, %s, %s)",
            [10**6, post.pk, tag.pk],
        )


def counts() -> dict[str, int]:
    """Rows and links the database holds."""
    return {
        "tags": Tag.objects.count(),
        "posts": Post.objects.count(),
        "links": Post.tags.through.objects.count(),
        "new_post_links": Post.objects.get(title="new").tags.count()
        if Post.objects.filter(title="new").exists()
        else 0,
        "places": Place.objects.count(),
        "restaurants": Restaurant.objects.count(),
    }


if __name__ == "__main__":
    {"before": before, "after": after, "raw": raw}[sys.argv[1]]()
    print(json.dumps(counts()))
