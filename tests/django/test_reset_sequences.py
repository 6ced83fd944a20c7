"""reset_sequences=True in a TransactionTestCase restarts autoseq's sequences like AutoField's."""

from __future__ import annotations

import pytest

from django_tests.testapp.models import Invoice, Order


@pytest.mark.autoseq_reset_sequences
@pytest.mark.parametrize("round_", [1, 2])
def test_keys_start_over(backend: str, round_: int) -> None:
    """Each test with reset_sequences=True sees keys start at 1 again, however many ran before."""
    first = Invoice.objects.using(backend).create()
    second = Order.objects.using(backend).create()
    Invoice.objects.using(backend).bulk_create([Invoice(id=10_000)])
    assert (first.pk, second.pk) == (1, 1)
