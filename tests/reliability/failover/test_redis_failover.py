"""Redis: the primary is lost mid-traffic and its replica is promoted; no value or snowflake
id is served twice."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from autoseq import BufferPolicy, SequenceConfig, SequenceLock
from autoseq.snowflake import Snowflake
from autoseq.stores import RedisStore

from .servers import RedisPair
from .traffic import Client, Count, Traffic, run, shown

pytestmark = pytest.mark.redis

POLICY = BufferPolicy(max_batch_count=100, retry_initial=0.01, retry_max=0.1, wait_timeout=5.0)


@pytest.fixture
def clients(redis_pair: RedisPair) -> Iterator[list[Client]]:
    """Six clients (processes) through the pair's client address, each with its own store."""
    stores = [RedisStore(redis_pair.url(), socket_timeout=1.0) for _ in range(6)]
    stores[0].create(SequenceConfig("orders", batch_count=100))
    yield [
        Client(SequenceLock("orders", store, batch_count=100, policy=POLICY)) for store in stores
    ]
    for store in stores:
        store.close()


def test_replica_promoted_never_repeats(redis_pair: RedisPair, clients: list[Client]) -> None:
    """Primary lost, its lagging replica promoted: processes after it never repeat a value."""
    assert redis_pair.link is not None
    count = run(clients[:3], redis_pair.link.cut, redis_pair.fail_over, clients[3:])
    assert count.after_failover > 0, count
    assert count.twice == 0, str(count)


def test_replica_promoted_same_processes_never_repeat(
    redis_pair: RedisPair, clients: list[Client]
) -> None:
    """Primary lost, its lagging replica promoted: the processes that go on never repeat one."""
    assert redis_pair.link is not None
    count = run(clients[:3], redis_pair.link.cut, redis_pair.fail_over)
    assert count.after_failover > 0, count
    assert count.twice == 0, str(count)


@pytest.fixture
def min_replicas_pair(redis_pair: RedisPair) -> RedisPair:
    """The pair with ``min-replicas-to-write 1`` on the primary (lag allowed: 10 s)."""
    redis_pair.primary.client.config_set("min-replicas-to-write", 1)
    redis_pair.primary.client.config_set("min-replicas-max-lag", 10)
    redis_pair.wait_good_replica()
    return redis_pair


def test_min_replicas_to_write_promoted_never_repeats(
    min_replicas_pair: RedisPair, clients: list[Client]
) -> None:
    """With min-replicas-to-write (which still accepts writes a lagging replica lacks),
    the replica promoted: processes after it never repeat a value."""
    pair = min_replicas_pair
    assert pair.link is not None
    count = run(clients[:3], pair.link.cut, pair.fail_over, clients[3:])
    assert count.after_failover > 0, count
    assert count.twice == 0, str(count)


# snowflake worker leases ------------------------------------------------------

LEASE_TTL = 1.0


class Generator:
    """A process's snowflake generator, made on first use and made again until the store
    gives it a lease (as an application restarts a worker that failed to start)."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.made: Snowflake | None = None

    def next_many(self, n: int) -> list[int]:
        """``n`` ids, once a lease is held."""
        if self.made is None:
            self.made = Snowflake(self.store, name="ids", lease_ttl=LEASE_TTL)
        return self.made.next_many(n)

    def close(self) -> None:
        """Stop the heartbeat; the servers go with the pair."""
        if self.made is not None:
            self.made.close(timeout=1.0)


@pytest.fixture
def generators(redis_pair: RedisPair) -> Iterator[Callable[[], Client]]:
    """Make a client whose process generates snowflake ids through the pair's client address."""
    made: list[Generator] = []
    stores: list[RedisStore] = []

    def make() -> Client:
        stores.append(RedisStore(redis_pair.url(), socket_timeout=1.0))
        made.append(Generator(stores[-1]))
        return Client(made[-1])

    yield make
    for generator in made:
        generator.close()
    for store in stores:
        store.close()


def record_layout(store: RedisStore) -> None:
    """A generator of the layout comes and goes, and its first-use grace runs out: the
    layout is on both servers, as in an application that has run for a while."""
    with Snowflake(store, name="ids", lease_ttl=LEASE_TTL) as pioneer:
        pioneer.next_many(10)
    time.sleep(LEASE_TTL + 0.2)


def snowflake_trial(pair: RedisPair, make: Callable[[], Client], *, lease_after_cut: bool) -> Count:
    """Three generators lease worker ids (before the replica falls behind, or after); their
    leases run out on the replica; it is promoted and three more generators start beside
    them. Every id of all six is counted."""
    assert pair.link is not None
    if lease_after_cut:
        pair.link.cut()
    first = [make() for _ in range(3)]
    with Traffic(first) as old:
        old.run_until(0.3, (lambda: True) if lease_after_cut else old.all_moved_since([0, 0, 0]))
        pair.link.cut()
        old.run_until(LEASE_TTL + 1.0)  # the replica's copy of every lease has expired
        pair.fail_over()
        marks = old.marks()
        then = [make() for _ in range(3)]
        with Traffic(then) as new:
            new.run_until(LEASE_TTL, new.all_moved_since([0, 0, 0]))
    return shown(Count.of(first + then, [*marks, 0, 0, 0]))


@pytest.mark.parametrize("lease_after_cut", [False, True], ids=["renewed", "leased"])
def test_snowflake_leases_survive_a_failover(
    redis_pair: RedisPair, generators: Callable[[], Client], lease_after_cut: bool
) -> None:
    """Leases taken or renewed on a primary whose replica lags, then the replica promoted:
    a worker id is never held by two generators at once, so no id is issued twice."""
    store = RedisStore(redis_pair.url())
    try:
        record_layout(store)
    finally:
        store.close()
    count = snowflake_trial(redis_pair, generators, lease_after_cut=lease_after_cut)
    assert count.after_failover > 0, count
    assert count.twice == 0, str(count)


def test_a_forward_move_is_never_lost_in_a_failover_unannounced(redis_pair: RedisPair) -> None:
    """A row moved forward (`set`, `sync`, `change`) waits for the replica like a reservation.

    With the replica cut off, the move is written on the primary alone; it
    must not pass for done: the replica promoted next has the row as it was,
    and would hand out the values the move was there to skip. Before the
    write waited (`WAIT`), the move returned the new row and the promoted
    replica served from 11 again.
    """
    from autoseq.errors import StoreUnavailable

    store = RedisStore(redis_pair.url(), socket_timeout=1.0)
    try:
        store.create(SequenceConfig("orders", batch_count=10))
        store.reserve("orders", 10)
        redis_pair.cut_replica()
        row = store.read("orders")
        assert row is not None
        with pytest.raises(StoreUnavailable, match="acknowledged the write of current=1000"):
            store.compare_and_set(row.with_current(1_000), row.version)
        redis_pair.fail_over()
        promoted = store.read("orders")
        assert promoted is not None
        assert promoted.next_value == 11  # the move never reached it, as the error said
    finally:
        store.close()


def test_a_forward_move_reaches_the_replica_before_it_returns(redis_pair: RedisPair) -> None:
    """With the replica connected, a move acknowledged by it survives the failover at once."""
    store = RedisStore(redis_pair.url(), socket_timeout=1.0)
    try:
        store.create(SequenceConfig("orders", batch_count=10))
        store.reserve("orders", 10)
        row = store.read("orders")
        assert row is not None
        assert store.compare_and_set(row.with_current(1_000), row.version) is not None
        redis_pair.fail_over()  # at once: no time for an unwaited write to arrive later
        assert store.reserve("orders", 10).first == 1_000
    finally:
        store.close()


def test_warm_serves_no_block_the_replica_lacks(redis_pair: RedisPair) -> None:
    """The replica cut off: warm()'s reservations are written on the primary alone, WAIT
    says so, and warm raises StoreUnavailable with no lock holding a block; the replica
    promoted then has every row as it was, so nothing served could repeat."""
    from autoseq import SequenceRegistry, StoreUnavailable

    names = [f"s{i:03d}" for i in range(100)]
    store = RedisStore(redis_pair.url(), socket_timeout=1.0)
    promoted = RedisStore(redis_pair.url(), socket_timeout=1.0)
    try:
        SequenceRegistry(store).register_many([SequenceConfig(name) for name in names])
        registry = SequenceRegistry(store)
        registry.load()
        redis_pair.cut_replica()
        with pytest.raises(StoreUnavailable, match="0 of 1 Redis replica"):
            registry.warm()
        assert sum(registry.get(name).stats()["reservations"] for name in names) == 0
        assert {store.read(name).current for name in names} == {101}  # on the primary only
        redis_pair.fail_over()
        assert {promoted.reserve(name, 1).first for name in names} == {1}
    finally:
        store.close()
        promoted.close()


def test_warmed_blocks_survive_a_failover_at_once(redis_pair: RedisPair) -> None:
    """warm() of 200 sequences with the replica connected, then the primary lost and the
    replica promoted at once: every warmed block was acknowledged by the replica before it
    was served, so the promoted replica goes on above them and no value repeats."""
    from autoseq import SequenceRegistry

    names = [f"s{i:03d}" for i in range(200)]
    store = RedisStore(redis_pair.url(), socket_timeout=1.0)
    promoted = RedisStore(redis_pair.url(), socket_timeout=1.0)
    try:
        SequenceRegistry(store).register_many([SequenceConfig(name) for name in names])
        registry = SequenceRegistry(store)
        registry.load()
        assert registry.warm() == 200
        served = [registry.next(name) for name in names]
        redis_pair.fail_over()
        after = [promoted.reserve(name, 1).first for name in names]
        assert served == [1] * 200
        assert after == [101] * 200
        registry.close_locks(release=False)
    finally:
        store.close()
        promoted.close()
