"""Rollbacks never hand a value out twice: atomic() on every backend, test cases in memory."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import IntegrityError, transaction
from django.test import TestCase, TransactionTestCase

from autoseq_django import registry as sequences
from django_tests.testapp.models import Invoice, Order


class Rollback(Exception):
    """Raised inside atomic() to roll it back."""


def rolled_back_then_more(alias: str) -> tuple[list[int], list[int]]:
    """Insert more rows than one block in atomic(), roll back, insert again; both key lists.

    Between the two, the registries are dropped, as in a restarted process,
    so a reservation undone by the rollback would show as a repeated value.
    """
    gone: list[int] = []

    def insert_then_fail() -> None:
        with transaction.atomic(using=alias):
            for i in range(12):  # blocks of 7: crosses a boundary by save()
                gone.append(Invoice.objects.using(alias).create(amount=i).pk)
            bulk = Invoice.objects.using(alias).bulk_create([Invoice() for _ in range(30)])
            gone.extend(invoice.pk for invoice in bulk)
            raise Rollback

    with pytest.raises(Rollback):
        insert_then_fail()
    assert not Invoice.objects.using(alias).filter(pk__in=gone).exists()
    # Start over as a new process would: only what the store committed counts.
    sequences.reset()
    kept = [Invoice.objects.using(alias).create(amount=i).pk for i in range(12)]
    bulk = Invoice.objects.using(alias).bulk_create([Invoice(amount=1) for _ in range(30)])
    kept.extend(invoice.pk for invoice in bulk)
    return gone, kept


def assert_never_reused(gone: list[int], kept: list[int]) -> None:
    assert len(set(gone)) == len(gone) == 42
    assert len(set(kept)) == len(kept) == 42
    assert min(kept) > max(gone), "values of the rolled-back transaction came back"


@pytest.mark.autoseq_transaction
def test_atomic_rollback_never_repeats_values(backend: str) -> None:
    """Real transactions: 42 rows over 6 blocks rolled back, then 42 more, all new values."""
    gone, kept = rolled_back_then_more(backend)
    assert_never_reused(gone, kept)
    assert Invoice.objects.using(backend).filter(pk__in=kept).count() == 42


def test_savepoint_rollback_never_repeats_values(backend: str) -> None:
    """The same inside a test transaction, where atomic() is a savepoint."""
    gone, kept = rolled_back_then_more(backend)
    assert_never_reused(gone, kept)


@pytest.mark.autoseq_transaction
def test_flush_keeps_sequences(backend: str) -> None:
    """flush (what TransactionTestCase runs) empties tables but never sys_sequence."""
    before = Order.objects.using(backend).create().pk
    call_command("flush", database=backend, interactive=False, verbosity=0)
    assert not Order.objects.using(backend).exists()
    assert Order.objects.using(backend).create().pk > before


@pytest.mark.django_db(transaction=True)
def test_in_memory_transactional_rollback() -> None:
    """pytest-django's transactional db on in-memory SQLite: rollback, more rows, no clash."""
    gone, kept = rolled_back_then_more("default")
    assert_never_reused(gone, kept)


@pytest.mark.django_db(transaction=True)
def test_in_memory_transactional_continues_after_flush() -> None:
    """A second transactional test on in-memory SQLite keeps getting new values."""
    orders = Order.objects.bulk_create([Order() for _ in range(120)])
    ids = [order.pk for order in orders]
    assert ids == list(range(ids[0], ids[0] + 120))
    with pytest.raises(IntegrityError), transaction.atomic():
        Order.objects.create(id=ids[0])  # an explicit clash is still the database's to refuse
    assert Order.objects.create().pk == ids[-1] + 1


class UserTransactionTestCase(TransactionTestCase):
    """What a user's own suite looks like: Django's TransactionTestCase on in-memory SQLite."""

    def test_first(self) -> None:
        """Objects are created inside and after a rolled-back atomic block."""
        gone, kept = rolled_back_then_more("default")
        assert_never_reused(gone, kept)

    def test_second(self) -> None:
        """After the first test's flush, inserts still work."""
        created = Order.objects.create(note="second")
        assert created.pk is not None
        assert Order.objects.count() == 1


class UserTestCase(TestCase):
    """Django's TestCase (one transaction per test) on in-memory SQLite."""

    def test_create_and_rollback(self) -> None:
        """Savepoint rollbacks inside the test transaction never repeat values."""
        gone, kept = rolled_back_then_more("default")
        assert_never_reused(gone, kept)
