"""Snowflake ids on the in-process store: layout, ordering, clock policy, leases, lifetime."""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from autoseq import signals
from autoseq.errors import (
    AutoseqError,
    ClockMovedBackwards,
    InvalidCount,
    InvalidSnowflakeConfig,
    LeaseLost,
    WorkersExhausted,
)
from autoseq.snowflake import DEFAULT_EPOCH, SharedSnowflakes, Snowflake, SnowflakeParts, decode
from autoseq.stores import MemoryStore
from autoseq.workers import worker_leases


class Clock:
    """The real clock plus an offset the test moves (seconds)."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def __call__(self) -> float:
        return time.time() + self.offset


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


def make(store: Any, **kwargs: Any) -> Snowflake:
    kwargs.setdefault("lease_ttl", 5.0)
    return Snowflake(store, **kwargs)


def test_ids_positive_signed_64_bit_and_increasing(store: MemoryStore) -> None:
    """Ids are positive, below 2**63 and strictly increasing, next and next_many alike."""
    with make(store) as gen:
        values = [gen.next() for _ in range(20_000)]
        values += gen.next_many(20_000)
        values.append(gen.next())
    assert values == sorted(set(values))
    assert values[0] > 0
    assert values[-1] < 2**63


@pytest.mark.parametrize(("worker_bits", "sequence_bits"), [(10, 12), (5, 5), (0, 1), (12, 12)])
def test_decode_round_trips(store: MemoryStore, worker_bits: int, sequence_bits: int) -> None:
    """decode gives back the timestamp, the leased worker id and the sequence of each id."""
    with make(store, worker_bits=worker_bits, sequence_bits=sequence_bits) as gen:
        before = datetime.now(UTC) - timedelta(milliseconds=2)
        values = gen.next_many(50)
        after = datetime.now(UTC) + timedelta(milliseconds=2)
        for value in values:
            parts = gen.decode(value)
            assert isinstance(parts, SnowflakeParts)
            assert before <= parts.timestamp <= after
            assert parts.worker == gen.worker_id
            ms = int(parts.timestamp.timestamp() * 1000) - gen.epoch_ms
            rebuilt = (
                (ms << (worker_bits + sequence_bits)) | (parts.worker << sequence_bits)
            ) | parts.sequence
            assert rebuilt == value
            assert (
                decode(
                    value, epoch=gen.epoch_ms, worker_bits=worker_bits, sequence_bits=sequence_bits
                )
                == parts
            )


def test_decode_of_a_known_value() -> None:
    """The default layout: ms since 2024-01-01 above 10 worker bits and 12 sequence bits."""
    value = (1000 << 22) | (5 << 12) | 7
    assert decode(value) == SnowflakeParts(DEFAULT_EPOCH + timedelta(seconds=1), 5, 7)


@pytest.mark.parametrize("value", [0, -1, 2**63, 1.5, "12", True])
def test_decode_refuses_what_is_no_id(value: Any) -> None:
    """Zero, negatives, values past 63 bits and non-ints are refused with the valid range."""
    with pytest.raises(InvalidSnowflakeConfig, match="from 1 to 2\\*\\*63 - 1"):
        decode(value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"worker_bits": 23}, "worker_bits=23"),
        ({"sequence_bits": -1}, "sequence_bits=-1"),
        ({"worker_bits": 16, "sequence_bits": 16}, "at most 28"),
        ({"on_clock_backwards": "ignore"}, "'wait', 'fail' or 'borrow'"),
        ({"lease_ttl": 0}, "lease_ttl=0"),
        ({"max_backwards_wait": -1}, "max_backwards_wait=-1"),
        ({"epoch": datetime(2030, 1, 1)}, "no time zone"),
        ({"epoch": datetime(2999, 1, 1, tzinfo=UTC)}, "not in the past"),
        ({"lease_ttl": True}, "lease_ttl=True"),
        ({"lease_ttl": float("nan")}, "lease_ttl=nan"),
        ({"max_backwards_wait": True}, "max_backwards_wait=True"),
        ({"max_wait": True}, "max_wait=True"),
        ({"max_wait": 0.001}, "max_wait=0.001: give seconds from 0.005"),
        ({"clock": None}, "clock=None: give a function"),
        ({"clock": lambda: None}, "it gave None"),
        ({"warn_years": "10"}, "warn_years='10': give years"),
        ({"warn_years": True}, "warn_years=True"),
        ({"warn_years": -1}, "warn_years=-1"),
        ({"on_clock_backwards": ["wait"]}, "'wait', 'fail' or 'borrow'"),
        ({"name": ""}, "snowflake name"),
        ({"name": 7}, "snowflake name"),
    ],
)
def test_bad_settings_are_refused(store: MemoryStore, kwargs: dict[str, Any], message: str) -> None:
    """Each setting out of range raises InvalidSnowflakeConfig naming it; no lease is written."""
    with pytest.raises(InvalidSnowflakeConfig, match=message):
        Snowflake(store, **kwargs)
    assert issubclass(InvalidSnowflakeConfig, AutoseqError)
    assert worker_leases(store).list_workers() == []
    assert not [t for t in threading.enumerate() if t.name.startswith("autoseq-snowflake")]


@pytest.mark.parametrize(
    ("count", "message"), [(10**12, "at most 10,000,000"), (-1, "0 or more"), (True, "True")]
)
def test_next_many_takes_the_counts_sequence_locks_take(
    store: MemoryStore, count: Any, message: str
) -> None:
    """next_many refuses what SequenceLock.next_many refuses, at once; 0 gives an empty list."""
    with make(store) as gen:
        started = time.monotonic()
        with pytest.raises(InvalidCount, match=message):
            gen.next_many(count)
        assert time.monotonic() - started < 1
        assert gen.next_many(0) == []


def test_threads_share_one_generator_without_duplicates(store: MemoryStore) -> None:
    """Eight threads on one generator get distinct ids, each thread's in increasing order."""
    with make(store) as gen:
        results: list[list[int]] = []

        def work() -> None:
            mine = [gen.next() for _ in range(20_000)] + gen.next_many(500)
            results.append(mine)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    every = [v for mine in results for v in mine]
    assert len(every) == 8 * 20_500
    assert len(set(every)) == len(every)
    assert all(mine == sorted(mine) for mine in results)


def test_sequence_exhaustion_waits_for_the_next_millisecond(store: MemoryStore) -> None:
    """With 2 ids per millisecond, a burst spreads over milliseconds, never more than 2 in one."""
    with make(store, sequence_bits=1) as gen:
        values = [gen.next() for _ in range(40)] + gen.next_many(40)
    stamps = [gen.decode(v).timestamp for v in values]
    assert len(set(values)) == 80
    assert max(stamps.count(t) for t in stamps) <= 2
    assert len(set(stamps)) >= 40


def test_small_step_back_is_waited_out(store: MemoryStore) -> None:
    """A step back within max_backwards_wait is waited out even under 'fail'."""
    clock = Clock()
    with make(store, clock=clock, on_clock_backwards="fail", max_backwards_wait=0.05) as gen:
        first = gen.next()
        clock.offset = -0.02
        second = gen.next()
    assert second > first


def test_large_step_back_fails_under_fail(store: MemoryStore) -> None:
    """A step back past max_backwards_wait raises ClockMovedBackwards; recovers with the clock."""
    clock = Clock()
    with make(store, clock=clock, on_clock_backwards="fail") as gen:
        first = gen.next()
        clock.offset = -2.0
        with pytest.raises(ClockMovedBackwards, match="ms behind"):
            gen.next()
        clock.offset = 0.0
        assert gen.next() > first


def test_large_step_back_waits_under_wait(store: MemoryStore) -> None:
    """Under 'wait' the generator blocks until the clock passes the last timestamp again."""
    clock = Clock()
    with make(store, clock=clock, on_clock_backwards="wait") as gen:
        first = gen.next()
        clock.offset = -0.3
        started = time.monotonic()
        second = gen.next()
        waited = time.monotonic() - started
    assert second > first
    assert waited >= 0.25


def test_borrow_issues_on_the_last_timestamp_then_waits(store: MemoryStore) -> None:
    """Under 'borrow' ids keep coming on the last timestamp until its sequence is used up."""
    clock = Clock()
    with make(store, clock=clock, on_clock_backwards="borrow", sequence_bits=4) as gen:
        first = gen.next()
        clock.offset = -0.3
        started = time.monotonic()
        borrowed = [gen.next() for _ in range(15)]
        assert time.monotonic() - started < 0.2
        assert {gen.decode(v).timestamp for v in borrowed} == {gen.decode(first).timestamp}
        later = gen.next()  # the sequence is used up: waits for the clock
        assert time.monotonic() - started >= 0.25
    assert [first, *borrowed, later] == sorted({first, *borrowed, later})


def test_restart_behind_the_recorded_last_timestamp(store: MemoryStore) -> None:
    """A new owner whose clock is behind the worker's last timestamp refuses or waits."""
    ahead = make(store, clock=Clock(0.4), worker_bits=0)
    last = ahead.next()
    ahead.close()
    with pytest.raises(ClockMovedBackwards):
        make(store, worker_bits=0, on_clock_backwards="fail")
    with make(store, worker_bits=0, on_clock_backwards="wait") as gen:
        started = time.monotonic()
        value = gen.next()
        assert time.monotonic() - started >= 0.2
    assert value > last
    assert gen.decode(value).timestamp > ahead.decode(last).timestamp


def test_every_worker_id_taken_says_how_many_exist(store: MemoryStore) -> None:
    """With all 2 worker ids leased, a third generator is told so, and how many exist."""
    first, second = make(store, worker_bits=1), make(store, worker_bits=1)
    assert {first.worker_id, second.worker_id} == {0, 1}
    with pytest.raises(WorkersExhausted, match="all 2 worker ids"):
        make(store, worker_bits=1)
    first.close()
    third = make(store, worker_bits=1)
    assert third.worker_id == 0
    second.close()
    third.close()


def test_names_lease_worker_ids_separately(store: MemoryStore) -> None:
    """Two layouts with different names each start at worker id 0."""
    with make(store, name="orders") as a, make(store, name="users") as b:
        assert a.worker_id == b.worker_id == 0


def test_close_releases_the_lease_and_stops_generation(store: MemoryStore) -> None:
    """close() frees the worker id with the last timestamp recorded; next() then raises."""
    gen = make(store)
    value = gen.next()
    gen.close()
    (row,) = worker_leases(store).list_workers("default")
    assert row.owner is None
    assert row.last_ms == int(gen.decode(value).timestamp.timestamp() * 1000)
    with pytest.raises(LeaseLost, match="closed"):
        gen.next()


def test_shared_snowflakes_make_one_generator_per_store_and_layout(store: MemoryStore) -> None:
    """SharedSnowflakes.get gives the same generator for a store and layout, another otherwise."""
    shared = SharedSnowflakes()
    other = MemoryStore()
    try:
        first = shared.get(store)
        assert shared.get(store, "default") is first
        assert shared.get(store, "orders") is not first
        assert shared.get(other) is not first
    finally:
        shared.close()


def test_shared_snowflakes_close_releases_every_lease(store: MemoryStore) -> None:
    """SharedSnowflakes.close() closes what it made; the next get() leases a new generator."""
    shared = SharedSnowflakes()
    first = shared.get(store)
    first.next()
    shared.close()
    (row,) = worker_leases(store).list_workers("default")
    assert row.owner is None
    with pytest.raises(LeaseLost, match="closed"):
        first.next()
    again = shared.get(store)
    try:
        assert again is not first
        assert again.next() > 0
    finally:
        shared.close()


def test_heartbeat_renews_the_lease(store: MemoryStore) -> None:
    """With a 0.3 s lease the generator keeps working for a second: the heartbeat renews it."""
    with make(store, lease_ttl=0.3) as gen:
        first = gen.lease
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            gen.next()
            time.sleep(0.01)
        assert gen.lease is not None
        assert first is not None
        assert gen.lease.expires_ms > first.expires_ms + 500
        assert gen.worker_id == first.worker


def test_takeover_of_an_expired_lease_starts_above_it(store: MemoryStore) -> None:
    """A lease left to expire is taken over; the new owner issues above its expiry."""
    leases = worker_leases(store)
    now = int(time.time() * 1000)
    stale = leases.acquire_worker("default", "gone:1:x", 1, now - 1000, 900)
    assert stale is not None
    with make(store, worker_bits=0) as gen:
        assert gen.lease is not None
        assert gen.lease.floor_ms == stale.expires_ms
        assert int(gen.decode(gen.next()).timestamp.timestamp() * 1000) > stale.expires_ms


def test_lifetime_warning_and_signal(store: MemoryStore) -> None:
    """Fewer years of timestamp bits than warn_years left: a RuntimeWarning and a signal."""
    total = (1 << 41) / (365.2425 * 86_400_000)
    epoch = datetime.now(UTC) - timedelta(days=365.2425 * (total - 3))
    seen: list[dict[str, Any]] = []

    def receive(sender: Any, **kwargs: Any) -> None:
        seen.append(kwargs)

    signals.snowflake_lifetime_low.connect(receive)
    try:
        with pytest.warns(RuntimeWarning, match="years of timestamp bits left"):
            gen = make(store, epoch=epoch, warn_years=5)
    finally:
        signals.snowflake_lifetime_low.disconnect(receive)
    assert 2.9 < gen.years_left < 3.1
    assert seen
    assert seen[0]["name"] == "default"
    assert 2.9 < seen[0]["years_left"] < 3.1
    gen.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make(store, epoch=epoch, warn_years=1).close()


def test_forked_child_threads_take_one_lease_between_them(
    store: MemoryStore, tmp_path: Any
) -> None:
    """Threads of a forked child calling next() at once take one new lease, not one each."""
    import json
    import os

    gen = make(store)
    parent_value = gen.next()
    out = tmp_path / "child.json"
    pid = os.fork()
    if pid == 0:
        try:
            values: list[int] = []
            threads = [
                threading.Thread(target=lambda: values.extend(gen.next() for _ in range(100)))
                for _ in range(4)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            mine = [
                r.worker
                for r in worker_leases(store).list_workers("default")
                if r.owner and f":{os.getpid()}:" in r.owner
            ]
            out.write_text(json.dumps({"values": values, "leases": mine, "worker": gen.worker_id}))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    child = json.loads(out.read_text())
    gen.close()
    assert len(child["leases"]) == 1
    assert child["worker"] != gen.decode(parent_value).worker
    assert len(set(child["values"])) == 400


def test_a_lease_taken_over_stops_generation_then_a_new_one_is_taken(store: MemoryStore) -> None:
    """When another owner takes the worker id, next() raises LeaseLost, then resumes higher."""
    lost: list[dict[str, Any]] = []

    def receive(sender: Any, **kwargs: Any) -> None:
        lost.append(kwargs)

    signals.worker_lease_lost.connect(receive)
    try:
        with make(store, worker_bits=1, lease_ttl=0.3) as gen:
            before = gen.next()
            assert gen.lease is not None
            # someone whose clock runs far ahead sees the lease expired and takes it
            thief = worker_leases(store).acquire_worker(
                "default", "thief", 1, gen.lease.expires_ms + 1, 60_000
            )
            assert thief is not None
            deadline = time.monotonic() + 3
            while not lost and time.monotonic() < deadline:
                with contextlib.suppress(LeaseLost):
                    gen.next()
                time.sleep(0.01)
            assert lost
            assert lost[0]["reason"] == "its lease row is gone or another generator took it over"
            resumed = None
            while resumed is None and time.monotonic() < deadline:
                try:
                    resumed = gen.next()
                except LeaseLost:
                    time.sleep(0.01)
            assert resumed is not None
            assert resumed > before
            assert gen.worker_id == 1
            assert gen.decode(resumed).worker == 1
    finally:
        signals.worker_lease_lost.disconnect(receive)


def test_lease_lost_never_claims_no_id_can_repeat() -> None:
    """LeaseLost says this call issued nothing, and never that ids issued before cannot
    repeat (a failover that lost the lease can make them repeat)."""
    message = str(LeaseLost("ids", 3, "its lease row is gone or another generator took it over"))
    assert "this call issued no id" in message
    assert "none can be duplicated" not in message
    assert "failover" in message
