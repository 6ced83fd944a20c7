"""SnowflakeField and SnowflakeAutoField on SQLite (file), PostgreSQL and MariaDB."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.conf import settings
from django.core import serializers
from django.db import models
from django.test import override_settings
from django.test.utils import isolate_apps

from autoseq.workers import worker_leases
from autoseq_django import registry as sequences
from autoseq_django.fields import SnowflakeAutoField, SnowflakeField
from autoseq_django.snowflake import close_generators, generator


class SnowEvent(models.Model):
    """A snowflake primary key and a second snowflake column of another layout."""

    id = SnowflakeField(primary_key=True)
    ref = SnowflakeField(layout="refs", null=True)
    note = models.CharField(max_length=40, default="")

    class Meta:
        app_label = "testapp"


class SnowAuto(models.Model):
    """SnowflakeAutoField as an explicit key."""

    id = SnowflakeAutoField(primary_key=True)
    note = models.CharField(max_length=40, default="")

    class Meta:
        app_label = "testapp"


@pytest.fixture(autouse=True, scope="module")
def _close_generators() -> Iterator[None]:
    yield
    close_generators()


def worker_of(value: int) -> int:
    return (value >> 12) & 1023


def test_every_save_path_gets_a_snowflake_id(backend: str) -> None:
    """save(), create(), get_or_create() and bulk_create() all get distinct snowflake ids."""
    objects = SnowEvent.objects.using(backend)
    made = [objects.create(note=str(i)) for i in range(3)]
    saved = SnowEvent(note="saved")
    saved.save(using=backend)
    got, created = objects.get_or_create(note="unique")
    bulk = objects.bulk_create([SnowEvent(note=f"b{i}") for i in range(300)])
    every = [*made, saved, got, *bulk]
    ids = [e.pk for e in every]
    assert created
    assert all(isinstance(v, int) and 0 < v < 2**63 for v in ids)
    assert len(set(ids)) == len(ids) == 305
    assert objects.filter(pk__in=ids).count() == 305
    gen = generator(backend)
    assert {worker_of(v) for v in ids} == {gen.worker_id}
    refs = [e.ref for e in every]
    assert len(set(refs)) == 305
    assert {worker_of(v) for v in refs} == {generator(backend, "refs").worker_id}


def held_leases(alias: str) -> set[tuple[str, int]]:
    """(layout, worker id) of the leases held now where rows written to ``alias`` lease."""
    leases = worker_leases(sequences.store(sequences.sequence_database(alias)))
    return {(lease.name, lease.worker) for lease in leases.list_workers() if lease.owner}


def test_ids_are_leased_where_the_row_is_written(backend: str) -> None:
    """save(using=), .using().create() and bulk_create() lease on that database, not default's."""
    close_generators()
    assert held_leases("default") == set()
    saved = SnowEvent(note="saved")
    saved.save(using=backend)
    objects = SnowEvent.objects.using(backend)
    rows = [saved, objects.create(), *objects.bulk_create([SnowEvent() for _ in range(5)])]
    auto = SnowAuto.objects.using(backend).create()
    assert held_leases("default") == set()
    leased = {
        ("default", generator(backend).worker_id),
        ("refs", generator(backend, "refs").worker_id),
    }
    assert held_leases(backend) == leased
    assert {("default", worker_of(row.pk)) for row in [*rows, auto]} | {
        ("refs", worker_of(row.ref)) for row in rows
    } == leased


def test_a_settings_change_gives_the_old_generators_leases_back(backend: str) -> None:
    """After an AUTOSEQ change (override_settings in a test) no old store's generator lives on.

    Each one kept its worker id and heartbeat: a suite overriding the
    settings test after test held more and more, and their connections kept
    the test database from being dropped.
    """
    close_generators()
    generator(backend).next()
    with override_settings(AUTOSEQ=dict(getattr(settings, "AUTOSEQ", {}))):
        generator(backend).next()
    assert held_leases(backend) == set()
    fresh = generator(backend)
    assert held_leases(backend) == {("default", fresh.worker_id)}


def test_ids_increase_in_insert_order(backend: str) -> None:
    """Rows saved one after another get increasing ids."""
    ids = [SnowEvent.objects.using(backend).create().pk for _ in range(20)]
    assert ids == sorted(ids)


def test_explicit_values_are_kept(backend: str) -> None:
    """An id and a ref set by the user are stored as given."""
    SnowEvent.objects.using(backend).create(id=77, ref=88)
    row = SnowEvent.objects.using(backend).get(pk=77)
    assert row.ref == 88


def test_raw_saves_get_an_id_when_empty(backend: str) -> None:
    """Deserialized rows without a key (what loaddata saves) get one; given keys stay."""
    data = '[{"model": "testapp.snowevent", "pk": null, "fields": {"note": "x", "ref": null}},'
    data += ' {"model": "testapp.snowevent", "pk": 5, "fields": {"note": "y", "ref": 6}}]'
    for obj in serializers.deserialize("json", data):
        obj.save(using=backend)
    rows = {row.note: row for row in SnowEvent.objects.using(backend).all()}
    assert rows["x"].pk > 2**22
    assert rows["x"].ref is not None
    assert (rows["y"].pk, rows["y"].ref) == (5, 6)


def test_snowflake_auto_field_is_a_plain_bigint_key(backend: str) -> None:
    """SnowflakeAutoField stores snowflake ids in a BIGINT column the database never numbers."""
    rows = SnowAuto.objects.using(backend).bulk_create([SnowAuto() for _ in range(50)])
    single = SnowAuto.objects.using(backend).create()
    ids = [r.pk for r in [*rows, single]]
    assert len(set(ids)) == 51
    assert all(v > 2**22 for v in ids)
    from django.db import connections

    column = SnowAuto._meta.pk
    assert column is not None
    assert column.db_type(connections[backend]) == models.BigIntegerField().db_type(
        connections[backend]
    )


@isolate_apps("django_tests.testapp")
def test_snowflake_auto_field_as_default_auto_field() -> None:
    """DEFAULT_AUTO_FIELD = SnowflakeAutoField gives models without a key snowflake keys."""
    with override_settings(DEFAULT_AUTO_FIELD="autoseq_django.fields.SnowflakeAutoField"):

        class Plain(models.Model):
            class Meta:
                app_label = "testapp"

    assert isinstance(Plain._meta.pk, SnowflakeAutoField)
    assert Plain._meta.pk.primary_key
    assert Plain._meta.pk.check() == []


def test_fields_deconstruct_for_migrations() -> None:
    """Migrations record the layout when it is not the default, and nothing else extra."""
    _, path, _, kwargs = SnowEvent._meta.get_field("ref").deconstruct()
    assert path == "autoseq_django.fields.SnowflakeField"
    assert kwargs == {"layout": "refs", "null": True}
    _, path, _, kwargs = SnowAuto._meta.get_field("id").deconstruct()
    assert path == "autoseq_django.fields.SnowflakeAutoField"
    assert kwargs == {"primary_key": True, "serialize": False}


def test_migrations_naming_the_old_module_load_and_makemigrations_sees_no_change() -> None:
    """`autoseq_django.snowflake_fields` (before issue 32) still gives the fields, with a warning.

    Their ``deconstruct()`` still names `autoseq_django.fields`, so migrations
    written before the move compare equal and ``makemigrations`` writes nothing.
    """
    from django.db.migrations.autodetector import MigrationAutodetector
    from django.db.migrations.graph import MigrationGraph
    from django.db.migrations.state import ModelState, ProjectState
    from django.utils.module_loading import import_string

    with pytest.warns(DeprecationWarning, match="autoseq_django.snowflake"):
        old_field = import_string("autoseq_django.snowflake_fields.SnowflakeField")
    with pytest.warns(DeprecationWarning, match="autoseq_django.snowflake"):
        old_auto = import_string("autoseq_django.snowflake_fields.SnowflakeAutoField")
    assert (old_field, old_auto) == (SnowflakeField, SnowflakeAutoField)
    assert SnowflakeField().deconstruct()[1] == "autoseq_django.fields.SnowflakeField"
    assert SnowflakeAutoField().deconstruct()[1] == "autoseq_django.fields.SnowflakeAutoField"
    # What a migration written with the old path declares, against the models now.
    migrated = ProjectState()
    migrated.add_model(
        ModelState(
            "testapp",
            "SnowEvent",
            [
                ("id", old_field(primary_key=True)),
                ("ref", old_field(layout="refs", null=True)),
                ("note", models.CharField(max_length=40, default="")),
            ],
        )
    )
    migrated.add_model(
        ModelState(
            "testapp",
            "SnowAuto",
            [
                ("id", old_auto(primary_key=True)),
                ("note", models.CharField(max_length=40, default="")),
            ],
        )
    )
    now = ProjectState()
    now.add_model(ModelState.from_model(SnowEvent))
    now.add_model(ModelState.from_model(SnowAuto))
    assert MigrationAutodetector(migrated, now).changes(graph=MigrationGraph()) == {}
