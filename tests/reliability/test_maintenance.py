"""Writes outside a reservation: hand-backs re-sent, stale laps, operators changing a row.

Each scenario counts the values actually handed out by every client
involved; a value handed out twice is a duplicate key in a user's table.
Before rows carried a version, the hand-back compared ``current`` alone:
a re-sent or stale hand-back rewound a row that had come back to the same
``current``, and every scenario below handed values out twice.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest

from autoseq import BufferPolicy, SequenceConfig, SequenceRegistry, StoreUnavailable
from autoseq.errors import ReservationConflict, ValueMovesBackward
from autoseq.stores.base import Block

from .faultproxy import FaultProxy
from .harness import Check, tally

#: Requests that apply a hand-back, as they travel to each server: the
#: transaction's COMMIT (a simple query on PostgreSQL, a COM_QUERY on
#: MariaDB; framed, since "BEGIN ISOLATION LEVEL READ COMMITTED" holds the
#: word too), the findAndModify (MongoDB), the script call (Redis). The
#: reply to it is what the proxy loses.
APPLIED_BY = {
    "postgres": b"Q\x00\x00\x00\x0bCOMMIT\x00",
    "mysql": b"\x03COMMIT",
    "mongodb": b"findAndModify",
    "redis": b"EVALSHA",
}
ROUNDS = 6
BLOCK = 50


def _wait_for_current(target: Any, name: str, value: int, timeout: float = 10.0) -> None:
    """Wait until the stored ``current`` is ``value`` (the hand-back landed), or ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(row["name"] == name and row["current"] == value for row in target.rows()):
            return
        time.sleep(0.01)


def test_a_hand_back_resent_after_a_lost_reply_never_rewinds(
    network_target: Any, record_property: Any
) -> None:
    """The reply to a hand-back is lost, another client reserves, the re-send changes nothing."""
    host, port = network_target.address
    name = "resent"
    direct = network_target.open()
    direct.create(SequenceConfig(name, batch_count=BLOCK))
    handed: list[int] = []
    resends = 0
    with FaultProxy(port, host) as proxy:
        proxied = network_target.open(
            network_target.spec_via(proxy.port), **network_target.fail_fast()
        )
        # A stale hand-back first: it changes nothing, and loads Redis's
        # script so the release below is one EVALSHA.
        stale = proxied.reserve(name, BLOCK)
        handed.extend(direct.reserve(name, BLOCK).values())
        assert proxied.release(stale) is False
        handed.extend(stale.values())
        for _ in range(ROUNDS):
            # Reserved and not served: the whole block goes back on close.
            mine = proxied.reserve(name, BLOCK)

            def competitor(block: Block = mine) -> None:
                # The hand-back is applied but its reply not yet delivered:
                # another process now takes the same values back, legally,
                # leaving current where the hand-back found it.
                _wait_for_current(network_target, name, block.first)
                handed.extend(direct.reserve(name, BLOCK).values())

            proxy.reset_on(APPLIED_BY[network_target.id], after=True, on_fire=competitor)
            # The reply is lost: Redis's client re-sends by itself, other
            # callers get StoreUnavailable and re-send below.
            with contextlib.suppress(StoreUnavailable):
                proxied.release(mine)
            assert proxy.armed == 0, "the hand-back never reached the server"
            resends += 1
            assert proxied.release(mine) is False, "a re-sent hand-back was applied again"
            handed.extend(direct.reserve(name, BLOCK).values())
    check = Check.of(handed)
    tally(
        record_property,
        network_target.id,
        "re-sent hand-back",
        values=check.values,
        duplicates=check.duplicates,
        faults=resends,
    )
    assert check.duplicates == 0, f"values handed out twice: {check.repeated(handed)}"


def test_a_stale_hand_back_after_the_sequence_wrapped_repeats_nothing_in_the_lap(
    target: Any, record_property: Any
) -> None:
    """A process closes after the sequence cycled past its block: the new lap has no repeat."""
    name = "lap"
    config = SequenceConfig(name, start=1, end=300, cycle=True, batch_count=100)
    policy = BufferPolicy(prefetch=False, max_batch_count=100)
    old = SequenceRegistry(target.open(), policy=policy).register(config)
    assert [old.next() for _ in range(10)] == list(range(1, 11))  # holds 11..100
    others = SequenceRegistry(target.open(), policy=policy).register(config)
    assert [others.next() for _ in range(200)] == list(range(101, 301))
    lap = [others.next() for _ in range(100)]  # the second lap: 1..100, current 101 again
    assert lap == list(range(1, 101))
    old.close()  # hands 11..100 back against a row that came back to current=101
    others.close()
    fresh = SequenceRegistry(target.open(), policy=policy).register(config)
    lap += [fresh.next() for _ in range(150)]  # still within the second lap
    fresh.close()
    check = Check.of(lap)
    tally(
        record_property,
        target.id,
        "stale lap hand-back",
        values=check.values,
        duplicates=check.duplicates,
    )
    assert check.duplicates == 0, f"values repeated in one lap: {check.repeated(lap)}"


def test_a_close_after_an_operator_changed_step_keeps_every_process_serving(
    target: Any, record_property: Any
) -> None:
    """A step change while a process holds a block: its close writes nothing off the grid."""
    from autoseq import maintenance

    name = "regrid"
    config = SequenceConfig(name, batch_count=100)
    policy = BufferPolicy(prefetch=False)
    holder = SequenceRegistry(target.open(), policy=policy).register(config)
    handed = [holder.next() for _ in range(5)]  # holds 6..100
    maintenance.change(target.open(), name, step=7)
    holder.close()  # the old hand-back would write current=6, off the new grid
    for _ in range(3):
        registry = SequenceRegistry(target.open(), policy=policy)
        lock = registry.register(config)
        handed += [lock.next() for _ in range(120)]
        lock.close()
    check = Check.of(handed)
    tally(
        record_property,
        target.id,
        "step change + close",
        values=check.values,
        duplicates=check.duplicates,
    )
    assert check.duplicates == 0
    assert all((value - 1) % 7 == 0 for value in handed[5:]), "a value off the new step grid"


def test_operators_moving_a_sequence_while_threads_serve_never_repeat_a_value(
    target: Any, record_property: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """set, sync and settings changes racing 4 serving threads: no value twice, order kept.

    Blocks of 20 to 200 values keep the row's version moving without pause,
    so a write may also give up (ReservationConflict, nothing written)
    rather than land: both are safe, and most writes must land.
    """
    from autoseq import maintenance

    monkeypatch.setattr(maintenance, "WRITE_TIMEOUT", 2.0)

    name = "busy"
    config = SequenceConfig(name, batch_count=20)
    policy = BufferPolicy(max_batch_count=200)
    registry = SequenceRegistry(target.open(), policy=policy)
    lock = registry.register(config)
    per_thread: list[list[int]] = [[] for _ in range(4)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def serve(mine: list[int]) -> None:
        try:
            while not stop.is_set():
                mine.append(lock.next())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=serve, args=(values,)) for values in per_thread]
    for thread in threads:
        thread.start()
    operator = target.open()
    writes = refused = starved = 0
    try:
        for round_ in range(12):
            row = maintenance.read(operator, name)
            try:
                if round_ % 3 == 0:
                    maintenance.set_current(operator, name, row.next_value + 500)
                elif round_ % 3 == 1:
                    maintenance.sync(operator, name, row.next_value + 250)
                else:
                    maintenance.change(operator, name, batch_count=10 + round_)
                writes += 1
            except ValueMovesBackward:
                refused += 1  # the threads reserved past the value meanwhile: forward only
            except ReservationConflict:
                starved += 1  # the row never held still long enough: nothing written
            time.sleep(0.02)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    lock.close()
    assert not errors, errors
    every = [value for values in per_thread for value in values]
    # A fresh process after all that continues past every value handed out.
    after = SequenceRegistry(target.open()).register(config)
    every += [after.next() for _ in range(50)]
    after.close()
    check = Check.of(every)
    tally(
        record_property,
        target.id,
        "maintenance race",
        values=check.values,
        writes=writes,
        refused=refused,
        starved=starved,
    )
    assert check.duplicates == 0, f"values handed out twice: {check.repeated(every)}"
    for values in per_thread:
        assert values == sorted(values)
    assert writes + refused >= 6, f"only {writes} writes landed and {refused} were refused"
