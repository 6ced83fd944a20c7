"""Store outage and latency: a fault-injecting proxy between autoseq and the real server.

While the proxy cuts, stalls, slows or resets the store's connections, a
registry behind it keeps serving (from its buffer, then with a clear
``StoreUnavailable``), no call hangs past the configured timeouts, and a
competitor connected directly interleaves its own blocks: no value is ever
handed out twice, and the store recovers once the network heals.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from autoseq import BufferPolicy, SequenceConfig, SequenceRegistry, StoreUnavailable

from .faultproxy import FaultProxy
from .harness import Check, tally

#: Longest one call may take while the store is faulty: the store's own
#: timeouts (about 2 s statement, 1 s connect) plus back-off, with margin.
CALL_BOUND = 10.0
#: How long the store may take to serve again once the network heals.
RECOVERY_BOUND = 10.0
POLICY = BufferPolicy(retry_initial=0.02, retry_max=0.3, wait_timeout=5.0)


@dataclass
class Outcome:
    value: int | None = None
    error: BaseException | None = None
    seconds: float = 0.0
    hung: bool = False


def call(fn: Callable[[], int], bound: float = CALL_BOUND) -> Outcome:
    """Run ``fn`` on a thread; a call still running after ``bound`` seconds is a hang."""
    outcome = Outcome()

    def run() -> None:
        started = time.monotonic()
        try:
            outcome.value = fn()
        except BaseException as exc:
            outcome.error = exc
        outcome.seconds = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound)
    outcome.hung = thread.is_alive()
    return outcome


@dataclass
class Ledger:
    """Everything the proxied registry and the direct competitor handed out."""

    values: list[int] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    slowest: float = 0.0
    outages_seen: dict[str, int] = field(default_factory=dict)

    def take(self, fault: str, lock: Any) -> bool:
        outcome = call(lock.next)
        if outcome.hung:
            self.hangs.append(fault)
            return False
        self.slowest = max(self.slowest, outcome.seconds)
        if outcome.error is not None:
            self.errors.append(outcome.error)
            if isinstance(outcome.error, StoreUnavailable):
                self.outages_seen[fault] = self.outages_seen.get(fault, 0) + 1
            return False
        assert outcome.value is not None
        self.values.append(outcome.value)
        return True


def reset_patterns(target: Any) -> dict[str, tuple[bytes, bool]]:
    """Where to break a reservation: (bytes the client sends, reset after forwarding them)."""
    if target.kind == "redis":
        return {
            "reset-before-script": (b"EVALSHA", False),
            "reset-after-script": (b"EVALSHA", True),
        }
    if target.kind == "mongo":
        return {
            "reset-before-write": (b"findAndModify", False),
            "reset-after-write": (b"findAndModify", True),
        }
    if target.id == "postgres":
        # One autocommitted UPDATE ... RETURNING per reservation: lost on its
        # way in, or committed with the answer lost on its way out.
        return {
            "reset-before-update": (b"SET current", False),
            "reset-after-update": (b"SET current", True),
        }
    return {
        "reset-at-select": (b"FOR UPDATE", False),
        "reset-before-update": (b"SET current", False),
        "reset-after-commit": (b"COMMIT", True),
    }


#: Faults during which the caller must see StoreUnavailable once its buffer
#: is spent; their phases last until it has been seen (or OUTAGE_BOUND).
OUTAGES = ("cut", "stall")
#: The longest a cut or stall lasts while the caller still has buffered values:
#: blocks are sized to last block_seconds (2 s) at the observed rate, and a
#: prefetched one may be in hand too.
OUTAGE_BOUND = 12.0


def phase_over(fault: str, started: float, seconds: float, ledger: Ledger) -> bool:
    """A fault's phase ends after ``seconds``; a cut or stall not before an outage was seen.

    A cut of a fixed 1.5 s could end before the caller had spent a block
    sized to last 2 s (and the one prefetched) and its next reservation had
    timed out (on MongoDB the first StoreUnavailable came 2.5-3.0 s into the
    cut), and the test then failed for want of an outage it never gave the
    caller time to meet.
    """
    elapsed = time.monotonic() - started
    if fault in OUTAGES and not ledger.outages_seen.get(fault):
        return elapsed >= OUTAGE_BOUND
    return elapsed >= seconds


def outage_run(target: Any, record_property: Any, rounds: int) -> None:
    host, port = target.address
    config = SequenceConfig("outage", batch_count=5)
    with FaultProxy(port, host) as proxy:
        proxied = SequenceRegistry(
            target.open(target.spec_via(proxy.port), **target.fail_fast()), policy=POLICY
        )
        direct = SequenceRegistry(target.open(), policy=POLICY)
        lock, competitor = proxied.register(config), direct.register(config)
        ledger = Ledger()
        resets = reset_patterns(target)
        faults: dict[str, tuple[Callable[[], None], float]] = {
            "latency": (lambda: setattr(proxy, "latency", 0.05), 0.6),
            "cut": (proxy.cut, 1.5),
            "stall": (proxy.stall, 5.0),
        }
        for fault, (pattern, after) in resets.items():
            faults[fault] = (lambda p=pattern, a=after: proxy.reset_on(p, after=a), 0.6)
        recoveries: list[float] = []
        phases = 0
        for _ in range(rounds):
            for fault, (apply, seconds) in faults.items():
                phases += 1
                apply()
                started = time.monotonic()
                while not ledger.hangs and not phase_over(fault, started, seconds, ledger):
                    ledger.take(fault, lock)
                    ledger.values.append(competitor.next())
                    time.sleep(0.002)
                proxy.heal()
                healed = time.monotonic()
                while not ledger.take(f"{fault}: recovery", lock):
                    assert time.monotonic() - healed < RECOVERY_BOUND, (
                        f"no value {RECOVERY_BOUND}s after the {fault} ended: {ledger.errors[-1:]}"
                    )
                    time.sleep(0.05)
                recoveries.append(time.monotonic() - healed)
                assert not ledger.hangs, f"a call hung over {CALL_BOUND}s during: {ledger.hangs}"

        check = Check.of(ledger.values)
        assert check.duplicates == 0, f"repeated values {check.repeated(ledger.values)}"
        foreign = [e for e in ledger.errors if not isinstance(e, StoreUnavailable)]
        assert not foreign, f"errors other than StoreUnavailable reached the caller: {foreign[:3]}"
        assert all("'outage'" in str(e) for e in ledger.errors), ledger.errors[:3]
        for fault in OUTAGES:
            assert ledger.outages_seen.get(fault), (
                f"no StoreUnavailable while the store was {fault}"
            )
        assert ledger.slowest < CALL_BOUND
        after = SequenceRegistry(target.open()).register(config).next()
        assert after > check.highest
        tally(
            record_property,
            target.id,
            "outage",
            values=check.values,
            duplicates=check.duplicates,
            gaps=check.gaps,
            outages=phases,
            store_unavailable=len(ledger.errors),
            proxy_resets=proxy.resets,
            slowest_call=round(ledger.slowest, 2),
            slowest_recovery=round(max(recoveries), 2),
        )
        proxied.close(release=False)
        direct.close(release=False)


def test_outages_never_duplicate_and_fail_within_timeouts(
    network_target: Any, record_property: Any
) -> None:
    """Cut, stall, latency and mid-transaction resets: StoreUnavailable, no hang, no repeat."""
    outage_run(network_target, record_property, rounds=1)


@pytest.mark.slow
def test_outage_soak(network_target: Any, record_property: Any) -> None:
    """The outage scenario, ten rounds of every fault."""
    outage_run(network_target, record_property, rounds=10)


def test_sqlite_writer_lock_held_elsewhere_fails_within_timeout(
    tmp_path: Path, record_property: Any
) -> None:
    """SQLite's outage: another process holds the write lock; a clear error in bounded time."""
    import sqlite3

    from autoseq.stores.sql import SQLStore

    store = SQLStore(f"sqlite:///{tmp_path / 'app.db'}", sqlite_timeout=0.2, max_retries=3)
    registry = SequenceRegistry(store, policy=POLICY)
    lock = registry.register(SequenceConfig("locked", batch_count=5))
    values = [lock.next() for _ in range(5)]
    holder = sqlite3.connect(store.url.database, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    outcome = call(lambda: lock.next_many(10)[-1], bound=CALL_BOUND)
    holder.execute("ROLLBACK")
    holder.close()
    assert not outcome.hung
    assert isinstance(outcome.error, StoreUnavailable), outcome.error
    assert "'locked'" in str(outcome.error)
    assert outcome.seconds < 0.2 * 3 + 2.0
    time.sleep(POLICY.retry_max)
    values += lock.next_many(20)
    assert len(set(values)) == len(values) == 25
    tally(
        record_property,
        "sqlite",
        "outage: writer lock",
        values=len(values),
        duplicates=0,
        seconds_to_error=round(outcome.seconds, 2),
    )
    registry.close()


def test_stalled_connection_gives_store_unavailable_within_timeout(
    network_target: Any, record_property: Any
) -> None:
    """A server that stops answering on an open connection: reserve fails in bounded time."""
    host, port = network_target.address
    with FaultProxy(port, host) as proxy:
        store = network_target.open(
            network_target.spec_via(proxy.port), **network_target.fail_fast()
        )
        store.create(SequenceConfig("stalled"))
        assert store.reserve("stalled", 5).first == 1
        proxy.stall()
        outcome = call(lambda: store.reserve("stalled", 5).first)
        proxy.heal()
        assert not outcome.hung, (
            f"reserve() on a stalled connection still blocked after {CALL_BOUND}s"
        )
        assert isinstance(outcome.error, StoreUnavailable), outcome.error
        assert "'stalled'" in str(outcome.error)
        healed = call(lambda: store.reserve("stalled", 5).first)
        assert healed.value is not None, healed.error
        assert healed.value > 5
        tally(
            record_property,
            network_target.id,
            "stall: reserve()",
            seconds_to_error=round(outcome.seconds, 2),
        )


def test_every_operation_on_a_cut_store_raises_store_unavailable(
    network_target: Any, record_property: Any
) -> None:
    """With the server unreachable, each store method raises StoreUnavailable, no driver error."""
    host, port = network_target.address
    with FaultProxy(port, host) as proxy:
        store = network_target.open(
            network_target.spec_via(proxy.port), **network_target.fail_fast()
        )
        row = store.create(SequenceConfig("cut"))
        block = store.reserve("cut", 5)
        proxy.cut()
        operations: dict[str, Callable[[], object]] = {
            "create": lambda: store.create(SequenceConfig("cut-2")),
            "read": lambda: store.read("cut"),
            "read_all": store.read_all,
            "update": lambda: store.update(row.replace(end=100)),
            "reserve": lambda: store.reserve("cut", 5),
            "release": lambda: store.release(block),
        }
        if hasattr(store, "create_table"):
            operations["create_table"] = store.create_table
        raised = {}
        for what, operation in operations.items():
            outcome = call(operation)  # type: ignore[arg-type]
            assert not outcome.hung, what
            raised[what] = type(outcome.error).__name__
            assert isinstance(outcome.error, StoreUnavailable), (what, outcome.error)
        proxy.heal()
        assert store.reserve("cut", 5).first == 6
        tally(record_property, network_target.id, "cut: every method", operations=len(raised))
