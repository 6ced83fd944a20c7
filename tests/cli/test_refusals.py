"""The ``autoseq`` command line refuses what it cannot do: one line, exit 2, nothing written.

Typos (a collection or field that is not there), a SQLite path with no
database, a URL scheme autoseq does not read, a driver that is not installed;
a server that does not answer fails fast in one line (exit 1).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from backends import MYSQL_URL, POSTGRES_URL, REDIS_URL, sql_url, unique_table

from autoseq import SequenceConfig
from autoseq.cli import main
from autoseq.stores.sql import SQLStore


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``main(argv)``: (status, stdout, stderr)."""
    capsys.readouterr()
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("autoseq: error: ")
    return lines[0]


# SQLite: a path with no database ------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["init"],
        ["create", "orders"],
        ["set", "orders", "5"],
        ["change", "orders", "--step", "2"],
        ["sync", "orders", "--past", "9"],
        ["list"],
    ],
)
def test_a_sqlite_path_with_no_database_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """Every verb on sqlite:///missing.db exits 2 naming the path and creates no file."""
    missing = tmp_path / "typo" / "app.db"
    missing.parent.mkdir()
    status, out, err = run(capsys, "--url", f"sqlite:///{missing}", *command)
    assert status == 2
    assert out == ""
    line = one_line(err)
    assert f"no SQLite database at {missing}; create it first" in line
    assert list(missing.parent.iterdir()) == []


def test_an_existing_sqlite_database_still_gets_its_companion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where the application's database exists, init creates the rows' companion file."""
    database = tmp_path / "app.db"
    sa.create_engine(f"sqlite:///{database}").connect().close()
    status, _, err = run(capsys, "--url", f"sqlite:///{database}", "init")
    assert status == 0, err
    assert (tmp_path / "app.db.autoseq").exists()


def test_rows_in_a_companion_whose_database_is_gone_are_still_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A companion holding rows is served even where the application's file is missing."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    store = SQLStore(url)
    store.create(SequenceConfig("orders", current=41))
    store.close()
    assert not (tmp_path / "app.db").exists()
    status, out, err = run(capsys, "--url", url, "list")
    assert status == 0, err
    assert out.splitlines()[1].split()[:2] == ["orders", "41"]


# URL schemes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "canonical"),
    [
        (POSTGRES_URL.replace("postgresql+psycopg://", "postgres://"), POSTGRES_URL),
        (POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://"), POSTGRES_URL),
        (MYSQL_URL.replace("mysql+pymysql://", "mysql://"), MYSQL_URL),
        (MYSQL_URL.replace("mysql+pymysql://", "mariadb://"), MYSQL_URL),
    ],
)
def test_urls_without_a_driver_use_the_one_autoseq_installs(
    typed: str, canonical: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """postgres://, postgresql://, mysql:// and mariadb:// work as a user types them."""
    backend = "postgres" if canonical == POSTGRES_URL else "mysql"
    sql_url(backend, tmp_path)  # skips, or fails when required, if the server is down
    table = unique_table("sys")
    try:
        status, out, err = run(capsys, "--url", typed, "--sequence-table", table, "create", "s")
        assert status == 0, err
        assert "created sequence 's'" in out
        store = SQLStore(canonical, table=table)
        row = store.read("s")
        assert row is not None
        assert row.current == 1
        assert run(capsys, "--url", typed, "--sequence-table", table, "list")[0] == 0
    finally:
        store = SQLStore(canonical, table=table)
        store.drop()
        store.close()


@pytest.mark.parametrize("url", ["http://example.com/db", "oracle://u@h/db", "app.db"])
def test_an_unknown_url_scheme_lists_the_accepted_ones(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A URL autoseq does not read exits 2 listing the schemes it does."""
    status, out, err = run(capsys, "--url", url, "init")
    assert status == 2
    assert out == ""
    line = one_line(err)
    for scheme in ("sqlite:///", "postgresql://", "mysql://", "mongodb://", "redis://"):
        assert scheme in line


# a driver that is not installed -----------------------------------------------------

HIDDEN = """
import sys


class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == sys.argv[1]:
            raise ImportError(f"No module named {sys.argv[1]!r}")


sys.meta_path.insert(0, Hide())
from autoseq import SequenceConfig
from autoseq.cli import main

sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize(
    ("module", "url", "extra"),
    [
        ("psycopg", POSTGRES_URL, "autoseq[postgres]"),
        ("psycopg", "postgres://u@127.0.0.1:1/db", "autoseq[postgres]"),
        ("pymysql", "mysql://u@127.0.0.1:1/db", "autoseq[mysql]"),
        ("redis", REDIS_URL, "autoseq[redis]"),
        ("pymongo", "mongodb://127.0.0.1:1/db", "autoseq[mongoengine]"),
    ],
)
def test_a_missing_driver_names_the_extra_to_install(module: str, url: str, extra: str) -> None:
    """Without the driver a URL needs, exit 2 with `pip install 'autoseq[...]'` in one line."""
    done = subprocess.run(
        [sys.executable, "-c", HIDDEN, module, "--url", url, "list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    line = one_line(done.stderr)
    assert f"pip install '{extra}'" in line


# MongoDB: typos and a silent server -------------------------------------------------


@pytest.fixture
def mongo_app(mongo_server: Any, mongo_db_name: str) -> Iterator[tuple[str, Any]]:
    """The URL of a fresh MongoDB database and a pymongo handle on it, dropped afterwards."""
    import pymongo

    url = f"{mongo_server.url.rstrip('/')}/{mongo_db_name}"
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(url)
    try:
        yield url, client[mongo_db_name]
    finally:
        client.drop_database(mongo_db_name)
        client.close()


@pytest.mark.mongodb
def test_sync_on_a_misspelled_collection_or_field_exits_2(
    mongo_app: tuple[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """sync --table/--column naming what is not there is a typo: exit 2, row unchanged."""
    url, database = mongo_app
    database["orders"].insert_many([{"_id": 1, "no": 40}, {"_id": 2, "no": 90}])
    assert run(capsys, "--url", url, "create", "orders")[0] == 0
    before = database["sys_sequence"].find_one({"_id": "orders"})
    sync = ("--url", url, "sync", "orders")
    status, out, err = run(capsys, *sync, "--table", "ordres", "--column", "no")
    assert (status, out) == (2, "")
    line = one_line(err)
    assert "'ordres'" in line
    assert "orders" in line.split("'ordres'", 1)[1]
    status, out, err = run(capsys, *sync, "--table", "orders", "--column", "nr")
    assert (status, out) == (2, "")
    assert "'nr'" in one_line(err)
    assert "ordres" not in database.list_collection_names()
    assert database["sys_sequence"].find_one({"_id": "orders"}) == before


@pytest.mark.mongodb
def test_sync_on_an_existing_empty_collection_changes_nothing(
    mongo_app: tuple[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """A collection that exists with no documents yet: "is empty; unchanged", exit 0."""
    url, database = mongo_app
    database.create_collection("orders")
    assert run(capsys, "--url", url, "create", "orders")[0] == 0
    status, out, err = run(
        capsys, "--url", url, "sync", "orders", "--table", "orders", "--column", "no"
    )
    assert status == 0, err
    assert "orders is empty; sequence 'orders' is unchanged" in out


@pytest.mark.parametrize(
    "command",
    [
        ["list"],
        ["mongo-adopt", "--sequence", "ticket", "--collection", "tickets"],
        ["mongo-adopt", "--sequence", "ticket", "--counter", "ticket.id"],
    ],
)
def test_an_unreachable_mongodb_fails_fast_in_one_line(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """No server at the URL: exit 1 within seconds, the URL without its password, no topology."""
    url = "mongodb://admin:s3cret@127.0.0.1:1/app"
    started = time.monotonic()
    status, out, err = run(capsys, "--url", url, *command)
    elapsed = time.monotonic() - started
    assert (status, out) == (1, "")
    line = one_line(err)
    assert "mongodb://admin:***@127.0.0.1:1/app" in line
    assert "s3cret" not in line
    assert "Topology" not in line
    assert elapsed < 6
