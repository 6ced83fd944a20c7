"""Formatted serials (``autoseq.Serial``) on every store: templates, periods, widths, parsing."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from backends import REDIS_URL, sql_url, unavailable, unique_table

from autoseq import (
    GaplessUnavailable,
    InvalidSequenceConfig,
    SequenceExhausted,
    SequenceRegistry,
    Serial,
)
from autoseq.serial import InvalidSerial, SerialOptions
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
        redis_store.drop()
        redis_store.close()
        return
    from autoseq.stores import SQLStore

    sql = SQLStore(sql_url(kind, tmp_path), table=unique_table())
    sql.create_table()
    yield sql
    sql.drop()
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


@pytest.mark.parametrize(
    ("tz", "around", "period"),
    [
        ("Europe/Paris", datetime(2026, 11, 30, 23, 0, tzinfo=UTC), "month"),
        ("Europe/Paris", datetime(2026, 12, 31, 23, 0, tzinfo=UTC), "year"),
        # Midnight does not exist on 6 September 2026 in Santiago (00:00 -04 is 01:00 -03).
        ("America/Santiago", datetime(2026, 9, 6, 4, 0, tzinfo=UTC), "day"),
        # On 5 April 2026 23:00-23:59 of the 4th happens twice there, just before midnight.
        ("America/Santiago", datetime(2026, 4, 5, 3, 30, tzinfo=UTC), "day"),
    ],
    ids=["paris-month", "paris-year", "santiago-gap", "santiago-fold"],
)
def test_the_period_is_right_on_every_call_across_a_boundary(
    tz: str, around: datetime, period: str
) -> None:
    """A fake clock walked across a boundary, back and forth: each serial shows its call's period.

    The serial converts the clock only when the period may have changed; a
    minute-by-minute walk either side of the boundary (DST gaps and folds
    at midnight included), then back across it, checks the shortcut never
    serves the period it has left.
    """
    zone = ZoneInfo(tz)
    key = {"day": "%Y%m%d", "month": "%Y%m", "year": "%Y"}[period]
    clock = Clock(around - timedelta(hours=3))
    serial = Serial(
        MemoryStore(), "walk", "{date:" + key + "}-{n:06d}", period=period, tz=tz, clock=clock
    )
    minutes = [*range(-180, 181), *range(180, -181, -7)]
    for minute in minutes:
        clock.now = around + timedelta(minutes=minute, seconds=minute % 60)
        expected = clock.now.astimezone(zone).strftime(key)
        shown = serial.next().split("-")[0]
        assert shown == expected, f"at {clock.now.isoformat()}: {shown}, expected {expected}"
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
        ("INV-{date:%Y%m%d %H}-{n}", "day", "%H is not allowed in {date:%Y%m%d %H}: it is a time"),
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
    setup.drop()
    setup.close()


# exact templates: a period's {date} shows the whole period (issue 29, item 3) -----------------

MID_NOVEMBER = datetime(2026, 11, 15, 12, 0, tzinfo=UTC)


def _serials_over_days(store: Any, template: str, days: int, per_day: int) -> list[str]:
    """``per_day`` serials on each of ``days`` simulated days from 15 November 2026."""
    clock = Clock(MID_NOVEMBER)
    serial = Serial(store, "days", template, period="day", clock=clock, batch_count=4)
    taken: list[str] = []
    for _ in range(days):
        taken += [serial.next(), *serial.next_many(per_day - 1)]
        clock.now += timedelta(days=1)
    serial.close()
    return taken


@pytest.mark.parametrize(
    "template",
    [
        "ORD-{date:%Y%d}-{n:05d}",
        "ORD-{date:%d-%Y}-{n:05d}",
        "ORD-{date:%a %d %Y}-{n:05d}",
        "ORD-{date:%y%e}-{n:05d}",
        "ORD-{date:%A %d}{date:%Y}-{n:05d}",
    ],
)
def test_day_templates_that_hide_the_month_are_refused_on_every_store(
    store: Any, template: str
) -> None:
    """A day's {date} without the month is refused before any row is written, on every store."""
    try:
        taken = _serials_over_days(store, template, days=120, per_day=3)
    except InvalidSequenceConfig as exc:
        refusal = str(exc)
    else:
        repeated = len(taken) - len(set(taken))
        pytest.fail(f"{template} was accepted: {repeated} of {len(taken)} serials repeated")
    assert "does not show the month (%m, %b or %B)" in refusal
    assert "{date:%Y%m%d}" in refusal
    assert store.read_all() == []


@pytest.mark.parametrize(
    "template",
    [
        "ORD-{date:%Y%m%d}-{n:05d}",
        "{date:%y%j}{n:04d}",
        "{date:%a %e %b %Y}/{n}",
        "{date:%d}{n:03d}{date:%B%y}",
    ],
)
def test_accepted_day_templates_never_repeat_over_120_days(store: Any, template: str) -> None:
    """120 simulated days across a new year, 3 serials a day: none repeats, each reads back."""
    taken = _serials_over_days(store, template, days=120, per_day=3)
    assert len(taken) == len(set(taken)) == 360
    parser = Serial(MemoryStore(), "days", template, period="day", clock=Clock(MID_NOVEMBER))
    keys = [parser.parse(text)[0] for text in taken]
    first = MID_NOVEMBER.date()
    assert keys == [str(first + timedelta(days=i // 3)) for i in range(360)]
    assert len([row for row in store.read_all() if row.name.startswith("days:")]) == 120


#: Directives whose every combination (up to three) is tried by the probe test below.
PROBED = ["%Y", "%y", "%m", "%b", "%B", "%d", "%e", "%j", "%a", "%u", "%w", "%%"]


def _probe_days(period: str) -> list[datetime]:
    """First days of periods from 2027 on (days: two years, and 5ths over 32 years)."""
    start = datetime(2027, 1, 1)
    if period == "year":
        return [start.replace(year=2027 + i) for i in range(60)]
    if period == "month":
        return [start.replace(year=2027 + i // 12, month=i % 12 + 1) for i in range(12 * 60)]
    days = [start + timedelta(days=i) for i in range(731)]
    return days + [start.replace(year=y, month=m, day=5) for y in range(2029, 2061) for m in (1, 3)]


@pytest.mark.parametrize("period", ["day", "month", "year"])
def test_a_template_is_accepted_exactly_when_its_periods_have_distinct_texts(period: str) -> None:
    """Any {date} of up to 3 directives is accepted iff the probed periods get distinct texts."""
    from itertools import product

    days = [day.date() for day in _probe_days(period)]
    accepted = refused = 0
    for size in (1, 2, 3):
        for combination in product(PROBED, repeat=size):
            spec = "-".join(combination)
            try:
                serial = Serial(MemoryStore(), "p", f"{{date:{spec}}}/{{n}}", period=period)
            except InvalidSequenceConfig as exc:
                serial, refusal = None, str(exc)
            if serial is None:
                assert "does not show" in refusal, spec
                texts = {_render(spec, day) for day in days}
                assert len(texts) < len(days), f"{spec} refused but never repeats"
                refused += 1
                continue
            texts = {serial.format(1, day) for day in days}
            assert len(texts) == len(days), f"{spec} accepted but repeats for period {period}"
            assert texts == {f"{_render(spec, day)}/1" for day in days}
            accepted += 1
    assert accepted > 50
    assert refused > 50


def _render(spec: str, day: Any) -> str:
    """``spec`` as the C library writes it (only C-locale, portable directives are probed)."""
    return str(day.strftime(spec))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("%x", "depends on the locale"),
        ("%c", "depends on the locale"),
        ("%G%m%d", "ISO week-based year"),
        ("%Y%V%u", "week number"),
        ("%Y%U%w", "week number"),
        ("%Y%W%a", "week number"),
        ("%C%y%m%d", "century alone"),
        ("%Y%m%-d", "platform-specific strftime flag"),
        ("%Y%m%_d", "platform-specific strftime flag"),
        ("%Y%m%Od", "platform-specific strftime flag"),
        ("%Y%m%d%", "lone %"),
        ("%Y%m%d%T", "time of day"),
        ("%Y%m%d%Z", "time of day"),
        ("%Y%m%d%s", "time of day"),
        ("%Y%m%d%q", "use only %Y %y"),
    ],
)
def test_directives_whose_text_is_not_sure_are_refused_with_what_to_use(
    spec: str, message: str
) -> None:
    """Locale-, platform- and week-based directives, time and unknown ones are refused by name."""
    with pytest.raises(InvalidSequenceConfig, match=f"is not allowed in .*{message}"):
        Serial(MemoryStore(), "d", f"{{date:{spec}}}-{{n}}", period="day")


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{date!s}-{n}", "drop the !s"),
        ("{date!r:%Y%m%d}-{n}", "drop the !r"),
        ("{date.year}{date:%m%d}-{n}", "only {n}"),
        ("{date[0]}-{n}", "only {n}"),
        ("{date:{spec}}-{n}", "nested fields"),
        ("{date:Ymd}-{n}", "does not show the year"),
        ("{{date:%Y%m%d}}-{n}", "has no {date}"),
    ],
)
def test_format_tricks_on_date_are_refused(template: str, message: str) -> None:
    """Conversions, attribute and index lookups, nested specs and escaped braces are no {date}."""
    with pytest.raises(InvalidSequenceConfig, match=message):
        Serial(MemoryStore(), "t", template, period="day")


@pytest.mark.parametrize(
    ("template", "period", "made"),
    [
        ("{date}-{n}", "day", "2026-03-05-7"),
        ("{date:}-{n}", "day", "2026-03-05-7"),
        ("{date:%F}-{n}", "day", "2026-03-05-7"),
        ("{date:%D}-{n}", "day", "03/05/26-7"),
        ("{date:%Y}/{n:03d}/{date:%m}", "month", "2026/007/03"),
        ("{date:%Y-%j}#{n}", "month", "2026-060#7"),
        ("{date:%b %Y}: 100%% {n}", "month", "Mar 2026: 100%% 7"),
        ("{date:%Y %%}{n}", "year", "2026 %7"),
        ("{date:%h %y} {n}", "month", "Mar 26 7"),
    ],
)
def test_accepted_date_specs_write_what_strftime_writes_in_the_c_locale(
    template: str, period: str, made: str
) -> None:
    """{date}, %F, %D and several {date} fields write C-locale strftime text that reads back."""
    serial = Serial(MemoryStore(), "a", template, period=period, clock=Clock(NOV_30_LATE))
    day = {"day": datetime(2026, 3, 5), "month": datetime(2026, 3, 1)}.get(
        period, datetime(2026, 1, 1)
    )
    assert serial.format(7, day.date()) == made
    assert serial.parse(made)[1] == 7
    assert len(made) <= serial.max_length


# exact parsing: a text is read only if formatting it gives it back (issue 29, item 4) ---------

#: Digit zeros of other scripts, which Python's regex digits and int() accept.
ARABIC_INDIC, FULLWIDTH, MATH_BOLD = 0x0660, 0xFF10, 0x1D7CE


def _digits(ascii_digits: str, zero: int) -> str:
    """``ascii_digits`` written with the digits starting at code point ``zero``."""
    return "".join(chr(zero + int(digit)) for digit in ascii_digits)


@pytest.mark.parametrize(
    ("template", "period", "text"),
    [
        ("ORD-{date:%Y%m%d}-{n:05d}", "day", f"ORD-{_digits('20261124', ARABIC_INDIC)}-00042"),
        ("ORD-{date:%Y%m%d}-{n:05d}", "day", f"ORD-20261124-{_digits('00042', FULLWIDTH)}"),
        ("ORD-{date:%Y%m%d}-{n:05d}", "day", f"ORD-{_digits('20261124', MATH_BOLD)}-00042"),
        ("T{n}", None, f"T{_digits('42', ARABIC_INDIC)}"),
        ("T{n}", None, "T042"),
        ("T{n}", None, "T00"),
        ("T{n}", None, "T" + "9" * 30),
        ("T{n}", None, "T9223372036854775808"),  # 2**63, one past the counter's end
        ("{date:%b %Y}-{n}", "month", "NOV 2026-1"),
        ("{date:%b %Y}-{n}", "month", "nov 2026-1"),
        ("{date:%B %Y}-{n}", "month", "NOVEMBER 2026-1"),
        ("{date:%a %d %b %Y}-{n}", "day", "Fri 24 Nov 2026-1"),  # 24 November is a Tuesday
        ("{date:%a %d %b %Y}-{n}", "day", "tue 24 Nov 2026-1"),
        ("{date:%Y%m%d}-{n}", "month", "20261105-1"),  # a month's serials show its 1st
        ("{date:%Y%m%d}-{n}", "day", "20261131-1"),  # no 31 November
        ("{date:%Y-%j}-{n}", "day", "2026-366-1"),  # 2026 has 365 days
        ("{date:%Y-%j}-{n}", "day", "2026-000-1"),
        ("{date:%Y %e}{date:%m}-{n}", "day", "2026 0511-1"),  # %e pads with a space
        ("{date:%Y}-{n}", "year", "02026-1"),
        ("{date:%Y}-{n}", "year", " 2026-1"),
    ],
)
def test_parse_refuses_texts_the_template_never_makes(
    template: str, period: str | None, text: str
) -> None:
    """A text that formatting its reading would not give back raises InvalidSerial."""
    serial = Serial(MemoryStore(), "p", template, period=period, clock=Clock(NOV_30_LATE))
    with pytest.raises(InvalidSerial, match="is not a serial of 'p'"):
        serial.parse(text)


def test_parse_reads_a_two_digit_year_as_the_latest_up_to_next_year() -> None:
    """With the clock in 2026, '27' is 2027 and '28' is 1928; each reads back to its text."""
    serial = Serial(MemoryStore(), "y", "{date:%y}-{n}", period="year", clock=Clock(NOV_30_LATE))
    assert serial.parse("26-1") == ("2026", 1)
    assert serial.parse("27-1") == ("2027", 1)
    assert serial.parse("28-1") == ("1928", 1)
    assert serial.parse("00-1") == ("2000", 1)


ROUND_TRIP_TEMPLATES = [
    ("ORD-{date:%Y%m%d}-{n:05d}", "day"),
    ("{n}{date:%y%j}", "day"),
    ("{date:%a %e %b %Y}/{n}", "day"),
    ("{date:%A, %d %B %y} #{n:03d}", "day"),
    ("{date}{n}", "day"),
    ("INV/{date:%b-%Y}/{n}", "month"),
    ("{date:%Y}{n:07d}{date:%m}", "month"),
    ("{date:%y}{n}", "year"),
    ("N{n}", None),
]


@pytest.mark.parametrize(("template", "period"), ROUND_TRIP_TEMPLATES)
def test_parse_and_format_are_inverse(template: str, period: str | None) -> None:
    """parse(format(n, day)) gives (key, n) back; any edited text parse accepts formats back."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    serial = Serial(MemoryStore(), "rt", template, period=period, clock=Clock(NOV_30_LATE))
    days = st.dates(min_value=datetime(1928, 1, 1).date(), max_value=datetime(2027, 12, 31).date())
    counters = st.integers(min_value=0, max_value=serial.config.end)

    @settings(max_examples=300, deadline=None, database=None)
    @given(day=days, counter=counters, edit=st.text(max_size=3), at=st.integers(0, 40))
    def check(day: Any, counter: int, edit: str, at: int) -> None:
        start = None if period is None else _period_start(day, period)
        text = serial.format(counter, start)
        assert serial.parse(text) == (serial.period_key(start), counter)
        changed = text[:at] + edit + text[at + len(edit) :]
        try:
            key, number = serial.parse(changed)
        except InvalidSerial:
            return
        assert _format_key(serial, key, number) == changed

    check()


def _period_start(day: Any, period: str) -> Any:
    """The first day of ``day``'s period."""
    if period == "month":
        return day.replace(day=1)
    return day.replace(month=1, day=1) if period == "year" else day


def _format_key(serial: Serial, key: str | None, counter: int) -> str:
    """The text of ``counter`` in the period whose key is ``key``."""
    if key is None:
        return serial.format(counter)
    parts = [int(part) for part in key.split("-")] + [1, 1]
    return serial.format(counter, datetime(parts[0], parts[1], parts[2]).date())


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


def test_serial_options_build_the_serial_their_settings_say() -> None:
    """SerialOptions.build makes a Serial with every setting given, gapless overridable."""
    options = SerialOptions("T-{date:%Y}-{n:03d}", period="year", start=5, step=2, cycle=True)
    serial = options.build(MemoryStore(), "tickets", gapless=False)
    assert (serial.name, serial.period, serial.config.start, serial.config.step) == (
        "tickets",
        "year",
        5,
        2,
    )
    assert serial.config.cycle
    assert serial.config.end == 999
    assert serial.next().endswith("-005")


def test_serial_options_check_refuses_what_serial_refuses() -> None:
    """SerialOptions.check raises InvalidSequenceConfig for a template Serial refuses."""
    with pytest.raises(InvalidSequenceConfig, match="period"):
        SerialOptions("T-{n}", period="week").check("tickets")
