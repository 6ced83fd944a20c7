"""save() finds its sequence's lock once, not per row; every change still reaches it."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import override_settings

from autoseq import MAX_VALUE, SequenceExhausted
from autoseq_django import maintenance
from autoseq_django import registry as sequences
from django_tests.routers import SequencesWhereTold
from django_tests.testapp.models import Invoice


def next_in(alias: str, name: str) -> int:
    row = sequences.store(alias).read(name)
    assert row is not None
    return row.next_value


def test_saves_after_a_move_continue_past_it(backend: str) -> None:
    """A row moved by maintenance (its lock discarded) is read again by the next save()."""
    Invoice.objects.using(backend).create()  # the lock is found and kept
    alias = sequences.sequence_database(backend)
    target = next_in(alias, "testapp_invoice") + 10**9
    maintenance.change(alias, "testapp_invoice", {"current": target})
    saved = Invoice.objects.using(backend).create()
    assert saved.pk >= target  # past keys an earlier run left in the table, too
    config = Invoice._meta.pk.sequence_config  # type: ignore[union-attr]
    assert sequences.lock(config, backend) is sequences.registry(alias).find(config.name)


def test_a_discarded_lock_is_never_served_again(backend: str) -> None:
    """Once the registry drops a lock (its row moved), the next insert gets the new one."""
    config = Invoice._meta.pk.sequence_config  # type: ignore[union-attr]
    alias = sequences.sequence_database(backend)
    Invoice.objects.using(backend).create()
    kept = sequences.lock(config, backend)
    assert sequences.lock(config, backend) is kept
    sequences.registry(alias).discard(config.name)
    saved = Invoice.objects.using(backend).create()
    fresh = sequences.registry(alias).find(config.name)
    assert fresh is not None
    assert fresh is not kept
    assert sequences.lock(config, backend) is fresh
    assert saved.pk is not None


def test_a_settings_change_is_followed_by_the_next_save(backend: str) -> None:
    """After AUTOSEQ changes (a reset), save() serves from the lock the new settings give."""
    Invoice.objects.using(backend).create()
    before = sequences.lock(Invoice._meta.pk.sequence_config, backend)  # type: ignore[union-attr]
    with override_settings(AUTOSEQ={"BUFFER": {"prefetch": False}}):
        saved = Invoice.objects.using(backend).create()
        after = sequences.lock(Invoice._meta.pk.sequence_config, backend)  # type: ignore[union-attr]
        assert after is not before
        assert after.policy.prefetch is False
    assert Invoice.objects.using(backend).filter(pk=saved.pk).exists()


@pytest.mark.autoseq_all_databases
def test_a_router_that_changes_its_mind_is_asked_on_every_lookup(backend: str) -> None:
    """With routers the sequence database is asked for each insert, never remembered."""
    if backend == "sqlite":
        pytest.skip("needs a second database besides sqlite")
    config = Invoice._meta.pk.sequence_config  # type: ignore[union-attr]
    with override_settings(DATABASE_ROUTERS=["django_tests.routers.SequencesWhereTold"]):
        try:
            for target in ("sqlite", backend, "sqlite"):
                SequencesWhereTold.target = target
                found = sequences.lock(config, backend)
                assert found is sequences.registry(target).find(config.name)
        finally:
            SequencesWhereTold.target = "sqlite"


def test_a_bulk_that_failed_to_get_keys_gets_them_when_tried_again(backend: str) -> None:
    """bulk_create() refused by an exhausted sequence fills the same objects when retried."""
    alias = sequences.sequence_database(backend)
    Invoice.objects.using(backend).create()
    sequences.forget(alias, "testapp_invoice")  # nothing buffered: the next take reserves
    row = sequences.store(alias).read("testapp_invoice")
    assert row is not None
    maintenance.change(alias, "testapp_invoice", {"end": row.next_value - 1})
    objs = [Invoice(amount=i) for i in range(30)]
    with pytest.raises(SequenceExhausted), transaction.atomic(using=backend):
        Invoice.objects.using(backend).bulk_create(objs)
    maintenance.change(alias, "testapp_invoice", {"end": MAX_VALUE})
    created = Invoice.objects.using(backend).bulk_create(objs)
    keys = [invoice.pk for invoice in created]
    assert keys == list(range(keys[0], keys[0] + 30))
    assert Invoice.objects.using(backend).filter(pk__in=keys).count() == 30
