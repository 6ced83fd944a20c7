"""Where sequences live: the database written to, a router's choice, or AUTOSEQ DATABASE."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import override_settings

from autoseq_django import registry as sequences
from autoseq_django.routers import SequenceRouter
from django_tests.testapp.models import Invoice


def current_in(alias: str, name: str) -> int | None:
    row = sequences.store(alias).read(name)
    return None if row is None else row.next_value


@pytest.mark.autoseq_all_databases
def test_rows_draw_from_the_database_they_are_written_to(backend: str) -> None:
    """using= picks the sys_sequence of that database and leaves the others alone."""
    others = [alias for alias in ("default", "sqlite", "postgres", "mysql") if alias != backend]
    reachable = [alias for alias in others if alias in settings.DATABASES]
    before = {alias: current_in(alias, "testapp_invoice") for alias in reachable}
    created = Invoice.objects.using(backend).bulk_create([Invoice() for _ in range(20)])
    assert current_in(backend, "testapp_invoice") > max(i.pk for i in created)  # type: ignore[operator]
    assert {alias: current_in(alias, "testapp_invoice") for alias in reachable} == before


@pytest.mark.autoseq_all_databases
def test_a_router_sends_every_sequence_elsewhere(backend: str) -> None:
    """A router's db_for_write(SysSequence) holds the sequences of every database."""
    routers = ["django_tests.routers.SequencesInSqlite"]
    with override_settings(DATABASE_ROUTERS=routers):
        assert sequences.sequence_database(backend) == "sqlite"
        Invoice.objects.using(backend).create()
        before = current_in("sqlite", "testapp_invoice")
        Invoice.objects.using(backend).bulk_create([Invoice() for _ in range(50)])
        assert current_in("sqlite", "testapp_invoice") > before  # type: ignore[operator]


def test_database_setting_wins_over_routers() -> None:
    """AUTOSEQ DATABASE names the sequence database for every write database."""
    with override_settings(AUTOSEQ={"DATABASE": "sqlite"}):
        assert {sequences.sequence_database(a) for a in ("default", "postgres")} == {"sqlite"}
    assert sequences.sequence_database("postgres") == "postgres"


def test_router_keeps_a_companion_for_sequences_only() -> None:
    """Only sys_sequence is migrated into a SQLite companion; elsewhere no opinion."""
    router = SequenceRouter()
    assert router.allow_migrate("sqlite_seq", "autoseq") is True
    assert router.allow_migrate("sqlite_seq", "testapp") is False
    assert router.allow_migrate("postgres", "testapp") is None
    with override_settings(AUTOSEQ={"DATABASE": "sqlite"}):
        assert router.allow_migrate("sqlite", "autoseq") is True
        assert router.allow_migrate("sqlite", "testapp") is None
        from autoseq_django.models import SysSequence

        assert router.db_for_read(SysSequence) == "sqlite"
        assert router.db_for_write(Invoice) is None
