"""SequenceAutoField: DEFAULT_AUTO_FIELD and AppConfig.default_auto_field with sequence keys."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connections, models
from django.db.migrations.executor import MigrationExecutor
from django.test import override_settings
from django.test.utils import isolate_apps

from autoseq_django import sequences
from autoseq_django.fields import SequenceAutoField
from django_tests.switch.models import Widget


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
