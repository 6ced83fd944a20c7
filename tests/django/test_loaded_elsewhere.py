"""Keys another process loads into a block this process holds: one clean error, then recovery.

Process A (the test) holds a block of ``testapp_order`` in memory; process B
(forked, with no block of its own) runs ``loaddata`` with keys inside A's
block. B's catch-up moves the stored ``current`` past them, but A's block
predates that, as a PostgreSQL sequence's CACHE would. A's first insert
meeting a loaded key fails once with an ``IntegrityError`` saying to retry;
the retry, and every insert after it, takes values past the loaded keys.
"""

from __future__ import annotations

import json
import multiprocessing
import traceback
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connections

from autoseq_django import registry as sequences
from django_tests.testapp.models import Order

pytestmark = pytest.mark.autoseq_transaction


def load(alias: str, fixture: str, errors: Any) -> None:
    """Process B: loaddata into ``alias``, as a deploy script would."""
    try:
        call_command("loaddata", fixture, database=alias, verbosity=0)
        errors.put("")
    except Exception:
        errors.put(traceback.format_exc())
    finally:
        connections.close_all()


def load_elsewhere(alias: str, keys: list[int], tmp_path: Path) -> None:
    """Run ``loaddata`` of orders with ``keys`` in another process and wait for it."""
    fixture = tmp_path / "orders.json"
    rows = [
        {"model": "testapp.order", "pk": key, "fields": {"ticket_no": key, "note": "loaded"}}
        for key in keys
    ]
    fixture.write_text(json.dumps(rows))
    connections.close_all()  # never share an open socket with a child
    context = multiprocessing.get_context("fork")
    errors = context.Queue()
    loader = context.Process(target=load, args=(alias, str(fixture), errors))
    loader.start()
    report = errors.get(timeout=120)
    loader.join(timeout=60)
    assert report == ""
    assert loader.exitcode == 0


def test_a_loaded_key_in_a_held_block_fails_once_then_recovers(
    backend: str, tmp_path: Path
) -> None:
    """One IntegrityError naming the retry; the retried save and later inserts never collide."""
    first = Order.objects.using(backend).create(note="A")
    held = sequences.lock(Order._meta.pk.sequence_config, backend).peek()  # type: ignore[union-attr]
    assert held is not None
    assert held > first.pk  # A holds the rest of its block
    loaded = [held, held + 1, held + 2, held + 7]
    load_elsewhere(backend, loaded, tmp_path)

    order = Order(note="A, first after the load")
    with pytest.raises(IntegrityError, match=r"retry the save"):
        order.save(using=backend)
    assert order.pk is None  # the value it met is not kept for the retry
    order.save(using=backend)
    assert order.pk > max(loaded)

    more = [Order.objects.using(backend).create(note="A later") for _ in range(30)]
    more += Order.objects.using(backend).bulk_create([Order(note="A bulk") for _ in range(300)])
    keys = [o.pk for o in more]
    assert min(keys) > max(loaded)
    assert Order.objects.using(backend).filter(note="loaded").count() == len(loaded)
    assert Order.objects.using(backend).count() == 2 + len(more) + len(loaded)


def test_other_integrity_errors_keep_the_block(backend: str) -> None:
    """An IntegrityError that is not about a sequence column drops nothing and adds no hint."""
    from django_tests.testapp.models import Line

    line = Line.objects.using(backend).create()
    codes = Line._meta.get_field("code")
    lock = sequences.lock(codes.sequence_config, backend)  # type: ignore[attr-defined]
    with pytest.raises(IntegrityError) as caught:
        Line.objects.using(backend).create(id=line.pk)  # the BigAutoField key, taken
    assert "retry the save" not in str(caught.value)
    assert sequences.lock(codes.sequence_config, backend) is lock  # type: ignore[attr-defined]


def test_a_chosen_key_that_exists_keeps_the_block(backend: str) -> None:
    """Saving a key the caller chose over an existing row is the caller's conflict: no hint."""
    first = Order.objects.using(backend).create(note="A")
    lock = sequences.lock(Order._meta.pk.sequence_config, backend)  # type: ignore[union-attr]
    with pytest.raises(IntegrityError) as caught:
        Order(id=first.pk, note="again").save(using=backend)
    assert "retry the save" not in str(caught.value)
    assert sequences.lock(Order._meta.pk.sequence_config, backend) is lock  # type: ignore[union-attr]


def test_a_bulk_meeting_loaded_keys_fails_once_then_recovers(backend: str, tmp_path: Path) -> None:
    """bulk_create() over loaded keys: one IntegrityError, keys cleared, the retry succeeds."""
    Order.objects.using(backend).create(note="A")
    held = sequences.lock(Order._meta.pk.sequence_config, backend).peek()  # type: ignore[union-attr]
    assert held is not None
    loaded = [held + 3, held + 5]
    load_elsewhere(backend, loaded, tmp_path)

    batch = [Order(note="A bulk") for _ in range(20)]
    with pytest.raises(IntegrityError, match=r"retry the save"):
        Order.objects.using(backend).bulk_create(batch)
    assert [o.pk for o in batch] == [None] * 20
    Order.objects.using(backend).bulk_create(batch)
    assert min(o.pk for o in batch) > max(loaded)
    assert Order.objects.using(backend).filter(note="A bulk").count() == 20
