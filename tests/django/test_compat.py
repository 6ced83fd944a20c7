"""get_next_value / get_next_values: django-sequences' calls, served from autoseq's blocks."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import transaction

from autoseq import InvalidSequenceConfig
from autoseq.errors import InvalidCount
from autoseq_django import get_next_value, get_next_values
from django_tests.helpers import stored_current


def fresh() -> str:
    return f"compat_{uuid.uuid4().hex[:10]}"


def test_first_values_start_at_initial_value(backend: str) -> None:
    """A new sequence starts at initial_value (1 by default) and counts up by one."""
    plain, invoices = fresh(), fresh()
    assert [get_next_value(plain, using=backend) for _ in range(3)] == [1, 2, 3]
    assert get_next_value(invoices, 1000, using=backend) == 1000
    assert get_next_value(invoices, initial_value=1000, using=backend) == 1001


def test_values_come_from_the_database_named_by_using(backend: str) -> None:
    """using= picks the sys_sequence the row lives in, as for fields."""
    name = fresh()
    get_next_value(name, using=backend)
    assert stored_current(backend, name) > 1


def test_reset_value_goes_back_to_initial_value(backend: str) -> None:
    """With reset_value the values run initial_value..reset_value - 1, then start over."""
    name = fresh()
    values = [get_next_value(name, 5, 8, using=backend) for _ in range(7)]
    assert values == [5, 6, 7, 5, 6, 7, 5]


def test_reset_value_must_be_above_initial_value(backend: str) -> None:
    """A reset_value at or below initial_value is refused with both values named."""
    with pytest.raises(InvalidSequenceConfig, match="reset_value=3 must be an int greater"):
        get_next_value(fresh(), 3, 3, using=backend)


def test_get_next_values_returns_a_batch(backend: str) -> None:
    """get_next_values(n) returns n increasing values following the single calls."""
    name = fresh()
    assert get_next_value(name, using=backend) == 1
    assert get_next_values(4, name, using=backend) == [2, 3, 4, 5]
    with pytest.raises(InvalidCount):
        get_next_values(-1, name, using=backend)


def test_rollback_does_not_return_values(backend: str) -> None:
    """Values taken in a transaction that rolls back are not handed out again."""
    name = fresh()
    taken: list[int] = []

    def take_then_fail() -> None:
        with transaction.atomic(using=backend):
            taken.append(get_next_value(name, using=backend))
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        take_then_fail()
    assert get_next_value(name, using=backend) > taken[0]


def test_threads_never_share_a_value(backend: str) -> None:
    """Eight threads taking 300 values each get 2,400 distinct values."""
    name = fresh()
    results: list[list[int]] = [[] for _ in range(8)]

    def work(out: list[int]) -> None:
        for i in range(300):
            if i % 50 == 0:
                out.extend(get_next_values(5, name, using=backend))
            else:
                out.append(get_next_value(name, using=backend))

    threads = [threading.Thread(target=work, args=(out,)) for out in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    values = [v for out in results for v in out]
    assert len(values) == len(set(values)) == 8 * (294 + 6 * 5)


def test_gapless_values_are_given_back_by_a_rollback(backend: str) -> None:
    """gapless=True, as django-sequences: a rolled-back value is taken again, no gap."""
    name = fresh()

    def take_then_roll_back() -> None:
        with transaction.atomic(using=backend):
            assert get_next_value(name, using=backend, gapless=True) == 2
            raise RuntimeError("rolled back")

    with transaction.atomic(using=backend):
        assert get_next_value(name, using=backend, gapless=True) == 1
    with pytest.raises(RuntimeError):
        take_then_roll_back()
    with transaction.atomic(using=backend):
        assert get_next_value(name, using=backend, gapless=True) == 2
        assert get_next_values(3, name, using=backend, gapless=True) == [3, 4, 5]


@pytest.mark.autoseq_transaction
def test_drop_in_sequence_class(backend: str) -> None:
    """django_sequences.Sequence: initial value, last value, a range batch, delete, iteration."""
    from autoseq_django import django_sequences

    name = fresh()
    invoices = django_sequences.Sequence(name, initial_value=5, using=backend)
    assert invoices.get_last_value() is None
    with transaction.atomic(using=backend):
        assert invoices.get_next_value() == 5
        assert invoices.get_last_value() == 5
    assert invoices.get_next_values(3) == range(6, 9)
    assert next(invoices) == 9
    assert invoices.delete() is True
    assert invoices.get_last_value() is None
    assert invoices.delete() is False
    assert next(iter(invoices)) == 5  # created again at initial_value


def test_drop_in_rollback_gives_the_value_back(backend: str) -> None:
    """django_sequences.get_next_value is gapless: a rolled-back value is taken again."""
    from autoseq_django import django_sequences

    name = fresh()
    taken: list[int] = []

    def take_then_fail() -> None:
        with transaction.atomic(using=backend):
            taken.append(django_sequences.get_next_value(name, using=backend))
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        take_then_fail()
    assert taken == [1]
    assert django_sequences.get_next_value(name, using=backend) == 1
    assert django_sequences.get_last_value(name, using=backend) == 1


def test_reset_value_at_or_below_initial_value_is_a_value_error(backend: str) -> None:
    """Sequence(reset_value <= initial_value) is refused at once, as django-sequences does."""
    from autoseq_django import Sequence, django_sequences

    for make in (Sequence, django_sequences.Sequence):
        with pytest.raises(ValueError, match="reset_value=1 must be an int greater"):
            make(fresh(), initial_value=1, reset_value=1, using=backend)


def test_blocks_last_value_and_delete(backend: str) -> None:
    """From blocks: get_last_value is the top reserved; delete restarts at initial_value."""
    from autoseq_django import Sequence, delete, get_last_value

    name = fresh()
    assert get_last_value(name, using=backend) is None
    first = get_next_value(name, 10, using=backend)
    assert first == 10
    assert get_last_value(name, using=backend) == stored_current(backend, name) - 1
    assert get_next_values(0, name, using=backend) == []
    assert delete(name, using=backend) is True
    assert delete(name, using=backend) is False
    assert Sequence(name, 10, using=backend).get_next_value() == 10  # no buffered value served


@pytest.mark.autoseq_transaction
def test_nowait_raises_when_another_transaction_holds_the_row(backend: str) -> None:
    """nowait=True (gapless) raises DatabaseError at once while another transaction holds it."""
    from django.db import DatabaseError, connections

    from autoseq_django import django_sequences

    if not connections[backend].features.has_select_for_update_nowait:
        pytest.skip(f"{backend} has no SELECT ... FOR UPDATE NOWAIT (SQLite: one writer)")
    name = fresh()
    django_sequences.get_next_value(name, using=backend)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic(using=backend):
                django_sequences.get_next_value(name, using=backend)
                holding.set()
                release.wait(10)
        finally:
            connections[backend].close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10)
        with pytest.raises(DatabaseError), transaction.atomic(using=backend):
            django_sequences.get_next_value(name, nowait=True, using=backend)
    finally:
        release.set()
        holder.join(10)
    assert django_sequences.get_next_value(name, nowait=True, using=backend) == 3


@pytest.mark.autoseq_transaction
def test_a_rolled_back_first_use_leaves_nothing_behind(backend: str) -> None:
    """After a rolled-back first use, other initial/reset values start the row anew."""
    from autoseq_django import django_sequences

    name = fresh()

    def first_use_then_fail() -> None:
        with transaction.atomic(using=backend):
            assert django_sequences.get_next_value(name, using=backend) == 1
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        first_use_then_fail()
    assert django_sequences.get_last_value(name, using=backend) is None
    assert [django_sequences.get_next_value(name, 7, 9, using=backend) for _ in range(3)] == [
        7,
        8,
        7,
    ]


@pytest.mark.autoseq_transaction
def test_delete_then_next_in_one_transaction(backend: str) -> None:
    """delete() and get_next_value() in one transaction start again at initial_value."""
    from autoseq_django import django_sequences

    name = fresh()
    assert django_sequences.get_next_value(name, 40, using=backend) == 40
    with transaction.atomic(using=backend):
        assert django_sequences.delete(name, using=backend) is True
        assert django_sequences.get_next_value(name, 40, using=backend) == 40
    assert django_sequences.get_last_value(name, using=backend) == 40
