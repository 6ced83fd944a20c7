"""The SysSequence admin: what it shows, and the changes it lets through.

``AUTOSEQ["DATABASE"]`` makes one sequence database serve every database,
so the admin checks ``max()`` in all of them: these tests may query all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse

from django_tests.helpers import SEQUENCE_ALIAS, stored_current
from django_tests.testapp.models import Line, Order

pytestmark = pytest.mark.autoseq_all_databases


@pytest.fixture
def admin_client_for(backend: str) -> Iterator[Client]:
    """A logged-in admin client whose SysSequence is the table serving ``backend``."""
    alias = SEQUENCE_ALIAS.get(backend, backend)
    with override_settings(AUTOSEQ={"DATABASE": alias}):
        user = User.objects.create_superuser("admin", "admin@example.com", "pw")
        client = Client()
        client.force_login(user)
        yield client


def form_data(backend: str, name: str, **changes: Any) -> dict[str, Any]:
    """The change form's fields as stored, with ``changes`` applied."""
    from autoseq_django import registry as sequences

    row = sequences.store(sequences.sequence_database(backend)).read(name)
    assert row is not None
    data: dict[str, Any] = {
        "current": row.next_value,
        "end": row.end,
        "step": row.step,
        "batch_count": row.batch_count,
        "opened_current": row.next_value,
    }
    if row.batch:
        data["batch"] = "on"
    if row.cycle:
        data["cycle"] = "on"
    data.update(changes)
    return data


def change_url(name: str) -> str:
    return reverse("admin:autoseq_syssequence_change", args=[name])


def test_changelist_shows_sequences(backend: str, admin_client_for: Client) -> None:
    """The list shows every sequence with its values left before end."""
    Order.objects.using(backend).create()
    response = admin_client_for.get(reverse("admin:autoseq_syssequence_changelist"))
    assert response.status_code == 200
    page = response.content.decode()
    assert "testapp_order" in page
    assert "values left before end" in page.lower()


def test_change_form_names_the_columns(backend: str, admin_client_for: Client) -> None:
    """The change form says which model fields draw from the sequence."""
    Order.objects.using(backend).create()
    response = admin_client_for.get(change_url("tickets"))
    assert response.status_code == 200
    assert "testapp.Order.ticket_no" in response.content.decode()


def test_moving_current_forward(backend: str, admin_client_for: Client) -> None:
    """A valid change is saved through the store and the next insert follows it."""
    order = Order.objects.using(backend).create()
    target = stored_current(backend, "testapp_order") + 1000
    response = admin_client_for.post(
        change_url("testapp_order"), form_data(backend, "testapp_order", current=target)
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert stored_current(backend, "testapp_order") == target
    assert Order.objects.using(backend).create().pk == target > order.pk


def test_current_not_past_a_column_max(backend: str, admin_client_for: Client) -> None:
    """Moving current forward but not past max() of a column using it is refused."""
    Line.objects.using(backend).create()
    before = stored_current(backend, "line_codes")
    Line.objects.using(backend).create(code=before + 1000)  # e.g. loaded by a fixture
    response = admin_client_for.post(
        change_url("line_codes"), form_data(backend, "line_codes", current=before + 500)
    )
    page = response.content.decode()
    assert response.status_code == 200
    assert f"not past max(testapp.Line.code)={before + 1000}" in page
    assert stored_current(backend, "line_codes") == before


def test_current_not_backwards_nor_past_end(backend: str, admin_client_for: Client) -> None:
    """Moving current back, or past end, is refused and nothing changes."""
    Order.objects.using(backend).create()
    before = stored_current(backend, "tickets")
    back = admin_client_for.post(change_url("tickets"), form_data(backend, "tickets", current=1000))
    past = admin_client_for.post(
        change_url("tickets"), form_data(backend, "tickets", current=before + 10, end=before)
    )
    assert "may only move forward" in back.content.decode()
    assert "past end" in past.content.decode()
    assert stored_current(backend, "tickets") == before


def test_no_adding_or_deleting(backend: str, admin_client_for: Client) -> None:
    """Rows are created by use or the command, and never deleted from the admin."""
    Order.objects.using(backend).create()
    add = admin_client_for.get(reverse("admin:autoseq_syssequence_add"))
    delete = admin_client_for.get(
        reverse("admin:autoseq_syssequence_delete", args=["testapp_order"])
    )
    assert add.status_code == 403
    assert delete.status_code == 403


def test_batch_count_alone_is_saved_after_current_moved(
    backend: str, admin_client_for: Client
) -> None:
    """A form opened before other processes reserved still saves a batch_count change."""
    from autoseq_django import registry as sequences

    Order.objects.using(backend).create()
    opened = form_data(backend, "tickets", batch_count=33)
    store = sequences.store(sequences.sequence_database(backend))
    store.reserve("tickets", 40)  # another process, while the form is open
    moved = stored_current(backend, "tickets")
    response = admin_client_for.post(change_url("tickets"), opened)
    assert response.status_code == 302, response.content.decode()[:2000]
    row = store.read("tickets")
    assert row is not None
    assert (row.batch_count, row.next_value) == (33, moved)


def test_change_form_shows_this_process_rate_and_next_block(
    backend: str, admin_client_for: Client
) -> None:
    """The dashboard fields: values left, the rate and time to end, the next block's state."""
    import uuid

    for _ in range(12):
        Order.objects.using(backend).create()  # past the prefetch point: a second block
    page = admin_client_for.get(change_url("testapp_order")).content.decode()
    for label in ("Rate (this process)", "Time to end", "Next block (this process)"):
        assert label in page
    assert "This process only (pid " in page
    assert "/s" in page  # two reservations: a measured rate
    assert "ready (" in page or "reserving" in page or "not yet (" in page
    assert "not used by this process" not in page

    from django.contrib import admin

    from autoseq_django.models import SysSequence

    idle = SysSequence(name=f"idle_{uuid.uuid4().hex[:8]}")
    assert admin.site._registry[SysSequence].next_block(idle) == "not used by this process"


def changelist(client: Client, query: str = "") -> str:
    response = client.get(reverse("admin:autoseq_syssequence_changelist") + query)
    assert response.status_code == 200
    return str(response.content.decode())


def column_headers(page: str) -> list[str]:
    """The result table's column headers, as the admin renders them."""
    import re

    table = page[page.index('id="result_list"') :]
    table = table[: table.index("</thead>")]
    return re.findall(
        r'<th scope="col"[^>]*>.*?<div class="text">(?:<a [^>]*>|<span>)?([^<]*)', table, re.S
    )


def test_changelist_shows_only_what_the_stored_rows_say(
    backend: str, admin_client_for: Client
) -> None:
    """Seven columns, all read from the stored rows: nothing per process in the list."""
    Order.objects.using(backend).create()
    page = changelist(admin_client_for)
    headers = column_headers(page)
    assert headers == [
        "Name",
        "Current",
        "End",
        "Values left before end",
        "Reserved per block",
        "Cycle",
        "Updated at",
    ]
    assert "this process" not in page.lower()
    assert "% used)" in page


def test_djangos_own_sequences_are_hidden_by_default(
    backend: str, admin_client_for: Client
) -> None:
    """django_migrations and auth_permission rows show only under the origin filter."""
    from autoseq import SequenceConfig
    from autoseq_django import registry as sequences

    store = sequences.store(sequences.sequence_database(backend))
    for name in ("django_migrations", "auth_permission", "auth_user_groups"):
        if store.read(name) is None:
            store.create(SequenceConfig(name))
    Order.objects.using(backend).create()

    def listed(page: str) -> set[str]:
        import re

        return set(re.findall(r'class="field-name"><a href="[^"]*">([^<]+)</a>', page))

    default = listed(changelist(admin_client_for))
    assert "testapp_order" in default
    assert not default & {"django_migrations", "auth_permission", "auth_user_groups"}
    theirs = listed(changelist(admin_client_for, "?origin=django"))
    assert {"django_migrations", "auth_permission", "auth_user_groups"} <= theirs
    assert "testapp_order" not in theirs
    assert default | theirs <= listed(changelist(admin_client_for, "?origin=all"))


@pytest.mark.autoseq_transaction
def test_a_gapless_sequence_is_listed_and_moved_like_any_other(
    backend: str, admin_client_for: Client
) -> None:
    """A gapless key's row (on SQLite in the application's file) is listed; a change moves it."""
    from django.db import transaction

    from django_tests.testapp.models import Voucher

    name = Voucher._meta.get_field("id").sequence_name
    with transaction.atomic(using=backend):
        taken = [Voucher.objects.using(backend).create().pk for _ in range(5)]
    page = admin_client_for.get(reverse("admin:autoseq_syssequence_changelist")).content
    assert name in page.decode()
    assert stored_current(backend, name) == taken[-1] + 1
    target = taken[-1] + 100
    response = admin_client_for.post(change_url(name), form_data(backend, name, current=target))
    assert response.status_code == 302, response.content.decode()[:2000]
    with transaction.atomic(using=backend):
        assert Voucher.objects.using(backend).create().pk == target
