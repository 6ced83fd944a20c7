"""Order numbers reset daily and gapless yearly invoices, from several processes.

Each worker process inserts orders numbered ``ORD-YYYYMMDD-NNNNN`` (a daily
serial served from blocks) and, for some of them, an invoice numbered
``INV-YYYY-NNNNNN`` (a gapless yearly serial, taken in the order's own
transaction); a third of the transactions roll back. The parent then checks
that no order number repeats and that the committed invoice numbers are
exactly 1..K, and prints a few of each.

    python -m example_project.serials [--db PATH] [--processes N] [--orders N]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import sys
import tempfile

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from autoseq.sqlalchemy import (
    SequenceField,
    SerialField,
    close_registries,
    install,
)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "serial_orders"

    id: Mapped[int] = SequenceField(primary_key=True)
    number: Mapped[str] = SerialField(
        "ORD-{date:%Y%m%d}-{n:05d}", sequence="orders", period="day", unique=True
    )
    customer: Mapped[str] = mapped_column(sa.String(40))


class Invoice(Base):
    __tablename__ = "serial_invoices"

    id: Mapped[int] = SequenceField(primary_key=True)
    number: Mapped[str] = SerialField(
        "INV-{date:%Y}-{n:06d}", sequence="invoices", period="year", gapless=True, unique=True
    )
    order_id: Mapped[int] = mapped_column(sa.BigInteger)


def engine_for(url: str) -> sa.Engine:
    return sa.create_engine(url, connect_args={"timeout": 60})


def worker(url: str, orders: int, seed: int) -> None:
    """Insert ``orders`` orders, invoicing some, rolling a third of them back."""
    engine = engine_for(url)
    maker = sessionmaker(engine)
    install(maker)
    rng = random.Random(seed)
    for i in range(orders):
        with maker() as session:
            order = Order(customer=f"c{rng.randrange(100)}")
            session.add(order)
            session.flush()  # the order number is taken here, from memory
            if i % 2 == 0:
                # The invoice number is taken at this flush, in this transaction.
                session.add(Invoice(order_id=order.id))
                session.flush()
            if rng.random() < 1 / 3:
                session.rollback()
            else:
                session.commit()
    close_registries()
    engine.dispose()


def run(url: str, processes: int, orders: int) -> bool:
    """Run the workers on ``url``; print and check what they committed."""
    engine = engine_for(url)
    Base.metadata.create_all(engine)
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=worker, args=(url, orders, seed)) for seed in range(processes)
    ]
    for process in workers:
        process.start()
    for process in workers:
        process.join()
    with engine.connect() as connection:
        numbers = list(connection.execute(sa.select(Order.number)).scalars())
        invoices = sorted(connection.execute(sa.select(Invoice.number)).scalars())
    engine.dispose()
    counters = [int(number.rsplit("-", 1)[1]) for number in invoices]
    gapless = counters == list(range(1, len(counters) + 1))
    print(f"orders committed: {len(numbers)}, e.g. {', '.join(sorted(numbers)[:3])}")
    print(f"order numbers repeated: {len(numbers) - len(set(numbers))}")
    print(f"invoices committed: {len(invoices)}, e.g. {', '.join(invoices[:3])}")
    print(f"invoice numbers exactly 1..{len(counters)}: {'yes' if gapless else 'NO'}")
    ok = all(p.exitcode == 0 for p in workers) and len(numbers) == len(set(numbers)) and gapless
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="SQLite file (default: a temporary one)")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--orders", type=int, default=60, help="per process")
    args = parser.parse_args(argv)
    scratch = None if args.db else tempfile.mkdtemp(prefix="autoseq-serials-")
    path = args.db or os.path.join(str(scratch), "serials.db")
    try:
        return 0 if run(f"sqlite:///{path}", args.processes, args.orders) else 1
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["main", "run"]
