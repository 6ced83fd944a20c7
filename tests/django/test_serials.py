"""Django ``SerialField``: serials on save, create and bulk_create; gapless in atomic()."""

from __future__ import annotations

import dataclasses
import inspect
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from django.db import connections, transaction

from autoseq import GaplessUnavailable
from django_tests.testapp.models import Receipt, Ticket, Voucher


class Rollback(Exception):
    """Raised inside atomic() to roll it back."""


def counters(alias: str, model: type, numbers: list[str]) -> list[int]:
    serial = model._meta.get_field("number").serial(alias)
    return [serial.parse(number)[1] for number in numbers]


def test_max_length_is_derived_from_the_template() -> None:
    """SerialField's max_length fits the longest serial of its template."""
    assert Ticket._meta.get_field("number").max_length == len("ORD-20261124-00001")


def test_serial_field_deconstructs_to_the_field_it_was() -> None:
    """deconstruct() leaves out exactly the settings at SerialField's own defaults, and the
    field it describes deconstructs the same (so migrations never see a change)."""
    from autoseq.serial import SerialOptions
    from autoseq_django.fields import SerialField

    declared = inspect.signature(SerialField.__init__).parameters
    for option in dataclasses.fields(SerialOptions):
        if option.name != "template":  # the defaults deconstruct() leaves out are the field's
            assert declared[option.name].default == option.default, option.name
    assert SerialField("T-{n:05d}").deconstruct()[3] == {"template": "T-{n:05d}", "max_length": 7}
    changed = {"period": "year", "tz": "Europe/Paris", "start": 3, "step": 2, "batch_count": 7}
    changed |= {"cycle": True, "clock": _clock, "gapless": True, "sequence": "s"}
    name, path, args, kwargs = SerialField("T-{date:%Y}-{n:05d}", **changed).deconstruct()
    assert path == "autoseq_django.fields.SerialField"
    assert kwargs == {"template": "T-{date:%Y}-{n:05d}", "max_length": 12, **changed}
    assert SerialField(*args, **kwargs).deconstruct() == (name, path, args, kwargs)


def _clock() -> datetime:
    return datetime.now(UTC)


def test_every_insert_path_takes_consecutive_serials(backend: str) -> None:
    """save(), create() and bulk_create() take the next serials of today, in order."""
    first = Ticket()
    first.save(using=backend)
    second = Ticket.objects.using(backend).create()
    bulk = Ticket.objects.using(backend).bulk_create([Ticket() for _ in range(7)])
    numbers = [first.number, second.number, *(t.number for t in bulk)]
    taken = counters(backend, Ticket, numbers)
    assert taken == list(range(taken[0], taken[0] + 9))
    stored = sorted(Ticket.objects.using(backend).values_list("number", flat=True))
    assert stored == sorted(numbers)


def test_an_explicit_serial_is_kept(backend: str) -> None:
    """A number the user set is stored as given, in save and bulk_create."""
    Ticket.objects.using(backend).create(number="OLD-1")
    Ticket.objects.using(backend).bulk_create([Ticket(number="OLD-2")])
    assert set(Ticket.objects.using(backend).values_list("number", flat=True)) == {
        "OLD-1",
        "OLD-2",
    }


def test_gapless_rollback_gives_the_number_back(backend: str) -> None:
    """A gapless number taken in a rolled-back atomic() block is taken again next time."""
    with transaction.atomic(using=backend):
        kept = Receipt.objects.using(backend).create()
    lost: list[Receipt] = []

    def take_then_fail() -> None:
        with transaction.atomic(using=backend):
            lost.append(Receipt.objects.using(backend).create())
            raise Rollback

    with pytest.raises(Rollback):
        take_then_fail()
    with transaction.atomic(using=backend):
        again = Receipt.objects.using(backend).create()
        bulk = Receipt.objects.using(backend).bulk_create([Receipt(), Receipt()])
    taken = counters(backend, Receipt, [kept.number, lost[0].number, again.number])
    assert taken[1] == taken[2] == taken[0] + 1
    assert counters(backend, Receipt, [r.number for r in bulk]) == [taken[0] + 2, taken[0] + 3]


def test_a_gapless_save_costs_one_statement_beside_its_insert(backend: str) -> None:
    """Once the row exists, a gapless create() runs the take and the INSERT, nothing else
    (on MariaDB too, where the take used to be an UPDATE and a locking read)."""
    from django.test.utils import CaptureQueriesContext

    create_in_atomic(backend)
    with CaptureQueriesContext(connections[backend]) as queries, transaction.atomic(using=backend):
        Receipt.objects.using(backend).create()
    statements = [q["sql"] for q in queries.captured_queries]
    statements = [sql for sql in statements if "SAVEPOINT" not in sql.upper()]
    assert len(statements) == 2, statements


@pytest.mark.autoseq_transaction
def test_gapless_outside_atomic_is_refused(backend: str) -> None:
    """In autocommit, outside atomic(), a gapless save raises GaplessUnavailable."""
    with pytest.raises(GaplessUnavailable, match="atomic"):
        Receipt.objects.using(backend).create()
    assert not Receipt.objects.using(backend).exists()


@pytest.mark.autoseq_transaction
def test_gapless_commits_are_consecutive_with_rollbacks_between(backend: str) -> None:
    """Real transactions, every third rolled back: committed numbers have no gap."""
    for i in range(9):
        try:
            with transaction.atomic(using=backend):
                Receipt.objects.using(backend).create(amount=i)
                if i % 3 == 2:
                    raise Rollback
        except Rollback:
            pass
    numbers = list(Receipt.objects.using(backend).values_list("number", flat=True))
    taken = sorted(counters(backend, Receipt, numbers))
    assert taken == list(range(taken[0], taken[0] + 6))


def test_gapless_sequence_field_gives_keys_back_on_rollback(backend: str) -> None:
    """SequenceField(gapless=True): keys taken in atomic(), a rolled-back one taken again."""
    with transaction.atomic(using=backend):
        first = Voucher.objects.using(backend).create().pk
    lost: list[int] = []

    def take_then_fail() -> None:
        with transaction.atomic(using=backend):
            lost.append(Voucher.objects.using(backend).create().pk)
            raise Rollback

    with pytest.raises(Rollback):
        take_then_fail()
    with transaction.atomic(using=backend):
        bulk = Voucher.objects.using(backend).bulk_create([Voucher(), Voucher()])
    assert lost == [first + 1]
    assert [v.pk for v in bulk] == [first + 1, first + 2]
    assert sorted(Voucher.objects.using(backend).values_list("pk", flat=True)) == [
        first,
        first + 1,
        first + 2,
    ]


@pytest.mark.autoseq_transaction
def test_gapless_sequence_field_outside_atomic_is_refused(backend: str) -> None:
    """A gapless key in autocommit raises GaplessUnavailable and inserts nothing."""
    with pytest.raises(GaplessUnavailable, match="atomic"):
        Voucher.objects.using(backend).create()
    assert not Voucher.objects.using(backend).exists()


@pytest.mark.autoseq_transaction
def test_gapless_key_row_created_for_a_table_with_rows_starts_past_them(backend: str) -> None:
    """With no row yet, a gapless key starts past the largest key stored."""
    from autoseq.stores.sql import gapless
    from autoseq_django import registry as sequences

    store = sequences.store(sequences.sequence_database(backend))
    name = Voucher._meta.get_field("id").sequence_name
    with transaction.atomic(using=backend):
        Voucher.objects.using(backend).bulk_create([Voucher(id=90), Voucher(id=99)])
    # No row anywhere, as for a table that had keys before the field existed.
    if connections[backend].vendor == "sqlite":
        table = gapless.sqlite_table(store).name  # gapless rows: in the application's file
        with connections[backend].cursor() as cursor:
            cursor.execute(f'DELETE FROM main."{table}" WHERE name = %s', [name])
    else:
        store.delete(name)
        gapless._created.get(store, set()).discard(name)
    with transaction.atomic(using=backend):
        assert Voucher.objects.using(backend).create().pk == 100


def test_a_gapless_sequence_field_declares_it_on_its_config() -> None:
    """SequenceField(gapless=True) carries gapless on its SequenceConfig, where take() reads it."""
    from autoseq import InvalidSequenceConfig
    from autoseq_django.fields import SequenceField
    from django_tests.testapp.models import Order

    assert Voucher._meta.get_field("id").sequence_config.gapless is True
    assert Order._meta.get_field("id").sequence_config.gapless is False
    with pytest.raises(InvalidSequenceConfig, match="gapless must be True or False"):
        SequenceField(gapless="yes")


def test_the_gapless_vendors_are_the_sql_stores_gapless_dialects() -> None:
    """The system checks' list of gapless databases is the SQL store's, whose statements run."""
    from autoseq.stores.sql.gapless import GAPLESS_DIALECTS
    from autoseq_django.serials import GAPLESS_VENDORS

    assert GAPLESS_VENDORS == GAPLESS_DIALECTS


@pytest.mark.django_db(databases=["sqlite", "sqlite_seq"])
def test_gapless_on_sqlite_with_sequences_in_the_companion_alias() -> None:
    """AUTOSEQ DATABASE naming the SQLite file's companion (as the example project does):
    gapless rows live in the file itself, so a gapless save works and has no E014."""
    from django.test import override_settings

    from autoseq_django.serials import gapless_problems

    field = Receipt._meta.get_field("number")
    with override_settings(AUTOSEQ={"DATABASE": "sqlite_seq"}):
        with transaction.atomic(using="sqlite"):
            first = Receipt.objects.using("sqlite").create()
            second = Receipt.objects.using("sqlite").create()
        assert counters("sqlite", Receipt, [second.number])[0] == (
            counters("sqlite", Receipt, [first.number])[0] + 1
        )
        problems = gapless_problems(field, True, "SerialField")
        flagged = {message.msg.split("database ")[1].split(",")[0] for message in problems}
        assert not any("'sqlite'" in text for text in flagged), flagged


@pytest.mark.autoseq_transaction
def test_a_settings_change_is_seen_by_the_next_gapless_take(backend: str) -> None:
    """What a take looks up once per connection is looked up again after AUTOSEQ changes:
    sequences sent to another database refuse the next gapless save."""
    from django.test import override_settings

    if backend == "sqlite":
        pytest.skip("the SQLite file's companion alias is allowed (see the test above)")
    with transaction.atomic(using=backend):
        Receipt.objects.using(backend).create()
    with (
        override_settings(AUTOSEQ={"DATABASE": "sqlite_seq"}),
        pytest.raises(GaplessUnavailable, match="same transaction as the row"),
        transaction.atomic(using=backend),
    ):
        Receipt.objects.using(backend).create()
    with transaction.atomic(using=backend):
        Receipt.objects.using(backend).create()


@pytest.mark.autoseq_transaction
def test_an_explicit_key_on_a_gapless_field_leaves_the_row_alone(backend: str) -> None:
    """A key the user sets on a gapless SequenceField is kept; no block is reserved on the
    gapless row to catch up past it, so the next taken key follows the last taken one."""
    with transaction.atomic(using=backend):
        first = Voucher.objects.using(backend).create()
    with transaction.atomic(using=backend):
        Voucher.objects.using(backend).create(id=first.id + 1000)
    with transaction.atomic(using=backend):
        second = Voucher.objects.using(backend).create()
    assert second.id == first.id + 1


@pytest.mark.autoseq_transaction
@pytest.mark.timeout(120)
def test_a_settings_change_inside_a_transaction_does_not_wait_on_its_own_lock(
    backend: str,
) -> None:
    """After AUTOSEQ changes, a new store serves the same transaction's next gapless save.

    The transaction holds the gapless row's lock from its first save; the
    store built after the change must not try to create that row again
    (which would wait on this transaction's own lock until a timeout).
    """
    from django.test import override_settings

    with transaction.atomic(using=backend):
        first = Receipt.objects.using(backend).create()
        with override_settings(AUTOSEQ={"DEFAULTS": {"batch_count": 50}}):
            second = Receipt.objects.using(backend).create()
    taken = counters(backend, Receipt, [first.number, second.number])
    assert taken[1] == taken[0] + 1


def create_in_atomic(backend: str) -> Receipt:
    """A ``Receipt`` saved in its own ``atomic()`` block."""
    with transaction.atomic(using=backend):
        return Receipt.objects.using(backend).create()


def _round_trips(alias: str, work: Callable[[], object]) -> list[str]:
    """The client's queries while ``work`` runs on ``alias`` (libpq's protocol trace)."""
    from psycopg import pq

    connection = connections[alias]
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile() as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            work()
        finally:
            pgconn.untrace()
        trace.seek(0)
        lines = trace.read().decode().splitlines()
    # A simple query is one round trip: the client's Query, the server's ReadyForQuery.
    assert sum("\tReadyForQuery\t" in line for line in lines) == len(
        [line for line in lines if line.startswith("F\t") and "\tQuery\t" in line]
    ), lines
    return [line.split("\tQuery\t", 1)[1] for line in lines if line.startswith("F\t")]


@pytest.mark.autoseq_transaction
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_gapless_take_opening_its_transaction_sends_begin_with_it(backend: str) -> None:
    """PostgreSQL: a gapless save that is its transaction's first statement sends BEGIN and
    the take in one query, so the whole transaction is three round trips, not four."""
    with transaction.atomic(using=backend):
        first = Receipt.objects.using(backend).create()
    made: list[Receipt] = []
    queries = _round_trips(backend, lambda: made.append(create_in_atomic(backend)))
    assert len(queries) == 3, queries
    assert queries[0].startswith(' "BEGIN; UPDATE'), queries
    assert queries[1].startswith(' "INSERT'), queries
    assert queries[2] == ' "COMMIT"', queries
    taken = counters(backend, Receipt, [first.number, made[0].number])
    assert taken[1] == taken[0] + 1


@pytest.mark.autoseq_transaction
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_logged_gapless_take_goes_through_the_cursor(backend: str) -> None:
    """With queries logged (DEBUG, assertNumQueries) the take is an ordinary cursor query,
    seen by Django like any other, after psycopg's own BEGIN."""
    from django.test.utils import CaptureQueriesContext

    create_in_atomic(backend)
    with CaptureQueriesContext(connections[backend]) as captured:
        queries = _round_trips(backend, lambda: create_in_atomic(backend))
    assert [q[:8] for q in queries] == [' "BEGIN"', ' "UPDATE', ' "INSERT', ' "COMMIT']
    assert any(q["sql"].startswith("UPDATE") for q in captured.captured_queries)


@pytest.mark.autoseq_transaction
@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_joined_take_that_fails_raises_djangos_error_and_rolls_back(backend: str) -> None:
    """A take sent with its BEGIN that meets a lock timeout raises Django's OperationalError;
    the transaction is rolled back and the next save gets the next number."""
    import psycopg
    from django.db import OperationalError

    with transaction.atomic(using=backend):
        first = Receipt.objects.using(backend).create()
    store = Receipt._meta.get_field("number").serial(backend)
    row = store.row_config(store._now()).name
    settings = connections[backend].settings_dict
    holder = psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"],
        user=settings["USER"],
        dbname=settings["NAME"],
        password=settings["PASSWORD"] or None,
    )
    try:
        holder.execute("SELECT 1 FROM sys_sequence WHERE name = %s FOR UPDATE", (row,))
        with connections[backend].cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        with pytest.raises(OperationalError, match="lock timeout"):
            create_in_atomic(backend)
    finally:
        holder.rollback()
        holder.close()
        with connections[backend].cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    again = create_in_atomic(backend)
    taken = counters(backend, Receipt, [first.number, again.number])
    assert taken[1] == taken[0] + 1
    assert Receipt.objects.using(backend).count() == 2
