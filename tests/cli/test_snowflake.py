"""``autoseq snowflake decode`` and ``autoseq workers`` (SQLite, PostgreSQL, MariaDB)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from backends import make_app_database, unique_table

from autoseq.cli import main
from autoseq.snowflake import Snowflake
from autoseq.stores.sql import SQLStore
from autoseq.stores.sql.workers import SQLWorkers


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def test_decode_prints_the_parts(capsys: pytest.CaptureFixture[str]) -> None:
    """decode VALUE prints the timestamp, worker id and sequence of the default layout."""
    value = (1000 << 22) | (5 << 12) | 7
    status, out, _ = run(capsys, "snowflake", "decode", str(value))
    assert status == 0
    assert out.split() == [
        "timestamp",
        "2024-01-01T00:00:01.000+00:00",
        "worker",
        "5",
        "sequence",
        "7",
    ]


def test_decode_with_another_layout_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    """--epoch, --worker-bits, --sequence-bits and --json describe another layout."""
    value = (2000 << 10) | (3 << 5) | 9
    status, out, _ = run(
        capsys,
        "snowflake",
        "decode",
        hex(value),
        "--epoch",
        "2020-01-01",
        "--worker-bits",
        "5",
        "--sequence-bits",
        "5",
        "--json",
    )
    assert status == 0
    assert json.loads(out) == {
        "timestamp": "2020-01-01T00:00:02.000+00:00",
        "worker": 3,
        "sequence": 9,
    }


@pytest.mark.parametrize("value", ["0", "-5", str(2**63), "abc"])
def test_decode_refuses_what_is_no_id(capsys: pytest.CaptureFixture[str], value: str) -> None:
    """A value that is no id gets one line on stderr and exit status 2."""
    status, out, err = run(capsys, "snowflake", "decode", "--", value)
    assert status == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1


@pytest.fixture
def table(db_url: str) -> Iterator[str]:
    """A sequence table name of the test's own; its worker table is dropped afterwards."""
    name = unique_table("sys")
    make_app_database(db_url)
    yield name
    store = SQLStore(db_url, table=name)
    SQLWorkers(store).drop_table()
    store.close()


def test_workers_lists_held_and_free_leases(
    capsys: pytest.CaptureFixture[str], db_url: str, table: str
) -> None:
    """workers shows each lease: held by its owner, or free with its last timestamp."""
    store = SQLStore(db_url, table=table)
    held = Snowflake(store, name="orders")
    held.next()
    with Snowflake(store, name="orders") as closed:
        closed.next()
    status, out, _ = run(capsys, "--url", db_url, "--sequence-table", table, "workers")
    held.close()
    store.close()
    assert status == 0
    lines = [line.split() for line in out.splitlines()]
    assert lines[0] == ["name", "worker", "state", "owner", "expires", "last_issued"]
    assert lines[1][:3] == ["orders", "0", "held"]
    assert held.lease is None  # closed after listing
    assert lines[2][:5] == ["orders", "1", "free", "-", "-"]
    assert lines[2][5].startswith("20")


def test_workers_with_no_leases(
    capsys: pytest.CaptureFixture[str], db_url: str, table: str
) -> None:
    """workers on a database without leases says so."""
    status, out, _ = run(capsys, "--url", db_url, "--sequence-table", table, "workers")
    assert (status, out.strip()) == (0, "no worker leases")
