"""First use and contention: many processes on one sequence at the same instant.

* First use: 8 processes, released together, all register the same new
  sequence (on SQL, into a table that does not exist yet): one row, no
  error, no duplicate.
* Contention: 8 processes x 4 threads on one sequence with blocks of 1 and
  of 10 values: every conflict is retried within the bound, every value is
  unique and increasing within its thread.
* The bound: a competing writer that holds the row makes a store with a
  small bound give up with a clear ``StoreUnavailable`` (``ReservationConflict``
  when the conflict is a lost compare-and-set), naming the sequence, in
  bounded time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from autoseq import ReservationConflict, SequenceConfig, StoreUnavailable

from .harness import Check, read_values, start_together, tally, value_files

PROCESSES = 8


def run_together(
    target: Any, tmp_path: Path, *, config: dict[str, Any], threads: int, count: int
) -> tuple[dict[str, list[int]], list[Any]]:
    out = tmp_path / "values"
    out.mkdir()
    go = tmp_path / "go"
    base = {
        "spec": target.spec,
        "config": config,
        "policy": {"max_batch_count": config.get("batch_count", 100)},  # keep blocks tiny
        "threads": threads,
        "count": count,
        "go": str(go),
    }
    workers = start_together([{**base, "out": str(out / f"p{i}")} for i in range(PROCESSES)], go)
    failures = [(w.process.returncode, w.stderr()) for w in workers if w.process.returncode != 0]
    assert not failures, failures
    return read_values(value_files(out)), workers


def test_first_use_race_creates_one_row(target: Any, tmp_path: Path, record_property: Any) -> None:
    """8 processes register one new sequence at the same instant: one row, no error, no repeat."""
    config = {"name": "first-use", "start": 1000, "step": 3, "batch_count": 10}
    per_file, _ = run_together(target, tmp_path, config=config, threads=1, count=60)
    rows = target.rows()
    assert [row["name"] for row in rows] == ["first-use"]
    assert (rows[0]["start"], rows[0]["step"]) == (1000, 3)
    values = [v for vs in per_file.values() for v in vs]
    check = Check.of(values, start=1000, step=3)
    assert check.duplicates == 0, f"repeated values {check.repeated(values)}"
    assert check.values == PROCESSES * 60
    assert all((v - 1000) % 3 == 0 for v in values)
    tally(
        record_property,
        target.id,
        "first use race",
        processes=PROCESSES,
        rows=len(rows),
        values=check.values,
        duplicates=0,
        gaps=check.gaps,
    )


@pytest.mark.parametrize("batch_count", [1, 10])
def test_contention_tiny_blocks(
    target: Any, tmp_path: Path, record_property: Any, batch_count: int
) -> None:
    """8 processes x 4 threads on one sequence with tiny blocks: no error, no repeat."""
    config = {"name": "hot", "batch_count": batch_count}
    per_thread = 15 if batch_count == 1 else 60
    started = time.monotonic()
    per_file, _ = run_together(target, tmp_path, config=config, threads=4, count=per_thread)
    seconds = time.monotonic() - started
    values = [v for vs in per_file.values() for v in vs]
    check = Check.of(values)
    assert check.duplicates == 0, f"repeated values {check.repeated(values)}"
    assert check.values == PROCESSES * 4 * per_thread
    for name, vs in per_file.items():
        assert vs == sorted(vs), f"{name}: values went backwards within a thread"
    current = target.rows()[0]["current"]
    assert current > check.highest
    tally(
        record_property,
        target.id,
        f"contention b={batch_count}",
        processes=PROCESSES,
        threads=PROCESSES * 4,
        values=check.values,
        duplicates=0,
        gaps=check.gaps,
        reserved=current - 1,
        seconds=round(seconds, 1),
    )


@contextmanager
def row_held_by_a_competitor(target: Any, name: str) -> Iterator[None]:
    """Another client holds the sequence's row (or, on SQLite, the write lock) meanwhile."""
    if target.kind == "sql":
        import sqlalchemy as sa

        table = target.raw_table()
        with target.raw.connect() as connection:
            if target.id == "sqlite":
                connection.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                connection.begin()
            connection.execute(sa.select(table).where(table.c.name == name).with_for_update())
            try:
                yield
            finally:
                connection.rollback()
        return
    # MongoDB has no row lock: a competitor moving ``current`` and changing a
    # setting all the time makes the store leave its ``$inc`` path (settings
    # pinned) and lose every compare-and-set instead.
    stop = threading.Event()

    def bump() -> None:
        sign = 1
        while not stop.is_set():
            target.raw.update_one({"_id": name}, {"$inc": {"current": 1, "batch_count": sign}})
            sign = -sign

    thread = threading.Thread(target=bump, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def first_refusal(store: Any, name: str, attempts: int = 200) -> StoreUnavailable | None:
    """Reserve until the store gives up (a lucky compare-and-set may win now and then)."""
    for _ in range(attempts):
        try:
            store.reserve(name, 5)
        except StoreUnavailable as exc:
            return exc
    return None


def test_retry_bound_exceeded_gives_a_clear_error(target: Any, record_property: Any) -> None:
    """A small retry bound against a competitor holding the row: ReservationConflict, fast."""
    if target.kind == "redis":
        pytest.skip("RedisStore reserves in one Lua script: reservations never conflict")
    options = {**target.fail_fast(), "max_retries": 1}
    if target.id == "sqlite":
        options["sqlite_timeout"] = 0.2
    store = target.open(**options)
    store.create(SequenceConfig("contended"))
    store.reserve("contended", 5)
    with row_held_by_a_competitor(target, "contended"):
        started = time.monotonic()
        error = first_refusal(store, "contended")
        seconds = time.monotonic() - started
    assert isinstance(error, ReservationConflict), error
    assert error.name == "contended"
    assert "'contended'" in str(error)
    assert "max_retries" in str(error)
    assert seconds < 5.0
    assert store.reserve("contended", 5).count == 5  # fine again once the competitor is gone
    tally(
        record_property,
        target.id,
        "retry bound exceeded",
        error=type(error).__name__,
        seconds=round(seconds, 2),
    )
