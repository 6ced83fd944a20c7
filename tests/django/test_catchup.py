"""Keys written with their own values never make a later insert collide."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import transaction

from autoseq_django import catchup
from django_tests.helpers import stored_current
from django_tests.testapp.models import Invoice, Order


def fixture_of(tmp_path: Path, keys: list[int]) -> str:
    path = tmp_path / "invoices.json"
    rows = [{"model": "testapp.invoice", "pk": k, "fields": {"amount": 1}} for k in keys]
    path.write_text(json.dumps(rows))
    return str(path)


def test_loaddata_then_create(backend: str, tmp_path: Path) -> None:
    """After loaddata of keys past current, create() continues past them."""
    first = Invoice.objects.using(backend).create()
    keys = [first.pk + 100 + i for i in range(20)]
    call_command("loaddata", fixture_of(tmp_path, keys), database=backend, verbosity=0)
    made = [Invoice.objects.using(backend).create() for _ in range(3)]
    assert made[0].pk > keys[-1]
    assert [m.pk for m in made] == list(range(made[0].pk, made[0].pk + 3))


def test_explicit_bulk_load_then_create(backend: str) -> None:
    """A bulk_create with explicit keys moves the sequence: the next bulk does not collide."""
    first = Order.objects.using(backend).create()
    loaded = [Order(id=first.pk + 1000 + i) for i in range(50)]
    Order.objects.using(backend).bulk_create(loaded)
    after = Order.objects.using(backend).bulk_create([Order() for _ in range(10)])
    assert after[0].pk > loaded[-1].pk


def test_explicit_key_inside_the_buffered_block(backend: str) -> None:
    """A key inside the block this process holds is never handed out again."""
    first = Invoice.objects.using(backend).create()  # blocks of 7: the key is in the buffer
    Invoice.objects.using(backend).create(id=first.pk + 2)
    made = [Invoice.objects.using(backend).create().pk for _ in range(10)]
    assert first.pk + 2 not in made
    assert len(set(made)) == 10


def test_values_the_sequence_gave_cost_nothing(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows keyed by the sequence (bulk, save, reload) never trigger a catch-up."""
    calls: list[int] = []
    original = catchup._catch_up
    monkeypatch.setattr(catchup, "_catch_up", lambda *a: (calls.append(a[3]), original(*a))[1])
    made = Invoice.objects.using(backend).bulk_create([Invoice() for _ in range(50)])
    made[0].amount = 5
    made[0].save(using=backend)
    Invoice.objects.using(backend).create()
    assert calls == []


def test_loaddata_costs_one_catch_up(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 fixture rows past current are applied as one catch-up, not one per row."""
    calls: list[int] = []
    original = catchup._catch_up
    monkeypatch.setattr(catchup, "_catch_up", lambda *a: (calls.append(a[3]), original(*a))[1])
    start = Invoice.objects.using(backend).create().pk
    keys = [start + 10_000 + i for i in range(200)]
    call_command("loaddata", fixture_of(tmp_path, keys), database=backend, verbosity=0)
    Invoice.objects.using(backend).create()
    assert calls == [keys[-1]]


@pytest.mark.autoseq_transaction
def test_committed_load_moves_the_stored_row(backend: str, tmp_path: Path) -> None:
    """Once loaddata commits, the stored row is past its keys: other processes see it too."""
    start = Invoice.objects.using(backend).create().pk
    keys = [start + 5000 + i for i in range(30)]
    call_command("loaddata", fixture_of(tmp_path, keys), database=backend, verbosity=0)
    assert stored_current(backend, "testapp_invoice") > keys[-1]
    with transaction.atomic(using=backend):
        Invoice.objects.using(backend).create(id=keys[-1] + 50_000)
        assert catchup.pending()  # applied when the transaction commits
    assert not catchup.pending()
    assert stored_current(backend, "testapp_invoice") > keys[-1] + 50_000


def test_explicit_key_past_end_is_left_alone(backend: str) -> None:
    """A key beyond the sequence's end cannot collide: inserts go on within the range."""
    from django_tests.testapp.models import Coupon

    first = Coupon.objects.using(backend).create()
    Coupon.objects.using(backend).create(id=10**6 + 5)
    made = Coupon.objects.using(backend).create()
    assert first.pk < made.pk <= 10**6


def test_skipping_a_loaded_key_keeps_the_lock_open(backend: str) -> None:
    """A thread holding the sequence's lock keeps taking values after a key lands in its block."""
    from autoseq_django import registry as sequences

    first = Order.objects.using(backend).create()
    field = Order._meta.get_field("id")
    held = sequences.lock(field.sequence_config, backend)  # as another thread would hold it
    ahead = held.peek()
    assert ahead is not None
    Order.objects.using(backend).create(id=ahead + 3)  # inside this process's block
    after = Order.objects.using(backend).create()
    assert held.next() > ahead + 3
    assert after.pk > ahead + 3 > first.pk


@pytest.mark.autoseq_transaction
def test_threads_inserting_while_keys_are_loaded(backend: str) -> None:
    """Four threads insert while a fifth loads keys far ahead: no error, no duplicate."""
    import threading

    from django.db import connections

    base = Order.objects.using(backend).create().pk + 1_000_000
    made: list[int] = []
    errors: list[BaseException] = []
    guard = threading.Lock()

    def insert() -> None:
        try:
            for _ in range(60):
                pk = Order.objects.using(backend).create().pk
                with guard:
                    made.append(pk)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def load() -> None:
        try:
            for round_ in range(5):
                keys = [base * (round_ + 1) + i for i in range(20)]
                Order.objects.using(backend).bulk_create([Order(id=k) for k in keys])
                with guard:
                    made.extend(keys)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=insert) for _ in range(4)]
    threads.append(threading.Thread(target=load))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(made) == len(set(made)) == 4 * 60 + 5 * 20
    assert Order.objects.using(backend).filter(pk__in=made).count() == len(made)


def test_mixed_bulk_passes_the_keys_it_carries(backend: str) -> None:
    """New rows of a bulk that also carries keys ahead of the sequence get values past them."""
    start = Order.objects.using(backend).create().pk
    ahead = [start + 2, start + 3]
    objs = [Order(id=ahead[0]), Order(), Order(id=ahead[1]), Order()]
    made = Order.objects.using(backend).bulk_create(objs)
    assert [m.pk for m in made][0::2] == ahead
    assert min(made[1].pk, made[3].pk) > ahead[1]


def test_keys_below_a_forced_move_back_are_noted(backend: str) -> None:
    """After `autoseq set --force` moves current back, a key loaded above it still counts."""
    from django.core.management import call_command

    first = Invoice.objects.using(backend).create().pk
    call_command(
        "autoseq", "set", "testapp_invoice", str(first + 10_000_000), "--database", backend
    )

    def take_then_roll_back() -> None:
        with transaction.atomic(using=backend):
            Invoice.objects.using(backend).create()  # handed out, never stored
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        take_then_roll_back()
    call_command(
        "autoseq", "set", "testapp_invoice", str(first + 1), "--force", "--database", backend
    )
    Invoice.objects.using(backend).create(id=first + 500)
    made = Invoice.objects.using(backend).bulk_create([Invoice() for _ in range(600)])
    assert first + 500 not in {m.pk for m in made}
