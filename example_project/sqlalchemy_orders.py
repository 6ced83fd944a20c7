"""Orders from several processes through the SQLAlchemy integration, on embedded SQLite.

Each worker process declares nothing special beyond the model below and one
``install()`` call; it inserts orders with ``session.add()``, ``add_all()``
and ORM bulk ``session.execute(insert(Order), [...])``, mixed at random. The
parent then counts rows, reads the sequences and looks for any key or order
code handed out twice.

    python -m example_project.sqlalchemy_orders [--db PATH] [--processes N] [--orders N]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import random
import shutil
import sys
import tempfile
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from autoseq.sqlalchemy import SequenceField, close_registries, get_registry, install
from autoseq.stores.sql import SQLStore


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = SequenceField(primary_key=True)  # sequence "orders"
    code: Mapped[int] = SequenceField(sequence="order_codes", start=1000, step=10, batch_count=500)
    customer: Mapped[str] = mapped_column(sa.String(40))
    total_cents: Mapped[int]
    path: Mapped[str] = mapped_column(sa.String(10))  # which insert path made the row


def make_engine(db_url: str) -> sa.Engine:
    # Several processes write the same file: wait for the write lock rather than fail.
    return sa.create_engine(db_url, connect_args={"timeout": 60})


def worker(db_url: str, orders: int, seed: int, results: Any) -> None:
    """One process: insert ``orders`` orders through the three ORM paths; report back."""
    engine = make_engine(db_url)
    maker = sessionmaker(engine)
    install(maker)  # the store defaults to sys_sequence beside the session's database
    rng = random.Random(seed)
    made: list[tuple[int, int]] = []
    calls = {"add": 0, "add_all": 0, "bulk": 0}
    started = time.perf_counter()
    with maker() as session:
        while len(made) < orders:
            left = orders - len(made)
            choice = "add" if left < 20 else rng.choice(("add", "add_all", "bulk"))
            if choice == "add":
                order = Order(customer=f"c{rng.randrange(1000)}", total_cents=999, path="add")
                session.add(order)
                session.commit()
                made.append((order.id, order.code))
            elif choice == "add_all":
                batch = [
                    Order(customer=f"c{rng.randrange(1000)}", total_cents=1999, path="add_all")
                    for _ in range(min(left, rng.randint(20, 300)))
                ]
                session.add_all(batch)
                session.commit()
                made.extend((order.id, order.code) for order in batch)
            else:
                rows = [
                    {"customer": f"c{rng.randrange(1000)}", "total_cents": 2999, "path": "bulk"}
                    for _ in range(min(left, rng.randint(20, 300)))
                ]
                returned = session.execute(
                    sa.insert(Order).returning(Order.id, Order.code), rows
                ).all()
                session.commit()
                made.extend((row.id, row.code) for row in returned)
            calls[choice] += 1
    elapsed = time.perf_counter() - started
    store = get_registry(engine).store
    reservations = int(getattr(store, "reservations", 0))
    close_registries()  # hand unused tails back, so the next run leaves no gap
    engine.dispose()
    results.put(
        {
            "pid": os.getpid(),
            "made": made,
            "calls": calls,
            "reservations": reservations,
            "seconds": elapsed,
        }
    )


def _collect(results: Any, workers: list[Any]) -> list[dict[str, Any]]:
    reports: list[dict[str, Any]] = []
    while len(reports) < len(workers):
        try:
            reports.append(results.get(timeout=0.5))
        except queue.Empty:
            failed = [p.exitcode for p in workers if p.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"a worker process failed (exit codes {failed})") from None
    for process in workers:
        process.join()
    return reports


def run(db_url: str, processes: int = 4, orders_per_process: int = 2000) -> dict[str, Any]:
    """Insert orders from ``processes`` processes into ``db_url``; what happened, as a dict."""
    engine = make_engine(db_url)
    with engine.begin() as connection:
        if engine.dialect.name == "sqlite":
            connection.exec_driver_sql("PRAGMA journal_mode=WAL")  # readers never block writers
    Base.metadata.create_all(engine)

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    workers = [
        context.Process(target=worker, args=(db_url, orders_per_process, seed, results))
        for seed in range(processes)
    ]
    started = time.perf_counter()
    for process in workers:
        process.start()
    reports = _collect(results, workers)
    elapsed = time.perf_counter() - started

    made = [pair for report in reports for pair in report["made"]]
    ids = [order_id for order_id, _ in made]
    codes = [code for _, code in made]
    table = Order.__table__
    with engine.connect() as connection:
        rows = connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
        stored_codes = connection.execute(
            sa.select(sa.func.count(sa.distinct(table.c.code)))
        ).scalar_one()
    engine.dispose()
    store = SQLStore(db_url)
    sequences = {row.name: row.next_value for row in store.read_all()}
    store.close()
    calls = {key: sum(report["calls"][key] for report in reports) for key in reports[0]["calls"]}
    return {
        "processes": processes,
        "orders inserted": len(made),
        "rows": rows,
        "insert calls": (
            f"{calls['add']} add(), {calls['add_all']} add_all(), {calls['bulk']} ORM bulk insert()"
        ),
        "sequences (current)": sequences,
        "reservations": sum(report["reservations"] for report in reports),
        "orders keys": (
            f"{len(ids):,} used (largest {max(ids):,}); {sequences['orders'] - 1 - len(ids):,} "
            "more were reserved in blocks the processes still held when they stopped "
            "(another had reserved after them): skipped, never reused"
        ),
        "seconds": round(elapsed, 2),
        "duplicates": (len(ids) - len(set(ids)))
        + (len(codes) - len(set(codes)))
        + (rows - stored_codes),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m example_project.sqlalchemy_orders", description=__doc__
    )
    parser.add_argument("--db", help="SQLite file to use (default: a temporary directory)")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--orders", type=int, default=2000, help="orders per process")
    args = parser.parse_args(argv)
    scratch = None if args.db else tempfile.mkdtemp(prefix="autoseq-sqlalchemy-")
    path = args.db or os.path.join(str(scratch), "orders.db")
    try:
        summary = run(f"sqlite:///{path}", args.processes, args.orders)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"SQLAlchemy orders on SQLite ({path}, sequences in {path}.autoseq)")
    for key, value in summary.items():
        print(f"  {key}: {value}")
    return 1 if summary["duplicates"] else 0


if __name__ == "__main__":
    sys.exit(main())
