"""``autoseq doctor``: each check against real stores, the exit codes and the JSON shape."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from backends import REDIS_URL, drop_sql_store, unavailable, unique_table

from autoseq import SequenceConfig
from autoseq.cli import main
from autoseq.doctor import ColumnUse, examine
from autoseq.sqlalchemy import application_tables
from autoseq.stores.sql import SQLStore


@dataclass
class Run:
    status: int
    out: str
    err: str

    def json(self) -> dict[str, Any]:
        return json.loads(self.out)  # type: ignore[no-any-return]


@pytest.fixture
def doctor(capsys: pytest.CaptureFixture[str]) -> Callable[..., Run]:
    """Runs ``autoseq ARGS...`` in-process and captures what it prints."""

    def run(*args: str) -> Run:
        capsys.readouterr()
        status = main(list(args))
        captured = capsys.readouterr()
        return Run(status, captured.out, captured.err)

    return run


@dataclass
class SqlSetup:
    url: str
    table: str  # the sequence table
    store: SQLStore
    make_rows: Callable[[list[int]], str]

    def args(self, *more: str) -> list[str]:
        return ["--url", self.url, "--sequence-table", self.table, "doctor", *more]


@pytest.fixture
def sql(db_url: str) -> Iterator[SqlSetup]:
    """A sequence table of the test's own and a maker of application tables holding ids."""
    table = unique_table("sys")
    store = SQLStore(db_url, table=table)
    store.create_table()
    engine = sa.create_engine(db_url)
    metadata = sa.MetaData()

    def make_rows(ids: list[int]) -> str:
        app = sa.Table(
            unique_table("app"),
            metadata,
            sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        )
        app.create(engine)
        if ids:
            with engine.begin() as connection:
                connection.execute(sa.insert(app), [{"id": i} for i in ids])
        return app.name

    yield SqlSetup(db_url, table, store, make_rows)
    metadata.drop_all(engine, tables=application_tables(metadata))
    engine.dispose()
    drop_sql_store(store)


def finding(report: dict[str, Any], check: str, sequence: str | None = None) -> dict[str, Any]:
    matches = [
        f
        for f in report["findings"]
        if f["check"] == check and (sequence is None or f["sequence"] == sequence)
    ]
    assert len(matches) == 1, report["findings"]
    return matches[0]


# behind max(column) ----------------------------------------------------------------


def test_a_sequence_behind_max_id_is_an_error_until_synced(
    sql: SqlSetup, doctor: Callable[..., Run]
) -> None:
    """current at or below max(id) is an error (exit 1); after `autoseq sync` it is fine."""
    app = sql.make_rows([1, 2, 40])
    sql.store.create(SequenceConfig(app, current=7))
    behind = doctor(*sql.args("--column", f"{app}.id", "--json"))
    assert behind.status == 1, behind.err
    report = behind.json()
    assert report["status"] == "error"
    error = finding(report, "behind", app)
    assert error["level"] == "error"
    assert "7" in error["message"]
    assert "40" in error["message"]
    assert "autoseq sync" in error["message"]
    (sequence,) = report["sequences"]
    assert sequence["columns"] == [{"column": f"{app}.id", "max": 40}]
    assert (sequence["current"], sequence["status"]) == (7, "error")

    sync = ["sync", app, "--table", app, "--column", "id"]
    synced = main(["--url", sql.url, "--sequence-table", sql.table, *sync])
    assert synced == 0
    fine = doctor(*sql.args("--column", f"{app}.id", "--json"))
    assert fine.status == 0, fine.out
    assert finding(fine.json(), "behind", app)["level"] == "ok"
    assert fine.json()["sequences"][0]["current"] == 41


def test_a_column_can_name_its_sequence_and_the_text_report_says_why(
    sql: SqlSetup, doctor: Callable[..., Run]
) -> None:
    """--column T.C=SEQ checks SEQ; the table names the sequence, column, max and the fix."""
    app = sql.make_rows([5, 900])
    sql.store.create(SequenceConfig("tickets", current=900))
    result = doctor(*sql.args("--column", f"{app}.id=tickets"))
    assert result.status == 1
    lines = result.out.splitlines()
    row = next(line for line in lines if line.startswith("tickets "))
    assert row.split()[:4] == ["tickets", "error", "900", "900"]
    assert any(line.startswith("ERROR") and "max(" in line for line in lines)
    assert lines[-1] == "status: error (1 errors, 0 warnings)"


def test_a_missing_row_with_keys_in_its_column_is_a_warning(
    sql: SqlSetup, doctor: Callable[..., Run]
) -> None:
    """No row yet but keys in the column: created past them on first use, so a warning."""
    app = sql.make_rows([12])
    result = doctor(*sql.args("--column", f"{app}.id", "--json"))
    assert result.status == 0
    assert finding(result.json(), "behind", app)["level"] == "warning"
    assert doctor(*sql.args("--column", f"{app}.id", "--strict")).status == 1


def test_sequence_columns_are_found_in_sqlalchemy_metadata(
    sql: SqlSetup, doctor: Callable[..., Run], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--metadata MODULE:NAME checks every autoseq column of the metadata against its sequence."""
    table = unique_table("meta")
    module = f"doctor_models_{table}"
    (tmp_path / f"{module}.py").write_text(
        "import sqlalchemy as sa\n"
        "from autoseq.sqlalchemy import sequence_column\n"
        "metadata = sa.MetaData()\n"
        f"orders = sa.Table({table!r}, metadata, sequence_column('id', primary_key=True))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    engine = sa.create_engine(sql.url)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text(f"CREATE TABLE {table} (id BIGINT PRIMARY KEY)"))
            connection.execute(sa.text(f"INSERT INTO {table} (id) VALUES (3), (9)"))
        sql.store.create(SequenceConfig(table, current=5))
        result = doctor(*sql.args("--metadata", f"{module}:metadata", "--json"))
        assert result.status == 1, result.err
        assert finding(result.json(), "behind", table)["level"] == "error"
        assert result.json()["sequences"][0]["columns"] == [{"column": f"{table}.id", "max": 9}]
    finally:
        with engine.begin() as connection:
            connection.execute(sa.text(f"DROP TABLE {table}"))
        engine.dispose()
        sys.modules.pop(module, None)


@pytest.mark.mongodb
def test_a_sequence_behind_max_id_on_mongodb_is_an_error(
    mongo_server: Any, mongo_db_name: str, doctor: Callable[..., Run]
) -> None:
    """On MongoDB the field of a collection is checked the same way: behind, then synced."""
    import pymongo

    from autoseq.stores.mongo import MongoStore

    url = f"{mongo_server.url.rstrip('/')}/{mongo_db_name}"
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(url)
    store = MongoStore(url)
    try:
        client[mongo_db_name]["orders"].insert_many([{"_id": i} for i in (3, 77, 41)])
        store.create(SequenceConfig("orders", current=20))
        behind = doctor("--url", url, "doctor", "--column", "orders._id", "--json")
        assert behind.status == 1, behind.err
        error = finding(behind.json(), "behind", "orders")
        assert error["level"] == "error"
        assert "77" in error["message"]
        assert main(["--url", url, "sync", "orders", "--table", "orders", "--column", "_id"]) == 0
        fine = doctor("--url", url, "doctor", "--column", "orders._id", "--json")
        assert fine.status == 0, fine.out
        assert fine.json()["sequences"][0]["current"] == 78
    finally:
        store.close()
        client.close()


# invalid rows and values left ----------------------------------------------------------


def test_a_row_failing_validation_is_an_error_and_the_others_are_still_checked(
    sql: SqlSetup, doctor: Callable[..., Run]
) -> None:
    """A hand-edited row (current off the step grid) is reported; other rows still are."""
    sql.store.create(SequenceConfig("edited", step=10, current=11))
    sql.store.create(SequenceConfig("fine"))
    with sql.store.engine.begin() as connection:
        table = sql.store.table
        connection.execute(sa.update(table).where(table.c.name == "edited").values(current=15))
    result = doctor(*sql.args("--json"))
    assert result.status == 1
    report = result.json()
    invalid = finding(report, "invalid_row", "edited")
    assert invalid["level"] == "error"
    assert "autoseq set edited" in invalid["message"]
    statuses = {s["name"]: s["status"] for s in report["sequences"]}
    assert statuses == {"edited": "error", "fine": "ok"}


def test_a_flag_edited_to_text_or_two_is_an_error_as_serving_refuses_it(
    sql: SqlSetup, sql_backend: str, doctor: Callable[..., Run]
) -> None:
    """cycle = 'no' (SQLite) or 2 (SQLite, MariaDB), which reserve refuses, fails doctor too."""
    if sql_backend == "postgres":
        pytest.skip("a PostgreSQL BOOLEAN column holds only true and false")
    sql.store.create(SequenceConfig("edited"))
    literal = "'no'" if sql_backend == "sqlite" else "2"
    quote = sql.store.engine.dialect.identifier_preparer.quote
    with sql.store.engine.begin() as connection:
        connection.exec_driver_sql(f"UPDATE {quote(sql.table)} SET {quote('cycle')} = {literal}")
    result = doctor(*sql.args("--json"))
    assert result.status == 1
    invalid = finding(result.json(), "invalid_row", "edited")
    assert invalid["level"] == "error"
    assert "cycle must be true/false" in invalid["message"]


def test_values_left_warns_past_the_share_and_errors_when_exhausted(
    sql: SqlSetup, doctor: Callable[..., Run]
) -> None:
    """95% reserved is a warning (exit 0, 1 with --strict); an exhausted sequence an error."""
    sql.store.create(SequenceConfig("nearly", start=1, end=100, current=96))
    nearly = doctor(*sql.args("nearly", "--json"))
    assert nearly.status == 0
    warning = finding(nearly.json(), "values_left", "nearly")
    assert warning["level"] == "warning"
    assert "5 values left" in warning["message"]
    assert nearly.json()["sequences"][0]["values_left"] == 5
    assert doctor(*sql.args("nearly", "--strict")).status == 1

    sql.store.create(SequenceConfig("done", start=1, end=10))
    sql.store.reserve("done", 10)
    done = doctor(*sql.args("done", "--json"))
    assert done.status == 1
    assert "exhausted" in finding(done.json(), "values_left", "done")["message"]


def test_the_rate_measured_while_values_are_reserved_gives_the_time_to_end(
    sql: SqlSetup,
) -> None:
    """Watching current for a moment gives a rate and a time to end; a short one warns."""
    sql.store.create(SequenceConfig("busy", end=1_000_000, batch_count=50))
    stop = threading.Event()

    def reserve() -> None:
        while not stop.is_set():
            sql.store.reserve("busy", 50)
            time.sleep(0.01)

    worker = threading.Thread(target=reserve)
    worker.start()
    try:
        report = examine(sql.store, sample=0.5, warn_seconds=10 * 365 * 86400.0)
    finally:
        stop.set()
        worker.join()
    (busy,) = report.sequences
    assert busy.rate is not None
    assert busy.rate > 0
    assert busy.seconds_to_end == pytest.approx(busy.values_left / busy.rate)
    assert [f.level for f in report.findings if f.check == "values_left"] == ["warning"]


def test_rates_given_by_a_running_process_are_used_as_they_are(sql: SqlSetup) -> None:
    """examine(rates=...) takes a process's consumption rate instead of sampling."""
    sql.store.create(SequenceConfig("steady", end=1000))
    report = examine(sql.store, rates={"steady": 10.0})
    (steady,) = report.sequences
    assert steady.rate == 10.0
    assert steady.seconds_to_end == pytest.approx(100.0)
    assert report.status == "warning"  # 100 s to end is under the 30-day threshold


def test_a_column_that_cannot_be_read_is_an_error_not_a_crash(sql: SqlSetup) -> None:
    """A column reader's AutoseqError becomes an error finding; the rest is still checked."""
    from autoseq.cli import UsageError

    def broken() -> int | None:
        raise UsageError("table 'gone' does not exist in that database")

    sql.store.create(SequenceConfig("gone"))
    report = examine(sql.store, [ColumnUse("gone.id", "gone", broken)])
    (column,) = [f for f in report.findings if f.check == "column"]
    assert column.level == "error"
    assert "gone.id" in column.message
    assert report.exit_code() == 1


# store checks ----------------------------------------------------------------------


def test_sqlite_companion_is_checked_beside_the_database(
    tmp_path: Path, doctor: Callable[..., Run]
) -> None:
    """A SQLite database without its companion file warns; with it, the backup note is shown."""
    database = tmp_path / "app.db"
    url = f"sqlite:///{database}"
    sa.create_engine(url).connect().close()  # the application's file, with no sequences yet
    missing = doctor("--url", url, "doctor", "--json")
    assert missing.status == 0
    warning = finding(missing.json(), "companion")
    assert warning["level"] == "warning"
    assert "app.db.autoseq is missing" in warning["message"]
    assert not (tmp_path / "app.db.autoseq").exists()  # doctor creates nothing

    assert main(["--url", url, "create", "orders"]) == 0
    present = doctor("--url", url, "doctor", "--json")
    assert present.status == 0
    note = finding(present.json(), "companion")
    assert note["level"] == "ok"
    assert "the database first" in note["message"]


@pytest.mark.redis
def test_redis_persistence_is_reported_as_the_server_has_it(doctor: Callable[..., Run]) -> None:
    """appendonly no is an error, appendfsync other than always a warning (CONFIG GET)."""
    import redis

    prefix = unique_table("doc")
    try:
        client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
        settings = dict(client.config_get("append*"))
        client.close()
    except redis.RedisError as exc:
        unavailable("redis", str(exc))
    result = doctor("--url", REDIS_URL, "--sequence-table", prefix, "doctor", "--json")
    (persistence,) = [f for f in result.json()["findings"] if f["check"] == "redis_persistence"]
    if settings["appendonly"] != "yes":
        assert persistence["level"] == "error"
        assert "appendonly=no" in persistence["message"]
        assert result.status == 1
    elif settings["appendfsync"] != "always":
        assert persistence["level"] == "warning"
    else:
        assert persistence["level"] == "ok"


def test_an_unreachable_store_is_reported_with_exit_status_1(doctor: Callable[..., Run]) -> None:
    """A server that does not answer is an error finding (JSON still printed), exit 1."""
    result = doctor("--url", "mysql+pymysql://root@127.0.0.1:1/nothing", "doctor", "--json")
    assert result.status == 1
    report = result.json()
    assert report["status"] == "error"
    assert finding(report, "store")["level"] == "error"


def test_bad_arguments_exit_with_status_2(sql: SqlSetup, doctor: Callable[..., Run]) -> None:
    """A column hint without a table, or an unknown --metadata, is bad input: exit 2."""
    for args in (
        ("--column", "id"),
        ("--metadata", "no_such_module_here:Base"),
        ("--warn-share", "0"),
    ):
        result = doctor(*sql.args(*args))
        assert result.status == 2, args
        assert result.out == ""
        assert result.err.startswith("autoseq: error: ")


def test_the_json_report_has_a_stable_shape(sql: SqlSetup, doctor: Callable[..., Run]) -> None:
    """--json prints status, store, sequences (with columns) and findings, all plain data."""
    app = sql.make_rows([])
    sql.store.create(SequenceConfig(app))
    report = doctor(*sql.args("--column", f"{app}.id", "--json")).json()
    assert set(report) == {"status", "store", "sequences", "findings"}
    assert report["status"] in ("ok", "warning")
    assert "password" not in report["store"]
    (sequence,) = report["sequences"]
    assert set(sequence) == {
        "name",
        "status",
        "current",
        "end",
        "step",
        "cycle",
        "values_left",
        "rate_per_second",
        "seconds_to_end",
        "columns",
    }
    assert sequence["columns"] == [{"column": f"{app}.id", "max": None}]
    for item in report["findings"]:
        assert set(item) == {"level", "check", "sequence", "message"}


@pytest.mark.redis
def test_a_corrupt_redis_row_is_found_among_the_others(doctor: Callable[..., Run]) -> None:
    """On Redis every name in the index is read; a hash edited by hand is an invalid row."""
    import redis

    from autoseq.stores.redis import RedisStore

    prefix = unique_table("doc")
    store = RedisStore(REDIS_URL, prefix=prefix)
    try:
        store.create(SequenceConfig("good"))
        store.create(SequenceConfig("bad"))
        client = redis.Redis.from_url(REDIS_URL)
        client.hset(store.key("bad"), "current", "abc")
        client.close()
        result = doctor("--url", REDIS_URL, "--sequence-table", prefix, "doctor", "--json")
        assert result.status == 1
        report = result.json()
        assert finding(report, "invalid_row", "bad")["level"] == "error"
        statuses = {s["name"]: s["status"] for s in report["sequences"]}
        assert statuses == {"bad": "error", "good": "ok"}
    except redis.RedisError as exc:
        unavailable("redis", str(exc))
    finally:
        store.drop()
        store.close()


@pytest.mark.mongodb
def test_a_corrupt_mongodb_row_is_found_among_the_others(
    mongo_server: Any, mongo_db_name: str, doctor: Callable[..., Run]
) -> None:
    """On MongoDB every document of the collection is read; step 0 is an invalid row."""
    from autoseq.stores.mongo import MongoStore

    url = f"{mongo_server.url.rstrip('/')}/{mongo_db_name}"
    store = MongoStore(url)
    try:
        store.create(SequenceConfig("good"))
        store.create(SequenceConfig("bad"))
        store.collection.update_one({"_id": "bad"}, {"$set": {"step": 0}})
        result = doctor("--url", url, "doctor", "--json")
        assert result.status == 1
        report = result.json()
        assert "step" in finding(report, "invalid_row", "bad")["message"]
        statuses = {s["name"]: s["status"] for s in report["sequences"]}
        assert statuses == {"bad": "error", "good": "ok"}
    finally:
        store.close()


def test_a_cycling_sequence_is_not_behind_its_column(
    sql: SqlSetup, doctor: Callable[..., Run]
) -> None:
    """A cycling sequence repeats by design: below max(column) it is noted, not an error."""
    app = sql.make_rows([90])
    sql.store.create(SequenceConfig(app, end=100, cycle=True, current=5))
    result = doctor(*sql.args("--column", f"{app}.id", "--json"))
    assert result.status == 0
    assert finding(result.json(), "behind", app)["level"] == "ok"
    assert not [f for f in result.json()["findings"] if f["check"] == "values_left"]


def test_registered_checks_add_their_findings(sql: SqlSetup) -> None:
    """register_check plugs a check in (snowflake leases, say); its AutoseqError is a finding."""
    from autoseq import doctor
    from autoseq.errors import StoreUnavailable

    def leases(store: Any, report: doctor.Report) -> None:
        report.add("warning", "leases", "worker 7's lease expires in 3 s")

    def broken_leases(store: Any, report: doctor.Report) -> None:
        raise StoreUnavailable("lease table unreadable")

    doctor.register_check(leases)
    doctor.register_check(broken_leases)
    try:
        report = examine(sql.store)
    finally:
        doctor.EXTRA_CHECKS.remove(leases)
        doctor.EXTRA_CHECKS.remove(broken_leases)
    assert [(f.level, f.check) for f in report.findings if "lease" in f.check] == [
        ("warning", "leases"),
        ("error", "broken_leases"),
    ]
    assert report.exit_code() == 1


def test_a_column_hint_naming_a_missing_table_is_an_error_finding(
    sql: SqlSetup, doctor: Callable[..., Run]
) -> None:
    """--column on a table that does not exist is reported (exit 1), the rest still checked."""
    sql.make_rows([])  # the database exists (on SQLite, its file), the table does not
    missing = unique_table("gone")
    result = doctor(*sql.args("--column", f"{missing}.id", "--json"))
    assert result.status == 1
    column = finding(result.json(), "column", missing)
    assert column["level"] == "error"
    assert "does not exist" in column["message"]


def test_snowflake_worker_leases_are_listed_and_a_clock_behind_them_warns(
    sql: SqlSetup, doctor: Callable[..., Run]
) -> None:
    """Held leases are counted per layout; a timestamp recorded ahead of this clock warns."""
    from autoseq.snowflake import Snowflake

    held = Snowflake(sql.store, name="orders", lease_ttl=30.0)
    held.next()
    ahead = Snowflake(sql.store, name="fast", lease_ttl=30.0, clock=lambda: time.time() + 60)
    ahead.next()
    ahead.close()  # released, with a last timestamp a minute ahead of real time
    try:
        run = doctor(*sql.args("--json"))
    finally:
        held.close()
    report = run.json()
    leases = [f for f in report["findings"] if f["check"] == "worker_leases"]
    messages = " | ".join(f["message"] for f in leases)
    assert "snowflake 'orders': 1 worker ids held, 0 expired" in messages
    assert "snowflake 'fast': 0 worker ids held, 0 expired (free to take over), 1 released" in (
        messages
    )
    behind = [f for f in leases if f["level"] == "warning"]
    assert len(behind) == 1
    assert "'fast'" in behind[0]["message"]
    assert "behind" in behind[0]["message"]
    assert run.status == 0  # a warning alone does not fail the deploy (--strict does)
