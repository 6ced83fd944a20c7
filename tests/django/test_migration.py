"""The documented move from AutoField: a table with rows converts and continues past max(id)."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.db import connections
from django.db.migrations.executor import MigrationExecutor

from autoseq_django import registry as sequences
from django_tests.legacy.models import Ticket


@pytest.mark.autoseq_transaction
def test_autofield_table_converts_and_continues(backend: str) -> None:
    """AlterField to SequenceField + RunPython(sync_sequences): new keys follow the old max."""
    call_command("migrate", "legacy", "0001", database=backend, verbosity=0)
    try:
        state = MigrationExecutor(connections[backend]).loader.project_state(
            ("legacy", "0001_initial")
        )
        old_ticket = state.apps.get_model("legacy", "Ticket")
        old_ticket.objects.using(backend).bulk_create(
            [old_ticket(title=f"old {i}") for i in range(40)]
        )
        stored = sequences.store(sequences.sequence_database(backend)).read("legacy_ticket")
        # Far past anything the sequence has handed out, so only sync can explain
        # new keys following it.
        old_max = (stored.next_value if stored else 1) + 500
        old_ticket.objects.using(backend).create(id=old_max, title="far")
    finally:
        call_command("migrate", "legacy", database=backend, verbosity=0)
    first = Ticket.objects.using(backend).create(title="new")
    bulk = Ticket.objects.using(backend).bulk_create([Ticket(title="bulk") for _ in range(10)])
    assert first.pk == old_max + 1
    assert [ticket.pk for ticket in bulk] == list(range(old_max + 2, old_max + 12))
    assert Ticket.objects.using(backend).count() == 52
    assert sorted(Ticket.objects.using(backend).values_list("pk", flat=True))[:40] == list(
        range(1, 41)
    )


@pytest.mark.django_db(databases="__all__")
def test_migration_matches_the_models() -> None:
    """makemigrations finds nothing to write: 0002 is what Django generates for the move."""
    call_command("makemigrations", "legacy", "autoseq", check=True, dry_run=True, verbosity=0)


@pytest.mark.autoseq_transaction
def test_sys_sequence_migration_is_idempotent_and_shared(backend: str) -> None:
    """Migrating autoseq again over an existing sys_sequence keeps its rows; both sides agree."""
    import sqlalchemy as sa

    from autoseq_django.models import SysSequence

    Ticket.objects.using(backend).create(title="x")
    store = sequences.store(sequences.sequence_database(backend))
    before = store.read("legacy_ticket")
    call_command("migrate", "autoseq", "zero", database=backend, verbosity=0)
    call_command("migrate", "autoseq", database=backend, verbosity=0)
    assert store.read("legacy_ticket") == before
    columns = {c["name"]: c for c in sa.inspect(store.engine).get_columns("sys_sequence")}
    assert set(columns) == {f.column for f in SysSequence._meta.concrete_fields}
    assert [name for name, c in columns.items() if c["nullable"]] == ["updated_at"]
    if backend != "sqlite":  # on SQLite Django reads the companion only through an alias
        row = SysSequence.objects.using(backend).get(name="legacy_ticket")
        assert row.as_config() == before


@pytest.mark.autoseq_transaction
def test_migration_0002_adds_version_to_an_older_table(backend: str) -> None:
    """A sys_sequence from before versions gains the column; its rows keep serving from 0."""
    import sqlalchemy as sa

    Ticket.objects.using(backend).create(title="before")
    store = sequences.store(sequences.sequence_database(backend))
    before = store.read("legacy_ticket")
    assert before is not None
    call_command("migrate", "autoseq", "0001", database=backend, verbosity=0)
    with store.engine.begin() as connection:
        connection.exec_driver_sql("ALTER TABLE sys_sequence DROP COLUMN version")
    call_command("migrate", "autoseq", database=backend, verbosity=0)
    columns = {c["name"] for c in sa.inspect(store.engine).get_columns("sys_sequence")}
    assert "version" in columns
    after = store.read("legacy_ticket")
    assert after is not None
    assert (after.next_value, after.version) == (before.next_value, 0)
    sequences.reset()
    assert Ticket.objects.using(backend).create(title="after").pk >= before.next_value


@pytest.mark.autoseq_transaction
def test_migration_0004_gives_sequence_names_a_binary_collation(backend: str) -> None:
    """On MariaDB a name column that folds case is altered: Orders and orders are two rows."""
    import sqlalchemy as sa

    from autoseq import SequenceConfig
    from autoseq_django.models import SysSequence

    if backend != "mysql":
        pytest.skip("PostgreSQL and SQLite compare names byte for byte already")
    store = sequences.store(sequences.sequence_database(backend))
    store.create(SequenceConfig("legacy_ticket"))
    call_command("migrate", "autoseq", "0003", database=backend, verbosity=0)
    with store.engine.begin() as connection:
        connection.exec_driver_sql(
            "ALTER TABLE sys_sequence MODIFY name VARCHAR(191) "
            "CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL"
        )
    call_command("migrate", "autoseq", database=backend, verbosity=0)
    with store.engine.connect() as connection:
        collation = connection.execute(
            sa.text(
                "SELECT collation_name FROM information_schema.columns WHERE "
                "table_schema = DATABASE() AND table_name = 'sys_sequence' "
                "AND column_name = 'name'"
            )
        ).scalar()
    assert collation == "utf8mb4_bin"
    fresh = type(store)(store.app_url)  # a store that has not upgraded the table itself
    try:
        fresh.create(SequenceConfig("Legacy_Ticket", start=700))
        rows = SysSequence.objects.using(backend).filter(
            name__in=["legacy_ticket", "Legacy_Ticket"]
        )
        assert sorted((row.name, row.start) for row in rows) == [
            ("Legacy_Ticket", 700),
            ("legacy_ticket", 1),
        ]
        assert fresh.delete("Legacy_Ticket")
    finally:
        fresh.close()
