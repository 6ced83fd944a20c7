"""The store contract on SQLStore: SQLite (file), PostgreSQL and MariaDB."""

from __future__ import annotations

from typing import Any

import pytest
from contract import StoreContract


class TestSQLStore(StoreContract):
    @pytest.fixture
    def store(self, sql_store: Any) -> Any:
        return sql_store


def _switch_new_files_to_wal(paths: list[str], barrier: Any, results: Any) -> None:
    import sqlite3

    from autoseq.stores.sql import _enable_wal

    failures = []
    for path in paths:
        connection = sqlite3.connect(path, timeout=30, isolation_level=None)
        barrier.wait()
        try:
            _enable_wal(connection, 30)
            connection.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
        except sqlite3.Error as exc:  # reported to the test, which names it
            failures.append(f"{path}: {type(exc).__name__}: {exc}")
        finally:
            connection.close()
    results.put(failures)


def test_processes_switching_a_new_sqlite_file_to_wal_together_all_succeed(tmp_path: Any) -> None:
    """Six processes switch 20 new SQLite files to WAL in lockstep: no "database is locked".

    Two connections that both read the file and both ask for it to themselves
    are a deadlock SQLite breaks at once, busy timeout or not: the race that
    once failed a process opening a new companion file in CI.
    """
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    paths = [str(tmp_path / f"app{i}.db.autoseq") for i in range(20)]
    barrier, results = spawn.Barrier(6), spawn.Queue()
    workers = [
        spawn.Process(target=_switch_new_files_to_wal, args=(paths, barrier, results))
        for _ in range(6)
    ]
    for worker in workers:
        worker.start()
    failures = [failure for _ in workers for failure in results.get(timeout=120)]
    for worker in workers:
        worker.join(timeout=30)
    assert failures == []
    assert [worker.exitcode for worker in workers] == [0] * 6
