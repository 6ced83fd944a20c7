"""The shop from scratch, orders from several processes (``python -m example_project``).

Migrates a fresh SQLite database in a temporary directory, has each worker
process insert orders through the Django ORM (``create()`` and
``bulk_create()`` mixed), then checks every key and order number handed out
for duplicates and prints what happened. If ``example_project.sqlalchemy_orders``
exists, the same is done through the SQLAlchemy integration on its own file.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import multiprocessing
import os
import queue
import random
import shutil
import tempfile
import time
from typing import Any


def setup(data_dir: str) -> None:
    """Point the example's settings at ``data_dir`` and start Django."""
    os.environ["AUTOSEQ_EXAMPLE_DIR"] = data_dir
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.settings"
    import django

    django.setup()


def worker(data_dir: str, orders: int, seed: int, results: Any) -> None:
    """One process: insert ``orders`` orders, a few at a time and in bulk; report back."""
    setup(data_dir)
    from django.db import connections

    from autoseq_django import registry as sequences
    from autoseq_django.snowflake import close_generators
    from example_project.orders.models import Order, Shipment

    rng = random.Random(seed)
    ids: list[int] = []
    numbers: list[int] = []
    references: list[str] = []
    saves = bulks = 0
    started = time.perf_counter()
    while len(ids) < orders:
        left = orders - len(ids)
        if left < 50 or rng.random() < 0.4:
            order = Order.objects.create(customer=f"c{rng.randrange(1000)}", total_cents=999)
            made = [order]
            saves += 1
        else:
            batch = [
                Order(customer=f"c{rng.randrange(1000)}", total_cents=rng.randrange(100, 9999))
                for _ in range(min(left, rng.randint(50, 400)))
            ]
            made = Order.objects.bulk_create(batch)
            bulks += 1
        ids.extend(order.pk for order in made)
        numbers.extend(order.number for order in made)
        references.extend(order.reference for order in made)
    elapsed = time.perf_counter() - started
    invoices, rolled_back = invoice_some(ids[::8], rng)
    # every fourth order ships: snowflake keys, leased worker id, no round trip per row
    shipped = Shipment.objects.bulk_create(
        [Shipment(order_id=pk, carrier=rng.choice(("post", "courier"))) for pk in ids[::4]]
    )
    shipments = [shipment.pk for shipment in shipped]
    stats = sequences.registry(sequences.sequence_database("default")).stats()
    close_generators()  # releases the worker id
    sequences.reset()  # hand unused tails back where no one reserved after us
    connections.close_all()
    results.put(
        {
            "pid": os.getpid(),
            "ids": ids,
            "numbers": numbers,
            "references": references,
            "invoices": invoices,
            "rolled_back": rolled_back,
            "shipments": shipments,
            "saves": saves,
            "bulk_creates": bulks,
            "reservations": sum(int(s["reservations"]) for s in stats.values()),
            "seconds": elapsed,
        }
    )


class PaymentFailed(Exception):
    """A simulated failure after the invoice number was taken: its atomic() rolls back."""


def invoice_some(order_ids: list[int], rng: random.Random) -> tuple[list[str], int]:
    """Invoice these orders, one atomic() each; one in five fails and rolls back.

    The gapless number is taken inside the block, so a rolled-back invoice
    gives its number back to the next one: committed invoices have no gap.
    """
    from django.db import transaction

    from example_project.orders.models import Invoice

    numbers: list[str] = []
    rolled_back = 0
    for order_id in order_ids:
        try:
            with transaction.atomic():
                invoice = Invoice.objects.create(order_id=order_id, total_cents=999)
                if rng.random() < 0.2:
                    raise PaymentFailed
            numbers.append(invoice.number)
        except PaymentFailed:
            rolled_back += 1
    return numbers, rolled_back


def collect(results: Any, workers: list[Any]) -> list[dict[str, Any]] | None:
    """Every worker's report, or None as soon as one died without reporting."""
    reports: list[dict[str, Any]] = []
    while len(reports) < len(workers):
        try:
            reports.append(results.get(timeout=0.5))
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in workers):
                return None
    for process in workers:
        process.join()
    return reports


def check_admin() -> str:
    """Open the two admin lists as a superuser; their status codes."""
    from django.contrib.auth.models import User
    from django.test import Client

    user = User.objects.create_superuser("admin", "admin@example.com", "admin")
    client = Client()
    client.force_login(user)
    shown = []
    pages = ("order", "invoice", "shipment")
    urls = [f"/admin/orders/{page}/" for page in pages] + ["/admin/autoseq/syssequence/"]
    for url in urls:
        response = client.get(url)
        shown.append(f"{url} {response.status_code}")
        if response.status_code != 200:
            raise SystemExit(f"admin page {url} answered {response.status_code}")
    return ", ".join(shown)


def run_django(data_dir: str, processes: int, orders: int) -> bool:
    """The Django part; True when every check passed."""
    setup(data_dir)
    from django.core.management import call_command
    from django.db import connections

    from autoseq.snowflake import decode
    from autoseq_django.models import SysSequence
    from example_project.orders.models import Order, Shipment

    print(f"Django shop on SQLite in {data_dir}")
    call_command("migrate", verbosity=0)
    print("  migrate: example.db (orders), example.db.autoseq (sys_sequence)")
    connections.close_all()

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    workers = [
        context.Process(target=worker, args=(data_dir, orders, seed, results))
        for seed in range(processes)
    ]
    started = time.perf_counter()
    for process in workers:
        process.start()
    reports = collect(results, workers)
    elapsed = time.perf_counter() - started
    if reports is None:
        print("  a worker process failed")
        return False

    ids = [value for report in reports for value in report["ids"]]
    numbers = [value for report in reports for value in report["numbers"]]
    references = [value for report in reports for value in report["references"]]
    invoices = sorted(value for report in reports for value in report["invoices"])
    rolled_back = sum(report["rolled_back"] for report in reports)
    shipments = [value for report in reports for value in report["shipments"]]
    duplicates = (len(ids) - len(set(ids))) + (len(numbers) - len(set(numbers)))
    duplicates += len(references) - len(set(references)) + len(invoices) - len(set(invoices))
    duplicates += len(shipments) - len(set(shipments))
    rows = Order.objects.count()
    saves = sum(report["saves"] for report in reports)
    bulks = sum(report["bulk_creates"] for report in reports)
    reservations = sum(report["reservations"] for report in reports)
    print(
        f"  {processes} processes inserted {len(ids):,} orders through the ORM "
        f"({saves:,} create(), {bulks:,} bulk_create()) in {elapsed:.1f}s"
    )
    print(f"  rows in orders_order: {rows:,}; distinct keys: {len(set(ids)):,}")
    print("  sequences (sys_sequence, as the admin shows them):")
    for row in SysSequence.objects.all():
        print(
            f"    {row.name:<34} current={row.current:<8} step={row.step} "
            f"batch_count={row.batch_count}"
        )
    show_reservations(reservations, ids, processes)
    gapless = show_serials(references, invoices, rolled_back)
    workers_used = sorted({decode(value).worker for value in shipments})
    print(
        f"  shipments (snowflake keys): {len(shipments):,}, rows "
        f"{Shipment.objects.count():,}, leased worker ids {workers_used}"
    )
    print(f"  admin: {check_admin()}")
    print(f"  duplicates found: {duplicates}")
    return (
        duplicates == 0
        and gapless
        and rows == len(ids)
        and Shipment.objects.count() == len(shipments)
    )


def show_reservations(reservations: int, ids: list[int], processes: int) -> None:
    """Why ``current`` runs ahead of the rows: blocks grow, and unused ones are skipped."""
    from autoseq_django.models import SysSequence
    from example_project.orders.models import Order

    row = SysSequence.objects.get(name=Order._meta.db_table)
    reserved = row.current - row.start
    print(
        f"  reservations: {reservations} in all; a block starts at batch_count values "
        "and grows with the insert rate"
    )
    print(
        f"  {row.name}: {len(ids):,} keys used (largest {max(ids):,}) of {reserved:,} "
        f"reserved; the other {reserved - len(ids):,} are blocks the {processes} processes "
        "still held when they stopped (another had reserved after them, so they could not "
        "be handed back): skipped, never reused"
    )


def show_serials(references: list[str], invoices: list[str], rolled_back: int) -> bool:
    """Print the order references and invoice numbers; True when the invoices have no gap."""
    from example_project.orders.models import Invoice

    days = sorted({reference[4:12] for reference in references})
    print(
        f"  order references (daily serial, from blocks): {len(references):,} over "
        f"{len(days)} day(s), e.g. {', '.join(sorted(references)[:3])}"
    )
    serial = Invoice._meta.get_field("number").serial("default")
    counters = sorted(serial.parse(number)[1] for number in invoices)
    gapless = counters == list(range(1, len(counters) + 1))
    stored = Invoice.objects.count()
    print(
        f"  invoices (gapless per year, in each save's atomic()): {len(invoices)} committed, "
        f"{rolled_back} rolled back and their numbers taken again; "
        f"{invoices[0] if invoices else '-'} .. {invoices[-1] if invoices else '-'}, "
        f"gaps: {'none' if gapless else 'FOUND'}"
    )
    return gapless and stored == len(invoices)


def run_sqlalchemy(data_dir: str, processes: int, orders: int) -> bool:
    """The SQLAlchemy part, when its module exists; True when it reported no duplicate."""
    if importlib.util.find_spec("example_project.sqlalchemy_orders") is None:
        return True
    module = importlib.import_module("example_project.sqlalchemy_orders")
    url = f"sqlite:///{os.path.join(data_dir, 'sqlalchemy_orders.db')}"
    print(f"SQLAlchemy orders on SQLite in {data_dir}")
    summary = module.run(url, processes=processes, orders_per_process=orders)
    for key, value in summary.items():
        print(f"  {key}: {value}")
    return not any(value for key, value in summary.items() if "duplicate" in key)


def run_serials(data_dir: str, processes: int, orders: int) -> bool:
    """Daily order numbers and gapless yearly invoices (``example_project.serials``)."""
    from example_project import serials

    print("-- serial numbers: ORD-YYYYMMDD-NNNNN daily, INV-YYYY-NNNNNN gapless per year")
    url = f"sqlite:///{os.path.join(data_dir, 'serials.db')}"
    return serials.run(url, processes, orders)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m example_project", description=__doc__)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--orders", type=int, default=2000, help="orders per process")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument(
        "--only", choices=("django", "sqlalchemy", "serials"), help="run one of the parts"
    )
    args = parser.parse_args(argv)
    data_dir = tempfile.mkdtemp(prefix="autoseq-example-")
    try:
        ok = True
        if args.only in (None, "django"):
            ok = run_django(data_dir, args.processes, args.orders)
        if args.only in (None, "sqlalchemy"):
            ok = run_sqlalchemy(data_dir, args.processes, args.orders) and ok
        if args.only in (None, "serials"):
            ok = run_serials(data_dir, args.processes, min(args.orders, 100)) and ok
    finally:
        if args.keep:
            print(f"files kept in {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)
    return 0 if ok else 1
