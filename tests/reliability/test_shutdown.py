"""Shutdown with the store unreachable: bounded in total, never a repeated value.

Many sequences buffered on one registry, the store cut off (stalled: no
answer at all), then ``registry.close()``: it must return within its
deadline however many sequences there are, log in one line the tails it
could not hand back, and leave them as gaps, so a registry opened once the
store is back continues past every value handed out.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from autoseq import AutoseqError, BufferPolicy, SequenceConfig, SequenceRegistry
from autoseq.snowflake import Snowflake

from .faultproxy import FaultProxy
from .harness import Check, tally

#: Sequences on the registry being closed: one store timeout each was the old cost.
SEQUENCES = 12
#: What close() may take with its default deadline (5 s), with margin for a busy machine.
CLOSE_BOUND = 6.0
POLICY = BufferPolicy(prefetch=False, retry_initial=0.02, retry_max=0.3, wait_timeout=5.0)


def configs() -> list[SequenceConfig]:
    return [SequenceConfig(f"shut{i}", batch_count=50) for i in range(SEQUENCES)]


def take_some(registry: SequenceRegistry) -> dict[str, list[int]]:
    """Three values from every sequence, so each holds an unused tail."""
    return {
        config.name: [registry.register(config).next() for _ in range(3)] for config in configs()
    }


@pytest.mark.timeout(120)
def test_close_is_bounded_with_the_store_stalled(
    network_target: Any, caplog: pytest.LogCaptureFixture, record_property: Any
) -> None:
    """close() on a stalled store ends within its deadline, logs the tails, repeats nothing."""
    host, port = network_target.address
    with FaultProxy(port, host) as proxy:
        store = network_target.open(
            network_target.spec_via(proxy.port), **network_target.fail_fast()
        )
        registry = SequenceRegistry(store, policy=POLICY)
        taken = take_some(registry)
        proxy.stall()
        caplog.set_level(logging.WARNING, logger="autoseq")
        started = time.monotonic()
        left = registry.close()
        seconds = time.monotonic() - started
        proxy.heal()
    assert seconds < CLOSE_BOUND, f"close() took {seconds:.1f}s with {SEQUENCES} sequences"
    assert sorted(name for name, _ in left) == sorted(taken)
    lines = [r.getMessage() for r in caplog.records if "not handed back" in r.getMessage()]
    assert len(lines) == 1, lines
    assert all(name in lines[0] for name in taken), lines[0]
    after = SequenceRegistry(network_target.open(), policy=POLICY)
    duplicates = values = 0
    for config in configs():
        run = taken[config.name]
        later = after.register(config).next()
        assert later > max(run), f"{config.name}: {later} after {run}"
        check = Check.of([*run, later])
        duplicates += check.duplicates
        values += check.values
    after.close()
    assert duplicates == 0
    tally(
        record_property,
        network_target.id,
        "shutdown (store stalled)",
        sequences=SEQUENCES,
        values=values,
        duplicates=duplicates,
        tails_left=len(left),
        close_seconds=round(seconds, 2),
    )


def test_close_hands_every_tail_back_when_healthy(network_target: Any) -> None:
    """close() on a healthy store hands every tail back: the next registry has no gap."""
    registry = SequenceRegistry(network_target.open(), policy=POLICY)
    taken = take_some(registry)
    assert registry.close() == []
    after = SequenceRegistry(network_target.open(), policy=POLICY)
    for config in configs():
        assert after.register(config).next() == taken[config.name][-1] + 1
    after.close()


@pytest.mark.timeout(120)
def test_close_does_not_wait_for_a_stalled_prefetch(network_target: Any) -> None:
    """A prefetch stuck on a stalled store holds close() up no longer than its deadline."""
    host, port = network_target.address
    config = SequenceConfig("shutprefetch", batch_count=20)
    values: list[int] = []
    with FaultProxy(port, host) as proxy:
        # The store's own timeouts (10 s and more) are longer than close()'s deadline.
        registry = SequenceRegistry(network_target.open(network_target.spec_via(proxy.port)))
        lock = registry.register(config)
        values.append(lock.next())
        proxy.stall()
        while not lock.stats()["loading"]:
            values.append(lock.next())
        time.sleep(0.5)  # the worker is now inside its reservation, waiting on the store
        started = time.monotonic()
        registry.close()
        seconds = time.monotonic() - started
        proxy.heal()
        healed = time.monotonic()
        while lock.stats()["loading"] and time.monotonic() - healed < 60:
            time.sleep(0.05)
        with pytest.raises(AutoseqError, match="closed"):
            values.append(lock.next())
    assert seconds < CLOSE_BOUND, f"close() waited {seconds:.1f}s for a stalled prefetch"
    after = SequenceRegistry(network_target.open())
    later = after.register(config).next()
    after.close()
    assert later > max(values)
    assert Check.of([*values, later]).duplicates == 0


@pytest.mark.timeout(120)
def test_snowflake_close_is_bounded_with_the_store_stalled(
    network_target: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Snowflake.close() on a stalled store ends within its deadline and logs the lease left."""
    host, port = network_target.address
    with FaultProxy(port, host) as proxy:
        # The store's own timeouts (10 s and more) are longer than close()'s deadline.
        generator = Snowflake(network_target.open(network_target.spec_via(proxy.port)), name="shut")
        before = [generator.next() for _ in range(100)]
        worker = generator.worker_id
        proxy.stall()
        caplog.set_level(logging.WARNING, logger="autoseq")
        started = time.monotonic()
        generator.close()
        seconds = time.monotonic() - started
        proxy.heal()
    assert seconds < CLOSE_BOUND, f"Snowflake.close() took {seconds:.1f}s on a stalled store"
    assert any(f"worker {worker} " in r.getMessage() for r in caplog.records), caplog.text
    with Snowflake(network_target.open(), name="shut") as after:
        later = [after.next() for _ in range(100)]
    assert Check.of([*before, *later], start=0).duplicates == 0


def test_close_of_many_sequences_commits_once_per_chunk(tmp_path: Any) -> None:
    """Issue 34: close() of N sequences hands their tails back in a few transactions,
    not one commit per sequence, and every tail still lands (restart without gaps)."""
    import sqlalchemy as sa

    from autoseq.stores import SQLStore

    store = SQLStore(f"sqlite:///{tmp_path / 'many.db'}")
    store.create_table()
    names = [f"s{i:04d}" for i in range(1200)]
    registry = SequenceRegistry(store)
    for name in names:
        registry.register(SequenceConfig(name)).next()
    registry.register(SequenceConfig("taken")).next()
    store.reserve("taken", 5)  # reserved past this process: its tail must stay a gap
    commits: list[int] = []
    sa.event.listen(store.engine, "commit", lambda _connection: commits.append(1))
    left = registry.close_locks()
    assert left == []
    assert len(commits) <= 3, f"{len(commits)} commits to close {len(names) + 1} sequences"
    assert {store.read(name).current for name in names} == {2}
    assert store.read("taken").current > 2
    store.close()
