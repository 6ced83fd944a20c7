"""Snowflake ids on every store: worker leases, processes, SIGKILL, fork, outages, clocks."""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autoseq.errors import ClockMovedBackwards, LeaseLost, StoreUnavailable, WorkersExhausted
from autoseq.snowflake import Snowflake
from autoseq.workers import WorkerLeases, worker_leases

from .faultproxy import FaultProxy
from .harness import HERE, Check, Worker, read_values, spawn, tally, value_files

WORKER = HERE / "snowflake_worker.py"


def start_together(jobs: list[dict[str, Any]], go: Path, timeout: float) -> list[Worker]:
    """Start a snowflake worker per job, release them at once, wait for them all."""
    workers = [spawn(job, WORKER) for job in jobs]
    deadline = time.monotonic() + timeout
    for worker in workers:
        if not worker.wait_for("ready", max(0.0, deadline - time.monotonic()), fresh=False):
            break
    go.touch()
    for worker in workers:
        try:
            worker.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.kill()
    return workers


def _drop_worker_table(target: Any) -> None:
    if target.kind == "sql":  # the others go with the target's own clean-up
        from autoseq.workers.sql import SQLWorkers

        SQLWorkers(target.open()).drop_table()


@pytest.fixture
def leased(target: Any) -> Iterator[Any]:
    """The target, its worker-lease table dropped afterwards (SQL servers are shared)."""
    yield target
    _drop_worker_table(target)


@pytest.fixture
def network_leased(network_target: Any) -> Iterator[Any]:
    """A target reached over TCP, its worker-lease table dropped afterwards."""
    yield network_target
    _drop_worker_table(network_target)


def ms_of(gen: Snowflake, value: int) -> int:
    return int(gen.decode(value).timestamp.timestamp() * 1000)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# the lease operations -------------------------------------------------------


def test_leases_are_compare_and_set(leased: Any) -> None:
    """Take, renew, release and take over follow the WorkerLeases contract on each store."""
    leases = worker_leases(leased.open())
    assert isinstance(leases, WorkerLeases)
    now = now_ms()
    a = leases.acquire_worker("layout", "a", 2, now, 1000)
    b = leases.acquire_worker("layout", "b", 2, now, 1000)
    assert a is not None
    assert b is not None
    assert (a.worker, b.worker, a.floor_ms, b.floor_ms) == (0, 1, 0, 0)
    assert leases.acquire_worker("layout", "c", 2, now, 1000) is None
    assert leases.acquire_worker("other", "c", 2, now, 1000) is not None

    renewed = leases.renew_worker(a, now + 500, 1000, now + 400)
    assert renewed is not None
    assert (renewed.expires_ms, renewed.last_ms) == (now + 1500, now + 400)
    # a renewal with an older clock never shortens the lease
    again = leases.renew_worker(renewed, now, 1000, now + 300)
    assert again is not None
    assert (again.expires_ms, again.last_ms) == (now + 1500, now + 400)

    # b expires unrenewed: c takes it over and must start above b's expiry
    c = leases.acquire_worker("layout", "c", 2, now + 1001, 1000)
    assert c is not None
    assert (c.worker, c.floor_ms) == (1, now + 1000)
    assert leases.renew_worker(b, now + 1002, 1000, now) is None
    assert not leases.release_worker(b, now)

    # a release leaves the last timestamp as the next owner's floor
    assert leases.release_worker(again, now + 450)
    d = leases.acquire_worker("layout", "d", 2, now + 600, 1000)
    assert d is not None
    assert (d.worker, d.floor_ms) == (0, now + 450)

    rows = {(r.name, r.worker): r for r in leases.list_workers()}
    assert {key: rows[key].owner for key in rows} == {
        ("layout", 0): "d",
        ("layout", 1): "c",
        ("other", 0): "c",
    }
    assert [r.worker for r in leases.list_workers("layout")] == [0, 1]


def test_racing_acquirers_get_distinct_workers(leased: Any) -> None:
    """Sixteen threads taking leases at once all get different worker ids."""
    import threading

    leases = worker_leases(leased.open())
    got: list[int] = []
    errors: list[BaseException] = []

    def take(index: int) -> None:
        try:
            lease = leases.acquire_worker("race", f"owner-{index}", 64, now_ms(), 5000)
            assert lease is not None
            got.append(lease.worker)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert sorted(got) == sorted(set(got))
    assert len(got) == 16


# generators -----------------------------------------------------------------


def test_processes_and_threads_never_duplicate(
    leased: Any, tmp_path: Path, record_property: Any
) -> None:
    """8 processes x 4 threads on a short lease: distinct worker ids, zero duplicate ids."""
    go = tmp_path / "go"
    jobs = [
        {
            "spec": leased.spec,
            "snowflake": {"name": "many", "lease_ttl": 1.0},
            "threads": 4,
            "count": 2000,
            "go": str(go),
            "out": str(tmp_path / f"p{i}"),
        }
        for i in range(8)
    ]
    workers = start_together(jobs, go, timeout=120)
    for worker in workers:
        assert worker.process.returncode == 0, worker.stderr()
    files = read_values(value_files(tmp_path))
    values = [v for vs in files.values() for v in vs]
    check = Check.of(values)
    tally(record_property, leased.id, "snowflake 8x4", ids=check.values, dups=check.duplicates)
    assert check.values == 8 * 4 * 2000
    assert check.duplicates == 0, check.repeated(values)
    # a worker id used by two processes (one released it, the other took it
    # after) covers two disjoint stretches of time
    spans: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for process in range(8):
        mine = [v for name, vs in files.items() if name.startswith(f"p{process}.") for v in vs]
        (worker,) = {(v >> 12) & 1023 for v in mine}
        spans[worker].append((min(mine) >> 22, max(mine) >> 22))
    for owned in spans.values():
        owned.sort()
        assert all(b[0] > a[1] for a, b in itertools.pairwise(owned)), owned


def test_sigkill_then_takeover_issues_above_the_dead_owner(
    leased: Any, tmp_path: Path, record_property: Any
) -> None:
    """A holder SIGKILLed mid-generation: after expiry a lagging new owner still issues above it."""
    victim = spawn(
        {
            "spec": leased.spec,
            "snowflake": {"name": "kill", "lease_ttl": 1.0, "worker_bits": 0},
            "threads": 1,
            "count": None,
            "out": str(tmp_path / "victim"),
        },
        WORKER,
    )
    assert victim.wait_for("generating", 30, fresh=False), victim.stderr()
    time.sleep(0.3)
    victim.kill()
    killed_at = time.monotonic()
    dead = [int(x) for x in (tmp_path / "victim.t0").read_text().split()]
    assert dead
    store = leased.open()

    def lagging() -> float:
        # the new owner's machine runs a second behind: only the lease's
        # recorded timestamps keep it above the dead owner's ids
        return time.time() - 1.0

    while True:
        try:
            gen = Snowflake(store, name="kill", lease_ttl=1.0, worker_bits=0, clock=lagging)
            break
        except WorkersExhausted:
            assert time.monotonic() - killed_at < 10
            time.sleep(0.05)
    waited = time.monotonic() - killed_at
    with gen:
        fresh = gen.next_many(5000)
    tally(record_property, leased.id, "snowflake takeover", dead_ids=len(dead), waited=waited)
    assert min(fresh) > max(dead)
    assert ms_of(gen, min(fresh)) > ms_of(gen, max(dead))
    assert waited > 0.2  # the lease outlived its holder: nobody took it at once


def test_fork_child_leases_its_own_worker(leased: Any, tmp_path: Path) -> None:
    """After fork() the child takes its own worker id; parent and child never share an id."""
    gen = Snowflake(leased.open(), name="fork", lease_ttl=2.0)
    before = gen.next_many(100)
    out = tmp_path / "child"
    pid = os.fork()
    if pid == 0:
        try:
            ids = gen.next_many(3000)
            out.write_text(f"{gen.worker_id}\n" + "\n".join(map(str, ids)))
            gen.close()
        finally:
            os._exit(0)
    parent_ids = gen.next_many(3000)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    lines = out.read_text().split()
    child_worker, child_ids = int(lines[0]), [int(x) for x in lines[1:]]
    assert child_worker != gen.worker_id
    assert {gen.decode(v).worker for v in child_ids} == {child_worker}
    assert child_ids == sorted(child_ids)
    every = before + parent_ids + child_ids
    assert len(set(every)) == len(every)
    gen.close()


def test_generators_never_share_a_worker_id(
    leased: Any, tmp_path: Path, record_property: Any
) -> None:
    """Processes churning through 2 worker ids (close or abandon) never overlap on one."""
    go = tmp_path / "go"
    jobs = [
        {
            "spec": leased.spec,
            "snowflake": {"name": "churn", "lease_ttl": 0.4, "worker_bits": 1},
            "churn": 3.0,
            "go": str(go),
            "out": str(tmp_path / f"c{i}"),
        }
        for i in range(4)
    ]
    workers = start_together(jobs, go, timeout=120)
    for worker in workers:
        assert worker.process.returncode == 0, worker.stderr()
    spans: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    values: list[int] = []
    for path in tmp_path.glob("*.rounds"):
        for line in path.read_text().splitlines():
            worker_text, owner, *ids = line.split()
            if not ids:
                continue
            stamps = [int(x) >> 13 for x in ids]  # 1 worker bit + 12 sequence bits
            spans[int(worker_text)].append((min(stamps), max(stamps), owner))
            values += map(int, ids)
    rounds = sum(len(s) for s in spans.values())
    overlaps = 0
    for owned in spans.values():
        owned.sort()
        overlaps += sum(1 for a, b in itertools.pairwise(owned) if b[0] <= a[1])
    check = Check.of(values)
    tally(
        record_property,
        leased.id,
        "snowflake churn",
        rounds=rounds,
        overlaps=overlaps,
        dups=check.duplicates,
    )
    assert rounds >= 8
    assert overlaps == 0, spans
    assert check.duplicates == 0


def test_clock_behind_at_restart(leased: Any) -> None:
    """A restart whose clock is behind the worker's last timestamp refuses ('fail') or waits."""
    store = leased.open()

    def ahead() -> float:
        return time.time() + 0.4

    with Snowflake(store, name="restart", worker_bits=0, clock=ahead) as first:
        last = first.next()
    with pytest.raises(ClockMovedBackwards, match="ms behind"):
        Snowflake(store, name="restart", worker_bits=0, on_clock_backwards="fail")
    with Snowflake(store, name="restart", worker_bits=0) as second:
        value = second.next()
    assert value > last


def test_renewal_failure_stops_generation_before_expiry(
    network_leased: Any, tmp_path: Path, record_property: Any
) -> None:
    """With the store unreachable, ids stop before the lease expires and resume after healing."""
    target = network_leased
    assert target.address is not None
    with FaultProxy(target.address[1], target.address[0]) as proxy:
        store = target.open(target.spec_via(proxy.port), **target.fail_fast())
        gen = Snowflake(store, name="outage", lease_ttl=1.0)
        issued = [gen.next()]
        proxy.stall()
        stalled_at = time.monotonic()
        error: LeaseLost | None = None
        while time.monotonic() - stalled_at < 5:
            try:
                issued.append(gen.next())
            except LeaseLost as exc:
                error = exc
                break
            time.sleep(0.002)
        stopped_after = time.monotonic() - stalled_at
        assert error is not None, "generation went on with the store unreachable"
        proxy.heal()
        rows = {r.worker: r for r in worker_leases(target.open()).list_workers("outage")}
        assert rows[gen.decode(issued[0]).worker].expires_ms > ms_of(gen, max(issued))
        resumed = None
        deadline = time.monotonic() + 10
        while resumed is None and time.monotonic() < deadline:
            try:
                resumed = gen.next()
            except LeaseLost:
                time.sleep(0.05)
        with contextlib.suppress(StoreUnavailable):
            gen.close()
    tally(record_property, target.id, "snowflake outage", stopped_after=round(stopped_after, 2))
    assert stopped_after < 1.5
    assert resumed is not None
    assert resumed > max(issued)
