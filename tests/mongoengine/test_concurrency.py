"""Several processes and threads saving and bulk-inserting documents never share a value."""

from __future__ import annotations

import itertools
import multiprocessing
import threading
import time
from typing import Any

import mongoengine as me
import pytest

from autoseq_mongoengine import SequenceField

pytestmark = [pytest.mark.mongodb, pytest.mark.usefixtures("me_db")]

PROCESSES = 4
THREADS = 4


class Order(me.Document):
    id = SequenceField(primary_key=True, batch_count=20)
    serial = SequenceField(sequence_name="order_serials", batch_count=7)
    strict = SequenceField(batch=False)
    worker = me.StringField()
    position = me.IntField()


def _work(worker: str, rounds: int, saves: int, bulk: int) -> None:
    position = 0
    for _ in range(rounds):
        for _ in range(saves):
            Order(worker=worker, position=position).save()
            position += 1
        batch = []
        for _ in range(bulk):
            batch.append(Order(worker=worker, position=position))
            position += 1
        Order.objects.insert(batch, load_bulk=False)


def _process(index: int, rounds: int, saves: int, bulk: int) -> None:
    errors: list[BaseException] = []

    def run(thread: int) -> None:
        try:
            _work(f"p{index}t{thread}", rounds, saves, bulk)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


@pytest.mark.parametrize(
    ("rounds", "saves", "bulk", "timeout"),
    [
        pytest.param(3, 10, 100, 180.0, id="quick"),
        # secantusdb's save() slows down as a collection grows (see
        # mongo_server.py), so the soak leans on bulk inserts.
        pytest.param(
            8, 25, 500, 1500.0, id="soak", marks=[pytest.mark.slow, pytest.mark.timeout(1800)]
        ),
    ],
)
def test_processes_and_threads_never_share_a_value(
    me_db: Any, rounds: int, saves: int, bulk: int, timeout: float
) -> None:
    """4 processes x 4 threads: unique keys and serials, increasing within each thread."""
    # The parent holds blocks of every sequence when it forks: children
    # must not serve them.
    before = [Order(worker="parent", position=i).save() for i in range(5)]
    context = multiprocessing.get_context("fork")
    children = [
        context.Process(target=_process, args=(index, rounds, saves, bulk))
        for index in range(PROCESSES)
    ]
    for child in children:
        child.start()
    deadline = time.monotonic() + timeout
    for child in children:
        child.join(timeout=max(0.0, deadline - time.monotonic()))
    hung = [child for child in children if child.is_alive()]
    for child in hung:
        child.kill()
        child.join()
    assert not hung, f"{len(hung)} processes still running after {timeout}s (deadlock?)"
    assert [child.exitcode for child in children] == [0] * PROCESSES
    after = [Order(worker="parent", position=5 + i).save() for i in range(5)]

    per_thread = rounds * (saves + bulk)
    total = PROCESSES * THREADS * per_thread + len(before) + len(after)
    collection = me_db["order"]
    assert collection.count_documents({}) == total
    for field in ("_id", "serial", "strict"):
        assert len(collection.distinct(field)) == total, f"duplicate {field}"
    rows = sorted(
        collection.find({}, {"worker": 1, "position": 1, "strict": 1}),
        key=lambda row: (row["worker"], row["position"]),
    )
    for worker, group in itertools.groupby(rows, key=lambda row: row["worker"]):
        ids = [row["_id"] for row in group]
        assert ids == sorted(ids), f"{worker}: keys not increasing"
        if worker != "parent":
            assert len(ids) == per_thread
    assert {doc.id for doc in before}.isdisjoint(doc.id for doc in after)
