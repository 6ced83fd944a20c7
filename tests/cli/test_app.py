"""The ``autoseq`` command line on SQLite (file), PostgreSQL and MariaDB.

Each test has its own sequence table (``--sequence-table``); bad input must
give one line on stderr, exit status 2, and leave the store as it was.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from backends import async_url, make_app_database, unique_table

from autoseq import MAX_VALUE, SequenceConfig
from autoseq.cli import COMMANDS, main, register
from autoseq.sqlalchemy import application_tables
from autoseq.stores.sql import SQLStore


@dataclass
class Result:
    status: int
    out: str
    err: str


@dataclass
class Cli:
    url: str
    table: str
    store: SQLStore
    run: Callable[..., Result]

    def rows(self) -> list[SequenceConfig]:
        return self.store.read_all() if self.table_exists() else []

    def table_exists(self) -> bool:
        if self.store.dialect == "sqlite":
            database = self.store.url.database or ""
            if not os.path.exists(database):
                return False
        return sa.inspect(self.store.engine).has_table(self.table)


@pytest.fixture
def cli(db_url: str, capsys: pytest.CaptureFixture[str]) -> Iterator[Cli]:
    """``main([...])`` against ``db_url`` with a sequence table of the test's own."""
    table = unique_table("sys")
    make_app_database(db_url)
    store = SQLStore(db_url, table=table)

    def run(*args: str) -> Result:
        capsys.readouterr()
        status = main(["--url", db_url, "--sequence-table", table, *args])
        captured = capsys.readouterr()
        return Result(status, captured.out, captured.err)

    yield Cli(db_url, table, store, run)
    store.drop()
    store.close()


@pytest.fixture
def app_table(db_url: str) -> Iterator[Callable[[list[int]], str]]:
    """Makes an application table holding the given ids; dropped afterwards."""
    engine = sa.create_engine(db_url)
    metadata = sa.MetaData()

    def make(ids: list[int]) -> str:
        table = sa.Table(
            unique_table("app"),
            metadata,
            sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("label", sa.String(20)),
        )
        table.create(engine)
        if ids:
            with engine.begin() as connection:
                connection.execute(sa.insert(table), [{"id": i, "label": "x"} for i in ids])
        return table.name

    yield make
    metadata.drop_all(engine, tables=application_tables(metadata))
    engine.dispose()


def one_line_error(result: Result) -> None:
    assert result.status == 2
    assert result.out == ""
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("autoseq: error: ")


# commands ------------------------------------------------------------------------


def test_init_creates_the_table_and_is_idempotent(cli: Cli) -> None:
    """init creates the sequence table; running it again is harmless."""
    assert not cli.table_exists()
    first = cli.run("init")
    assert first.status == 0
    assert cli.table in first.out
    assert cli.table_exists()
    assert cli.run("init").status == 0
    assert cli.rows() == []


def test_create_then_list_shows_every_setting(cli: Cli) -> None:
    """create stores the given settings; list prints them as a table with values left."""
    assert cli.run("create", "orders").status == 0
    created = cli.run(
        "create", "codes", "--start", "5", "--end", "1000", "--step", "10",
        "--no-batch", "--batch-count", "7", "--cycle",
    )  # fmt: skip
    assert created.status == 0
    codes = cli.store.read("codes")
    assert codes is not None
    assert (codes.start, codes.end, codes.step, codes.batch, codes.batch_count, codes.cycle) == (
        5,
        1000,
        10,
        False,
        7,
        True,
    )
    listing = cli.run("list")
    assert listing.status == 0
    lines = listing.out.splitlines()
    assert lines[0].split() == [
        "name", "current", "end", "step", "batch", "batch_count", "cycle", "values_left",
    ]  # fmt: skip
    assert lines[1].split() == ["codes", "5", "1000", "10", "no", "7", "yes", "100"]
    last = str(MAX_VALUE - 1)
    assert lines[2].split() == ["orders", "1", str(MAX_VALUE), "1", "yes", "100", "no", last]


def test_list_without_a_table_writes_nothing(cli: Cli) -> None:
    """list on a database with no sequence table says so and creates nothing."""
    result = cli.run("list")
    assert result.status == 0
    assert "no sequences" in result.out
    assert not cli.table_exists()


def test_list_shows_what_a_registry_reserved(cli: Cli) -> None:
    """current in the listing moves as blocks are reserved by the library."""
    from autoseq import SequenceRegistry

    cli.run("create", "orders", "--batch-count", "50")
    registry = SequenceRegistry(SQLStore(cli.url, table=cli.table))
    registry.next("orders")
    registry.close(release=False)
    line = cli.run("list").out.splitlines()[1].split()
    assert line[:2] == ["orders", "51"]


def test_set_moves_forward(cli: Cli) -> None:
    """set NAME VALUE makes VALUE the next value handed out."""
    cli.run("create", "orders")
    result = cli.run("set", "orders", "5000")
    assert result.status == 0
    assert cli.store.reserve("orders", 1).first == 5000


def test_set_backwards_needs_force(cli: Cli) -> None:
    """Moving current back is refused (values may be in use) unless --force is given."""
    cli.run("create", "orders")
    cli.run("set", "orders", "500")
    refused = cli.run("set", "orders", "100")
    one_line_error(refused)
    assert "--force" in refused.err
    assert cli.store.read("orders").current == 500
    assert cli.run("set", "orders", "100", "--force").status == 0
    assert cli.store.read("orders").current == 100


def test_sync_moves_current_past_the_column_max(cli: Cli, app_table: Callable[..., str]) -> None:
    """sync sets current to the first value of the series above max(column)."""
    cli.run("create", "orders", "--start", "5", "--step", "10")
    table = app_table([5, 15, 1240])
    result = cli.run("sync", "orders", "--table", table, "--column", "id")
    assert result.status == 0
    assert "1240" in result.out
    assert cli.store.read("orders").current == 1245


def test_sync_never_moves_backwards(cli: Cli, app_table: Callable[..., str]) -> None:
    """When the sequence is already past max(column), sync leaves it alone."""
    cli.run("create", "orders")
    cli.run("set", "orders", "9000")
    table = app_table([1, 2, 3])
    assert cli.run("sync", "orders", "--table", table, "--column", "id").status == 0
    assert cli.store.read("orders").current == 9000


def test_sync_of_an_empty_table_changes_nothing(cli: Cli, app_table: Callable[..., str]) -> None:
    """An empty table has no max: the sequence is left as it is."""
    cli.run("create", "orders", "--start", "100")
    table = app_table([])
    result = cli.run("sync", "orders", "--table", table, "--column", "id")
    assert result.status == 0
    assert "empty" in result.out
    assert cli.store.read("orders").current == 100


def test_sync_reads_the_column_through_the_sync_driver_of_an_async_url(
    cli: Cli, app_table: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    """--url with an asyncio driver (asyncpg, aiosqlite...) reads max() through the sync one."""
    url = async_url(cli.url)
    cli.run("create", "orders")
    table = app_table([7, 700])
    status = main(
        [
            "--url",
            url,
            "--sequence-table",
            cli.table,
            "sync",
            "orders",
            "--table",
            table,
            "--column",
            "id",
        ]
    )
    assert status == 0, capsys.readouterr().err
    assert cli.store.read("orders").current == 701


# bad input -------------------------------------------------------------------------

BAD_COMMANDS = [
    ("create x --step 0", "step", "step-0"),
    ("create x --start 10 --end 5", "greater than end", "start>end"),
    ("create x --batch-count 0", "batch_count", "batch-count-0"),
    ("create x --start abc", "invalid int", "start-not-int"),
    (f"create x --end {2**64}", "64-bit", "end-too-big"),
    ("create bad\x01name", "control character", "control-char-name"),
    ("create " + "y" * 192, "limit", "name-too-long"),
    ("create orders", "already exists", "create-existing"),
    ("set ghost 5", "does not exist", "set-unknown"),
    ("set orders 0", "outside", "set-below-start"),
    ("set stepped 12", "start + k * step", "set-off-step"),
    ("set bounded 101", "outside", "set-past-end"),
    ("set orders ten", "invalid int", "set-not-int"),
    ("sync ghost --table t --column id", "does not exist", "sync-unknown-seq"),
    ("sync orders --table no_such_table_xyz --column id", "does not exist", "sync-unknown-table"),
    ("sync orders --table 't; DROP TABLE x' --column id", "plain identifier", "sync-sql-table"),
    ("sync orders --table {app} --column nope", "no column", "sync-unknown-column"),
    ("sync orders --table {app} --column label", "not an integer", "sync-text-column"),
    ("sync bounded --table {app} --column id", "raise its end", "sync-past-end"),
    ("sync orders --table {app}", "--column", "sync-no-column"),
    ("", "COMMAND", "no-command"),
    ("frobnicate", "invalid choice", "unknown-command"),
]


@pytest.mark.parametrize(
    ("command", "message"), [pytest.param(c, m, id=i) for c, m, i in BAD_COMMANDS]
)
def test_bad_input_gets_one_line_status_2_and_writes_nothing(
    cli: Cli, app_table: Callable[..., str], command: str, message: str
) -> None:
    """Each bad command exits 2 with one line naming the problem; rows are unchanged."""
    cli.store.create(SequenceConfig("orders", current=50))
    cli.store.create(SequenceConfig("stepped", start=5, step=10))
    cli.store.create(SequenceConfig("bounded", end=100))
    table = app_table([1, 2, 500])
    before = [row.as_row() for row in cli.rows()]
    result = cli.run(*shlex.split(command.replace("{app}", table)))
    one_line_error(result)
    assert message in result.err
    assert [row.as_row() for row in cli.rows()] == before


def test_bad_create_before_init_creates_no_table(cli: Cli) -> None:
    """An invalid create on a fresh database leaves no table behind."""
    one_line_error(cli.run("create", "x", "--step", "-1"))
    assert not cli.table_exists()


def test_bad_sequence_table_name_is_refused(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --sequence-table that is not a plain identifier exits 2 before any I/O."""
    status = main(
        ["--url", make_app_database(db_url), "--sequence-table", "sys; DROP TABLE x", "init"]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert "plain identifier" in err


@pytest.mark.parametrize(
    "url", ["nope://x", "definitely not a url"], ids=["unknown-dialect", "garbage"]
)
def test_bad_url_exits_2(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A URL SQLAlchemy cannot use exits 2 with one line."""
    status = main(["--url", url, "list"])
    captured = capsys.readouterr()
    assert status == 2
    assert len(captured.err.strip().splitlines()) == 1


def test_missing_url_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --url or AUTOSEQ_URL the command says how to give one."""
    monkeypatch.delenv("AUTOSEQ_URL", raising=False)
    assert main(["list"]) == 2
    assert "--url" in capsys.readouterr().err


def test_url_from_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """AUTOSEQ_URL stands in for --url."""
    monkeypatch.setenv("AUTOSEQ_URL", make_app_database(f"sqlite:///{tmp_path / 'env.db'}"))
    assert main(["create", "from_env"]) == 0
    assert (tmp_path / "env.db.autoseq").exists()


def test_unreachable_server_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    """A server that cannot be reached is a store failure: exit 1, one line."""
    status = main(["--url", "postgresql+psycopg://postgres@127.0.0.1:1/test", "init"])
    captured = capsys.readouterr()
    assert status == 1
    assert len(captured.err.strip().splitlines()) == 1


# process level ------------------------------------------------------------------


def test_console_script_runs_as_a_process(tmp_path: Path) -> None:
    """`python -m autoseq.cli` creates and lists sequences; errors exit 2 on stderr."""
    url = make_app_database(f"sqlite:///{tmp_path / 'proc.db'}")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "autoseq.cli", "--url", url, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    assert run("create", "orders", "--start", "10").returncode == 0
    listing = run("list")
    assert listing.returncode == 0
    assert listing.stdout.splitlines()[1].split()[:2] == ["orders", "10"]
    bad = run("set", "orders", "-5")
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert len(bad.stderr.strip().splitlines()) == 1


def test_importing_the_cli_loads_no_orm() -> None:
    """`import autoseq.cli` imports neither SQLAlchemy, Django nor a MongoDB driver."""
    code = (
        "import json, sys, autoseq.cli; "
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('sqlalchemy', 'django', 'mongoengine', 'pymongo'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_register_adds_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    """Another package can add a subcommand with register()."""

    def configure(parser: object) -> None:
        parser.add_argument("word")  # type: ignore[attr-defined]

    def run(args: object) -> int:
        print(f"hello {args.word}")  # type: ignore[attr-defined]
        return 0

    register("hello", "say hello", run, configure)
    try:
        assert main(["hello", "world"]) == 0
        assert capsys.readouterr().out == "hello world\n"
    finally:
        COMMANDS.pop("hello")


# every store, through autoseq.maintenance ------------------------------------------


def test_change_moves_current_onto_the_new_step_grid(cli: Cli) -> None:
    """change --step keeps the row valid for processes holding blocks; end stays above them."""
    cli.store.create(SequenceConfig("stepped"))
    cli.store.reserve("stepped", 10)
    result = cli.run("change", "stepped", "--step", "4", "--batch-count", "9")
    assert result.status == 0, result.err
    row = cli.store.read("stepped")
    assert row is not None
    assert (row.step, row.current, row.batch_count) == (4, 13, 9)
    refused = cli.run("change", "stepped", "--end", "5")
    assert refused.status == 2
    assert "end >=" in refused.err


def test_set_force_repairs_a_row_that_fails_validation(cli: Cli) -> None:
    """A hand-edited row is refused by set; set --force with the missing setting repairs it."""
    cli.store.create(SequenceConfig("edited"))
    with cli.store.engine.begin() as connection:
        table = cli.store.table
        connection.execute(sa.update(table).where(table.c.name == "edited").values(step=0))
    plain = cli.run("set", "edited", "100")
    assert plain.status == 2
    assert "autoseq set edited VALUE --force" in plain.err
    missing = cli.run("set", "edited", "100", "--force")
    assert missing.status == 2
    assert "step" in missing.err
    fixed = cli.run("set", "edited", "100", "--force", "--step", "1")
    assert fixed.status == 0, fixed.err
    assert cli.store.reserve("edited", 1).first == 100


@pytest.mark.redis
def test_redis_url_lists_sets_and_changes(capsys: pytest.CaptureFixture[str]) -> None:
    """--url redis://... drives the same commands against a RedisStore."""
    from backends import REDIS_URL

    from autoseq.stores.redis import RedisStore

    prefix = unique_table("cli")
    store = RedisStore(REDIS_URL, prefix=prefix)
    try:
        store.read_all()
    except Exception as exc:
        from backends import unavailable

        unavailable("redis", str(exc))
    try:
        base = ["--url", REDIS_URL, "--sequence-table", prefix]
        assert main([*base, "create", "tickets", "--start", "10"]) == 0
        assert main([*base, "set", "tickets", "500"]) == 0
        assert main([*base, "set", "tickets", "20"]) == 2  # backwards without --force
        assert main([*base, "change", "tickets", "--batch-count", "7"]) == 0
        assert main([*base, "sync", "tickets", "--past", "900"]) == 0
        assert main([*base, "list"]) == 0
        out = capsys.readouterr().out
        assert "tickets" in out
        row = store.read("tickets")
        assert row is not None
        assert (row.current, row.batch_count) == (901, 7)
    finally:
        store.drop()
        store.close()


@pytest.mark.mongodb
def test_mongodb_url_sets_and_syncs_past_a_collection(
    mongo_server: object, mongo_db_name: str
) -> None:
    """--url mongodb://.../db drives the commands against a MongoStore; sync reads a field."""
    import pymongo

    from autoseq.stores.mongo import MongoStore

    url = f"{mongo_server.url.rstrip('/')}/{mongo_db_name}"  # type: ignore[attr-defined]
    base = ["--url", url]
    client: pymongo.MongoClient[dict[str, object]] = pymongo.MongoClient(url)
    try:
        client[mongo_db_name]["orders"].insert_many([{"_id": i} for i in (3, 77, 41)])
        assert main([*base, "create", "orders"]) == 0
        assert main([*base, "sync", "orders", "--table", "orders", "--column", "_id"]) == 0
        assert main([*base, "set", "orders", "200"]) == 0
        store = MongoStore(url)
        row = store.read("orders")
        store.close()
        assert row is not None
        assert row.current == 200
    finally:
        client.close()


def test_create_and_change_offer_every_setting_of_the_core() -> None:
    """`create` has an option per setting of the core, `change` one per changeable setting."""
    from autoseq.cli import build_parser
    from autoseq.config import CHANGEABLE_SETTINGS, SETTINGS

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    assert subparsers is not None

    def options(command: str) -> set[str]:
        return {o for a in subparsers[command]._actions for o in a.option_strings}

    assert {s.option for s in SETTINGS} <= options("create")
    assert {"--" + n.replace("_", "-") for n in CHANGEABLE_SETTINGS} <= options("change")
    assert "--start" not in options("change")


# gapless rows on SQLite: one place for every row of the application -----------------


@pytest.fixture
def gapless_app(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> Iterator[tuple[Callable[..., Result], Callable[[int], list[str]], SQLStore]]:
    """A SQLite application taking gapless invoice numbers, and ``autoseq`` on its file.

    Yields (run the command line, commit N invoices and return their numbers, the store).
    """
    from autoseq import Serial

    url = make_app_database(f"sqlite:///{tmp_path / 'app.db'}")
    engine = sa.create_engine(url)
    store = SQLStore(url)
    serial = Serial(store, "invoices", "INV-{n:05d}", gapless=True)

    def run(*args: str) -> Result:
        capsys.readouterr()
        status = main(["--url", url, *args])
        captured = capsys.readouterr()
        return Result(status, captured.out, captured.err)

    def commit(count: int) -> list[str]:
        with engine.begin() as connection:
            return [serial.next(connection) for _ in range(count)]

    yield run, commit, store
    store.close()
    engine.dispose()


def test_gapless_rows_on_sqlite_are_listed_and_examined(gapless_app: tuple[Any, ...]) -> None:
    """A gapless serial's row (in the application's file) shows in list and doctor."""
    run, commit, _store = gapless_app
    assert commit(5) == [f"INV-{n:05d}" for n in range(1, 6)]
    listed = run("list")
    assert listed.status == 0
    assert [line.split()[:2] for line in listed.out.splitlines()[1:]] == [["invoices", "6"]]
    report = run("doctor", "--json")
    assert [s["name"] for s in json.loads(report.out)["sequences"]] == ["invoices"]
    assert json.loads(report.out)["sequences"][0]["current"] == 6
    created = run("create", "invoices")
    assert (created.status, created.out) == (2, "")
    assert "'invoices' already exists" in created.err


def test_set_moves_a_gapless_serial_on_sqlite(gapless_app: tuple[Any, ...]) -> None:
    """`autoseq set invoices 100`: the next committed gapless number is INV-00100."""
    run, commit, _store = gapless_app
    commit(5)
    result = run("set", "invoices", "100")
    assert (result.status, result.out) == (0, "sequence 'invoices': next value 100\n")
    assert commit(2) == ["INV-00100", "INV-00101"]
    again = run("set", "invoices", "102")
    assert again.out == "sequence 'invoices' is unchanged: next value 102\n"
    changed = run("change", "invoices", "--end", "500")
    assert changed.status == 0
    assert commit(1) == ["INV-00102"]
    assert run("list").out.splitlines()[1].split()[:3] == ["invoices", "103", "500"]


def test_a_companion_row_beside_a_gapless_one_no_longer_takes_the_set(
    gapless_app: tuple[Any, ...],
) -> None:
    """The stuck state: a row `create` once made in the companion; set now moves the serial.

    Before, `autoseq set invoices 100` wrote that companion row, printed
    success, and the serial carried on at INV-00006.
    """
    run, commit, store = gapless_app
    commit(5)
    with store.engine.begin() as connection:  # as `autoseq create` made it before
        store.table.create(connection, checkfirst=True)
        row = SequenceConfig("invoices").as_row() | {"version": 0}
        connection.execute(sa.insert(store.table).values(row))
    assert run("set", "invoices", "100").status == 0
    assert commit(1) == ["INV-00100"]
    assert [line.split()[:2] for line in run("list").out.splitlines()[1:]] == [["invoices", "101"]]


def test_a_row_created_before_the_first_gapless_take_is_where_it_starts(
    gapless_app: tuple[Any, ...],
) -> None:
    """`autoseq create invoices --start 1000` first: gapless numbers start at INV-01000."""
    run, commit, _store = gapless_app
    assert run("create", "invoices", "--start", "1000").status == 0
    assert commit(2) == ["INV-01000", "INV-01001"]
    assert run("list").out.splitlines()[1].split()[:2] == ["invoices", "1002"]
