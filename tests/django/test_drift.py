"""A field whose arguments changed after its row was stored: check W002 and `autoseq apply`."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.apps.registry import Apps
from django.core.management import call_command
from django.db import models
from django.test.utils import isolate_apps

from autoseq import SequenceConfig, SequenceNotFound
from autoseq_django import checks as autoseq_checks
from autoseq_django import maintenance
from autoseq_django import registry as sequences
from autoseq_django.fields import SequenceField
from django_tests.testapp.models import Order


@pytest.fixture
def changed_field() -> Iterator[tuple[Apps, str]]:
    """A model whose field now asks for start=50000, step=1, batch_count=7."""
    name = f"drift_{uuid.uuid4().hex[:10]}"
    with isolate_apps("django_tests.testapp") as isolated:

        class Thing(models.Model):
            code = SequenceField(sequence=name, start=50_000, batch_count=7)

            class Meta:
                app_label = "testapp"

        yield isolated, name


def store_old_row(backend: str, name: str, **settings: Any) -> None:
    """The row as the field's earlier arguments created it."""
    store = sequences.store(sequences.sequence_database(backend))
    store.create(SequenceConfig(name, **settings))


def test_changed_arguments_are_reported(backend: str, changed_field: tuple[Apps, str]) -> None:
    """Check W002 names each setting that differs and the command that applies it."""
    isolated, name = changed_field
    store_old_row(backend, name, start=1000, batch_count=100)
    messages = autoseq_checks.check_stored_rows(isolated.get_app_configs(), databases=[backend])
    assert [m.id for m in messages] == ["autoseq.W002"]
    assert "batch_count=7 (stored 100)" in messages[0].msg
    assert "start=50000 (stored current=1000)" in messages[0].msg
    assert f"manage.py autoseq apply {name} --database {backend}" in (messages[0].hint or "")


def test_apply_writes_the_field_settings(backend: str, changed_field: tuple[Apps, str]) -> None:
    """apply moves current up to the new start and writes batch_count; the warning goes away."""
    isolated, name = changed_field
    store_old_row(backend, name, start=1000, batch_count=100)
    [result] = maintenance.apply(backend, names=[name], apps=isolated)
    assert result.changed == {"batch_count": (100, 7), "current": (1000, 50_000)}
    row = sequences.store(sequences.sequence_database(backend)).read(name)
    assert row is not None
    assert (row.next_value, row.batch_count) == (50_000, 7)
    assert autoseq_checks.check_stored_rows(isolated.get_app_configs(), databases=[backend]) == []


def test_a_lower_start_is_not_drift(backend: str) -> None:
    """A row already past the field's start needs nothing: start only matters before it."""
    name = f"drift_{uuid.uuid4().hex[:10]}"
    with isolate_apps("django_tests.testapp") as isolated:

        class Other(models.Model):
            code = SequenceField(sequence=name, start=10)

            class Meta:
                app_label = "testapp"

        store_old_row(backend, name, start=1000)
        configs = isolated.get_app_configs()
        assert autoseq_checks.check_stored_rows(configs, databases=[backend]) == []


def test_project_rows_match_and_apply_says_so(backend: str) -> None:
    """An unchanged field: no W002 for its row, and apply changes nothing."""
    Order.objects.using(backend).create()
    out = StringIO()
    call_command("autoseq", "apply", "testapp_order", "--database", backend, stdout=out)
    assert out.getvalue().strip() == "'testapp_order': already as the fields say"
    # Other tests edit some rows on purpose (the admin's batch_count test, say).
    warnings = autoseq_checks.check_stored_rows(databases=[backend])
    assert [m.msg for m in warnings if "'testapp_order'" in m.msg] == []


def test_manage_py_check_names_the_drift_and_apply_fixes_it(backend: str) -> None:
    """`check --database` prints W002 for a row changed behind the field; `apply` restores it."""
    from django_tests.testapp.models import Coupon

    Coupon.objects.using(backend).create()
    maintenance.change(sequences.sequence_database(backend), "testapp_coupon", {"batch_count": 3})
    err = StringIO()
    call_command("check", databases=[backend], stdout=StringIO(), stderr=err)
    assert "autoseq.W002" in err.getvalue()
    assert "testapp.Coupon.id asks for batch_count=100 (stored 3)" in err.getvalue()
    assert f"manage.py autoseq apply testapp_coupon --database {backend}" in err.getvalue()
    out = StringIO()
    call_command("autoseq", "apply", "testapp_coupon", "--database", backend, stdout=out)
    assert "batch_count 3 -> 100" in out.getvalue()
    err = StringIO()
    call_command("check", databases=[backend], stdout=StringIO(), stderr=err)
    assert "testapp_coupon" not in err.getvalue()


def test_apply_says_when_a_row_is_not_there_yet(backend: str) -> None:
    """apply of a sequence with no stored row says the field creates it; nothing is written."""
    isolated_name = f"drift_{uuid.uuid4().hex[:10]}"
    with isolate_apps("django_tests.testapp") as isolated:

        class Fresh(models.Model):
            code = SequenceField(sequence=isolated_name)

            class Meta:
                app_label = "testapp"

        [result] = maintenance.apply(backend, names=[isolated_name], apps=isolated)
    assert (result.stored, result.changed) == (False, {})
    assert sequences.store(sequences.sequence_database(backend)).read(isolated_name) is None


def test_sync_and_apply_refuse_a_name_no_model_uses(
    backend: str, changed_field: tuple[Apps, str]
) -> None:
    """A wanted name no field uses raises SequenceNotFound naming the used ones (sync: tabled)."""
    isolated, name = changed_field  # its model has no table in the database
    with pytest.raises(SequenceNotFound, match="sequences used there: none"):
        maintenance.sync(backend, names=["nobody_uses_this"], apps=isolated)
    with pytest.raises(SequenceNotFound, match=f"sequences used there: {name}"):
        maintenance.apply(backend, names=["nobody_uses_this"], apps=isolated)
