"""A rolled-back gapless number is never reused by its old holder (Django, issue 29).

Real transactions on each SQL backend: an instance saved in an ``atomic()``
block that rolled back (whole, or to a savepoint) keeps no number that the
rollback gave back, so the plain retry of the same ``save()`` or
``bulk_create()`` commits with a fresh one, as with ``AutoField``. Counted
on what was committed: every row kept, numbers consecutive, none repeated,
and the sequence still serving new rows afterwards.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable

import pytest
from django.db import IntegrityError, transaction

from django_tests.testapp.models import Receipt, Slip, Voucher

pytestmark = pytest.mark.autoseq_transaction


class Rollback(Exception):
    """Raised inside atomic() to roll it back."""


def rolled_back(backend: str, work: Callable[[], object]) -> None:
    """Run ``work`` in an atomic() block that then rolls back."""
    try:
        with transaction.atomic(using=backend):
            work()
            raise Rollback
    except Rollback:
        return


def committed(backend: str, work: Callable[[], object]) -> None:
    """Run ``work`` in an atomic() block that commits."""
    with transaction.atomic(using=backend):
        work()


def consecutive(values: list[int]) -> bool:
    """Whether ``values`` are distinct and make one run with no gap."""
    ordered = sorted(values)
    return ordered == list(range(ordered[0], ordered[0] + len(ordered)))


def slip_counters(backend: str) -> tuple[list[int], list[int], list[str]]:
    """The committed slips' serial counters, seq_no values and notes."""
    rows = list(Slip.objects.using(backend).values_list("number", "seq_no", "note"))
    return [int(r[0][3:]) for r in rows], [r[1] for r in rows], [r[2] for r in rows]


def test_a_retried_gapless_key_never_overwrites_another_writers_row(backend: str) -> None:
    """A rolls back, B gets A's key back, A retries save(): three rows, keys consecutive."""
    first = Voucher(amount=1)
    committed(backend, lambda: first.save(using=backend))
    a = Voucher(amount=2)
    rolled_back(backend, lambda: a.save(using=backend))
    b = Voucher(amount=3)
    committed(backend, lambda: b.save(using=backend))
    assert b.pk == first.pk + 1  # the number A's rollback gave back
    committed(backend, lambda: a.save(using=backend))
    rows = dict(Voucher.objects.using(backend).values_list("pk", "amount"))
    assert rows == {first.pk: 1, first.pk + 1: 3, first.pk + 2: 2}
    assert a.pk == first.pk + 2


def test_a_retried_bulk_create_takes_fresh_keys(backend: str) -> None:
    """bulk_create() of the same instances after a rollback: fresh keys, every row kept."""
    first = Voucher(amount=0)
    committed(backend, lambda: first.save(using=backend))
    batch = [Voucher(amount=1), Voucher(amount=2)]
    rolled_back(backend, lambda: Voucher.objects.using(backend).bulk_create(batch))
    committed(backend, lambda: Voucher.objects.using(backend).create(amount=3))
    committed(backend, lambda: Voucher.objects.using(backend).bulk_create(batch))
    rows = dict(Voucher.objects.using(backend).values_list("pk", "amount"))
    assert sorted(rows.values()) == [0, 1, 2, 3]
    assert consecutive(list(rows))
    assert [v.pk for v in batch] == [first.pk + 2, first.pk + 3]


def test_a_retry_alone_leaves_the_unique_serial_serving(backend: str) -> None:
    """A unique gapless serial: A rolls back and retries, then five new saves all commit."""
    committed(backend, lambda: Receipt.objects.using(backend).create(amount=0))
    a = Receipt(amount=1)
    rolled_back(backend, lambda: a.save(using=backend))
    committed(backend, lambda: a.save(using=backend))
    failed = 0
    for i in range(5):
        try:
            committed(backend, lambda i=i: Receipt.objects.using(backend).create(amount=10 + i))
        except IntegrityError:
            failed += 1
    assert failed == 0
    numbers = list(Receipt.objects.using(backend).values_list("number", flat=True))
    assert len(numbers) == 7
    assert consecutive([int(n.rsplit("-", 1)[1]) for n in numbers])


def test_non_unique_gapless_columns_never_repeat_after_a_retry(backend: str) -> None:
    """A gapless serial and integer column, no unique index: the retry commits no duplicate."""
    committed(backend, lambda: Slip.objects.using(backend).create(note="first"))
    a = Slip(note="a")
    rolled_back(backend, lambda: a.save(using=backend))
    committed(backend, lambda: Slip.objects.using(backend).create(note="b"))
    committed(backend, lambda: a.save(using=backend))
    numbers, seq_nos, notes = slip_counters(backend)
    assert sorted(notes) == ["a", "b", "first"]
    assert consecutive(numbers)
    assert consecutive(seq_nos)


def test_a_savepoint_rolled_back_gives_fresh_numbers_inside_the_transaction(
    backend: str,
) -> None:
    """A nested atomic() rolls back; the retry in the same transaction takes fresh numbers."""
    slip, voucher = Slip(note="retried"), Voucher(amount=1)

    def work() -> None:
        kept_slip = Slip.objects.using(backend).create(note="kept")
        kept = Voucher.objects.using(backend).create(amount=0)
        held = (kept_slip.number, kept_slip.seq_no, kept.pk)

        def inner() -> None:
            slip.save(using=backend)
            voucher.save(using=backend)

        rolled_back(backend, inner)
        # Taken before the savepoint: still this transaction's, saved again in place.
        kept_slip.save(using=backend)
        kept.save(using=backend)
        assert (kept_slip.number, kept_slip.seq_no, kept.pk) == held
        Slip.objects.using(backend).create(note="between")
        Voucher.objects.using(backend).create(amount=2)
        slip.save(using=backend)
        voucher.save(using=backend)
        assert voucher.pk == kept.pk + 2

    committed(backend, work)
    numbers, seq_nos, notes = slip_counters(backend)
    assert sorted(notes) == ["between", "kept", "retried"]
    assert consecutive(numbers)
    assert consecutive(seq_nos)
    amounts = dict(Voucher.objects.using(backend).values_list("pk", "amount"))
    assert sorted(amounts.values()) == [0, 1, 2]
    assert consecutive(list(amounts))


def test_a_value_still_held_or_committed_is_kept(backend: str) -> None:
    """Saving again in the same transaction, or after it committed, updates the one row."""
    slip, voucher = Slip(note="x"), Voucher(amount=1)

    def work() -> None:
        slip.save(using=backend)
        voucher.save(using=backend)
        slip.note, voucher.amount = "y", 2
        slip.save(using=backend)
        voucher.save(using=backend)

    committed(backend, work)
    number, key = slip.number, voucher.pk
    slip.note, voucher.amount = "z", 3
    committed(backend, lambda: (slip.save(using=backend), voucher.save(using=backend)))
    assert (slip.number, voucher.pk) == (number, key)
    assert list(Slip.objects.using(backend).values_list("number", "note")) == [(number, "z")]
    assert list(Voucher.objects.using(backend).values_list("pk", "amount")) == [(key, 3)]


def test_a_copy_shares_the_verdict_and_a_pickle_keeps_it(backend: str) -> None:
    """copy() and deepcopy() of a rolled-back instance retry fresh; a pickle keeps a commit."""
    shallow, deep = Slip(note="shallow"), Slip(note="deep")
    rolled_back(backend, lambda: (shallow.save(using=backend), deep.save(using=backend)))
    copies = [copy.copy(shallow), copy.deepcopy(deep)]
    committed(backend, lambda: Slip.objects.using(backend).create(note="b"))
    for twin in copies:
        committed(backend, lambda twin=twin: twin.save(using=backend))
    kept = Slip(note="kept")
    committed(backend, lambda: kept.save(using=backend))
    revived = pickle.loads(pickle.dumps(kept))
    revived.note = "kept2"
    committed(backend, lambda: revived.save(using=backend))
    numbers, _seq_nos, notes = slip_counters(backend)
    assert sorted(notes) == ["b", "deep", "kept2", "shallow"]
    assert consecutive(numbers)
