"""SequenceAutoField: DEFAULT_AUTO_FIELD and AppConfig.default_auto_field with sequence keys."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections, models
from django.db.migrations.executor import MigrationExecutor
from django.test import override_settings
from django.test.utils import isolate_apps

from autoseq_django import registry as sequences
from autoseq_django.fields import SequenceAutoField
from django_tests.switch.models import Place, Post, Restaurant, Tag, Widget


@pytest.mark.django_db
def test_default_auto_field_setting_gives_sequence_keys() -> None:
    """DEFAULT_AUTO_FIELD = SequenceAutoField passes Django's check and keys every model."""
    with (
        override_settings(DEFAULT_AUTO_FIELD="autoseq_django.fields.SequenceAutoField"),
        isolate_apps("django_tests.testapp"),
    ):

        class Gadget(models.Model):
            class Meta:
                app_label = "testapp"

        pk = Gadget._meta.pk
        assert isinstance(pk, SequenceAutoField)
        assert pk.sequence_name == "testapp_gadget"
        assert Gadget._meta.auto_field is pk
        assert pk.check() == []


def test_app_default_auto_field_inserts_from_the_sequence(backend: str) -> None:
    """A model keyed by its app's default_auto_field takes consecutive sequence keys."""
    first = Widget.objects.using(backend).create(name="a")
    bulk = Widget.objects.using(backend).bulk_create([Widget(name="b") for _ in range(5)])
    assert isinstance(Widget._meta.pk, SequenceAutoField)
    assert [w.pk for w in bulk] == list(range(first.pk + 1, first.pk + 6))
    stored = sequences.store(sequences.sequence_database(backend)).read("switch_widget")
    assert stored is not None
    assert stored.next_value > bulk[-1].pk


@pytest.mark.django_db
def test_drf_maps_the_auto_field_read_only() -> None:
    """Django REST framework sees an AutoField: the key is read-only."""
    from rest_framework import serializers

    class WidgetSerializer(serializers.ModelSerializer):  # type: ignore[type-arg]
        class Meta:
            model = Widget
            fields = "__all__"

    assert WidgetSerializer().fields["id"].read_only


@pytest.mark.django_db(databases="__all__")
def test_switch_migration_is_what_makemigrations_writes() -> None:
    """The app's migrations match its models: the switch is one generated AlterField."""
    call_command("makemigrations", "switch", check=True, dry_run=True, verbosity=0)


@pytest.mark.autoseq_transaction
def test_switch_from_bigautofield_continues_past_rows(backend: str) -> None:
    """BigAutoField rows, then makemigrations' AlterField and migrate: new keys follow max(id)."""
    call_command("migrate", "switch", "0001", database=backend, verbosity=0)
    try:
        state = MigrationExecutor(connections[backend]).loader.project_state(
            ("switch", "0001_initial")
        )
        old_widget = state.apps.get_model("switch", "Widget")
        old_widget.objects.using(backend).bulk_create([old_widget(name=f"{i}") for i in range(30)])
        stored = sequences.store(sequences.sequence_database(backend)).read("switch_widget")
        # Past anything the sequence handed out, so only the migration explains it.
        old_max = (stored.next_value if stored else 1) + 500
        old_widget.objects.using(backend).create(id=old_max, name="far")
    finally:
        call_command("migrate", "switch", database=backend, verbosity=0)
    first = Widget.objects.using(backend).create(name="new")
    bulk = Widget.objects.using(backend).bulk_create([Widget(name="bulk") for _ in range(5)])
    assert first.pk == old_max + 1
    assert [w.pk for w in bulk] == list(range(old_max + 2, old_max + 7))
    assert Widget.objects.using(backend).count() == 37


def test_child_for_an_existing_parent_keeps_the_parent_row(backend: str) -> None:
    """Restaurant(place_ptr=place) updates the parent row, never inserts it again."""
    place = Place.objects.using(backend).create(name="corner")
    places = Place.objects.using(backend).count()
    made = Restaurant.objects.using(backend).create(place_ptr=place, name="corner", serves="tea")
    assert made.pk == place.pk
    assert Place.objects.using(backend).count() == places
    assert Restaurant.objects.using(backend).get(pk=place.pk).serves == "tea"
    fresh = Restaurant.objects.using(backend).create(name="new", serves="soup")
    assert fresh.pk > place.pk
    assert Place.objects.using(backend).count() == places + 1


def test_save_with_an_existing_key_updates_the_row(backend: str) -> None:
    """Tag(id=<existing>).save() updates that row, as with BigAutoField; a new key inserts."""
    tag = Tag.objects.using(backend).create(name="before")
    Tag(id=tag.pk, name="after").save(using=backend)
    assert Tag.objects.using(backend).get(pk=tag.pk).name == "after"
    Tag(id=tag.pk + 10**6, name="far").save(using=backend)
    assert Tag.objects.using(backend).filter(pk=tag.pk + 10**6).exists()


def test_mixed_bulk_over_several_statements_saves_every_row(backend: str) -> None:
    """60 rows, every other one with a key ahead of the sequence, 10 per INSERT: all saved."""
    base = Tag.objects.using(backend).create(name="base").pk
    ahead = {i: base + 1000 + 2 * i for i in range(0, 60, 2)}
    objs = [Tag(id=ahead.get(i), name=f"mixed{i}") for i in range(60)]
    made = Tag.objects.using(backend).bulk_create(objs, batch_size=10)
    keys = [tag.pk for tag in made]
    assert len(set(keys)) == 60
    assert [keys[i] for i in ahead] == list(ahead.values())
    assert Tag.objects.using(backend).filter(name__startswith="mixed").count() == 60
    later = Tag.objects.using(backend).create(name="later")
    assert later.pk > max(ahead.values())  # the given keys were caught up with


def test_ignore_conflicts_leaves_skipped_objects_without_keys(backend: str) -> None:
    """bulk_create(ignore_conflicts=True) of clashing rows stores nothing and keeps no key."""
    Tag.objects.using(backend).bulk_create([Tag(name="one"), Tag(name="two")])
    clashing = [Tag(name="one"), Tag(name="two")]
    Tag.objects.using(backend).bulk_create(clashing, ignore_conflicts=True)
    assert [tag.pk for tag in clashing] == [None, None]
    assert Tag.objects.using(backend).filter(name__in=["one", "two"]).count() == 2


@pytest.mark.autoseq_transaction
def test_links_after_a_lost_row_start_past_existing_links(backend: str) -> None:
    """The auto-created m2m table's sequence starts past its rows: every new link is saved."""
    tags = Tag.objects.using(backend).bulk_create([Tag(name=f"t{i}") for i in range(9)])
    for i in range(3):
        Post.objects.using(backend).create(title=f"p{i}").tags.set(tags[i * 3 : i * 3 + 3])
    through = Post.tags.through
    store = sequences.store(sequences.sequence_database(backend))
    store.delete(through._meta.db_table)  # as if the key had just switched to ours
    sequences.reset()
    post = Post.objects.using(backend).create(title="new")
    post.tags.set(tags[:7])
    assert through.objects.using(backend).count() == 9 + 7
    assert post.tags.count() == 7


@pytest.mark.autoseq_transaction
def test_first_insert_after_migrate_costs_one_query(backend: str) -> None:
    """After migrate, a new process's first bulk_create is its INSERT alone (no max() read)."""
    from django.test.utils import CaptureQueriesContext

    store = sequences.store(sequences.sequence_database(backend))
    store.delete("switch_post")
    sequences.reset()
    call_command("migrate", database=backend, verbosity=0)
    sequences.reset()  # a fresh worker process
    with CaptureQueriesContext(connections[backend]) as queries:
        Post.objects.using(backend).bulk_create([Post(title="a"), Post(title="b")])
    statements = [q["sql"].split()[0].upper() for q in queries.captured_queries]
    assert [s for s in statements if s not in ("BEGIN", "COMMIT")] == ["INSERT"]


def test_update_conflicts_leaves_the_stored_key(backend: str) -> None:
    """bulk_create(update_conflicts=True) over an existing row: the object names that row."""
    stored = Tag.objects.using(backend).create(name="kept")
    objs = [Tag(name="kept")]
    Tag.objects.using(backend).bulk_create(
        objs, update_conflicts=True, unique_fields=_upsert_target(backend), update_fields=["name"]
    )
    # BigAutoField: the row's key, or None where no rows come back from a bulk INSERT (MySQL)
    assert objs[0].pk in (stored.pk, None)


def _upsert_target(backend: str) -> list[str] | None:
    # MariaDB's ON DUPLICATE KEY UPDATE names no conflict target: Django refuses one.
    return ["name"] if connections[backend].features.supports_update_conflicts_with_target else None


def _upsert_keys(model: type[models.Model], backend: str) -> tuple[list[Any], list[Any]]:
    """What an upsert of 2 existing and 2 new names, 3 per INSERT, leaves on the objects.

    Returns the objects' keys relative to the stored rows (the row each names,
    by position, or None) and the stored names by key order.
    """
    manager = model._default_manager.using(backend)
    manager.bulk_create([model(name="a"), model(name="b")])
    objs = [model(name=name) for name in ("new1", "b", "new2", "a")]
    manager.bulk_create(
        objs,
        update_conflicts=True,
        unique_fields=_upsert_target(backend),
        update_fields=["name"],
        batch_size=3,
    )
    stored = dict(manager.values_list("pk", "name"))
    named = [None if obj.pk is None else stored.get(obj.pk) for obj in objs]
    return named, sorted(stored.values())


def test_update_conflicts_sets_keys_as_bigautofield_does(backend: str) -> None:
    """Each object of an upsert names the row it became, exactly as a BigAutoField model's."""
    from django_tests.testapp.models import BaselineTag

    ours = _upsert_keys(Tag, backend)
    theirs = _upsert_keys(BaselineTag, backend)
    assert ours == theirs
    if connections[backend].features.can_return_rows_from_bulk_insert:
        assert ours[0] == ["new1", "b", "new2", "a"]  # each object holds its row's key
    keys = list(Tag.objects.using(backend).values_list("pk", flat=True))
    later = Tag.objects.using(backend).create(name="later")  # taken past the filled keys
    assert later.pk not in keys
    assert Tag.objects.using(backend).count() == len(keys) + 1


@pytest.mark.django_db(databases=["sqlite", "default"])
def test_update_conflicts_without_returned_rows_keeps_no_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where no rows come back from a bulk INSERT (MySQL; SQLite < 3.35): no key, as Django's.

    SQLite told it cannot return columns from an INSERT, which Django's
    own code then believes too; both models are compared under it.
    """
    from django_tests.testapp.models import BaselineTag

    features = connections["sqlite"].features
    monkeypatch.setitem(features.__dict__, "can_return_columns_from_insert", False)
    assert not features.can_return_rows_from_bulk_insert
    ours = _upsert_keys(Tag, "sqlite")
    assert ours == _upsert_keys(BaselineTag, "sqlite")
    assert ours[0] == [None, None, None, None]


def test_inserts_work_while_the_installed_apps_leave_autoseq_out(backend: str) -> None:
    """Django's own suite narrows INSTALLED_APPS (``override_settings``) and still saves
    rows keyed by sequences (its migration records): the SysSequence model is found
    though its app is not installed for the moment (142 of Django's tests raised
    LookupError: "No installed app with label 'autoseq'" when it was looked up by label)."""
    from django.conf import settings

    before = Widget.objects.using(backend).create(name="before")
    narrowed = [app for app in settings.INSTALLED_APPS if app != "autoseq_django"]
    with override_settings(INSTALLED_APPS=narrowed):
        sequences.changed()  # as a new process would: the routing is looked up again
        during = Widget.objects.using(backend).create(name="during")
    assert during.pk > before.pk
