"""Scaling: 1, 2, 4 and 8 processes drawing from one sequence at once; many sequences in one.

Each process opens its own store and ``SequenceLock`` (default settings) and
calls ``next()`` as fast as it can for a fixed time; the total values/s and
the reservations they cost are summed. The peers do the same with one round
trip per value: PostgreSQL ``nextval()``, and on SQLite a counter row
updated in a ``BEGIN IMMEDIATE`` transaction per value (what a per-value
counter such as django-sequences does there). The workers are spawned once
and reused; all processes of a trial start on the same wall-clock instant.
The machine has 2 cores, so more than 2 processes compete for CPU as well
as for the row. Many sequences in one process are the next suite,
`many_sequences`.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Contender, Group, Sample, Unavailable, run_group
from benchmarks.servers import POSTGRES_URL, Context, unique_name

PROCESSES = (1, 2, 4, 8)
#: What a worker reports: values taken, server calls, when it began and ended.
Outcome = tuple[int, int, float, float]


def _warm() -> None:
    # Imports paid once per worker, not inside a timed trial.
    import psycopg  # noqa: F401
    import sqlalchemy  # noqa: F401

    import autoseq.stores.sql  # noqa: F401


def _until(start_at: float) -> None:
    delay = start_at - time.time()
    if delay > 0:
        time.sleep(delay)


def autoseq_worker(url: str, table: str, name: str, start_at: float, seconds: float) -> Outcome:
    from autoseq import SequenceLock
    from autoseq.stores import SQLStore

    store = SQLStore(url, table=table)
    store.read(name)  # connect (and learn the server) before the clock starts, as nextval does
    lock = SequenceLock(name, store)
    take = lock.next
    count = 0
    _until(start_at)
    began = time.time()
    deadline = start_at + seconds
    while time.time() < deadline or not count:
        for _ in range(256):
            take()
        count += 256
    ended = time.time()
    reservations = lock.stats()["reservations"]
    lock.close(release=False)
    store.close()
    return count, reservations, began, ended


def nextval_worker(conninfo: dict[str, Any], name: str, start_at: float, seconds: float) -> Outcome:
    import psycopg

    with psycopg.connect(**conninfo, autocommit=True) as connection:
        cursor = connection.cursor()
        count = 0
        _until(start_at)
        began = time.time()
        deadline = start_at + seconds
        while time.time() < deadline or not count:
            for _ in range(16):
                cursor.execute("SELECT nextval(%s)", (name,))
                cursor.fetchone()
            count += 16
        ended = time.time()
    return count, count, began, ended


def sqlite_counter_worker(path: str, start_at: float, seconds: float) -> Outcome:
    connection = sqlite3.connect(path, timeout=60, isolation_level=None)
    count = 0
    _until(start_at)
    began = time.time()
    deadline = start_at + seconds
    while time.time() < deadline or not count:
        for _ in range(16):
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("UPDATE counter SET last = last + 1 WHERE name = 'c'")
            connection.execute("SELECT last FROM counter WHERE name = 'c'").fetchone()
            connection.execute("COMMIT")
        count += 16
    ended = time.time()
    connection.close()
    return count, count, began, ended


class Runner:
    """Runs ``processes`` copies of a worker on the shared pool, started together."""

    def __init__(self, pool: Any, seconds: float, lead: float) -> None:
        self.pool = pool
        self.seconds = seconds
        self.lead = lead

    def trial(self, processes: int, worker: Any, *args: Any) -> Sample:
        # Far enough ahead that every worker has its connection open first.
        start_at = time.time() + self.lead * (1 + processes / 4)
        handles = [
            self.pool.apply_async(worker, (*args, start_at, self.seconds)) for _ in range(processes)
        ]
        results = [handle.get(timeout=120 + self.seconds) for handle in handles]
        values = sum(result[0] for result in results)
        trips = sum(result[1] for result in results)
        # A worker the loaded machine started late stretches the window
        # rather than being counted as if it had run alongside the others.
        window = max(result[3] for result in results) - min(result[2] for result in results)
        late = max(result[2] for result in results) - start_at
        return Sample(
            values,
            window,
            {
                "processes": processes,
                "server calls per 100k values": trips * 1e5 / values,
                "latest start s": late,
            },
        )


def postgres_groups(ctx: Context, runner: Runner) -> list[Group]:
    from sqlalchemy.engine import make_url

    from autoseq import SequenceConfig
    from autoseq.stores import SQLStore

    groups = []
    try:
        url = ctx.sql_url("postgres")
    except Unavailable as exc:
        group = Group("scaling", "one sequence from N processes, PostgreSQL", "values/s", "")
        group.unavailable = str(exc)
        return [group]
    parsed = make_url(POSTGRES_URL)
    conninfo = {
        "host": parsed.host,
        "port": parsed.port or 5432,
        "user": parsed.username,
        "password": parsed.password,
        "dbname": parsed.database,
    }
    store = SQLStore(url, table=unique_name("scale"))
    store.create_table()
    name = unique_name("seq")
    store.create(SequenceConfig(name))
    sequence = unique_name("nextval")
    import psycopg

    with psycopg.connect(**conninfo, autocommit=True) as admin:
        admin.execute(f'CREATE SEQUENCE "{sequence}"')
        try:
            for processes in PROCESSES:
                group = Group(
                    "scaling",
                    f"one sequence from {processes} process{'es' if processes > 1 else ''}, "
                    "PostgreSQL",
                    "values/s",
                    subject=f"autoseq next() x{processes}",
                )
                run_group(
                    group,
                    [
                        Contender(
                            group.subject,
                            lambda p=processes: runner.trial(
                                p, autoseq_worker, url, store.table_name, name
                            ),
                        ),
                        Contender(
                            f"nextval() x{processes}",
                            lambda p=processes: runner.trial(p, nextval_worker, conninfo, sequence),
                        ),
                    ],
                    repeats=ctx.n(3, 1),
                    warmup=False,
                    log=ctx.log,
                )
                groups.append(group)
        finally:
            admin.execute(f'DROP SEQUENCE IF EXISTS "{sequence}"')
            store.drop()
            store.close()
    return groups


def sqlite_groups(ctx: Context, runner: Runner) -> list[Group]:
    from autoseq import SequenceConfig
    from autoseq.stores import SQLStore

    url = ctx.sqlite_url("scale")
    store = SQLStore(url, table=unique_name("scale"))
    store.create_table()
    name = unique_name("seq")
    store.create(SequenceConfig(name))
    counter_path = str(Path(ctx.workdir) / (unique_name("counter") + ".db"))
    setup = sqlite3.connect(counter_path, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE counter (name TEXT PRIMARY KEY, last INTEGER NOT NULL)")
    setup.execute("INSERT INTO counter VALUES ('c', 0)")
    setup.close()
    groups = []
    try:
        for processes in PROCESSES:
            group = Group(
                "scaling",
                f"one sequence from {processes} process{'es' if processes > 1 else ''}, "
                "SQLite file",
                "values/s",
                subject=f"autoseq next() x{processes}",
            )
            run_group(
                group,
                [
                    Contender(
                        group.subject,
                        lambda p=processes: runner.trial(
                            p, autoseq_worker, url, store.table_name, name
                        ),
                    ),
                    Contender(
                        f"counter row per value x{processes}",
                        lambda p=processes: runner.trial(p, sqlite_counter_worker, counter_path),
                    ),
                ],
                repeats=ctx.n(3, 1),
                warmup=False,
                log=ctx.log,
            )
            groups.append(group)
    finally:
        store.drop()
        store.close()
    return groups


def run(ctx: Context) -> list[Group]:
    seconds = ctx.n(2, 0.3)
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(max(PROCESSES), initializer=_warm) as pool:
        # Every worker started and its imports done before the first trial.
        pool.map(time.sleep, [0.2] * (2 * max(PROCESSES)))
        runner = Runner(pool, seconds, lead=ctx.n(1.0, 0.3))
        groups = postgres_groups(ctx, runner) + sqlite_groups(ctx, runner)
    for group in groups:
        group.notes.append(f"{seconds} s per trial, all processes started together")
    return groups
