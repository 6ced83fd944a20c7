"""``manage.py autoseq list | create | set | sync`` on every backend."""

from __future__ import annotations

import uuid
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_tests.helpers import stored_current
from django_tests.testapp.models import Line, Order


def run(*args: str) -> str:
    out = StringIO()
    call_command("autoseq", *args, stdout=out)
    return out.getvalue()


def fresh_name() -> str:
    return f"cmd_{uuid.uuid4().hex[:10]}"


def test_list_shows_rows_and_their_users(backend: str) -> None:
    """list prints each sequence with current, end, values left and the columns using it."""
    order = Order.objects.using(backend).create()
    output = run("list", "--database", backend)
    line = next(row for row in output.splitlines() if row.startswith("testapp_order "))
    assert "testapp.Order.id" in line
    assert str(stored_current(backend, "testapp_order")) in line.split()
    assert int(line.split()[1]) > order.pk


def test_create_makes_a_row_once(backend: str) -> None:
    """create writes the row with the given settings; creating it again is refused."""
    name = fresh_name()
    output = run(
        "create", name, "--start", "500", "--step", "5", "--no-batch", "--database", backend
    )
    assert f"created {name!r}: current=500" in output
    with pytest.raises(CommandError, match="exists already") as caught:
        run("create", name, "--start", "1", "--database", backend)
    assert caught.value.returncode == 2
    assert stored_current(backend, name) == 500


def test_create_refuses_bad_settings(backend: str) -> None:
    """An impossible configuration is refused with the reason and nothing is written."""
    name = fresh_name()
    with pytest.raises(CommandError, match="start=10 is greater than end=5"):
        run("create", name, "--start", "10", "--end", "5", "--database", backend)
    assert name not in run("list", "--database", backend)


def test_set_moves_forward_only(backend: str) -> None:
    """set moves current forward; backwards needs --force, and both respect max()."""
    name = fresh_name()
    run("create", name, "--start", "1", "--database", backend)
    assert "current 1 -> 100" in run("set", name, "100", "--database", backend)
    with pytest.raises(CommandError, match="only move forward"):
        run("set", name, "50", "--database", backend)
    assert "current 100 -> 50" in run("set", name, "50", "--force", "--database", backend)


def test_set_refuses_values_at_or_below_a_column_max(backend: str) -> None:
    """current cannot go to a value that a column using the sequence already holds."""
    top = Line.objects.using(backend).bulk_create([Line() for _ in range(3)])[-1].code
    with pytest.raises(CommandError, match=r"not past max\(testapp.Line.code\)"):
        run("set", "line_codes", str(top), "--force", "--database", backend)
    assert stored_current(backend, "line_codes") > top


def test_set_refuses_past_end_and_off_step(backend: str) -> None:
    """current must stay within end and on the start + k * step grid."""
    name = fresh_name()
    run("create", name, "--start", "1", "--end", "100", "--step", "10", "--database", backend)
    with pytest.raises(CommandError, match="past end=100"):
        run("set", name, "101", "--database", backend)
    with pytest.raises(CommandError, match="not start \\+ k \\* step"):
        run("set", name, "15", "--database", backend)
    assert stored_current(backend, name) == 1


def test_set_unknown_sequence(backend: str) -> None:
    """Setting a sequence that does not exist names it and says how to create it."""
    with pytest.raises(CommandError, match=r"does not exist.*autoseq create"):
        run("set", fresh_name(), "10", "--database", backend)


def test_sync_moves_past_loaded_rows(backend: str) -> None:
    """After rows arrive with explicit keys, sync moves the sequence past max() of them."""
    first = Order.objects.using(backend).create()
    top = first.pk + 5000
    Order.objects.using(backend).bulk_create(
        [Order(id=top - 1, ticket_no=1), Order(id=top, ticket_no=2)]
    )
    output = run("sync", "testapp_order", "--database", backend)
    assert f"max={top}" in output
    assert stored_current(backend, "testapp_order") == top + 1
    assert Order.objects.using(backend).create().pk == top + 1


def test_sync_leaves_sequences_already_past(backend: str) -> None:
    """sync never moves a sequence back."""
    Line.objects.using(backend).create()
    before = stored_current(backend, "line_codes")
    output = run("sync", "line_codes", "--database", backend)
    assert "already past it" in output
    assert stored_current(backend, "line_codes") == before


def test_sync_unknown_name_is_refused(backend: str) -> None:
    """sync of a name no model uses says so."""
    with pytest.raises(CommandError, match="no model"):
        run("sync", "nobody_uses_this", "--database", backend)


def test_a_lost_row_is_recreated_past_the_keys_in_the_table(
    backend: str, fresh_registries: None
) -> None:
    """A sys_sequence row that went missing comes back past max(id), not at start."""
    from django.db.models import Max

    from autoseq_django import registry as sequences
    from django_tests.testapp.models import Invoice

    base = (Invoice.objects.using(backend).aggregate(top=Max("id"))["top"] or 0) + 5000
    Invoice.objects.using(backend).bulk_create([Invoice(id=base + i) for i in range(3)])
    sequences.store(sequences.sequence_database(backend)).delete("testapp_invoice")
    sequences.reset()  # a new process: nothing buffered
    assert Invoice.objects.using(backend).create().pk == base + 3
