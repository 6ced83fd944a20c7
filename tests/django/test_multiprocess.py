"""Processes and threads writing through the ORM: no duplicate, and gapless serials with no gap."""

from __future__ import annotations

import multiprocessing
import random
import threading
import traceback
from typing import Any

import pytest
from django.db import connections, transaction
from django.db.models import Count

from django_tests.testapp.models import Line, Order, Receipt

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


def run_children(target: Any, arguments: list[tuple[Any, ...]]) -> None:
    """Fork one process per ``arguments`` running ``target(*args, errors)``; each puts its
    list of failures on ``errors``: all must exit 0 and report none."""
    connections.close_all()  # never share an open socket with a child
    context = multiprocessing.get_context("fork")
    errors = context.Queue()
    workers = [context.Process(target=target, args=(*args, errors)) for args in arguments]
    for worker in workers:
        worker.start()
    reports = [errors.get(timeout=240) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0] * len(workers)
    assert [failure for report in reports for failure in report] == []


@pytest.mark.autoseq_transaction
def test_processes_and_threads_never_share_a_value(backend: str) -> None:
    """Every key, ticket and line code is distinct across 4 x 4 writers, forked mid-block."""
    Order.objects.using(backend).create(note="parent")  # children fork with a block cached
    run_children(child, [(backend,)] * PROCESSES)
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


GAPLESS_PROCESSES = 6
GAPLESS_ROUNDS = 25


def gapless_child(alias: str, seed: int, errors: Any) -> None:
    """A worker process: one Receipt per transaction, about 30% of them rolled back."""
    failures: list[str] = []
    rng = random.Random(seed)
    try:
        for _ in range(GAPLESS_ROUNDS):
            try:
                with transaction.atomic(using=alias):
                    Receipt.objects.using(alias).create(amount=seed)
                    if rng.random() < 0.3:
                        raise _Rollback
            except _Rollback:
                pass
    except Exception:
        failures.append(traceback.format_exc())
    finally:
        connections.close_all()
    errors.put(failures)


class _Rollback(Exception):
    """Raised inside atomic() to roll it back."""


@pytest.mark.autoseq_transaction
def test_gapless_serials_from_six_processes_with_rollbacks_have_no_gap(backend: str) -> None:
    """6 processes, each transaction its own gapless Receipt, 30% rolled back: the committed
    numbers are exactly the ones after the parent's, with no gap and no repeat."""
    with transaction.atomic(using=backend):
        first = Receipt.objects.using(backend).create(amount=-1)
    run_children(gapless_child, [(backend, seed) for seed in range(GAPLESS_PROCESSES)])

    serial = Receipt._meta.get_field("number").serial(backend)
    base = serial.parse(first.number)[1]
    rows = list(Receipt.objects.using(backend).exclude(pk=first.pk).values_list("number", "amount"))
    counters = sorted(serial.parse(number)[1] for number, _ in rows)
    assert (
        GAPLESS_PROCESSES * GAPLESS_ROUNDS * 0.4
        < len(counters)
        < GAPLESS_PROCESSES * GAPLESS_ROUNDS
    )
    assert counters == list(range(base + 1, base + 1 + len(counters)))
    assert {amount for _, amount in rows} == set(range(GAPLESS_PROCESSES))
