"""Snowflake ids on every store: worker leases, processes, SIGKILL, fork, outages, clocks."""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import threading
import time
import warnings
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autoseq.errors import (
    ClockMovedBackwards,
    InvalidSnowflakeConfig,
    LeaseLost,
    StoreUnavailable,
    WorkersExhausted,
)
from autoseq.snowflake import Snowflake
from autoseq.stores import MemoryStore
from autoseq.workers import WorkerLeases, worker_leases

from .conftest import TARGETS
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
        from autoseq.stores.sql.workers import SQLWorkers

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


class MemoryTarget:
    """The in-process store, shared by every ``open()`` as a server is by its clients."""

    kind = "memory"
    id = "memory"

    def __init__(self) -> None:
        self.store = MemoryStore()

    def open(self) -> Any:
        return self.store

    def cleanup(self) -> None:
        pass


@pytest.fixture(
    params=[*TARGETS, pytest.param(lambda request, tmp_path: MemoryTarget(), id="memory")]
)
def lease_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Every lease store, the in-process one included, its worker leases dropped afterwards."""
    made = request.param(request, tmp_path)
    yield made
    _drop_worker_table(made)
    made.cleanup()


def drop_leases(target: Any, name: str) -> None:
    """Drop the lease table (collection, hash) of ``name`` as a migration or an operator might."""
    store = target.open()
    if target.kind == "sql":
        from autoseq.stores.sql.workers import SQLWorkers

        SQLWorkers(store).drop_table()
    elif target.kind == "mongo":
        from autoseq.stores.mongo.workers import MongoWorkers

        MongoWorkers(store).collection.drop()
    else:
        from autoseq.stores.redis.workers import RedisWorkers

        store.client.delete(RedisWorkers(store).key(name))


class Clock:
    """The real clock plus an offset the test moves (seconds)."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset

    def __call__(self) -> float:
        return time.time() + self.offset


def generate(gen: Snowflake, seconds: float) -> tuple[list[int], int]:
    """Call ``next()`` for ``seconds``: the ids issued and how many calls raised LeaseLost."""
    ids: list[int] = []
    refused = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ids.append(gen.next())
        except LeaseLost:
            refused += 1
            time.sleep(0.001)
    return ids, refused


def generate_together(*gens: Snowflake, seconds: float) -> list[tuple[list[int], int]]:
    """``generate`` on each generator in a thread of its own, all at once."""
    results: list[tuple[list[int], int]] = [([], 0)] * len(gens)

    def run(index: int) -> None:
        results[index] = generate(gens[index], seconds)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(gens))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def issued_twice(*batches: list[int]) -> int:
    """How many ids appear in more than one batch."""
    return Check.of([v for batch in batches for v in set(batch)]).duplicates


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
    issued = tmp_path / "victim.t0"
    deadline = time.monotonic() + 10  # a fresh lease table issues after one lease_ttl
    while not issued.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)
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
        # past a fresh table's grace (its first lease outlasts it by lease_ttl) and a renewal
        time.sleep(1.5)
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


# one layout per name, a dropped table, clocks ahead, failed constructors --------


def test_a_name_keeps_the_layout_recorded_first(lease_store: Any, record_property: Any) -> None:
    """A generator whose bit widths or epoch differ from the name's recorded layout is refused."""
    # 9 worker bits + 13 sequence bits put worker 1 where 10 + 12 put workers 2 and 3
    first = [
        Snowflake(lease_store.open(), name="layout", lease_ttl=0.3, worker_bits=9, sequence_bits=13)
        for _ in range(2)
    ]
    accepted: list[Snowflake] = []
    refusals: list[str] = []
    for kwargs in ({}, {"worker_bits": 9, "sequence_bits": 13, "epoch": first[0].epoch_ms + 1}):
        try:
            accepted.append(Snowflake(lease_store.open(), name="layout", lease_ttl=0.3, **kwargs))
        except InvalidSnowflakeConfig as exc:
            refusals.append(str(exc))
    ids = generate_together(first[1], *accepted, seconds=0.5)
    twice = issued_twice(*(batch for batch, _ in ids))
    for gen in first + accepted:
        gen.close()
    tally(
        record_property,
        lease_store.id,
        "snowflake layouts",
        ids=sum(len(b) for b, _ in ids),
        accepted=len(accepted),
        twice=twice,
    )
    assert twice == 0
    assert accepted == []
    assert all("recorded with layout" in text for text in refusals)
    held = [r for r in worker_leases(lease_store.open()).list_workers("layout") if r.owner]
    assert held == []
    with Snowflake(
        lease_store.open(), name="layout", lease_ttl=0.3, worker_bits=9, sequence_bits=13
    ) as same:
        assert same.next() > 0


def test_two_layouts_starting_at_once_one_wins(lease_store: Any) -> None:
    """Two generators of one new name with different layouts, started together: one is refused."""
    for round_ in range(4):
        name = f"race-{round_}"
        start = threading.Barrier(2)
        outcome: list[object] = []

        def begin(
            worker_bits: int, name: str = name, start: Any = start, outcome: Any = outcome
        ) -> None:
            store = lease_store.open()
            start.wait()
            try:
                outcome.append(Snowflake(store, name=name, lease_ttl=0.3, worker_bits=worker_bits))
            except InvalidSnowflakeConfig as exc:
                outcome.append(exc)

        threads = [threading.Thread(target=begin, args=(bits,)) for bits in (8, 10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        made = [o for o in outcome if isinstance(o, Snowflake)]
        for gen in made:
            gen.close()
        assert len(made) == 1, outcome
        assert len(outcome) == 2


def test_a_dropped_lease_table_stops_its_holder_before_a_newcomer_issues(
    leased: Any, record_property: Any
) -> None:
    """Lease table dropped under a holder: a newcomer on the new table issues no id it issued."""
    holder = Snowflake(leased.open(), name="dropped", lease_ttl=1.5)
    before = [holder.next()]  # a fresh table issues after one lease_ttl
    results: list[tuple[list[int], int]] = []
    running = threading.Thread(target=lambda: results.append(generate(holder, 2.5)))
    running.start()
    confirmed = holder.lease
    while holder.lease is confirmed:  # just renewed: its next renewal is 0.5 s away
        time.sleep(0.001)
    drop_leases(leased, "dropped")
    newcomer = Snowflake(leased.open(), name="dropped", lease_ttl=1.5)
    fresh, _ = generate(newcomer, 2.3)
    running.join()
    ((held, refused),) = results
    holder.close()
    newcomer.close()
    twice = issued_twice(before + held, fresh)
    tally(
        record_property,
        leased.id,
        "snowflake dropped table",
        holder=len(held),
        newcomer=len(fresh),
        twice=twice,
        holder_refused=refused,
    )
    assert fresh
    assert held
    assert twice == 0
    assert refused > 0  # the holder was told: LeaseLost


def test_free_ids_not_ahead_of_the_clock_come_first(lease_store: Any, record_property: Any) -> None:
    """A worker id left by a clock a day ahead is passed over; alone, it is refused at once."""
    store = lease_store.open()
    ahead = Clock(86_400)
    with Snowflake(store, name="ahead", worker_bits=2, lease_ttl=0.3, clock=ahead) as far:
        far.next()
    started = time.monotonic()
    with Snowflake(
        store, name="ahead", worker_bits=2, lease_ttl=0.3, on_clock_backwards="fail"
    ) as a:
        a.next()
        passed_over = a.worker_id
    with Snowflake(store, name="ahead", worker_bits=2, lease_ttl=0.3) as b:
        b.next()
    waited = time.monotonic() - started
    with Snowflake(store, name="alone", worker_bits=0, lease_ttl=0.3, clock=ahead) as far_alone:
        far_alone.next()
    refused_at = time.monotonic()
    with pytest.raises(ClockMovedBackwards, match="max_wait=60s"):
        Snowflake(store, name="alone", worker_bits=0, lease_ttl=0.3)
    refused_after = time.monotonic() - refused_at
    tally(
        record_property,
        lease_store.id,
        "snowflake clock ahead",
        waited=round(waited, 2),
        refused_after=round(refused_after, 2),
    )
    assert passed_over != 0  # 0 was left by the clock a day ahead
    assert waited < 2.0
    assert refused_after < 2.0
    (row,) = worker_leases(store).list_workers("alone")
    assert row.owner is None  # the refused generator gave the id back


def test_a_failed_constructor_gives_its_lease_back(lease_store: Any) -> None:
    """Constructors refused on an argument or on -W error leave no lease or heartbeat behind."""
    store = lease_store.open()
    for _ in range(9):  # more than the 8 worker ids
        with pytest.raises(InvalidSnowflakeConfig, match="warn_years"):
            Snowflake(store, name="leak", worker_bits=3, lease_ttl=0.3, warn_years="10")  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(9):
            with pytest.raises(RuntimeWarning, match="years of timestamp bits left"):
                Snowflake(store, name="leak", worker_bits=3, lease_ttl=0.3, warn_years=10_000)
    beating = [t for t in threading.enumerate() if t.name == "autoseq-snowflake-leak"]
    held = [r for r in worker_leases(store).list_workers("leak") if r.owner is not None]
    assert beating == []
    assert held == []
    with Snowflake(store, name="leak", worker_bits=3, lease_ttl=0.3) as gen:
        assert gen.next() > 0


def test_a_forward_clock_step_renews_the_lease_at_once(
    lease_store: Any, record_property: Any
) -> None:
    """A clock stepped ten lease lengths forward: every call keeps getting ids, none LeaseLost."""
    clock = Clock()
    with Snowflake(lease_store.open(), name="step", lease_ttl=1.0, clock=clock) as gen:
        first = gen.next()
        clock.offset = 10.0
        ids, refused = generate(gen, 0.3)
    tally(record_property, lease_store.id, "snowflake clock step", ids=len(ids), refused=refused)
    assert refused == 0
    assert ids
    assert ids == sorted(set(ids))
    assert ids[0] > first


def test_a_lease_table_from_before_layouts_keeps_working(lease_store: Any) -> None:
    """Leases written without a layout row (older autoseq) are kept; the layout is added beside."""
    leases = worker_leases(lease_store.open())
    old = leases.acquire_worker("legacy", "old-process", 4, now_ms(), 60_000)
    assert old is not None
    with Snowflake(lease_store.open(), name="legacy", worker_bits=2, lease_ttl=0.3) as gen:
        values = gen.next_many(1000)
        assert gen.worker_id != old.worker
    assert values == sorted(set(values))
    rows = {r.worker: r for r in leases.list_workers("legacy")}
    assert rows[old.worker].owner == "old-process"
    with pytest.raises(InvalidSnowflakeConfig, match="recorded with layout"):
        Snowflake(lease_store.open(), name="legacy", worker_bits=3, lease_ttl=0.3)
