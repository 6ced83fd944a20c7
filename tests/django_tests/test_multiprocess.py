"""4 processes x 4 threads creating rows through the ORM, bulk_create mixed in: no duplicate."""

from __future__ import annotations

import multiprocessing
import threading
import traceback
from typing import Any

import pytest
from django.db import connections
from django.db.models import Count

from django_tests.testapp.models import Line, Order

PROCESSES = 4
THREADS = 4
ROUNDS = 24  # per thread: 24 save()s and 4 bulk_create()s of 40 orders and 10 lines
BULK_EVERY = 6


def insert_rows(alias: str) -> None:
    """One thread's share: saves, with a bulk_create every BULK_EVERY rounds."""
    try:
        for i in range(ROUNDS):
            Order.objects.using(alias).create(note="save")
            if i % BULK_EVERY == 0:
                Order.objects.using(alias).bulk_create([Order(note="bulk") for _ in range(40)])
                Line.objects.using(alias).bulk_create([Line() for _ in range(10)])
    finally:
        connections.close_all()


def child(alias: str, errors: Any) -> None:
    """A worker process: THREADS threads inserting at once."""
    failures: list[str] = []

    def run() -> None:
        try:
            insert_rows(alias)
        except Exception:
            failures.append(traceback.format_exc())

    threads = [threading.Thread(target=run) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    errors.put(failures)


@pytest.mark.autoseq_transaction
def test_processes_and_threads_never_share_a_value(backend: str) -> None:
    """Every key, ticket and line code is distinct across 4 x 4 writers, forked mid-block."""
    Order.objects.using(backend).create(note="parent")  # children fork with a block cached
    connections.close_all()  # never share an open socket with a child
    context = multiprocessing.get_context("fork")
    errors = context.Queue()
    workers = [context.Process(target=child, args=(backend, errors)) for _ in range(PROCESSES)]
    for worker in workers:
        worker.start()
    reports = [errors.get(timeout=240) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0] * PROCESSES
    assert [failure for report in reports for failure in report] == []
    Order.objects.using(backend).create(note="parent again")

    per_thread = ROUNDS + (ROUNDS // BULK_EVERY) * 40
    orders = Order.objects.using(backend)
    assert orders.count() == PROCESSES * THREADS * per_thread + 2
    # ticket_no is not unique in the schema: a duplicate would be stored, and seen here.
    repeated = orders.values("ticket_no").annotate(n=Count("id")).filter(n__gt=1)
    assert list(repeated) == []
    codes = Line.objects.using(backend)
    assert codes.count() == PROCESSES * THREADS * (ROUNDS // BULK_EVERY) * 10
    assert codes.values("code").distinct().count() == codes.count()
