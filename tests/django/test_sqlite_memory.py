"""SQLite's in-memory test database: SysSequence and the admin show the real sequences.

Django's runner and pytest-django put a SQLite test database in memory;
its sequences live in a shared-cache in-memory store that its connections
attach, so tests see them as a project sees its ``db.sqlite3.autoseq``.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client, TestCase, TransactionTestCase
from django.urls import reverse

from autoseq_django.models import SysSequence
from django_tests.helpers import stored_current
from django_tests.testapp.models import Order

CHANGELIST = "admin:autoseq_syssequence_changelist"


def assert_admin_lists_sequences(client: Client) -> None:
    """Create rows on the in-memory alias; SysSequence and the admin list their sequences."""
    order = Order.objects.using("default").create()
    row = SysSequence.objects.using("default").get(name="testapp_order")
    # current is past every value handed out; a background prefetch may move it on.
    assert order.pk < row.current <= stored_current("default", "testapp_order")
    assert row.version >= 1
    client.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    # Searched: earlier tests may have left more sequences than one page holds.
    page = client.get(reverse(CHANGELIST), {"q": "testapp_order"}).content.decode()
    assert "testapp_order" in page
    assert "tickets" in client.get(reverse(CHANGELIST), {"q": "tickets"}).content.decode()
    change = reverse("admin:autoseq_syssequence_change", args=["testapp_order"])
    assert client.get(change).status_code == 200
    # Reserving again while this test's transaction has read the table.
    orders = Order.objects.using("default").bulk_create([Order() for _ in range(2500)])
    top = max(o.pk for o in orders)
    assert SysSequence.objects.using("default").get(name="testapp_order").current > top


def test_the_in_memory_database_is_in_memory() -> None:
    """The premise: alias "default" is an in-memory SQLite test database."""
    assert "mode=memory" in str(connections["default"].settings_dict["NAME"])


@pytest.mark.django_db
def test_pytest_django_db(client: Client) -> None:
    """pytest-django's db fixture (one transaction): the admin lists the sequences."""
    assert_admin_lists_sequences(client)


@pytest.mark.django_db(transaction=True)
def test_pytest_django_transactional_db(client: Client) -> None:
    """pytest-django's transactional_db: the admin lists the sequences."""
    assert_admin_lists_sequences(client)


class AdminInTestCase(TestCase):
    """Django's TestCase on the in-memory database."""

    databases = {"default"}

    def test_admin_lists_sequences(self) -> None:
        """The changelist shows the rows of the sequences this test used."""
        assert_admin_lists_sequences(self.client)


class AdminInTransactionTestCase(TransactionTestCase):
    """Django's TransactionTestCase (flush at teardown) on the in-memory database."""

    databases = {"default"}

    def test_admin_lists_sequences(self) -> None:
        """The changelist shows the rows of the sequences this test used."""
        assert_admin_lists_sequences(self.client)
