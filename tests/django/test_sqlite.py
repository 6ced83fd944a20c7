"""SQLite with no extra settings: Django's connection reads the companion file's rows."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connections

from autoseq_django import checks as autoseq_checks
from autoseq_django.models import SysSequence
from django_tests.helpers import stored_current
from django_tests.testapp.models import Order

FILE_DATABASES = ["default", "sqlite", "sqlite_seq"]
ROOT = Path(__file__).resolve().parents[2]


# Autocommit: this alias opens transactions with BEGIN IMMEDIATE, which also
# starts the read snapshot of the attached file, so a transaction sees the
# rows as they were when it began.
@pytest.mark.django_db(databases=FILE_DATABASES, transaction=True)
def test_sys_sequence_queries_see_the_companion_rows() -> None:
    """SysSequence on a SQLite file alias shows the rows the store writes, no alias needed."""
    Order.objects.using("sqlite").create()
    row = SysSequence.objects.using("sqlite").get(name="testapp_order")
    assert row.current == stored_current("sqlite", "testapp_order")


@pytest.mark.django_db(databases=FILE_DATABASES)
def test_migrate_leaves_no_table_in_the_main_file() -> None:
    """The main SQLite file holds no sys_sequence: the companion is the only one."""
    connection = connections["sqlite"]
    with connection.cursor() as cursor:
        assert "sys_sequence" not in connection.introspection.table_names(cursor)
    assert autoseq_checks.check_sqlite_admin(databases=["sqlite"]) == []


@pytest.mark.django_db(databases=FILE_DATABASES, transaction=True)
def test_an_older_main_table_is_dropped_or_reported() -> None:
    """Migration 0003 drops an empty main-file sys_sequence; one with rows is check W001."""
    connection = connections["sqlite"]
    ddl = "CREATE TABLE main.sys_sequence (name varchar(191) PRIMARY KEY)"
    try:
        with connection.cursor() as cursor:
            cursor.execute(ddl)
        call_command("migrate", "autoseq", "0002", database="sqlite", verbosity=0)
        call_command("migrate", "autoseq", database="sqlite", verbosity=0)
        with connection.cursor() as cursor:
            assert "sys_sequence" not in connection.introspection.table_names(cursor)
            cursor.execute(ddl)
            cursor.execute("INSERT INTO main.sys_sequence VALUES ('hand_made')")
        call_command("migrate", "autoseq", "0002", database="sqlite", verbosity=0)
        call_command("migrate", "autoseq", database="sqlite", verbosity=0)
        warnings = autoseq_checks.check_sqlite_admin(databases=["sqlite"])
        assert [w.id for w in warnings] == ["autoseq.W001"]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS main.sys_sequence")


FRESH_SETTINGS = """
    import os
    BASE = os.path.dirname(os.path.abspath(__file__))
    SECRET_KEY = "fresh"
    DEBUG = True
    ALLOWED_HOSTS = ["*"]
    ROOT_URLCONF = "urls"
    DEFAULT_AUTO_FIELD = "autoseq_django.fields.SequenceAutoField"
    INSTALLED_APPS = [
        "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
        "django.contrib.sessions", "django.contrib.messages", "autoseq_django", "shop",
    ]
    MIDDLEWARE = [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ]
    TEMPLATES = [{
        "BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
        "OPTIONS": {"context_processors": [
            "django.template.context_processors.request",
            "django.contrib.auth.context_processors.auth",
            "django.contrib.messages.context_processors.messages",
        ]},
    }]
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.sqlite3", "NAME": os.path.join(BASE, "db.sqlite3"),
    }}
"""

FRESH_SCRIPT = """
    from autoseq_django.models import SysSequence
    from shop.models import Item
    items = [Item.objects.create(name=str(i)) for i in range(3)]
    print("keys", [item.pk for item in items])
    print("rows", sorted(SysSequence.objects.values_list("name", "current")))
    from django.contrib.auth.models import User
    from django.test import Client
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
    page = client.get("/admin/autoseq/syssequence/").content.decode()
    print("admin lists shop_item:", "shop_item" in page)
"""


FRESH_TESTS = """
    from django.contrib.auth.models import User
    from django.test import TestCase

    from autoseq_django.models import SysSequence
    from shop.models import Item


    class ItemTests(TestCase):
        def test_keys(self):
            first, second = Item.objects.create(), Item.objects.create()
            self.assertEqual(second.pk, first.pk + 1)

        def test_admin_lists_the_sequences(self):
            Item.objects.create()
            self.assertTrue(SysSequence.objects.filter(name="shop_item").exists())
            self.client.force_login(User.objects.create_superuser("a", "a@example.com", "pw"))
            page = self.client.get("/admin/autoseq/syssequence/").content.decode()
            self.assertIn("shop_item", page)
"""

FRESH_PYTEST = """
    import pytest
    from django.contrib.auth.models import User

    from shop.models import Item


    @pytest.mark.django_db
    def test_admin_lists_the_sequences(client):
        Item.objects.create()
        client.force_login(User.objects.create_superuser("a", "a@example.com", "pw"))
        assert "shop_item" in client.get("/admin/autoseq/syssequence/").content.decode()
"""


def fresh_project(tmp_path: Path, settings: str = "") -> Callable[..., str]:
    """Write a startproject-like SQLite project; returns a runner of Python in it."""
    (tmp_path / "settings.py").write_text(textwrap.dedent(FRESH_SETTINGS) + settings)
    (tmp_path / "urls.py").write_text(
        "from django.contrib import admin\nfrom django.urls import path\n"
        "urlpatterns = [path('admin/', admin.site.urls)]\n"
    )
    shop = tmp_path / "shop"
    (shop / "migrations").mkdir(parents=True)
    (shop / "__init__.py").write_text("")
    (shop / "migrations" / "__init__.py").write_text("")
    (shop / "models.py").write_text(
        "from django.db import models\n\n\nclass Item(models.Model):\n"
        "    name = models.CharField(max_length=20)\n"
    )
    (shop / "tests.py").write_text(textwrap.dedent(FRESH_TESTS))
    (tmp_path / "test_shop_pytest.py").write_text(textwrap.dedent(FRESH_PYTEST))
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(DJANGO_SETTINGS_MODULE="settings", PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout + done.stderr

    return run


def test_a_fresh_sqlite_project_is_quiet(tmp_path: Path) -> None:
    """startproject-like settings on SQLite: check, migrate, test, pytest, shell, no warning.

    Both test runners use an in-memory database, whose admin lists the sequences.
    """
    run = fresh_project(tmp_path)

    def django(*args: str) -> str:
        return run("-m", "django", *args)

    outputs = [
        django("check"),
        django("makemigrations", "shop"),
        django("migrate"),
        django("check", "--database", "default"),
        django("test", "shop"),
        run("-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error", "test_shop_pytest.py"),
        django("shell", "-c", textwrap.dedent(FRESH_SCRIPT)),
    ]
    assert not [line for out in outputs for line in out.splitlines() if "autoseq.W" in line]
    assert "keys [1, 2, 3]" in outputs[-1]
    assert "('shop_item', 101)" in outputs[-1]
    assert "admin lists shop_item: True" in outputs[-1]
    with sqlite3.connect(tmp_path / "db.sqlite3") as main:
        tables = {row[0] for row in main.execute("SELECT name FROM sqlite_master")}
    assert "sys_sequence" not in tables
    assert (tmp_path / "db.sqlite3.autoseq").exists()


IMMEDIATE_TESTS = """
    from django.test import TestCase

    from autoseq_django.models import SysSequence
    from shop.models import Item


    class ItemTests(TestCase):
        def test_keys_and_an_empty_sequence_list(self):
            first, second = Item.objects.create(), Item.objects.create()
            self.assertEqual(second.pk, first.pk + 1)
            # Not attached under BEGIN IMMEDIATE: an empty table, not an error.
            self.assertEqual(list(SysSequence.objects.all()), [])
"""


def test_an_in_memory_immediate_database_works_without_the_list(tmp_path: Path) -> None:
    """transaction_mode IMMEDIATE on the in-memory test database: inserts work, no crash."""
    run = fresh_project(
        tmp_path, 'DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE"}\n'
    )
    (tmp_path / "shop" / "tests.py").write_text(textwrap.dedent(IMMEDIATE_TESTS))
    run("-m", "django", "makemigrations", "shop")
    assert "OK" in run("-m", "django", "test", "shop")


@pytest.mark.django_db(databases=FILE_DATABASES, transaction=True)
def test_gapless_rows_of_a_sqlite_file_are_queried_listed_and_set() -> None:
    """SysSequence and manage.py autoseq see a gapless key's row (kept in the main file).

    `manage.py autoseq set` moves it: the next committed key is the value set.
    """
    import io

    from django.db import transaction

    from django_tests.testapp.models import Voucher

    name = Voucher._meta.get_field("id").sequence_name
    with transaction.atomic(using="sqlite"):
        last = [Voucher.objects.using("sqlite").create().pk for _ in range(3)][-1]
    row = SysSequence.objects.using("sqlite").get(name=name)
    assert row.current == last + 1
    out = io.StringIO()
    call_command("autoseq", "list", database="sqlite", stdout=out)
    assert [line.split()[:2] for line in out.getvalue().splitlines() if name in line] == [
        [name, str(last + 1)]
    ]
    call_command("autoseq", "set", name, str(last + 50), database="sqlite", stdout=out)
    with transaction.atomic(using="sqlite"):
        assert Voucher.objects.using("sqlite").create().pk == last + 50
    out = io.StringIO()
    call_command("autoseq", "set", name, str(last + 51), database="sqlite", stdout=out)
    assert out.getvalue() == f"{name!r}: current {last + 51}, unchanged\n"


@pytest.mark.django_db(databases=FILE_DATABASES)
def test_sequence_keys_are_the_sqlite_rowid() -> None:
    """A SequenceField key and a SequenceAutoField are ``integer PRIMARY KEY``: the rowid."""
    from django_tests.switch.models import Widget

    connection = connections["sqlite"]
    for model in (Order, Widget):
        with connection.cursor() as cursor:
            cursor.execute("SELECT sql FROM sqlite_master WHERE name = %s", [model._meta.db_table])
            ddl = cursor.fetchone()[0]
            cursor.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = %s",
                [model._meta.db_table],
            )
            indexes = cursor.fetchone()[0]
        assert '"id" integer NOT NULL PRIMARY KEY' in ddl
        assert indexes == 0  # a bigint key would add sqlite_autoindex_<table>_1
    orders = Order.objects.using("sqlite").bulk_create([Order() for _ in range(5)])
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT rowid, id FROM {Order._meta.db_table}")
        pairs = sorted(cursor.fetchall())
    assert pairs == sorted((order.pk, order.pk) for order in orders)
