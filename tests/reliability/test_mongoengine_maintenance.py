"""mongoengine's ``set_next_value`` beside saves: a compare-and-set, forward only, no repeat.

It used to read the row and overwrite ``current`` blindly; a call made
with a value read a moment earlier rewound the sequence under the threads
saving at the same time, and their documents got serials twice.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import mongoengine as me
import pytest

from autoseq.errors import ValueMovesBackward
from autoseq_mongoengine import SequenceField

from .harness import tally

pytestmark = [pytest.mark.mongodb, pytest.mark.usefixtures("me_db")]


class Receipt(me.Document):
    serial = SequenceField(batch_count=5)
    worker = me.IntField()


def test_set_next_value_beside_saving_threads_never_repeats_a_serial(
    record_property: Any,
) -> None:
    """4 threads save while set_next_value moves the counter with stale values: 0 duplicates."""
    Receipt(worker=-1).save()
    errors: list[BaseException] = []

    def save(worker: int) -> None:
        try:
            for _ in range(60):
                Receipt(worker=worker).save()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=save, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    moved = refused = 0
    while any(thread.is_alive() for thread in threads):
        # What an import script does: read the highest serial, then set the
        # counter from it; by the time it writes, saves have moved past it.
        highest = Receipt.objects.order_by("-serial").first()
        try:
            Receipt.serial.set_next_value(highest.serial + 500)
            moved += 1
        except ValueMovesBackward:
            refused += 1
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    serials = [doc.serial for doc in Receipt.objects.only("serial")]
    duplicates = sum(n - 1 for n in Counter(serials).values() if n > 1)
    tally(
        record_property,
        "mongodb",
        "set_next_value race",
        values=len(serials),
        duplicates=duplicates,
        moves=moved,
        refused=refused,
    )
    assert len(serials) == 241
    twice = [serial for serial, n in Counter(serials).items() if n > 1]
    assert duplicates == 0, f"serials saved twice: {twice[:10]}"
