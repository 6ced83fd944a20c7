"""Formatted serials (``autoseq.Serial``) on every store: templates, periods, widths, parsing."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from backends import REDIS_URL, sql_url, unavailable, unique_table

from autoseq import (
    GaplessUnavailable,
    InvalidSequenceConfig,
    SequenceExhausted,
    SequenceRegistry,
    Serial,
)
from autoseq.serial import InvalidSerial
from autoseq.stores import MemoryStore

STORES = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", marks=pytest.mark.postgres, id="postgres"),
    pytest.param("mysql", marks=pytest.mark.mysql, id="mysql"),
    pytest.param("mongodb", marks=pytest.mark.mongodb, id="mongodb"),
    pytest.param("redis", marks=pytest.mark.redis, id="redis"),
]


def _redis_store() -> Any:
    import redis

    from autoseq.stores import RedisStore

    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
        client.ping()
        client.close()
    except redis.RedisError as exc:
        unavailable("redis", f"cannot reach {REDIS_URL}: {exc}")
    return RedisStore(REDIS_URL, prefix=unique_table("autoseq_serial"))


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A fresh, empty store of each kind on its real server."""
    kind = request.param
    if kind == "memory":
        yield MemoryStore()
        return
    if kind == "mongodb":
        from autoseq.stores import MongoStore

        server = request.getfixturevalue("mongo_server")
        mongo = MongoStore(server.url, database=request.getfixturevalue("mongo_db_name"))
        yield mongo
        mongo.close()
        return
    if kind == "redis":
        redis_store = _redis_store()
        yield redis_store
        redis_store.drop_all()
        redis_store.close()
        return
    from autoseq.stores import SQLStore

    sql = SQLStore(sql_url(kind, tmp_path), table=unique_table())
    sql.create_table()
    yield sql
    sql.drop_table()
    sql.close()


class Clock:
    """A settable clock, as ``Serial(clock=...)`` takes."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


NOV_30_LATE = datetime(2026, 11, 30, 23, 59, 58, tzinfo=UTC)


def test_next_formats_the_counter_into_the_template(store: Any) -> None:
    """next() fills {n} and {date}; the first value is start."""
    serial = Serial(
        store, "inv", "INV-{date:%Y%m}-{n:05d}", period="month", clock=Clock(NOV_30_LATE)
    )
    assert serial.next() == "INV-202611-00001"
    assert serial.next_many(2) == ["INV-202611-00002", "INV-202611-00003"]
    serial.close()


def test_zero_padded_serials_sort_as_strings_in_the_order_taken(store: Any) -> None:
    """Within a period, zero-padded serials sort as text exactly as they were taken."""
    serial = Serial(store, "ord", "ORD-{n:06d}", batch_count=7)
    taken = [serial.next() for _ in range(30)] + serial.next_many(40)
    assert taken == sorted(taken)
    assert len(set(taken)) == 70
    serial.close()


def test_period_rollover_restarts_the_counter_in_a_new_row(store: Any) -> None:
    """At the month boundary the counter restarts at start, in the row '<name>:<key>'."""
    clock = Clock(NOV_30_LATE)
    serial = Serial(store, "invoices", "{date:%Y-%m}/{n:04d}", period="month", clock=clock)
    november = [serial.next() for _ in range(3)]
    clock.now += timedelta(seconds=3)
    december = [serial.next() for _ in range(2)]
    assert november == ["2026-11/0001", "2026-11/0002", "2026-11/0003"]
    assert december == ["2026-12/0001", "2026-12/0002"]
    names = {row.name for row in store.read_all()}
    assert {"invoices:2026-11", "invoices:2026-12"} <= names
    # The November block's unused tail went back to November's row, not December's.
    assert store.read("invoices:2026-11").current == 4
    serial.close()


def test_the_period_switches_at_the_boundary_in_the_serials_time_zone(store: Any) -> None:
    """23:30 UTC on 30 November is already December in Paris."""
    clock = Clock(datetime(2026, 11, 30, 22, 59, tzinfo=UTC))
    serial = Serial(
        store, "paris", "P{date:%Y%m%d}-{n:03d}", period="day", tz="Europe/Paris", clock=clock
    )
    assert serial.next() == "P20261130-001"
    clock.now = datetime(2026, 11, 30, 23, 30, tzinfo=UTC)
    assert serial.next() == "P20261201-001"
    serial.close()


def test_a_clock_going_back_continues_the_old_period_without_repeating(store: Any) -> None:
    """A clock stepping back into the previous period serves values past those handed out."""
    clock = Clock(NOV_30_LATE)
    serial = Serial(store, "back", "{date:%Y%m}{n:04d}", period="month", clock=clock)
    first = serial.next_many(3)
    clock.now += timedelta(seconds=5)
    serial.next()
    clock.now -= timedelta(seconds=5)
    again = serial.next()
    assert again not in first
    assert serial.parse(again) == ("2026-11", 4)
    serial.close()


def test_fixed_width_overflow_raises_exhausted(store: Any) -> None:
    """{n:02d} ends at 99; the next value raises SequenceExhausted."""
    serial = Serial(store, "w", "T{n:02d}", start=97, batch_count=2)
    assert serial.next_many(3) == ["T97", "T98", "T99"]
    with pytest.raises(SequenceExhausted, match="end 99"):
        serial.next()
    serial.close()


def test_fixed_width_overflow_wraps_with_cycle(store: Any) -> None:
    """With cycle=True, {n:02d} wraps from 99 back to start."""
    serial = Serial(store, "c", "T{n:02d}", start=98, cycle=True, batch_count=2)
    assert [serial.next() for _ in range(4)] == ["T98", "T99", "T98", "T99"]
    serial.close()


def test_parse_round_trips_what_next_made(store: Any) -> None:
    """parse(next()) gives back the period key and the counter."""
    serial = Serial(
        store,
        "rt",
        "ORD-{date:%Y%m%d}-{n:05d}",
        period="day",
        step=3,
        start=10,
        clock=Clock(NOV_30_LATE),
    )
    values = serial.next_many(4)
    assert [serial.parse(v) for v in values] == [("2026-11-30", n) for n in (10, 13, 16, 19)]
    serial.close()


@pytest.mark.parametrize(
    ("template", "period", "text", "parsed"),
    [
        ("INV-{date:%Y}-{n:05d}", "year", "INV-2026-00042", ("2026", 42)),
        ("{date:%y%m}{n:04d}", "month", "26110007", ("2026-11", 7)),
        ("{n}", None, "123456789", (None, 123456789)),
        ("T{n:d}/{date}", "day", "T5/2026-11-24", ("2026-11-24", 5)),
        ("{{x}}{n:03d}.{date:%B %Y}", "month", "{x}012.November 2026", ("2026-11", 12)),
        ("{date:%Y-%j}#{n}", "day", "2026-328#9", ("2026-11-24", 9)),
    ],
)
def test_parse_reads_period_key_and_counter(
    template: str, period: str | None, text: str, parsed: tuple[str | None, int]
) -> None:
    """parse understands every supported {n} and {date} spec, and format gives the text back."""
    serial = Serial(MemoryStore(), "p", template, period=period)
    assert serial.parse(text) == parsed
    key, counter = parsed
    day = None
    if key is not None:
        day = datetime.strptime(text and key, {4: "%Y", 7: "%Y-%m", 10: "%Y-%m-%d"}[len(key)])
    if day is not None and "%j" not in template:
        assert serial.format(counter, day.date()) == text


@pytest.mark.parametrize("text", ["INV-2026-0042", "INV-2026-000042", "inv-2026-00042", 42, ""])
def test_parse_refuses_text_the_template_did_not_make(text: Any) -> None:
    """A wrong width, prefix or type raises InvalidSerial naming the template."""
    serial = Serial(MemoryStore(), "p", "INV-{date:%Y}-{n:05d}", period="year")
    with pytest.raises(InvalidSerial, match="INV-"):
        serial.parse(text)


@pytest.mark.parametrize(
    ("template", "period", "message"),
    [
        ("INV-{x}-{n}", None, "only {n}"),
        ("INV-{}", None, "only {n}"),
        ("INV-{date:%Y}", "year", "has no {n}"),
        ("INV-{n}", "month", "has no {date}"),
        ("INV-{date:%Y}-{n}", None, "period is None"),
        ("INV-{date:%Y}-{n}", "month", "does not show the month"),
        ("INV-{date:%m}-{n}", "month", "does not show the year"),
        ("INV-{date:%Y%m%d %H}-{n}", "day", "%H is not allowed"),
        ("INV-{n:5d}", None, "zero-padded fixed width"),
        ("INV-{n:x}", None, "zero-padded fixed width"),
        ("INV-{n:019d}", None, "18 digits or fewer"),
        ("INV-{n!r}", None, "drop the !r"),
        ("INV-{n}{n}", None, "twice"),
        ("INV-{n", None, "not a valid str.format"),
        (42, None, "must be a str"),
    ],
)
def test_bad_templates_are_refused_at_construction(
    template: Any, period: str | None, message: str
) -> None:
    """Every template that cannot make unique, parseable serials raises InvalidSequenceConfig."""
    with pytest.raises(InvalidSequenceConfig, match=message):
        Serial(MemoryStore(), "bad", template, period=period)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"period": "week"}, "period='week'"),
        ({"tz": "Mars/Olympus"}, "not a known time zone"),
        ({"start": -1}, "starts at 0 or more"),
        ({"start": 1000}, "does not fit"),
        ({"step": 0}, "step must be 1 or more"),
        ({"batch_count": 0}, "batch_count must be 1 or more"),
    ],
)
def test_bad_settings_are_refused_at_construction(kwargs: dict[str, Any], message: str) -> None:
    """Unknown periods and zones, negative or too large starts raise InvalidSequenceConfig."""
    with pytest.raises(InvalidSequenceConfig, match=message):
        Serial(MemoryStore(), "bad", "{date:%Y%m%d}{n:03d}", **{"period": "day", **kwargs})


def test_a_naive_clock_is_refused() -> None:
    """A clock returning a naive datetime raises InvalidSequenceConfig at next()."""
    serial = Serial(
        MemoryStore(), "n", "{date:%Y}{n}", period="year", clock=lambda: datetime(2026, 1, 1)
    )
    with pytest.raises(InvalidSequenceConfig, match="aware datetime"):
        serial.next()


def test_gapless_on_a_store_without_transactions_is_refused() -> None:
    """gapless=True on a MemoryStore raises GaplessUnavailable saying what to use."""
    with pytest.raises(GaplessUnavailable, match="needs a SQLStore"):
        Serial(MemoryStore(), "g", "G{n}", gapless=True)


def test_serials_sharing_a_registry_share_the_rows() -> None:
    """Two Serials of one name on one registry never hand out the same value."""
    registry = SequenceRegistry(MemoryStore())
    clock = Clock(NOV_30_LATE)
    one = Serial(registry, "s", "{date:%Y%m}{n:03d}", period="month", clock=clock)
    two = Serial(registry, "s", "{date:%Y%m}{n:03d}", period="month", clock=clock)
    taken = [one.next(), two.next(), one.next()]
    clock.now += timedelta(seconds=5)
    taken += [two.next(), one.next(), two.next()]
    assert len(set(taken)) == 6
    assert taken[3:] == ["202612001", "202612002", "202612003"]


def test_threads_never_get_the_same_serial(store: Any) -> None:
    """8 threads taking serials across a period switch: no serial repeats."""
    clock = Clock(NOV_30_LATE)
    serial = Serial(store, "t", "{date:%Y%m%d}-{n:06d}", period="day", clock=clock, batch_count=5)
    taken: list[str] = []
    guard = threading.Lock()

    def work(index: int) -> None:
        mine = []
        for i in range(60):
            if index == 0 and i == 30:
                clock.now += timedelta(seconds=5)
            mine.append(serial.next())
        with guard:
            taken.extend(mine)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(taken) == len(set(taken)) == 480
    serial.close()


def _rollover_worker(url: str, table: str, ticks: Any, barrier: Any, out: Any) -> None:
    from autoseq.stores import SQLStore

    store = SQLStore(url, table=table)

    def clock() -> datetime:
        return NOV_30_LATE + timedelta(seconds=ticks.value)

    serial = Serial(store, "x", "{date:%Y%m%d}-{n:06d}", period="day", clock=clock, batch_count=4)
    # 62 values leave this process holding part of a 30 November block at midnight.
    taken = [serial.next() for _ in range(62)]
    barrier.wait(60)  # the parent moves the clock past midnight
    barrier.wait(60)
    taken += [serial.next() for _ in range(60)]
    out.put(taken)
    serial.close()
    store.close()


@pytest.mark.parametrize("sql_backend", ["sqlite", "postgres", "mysql"], indirect=True)
def test_rollover_across_processes_leaks_no_value_into_the_next_day(
    sql_backend: str, tmp_path: Path
) -> None:
    """4 processes holding 30 November blocks cross midnight: 1 December starts at 1, no repeat."""
    from autoseq.stores import SQLStore

    url = sql_url(sql_backend, tmp_path)
    table = unique_table()
    setup = SQLStore(url, table=table)
    setup.create_table()
    context = multiprocessing.get_context("spawn")
    ticks = context.Value("i", 0)
    barrier = context.Barrier(5)
    out = context.Queue()
    workers = [
        context.Process(target=_rollover_worker, args=(url, table, ticks, barrier, out))
        for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    barrier.wait(60)
    ticks.value = 10
    barrier.wait(60)
    results = [out.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(30)
    parser = Serial(MemoryStore(), "x", "{date:%Y%m%d}-{n:06d}", period="day")
    by_day: dict[str, list[int]] = {}
    for taken in results:
        parsed = [parser.parse(value) for value in taken]
        assert [day for day, _ in parsed] == ["2026-11-30"] * 62 + ["2026-12-01"] * 60
        for day, counter in parsed:
            by_day.setdefault(str(day), []).append(counter)
    for day, counters in by_day.items():
        assert len(counters) == len(set(counters)), f"{day} repeated a value"
        row = setup.read(f"x:{day}")
        assert row is not None
        assert max(counters) < row.next_value
    assert min(by_day["2026-12-01"]) == 1
    assert sorted(by_day["2026-12-01"])[:4] == [1, 2, 3, 4]
    setup.drop_table()
    setup.close()


# counts are refused before any row is written (issue 29, item 14) ------------------------------


@pytest.mark.parametrize("count", [10**12, 10_000_001, -1, 1.5, True, "3", None])
def test_next_many_refuses_a_bad_count_before_creating_the_periods_row(
    store: Any, count: Any
) -> None:
    """Serial.next_many(10**12) and other bad counts raise InvalidCount; no row is created."""
    from autoseq.errors import InvalidCount

    serial = Serial(store, "cnt", "{date:%Y%m}-{n}", period="month", clock=Clock(NOV_30_LATE))
    with pytest.raises(InvalidCount, match="next_many"):
        serial.next_many(count)
    assert store.read_all() == []
    assert serial.next_many(2) == ["202611-1", "202611-2"]
    serial.close()


@pytest.mark.parametrize("sql_backend", ["sqlite", "postgres", "mysql"], indirect=True)
def test_gapless_next_many_refuses_a_bad_count_before_creating_the_row(
    sql_store: Any, db_url: str
) -> None:
    """A gapless Serial.next_many(10**12, connection) raises InvalidCount and writes nothing."""
    import sqlalchemy as sa

    from autoseq.errors import InvalidCount

    serial = Serial(sql_store, "gcnt", "G{n}", gapless=True)
    engine = sa.create_engine(db_url)
    with engine.begin() as connection, pytest.raises(InvalidCount, match="at most"):
        serial.next_many(10**12, connection)
    assert sql_store.read_all() == []
    assert not sa.inspect(engine).has_table(f"{sql_store.table.name}_gapless")
    engine.dispose()
