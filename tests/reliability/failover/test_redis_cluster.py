"""RedisStore on a real Redis Cluster (three primaries on spare ports): the whole contract,
sequences spread over the shards, processes, fork, snowflake leases, a lost node and a
shard's failover to its replica."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from backends import redis_requests, unique_table

from autoseq import BufferPolicy, SequenceConfig, SequenceLock, SequenceRegistry, StoreUnavailable
from autoseq.snowflake import Snowflake
from autoseq.stores import RedisStore
from autoseq.stores.base import reserve_many
from autoseq.testing.contract import MaintenanceContract, StoreContract
from autoseq.workers import worker_leases

from .servers import LocalRedisCluster
from .traffic import Client, run

pytestmark = pytest.mark.redis

POLICY = BufferPolicy(max_batch_count=100, retry_initial=0.01, retry_max=0.1, wait_timeout=5.0)


@pytest.fixture
def cluster_store(redis_cluster: LocalRedisCluster) -> Iterator[RedisStore]:
    """A RedisStore from a ``redis+cluster://`` URL under its own prefix; keys dropped after."""
    store = RedisStore(redis_cluster.url(), prefix=unique_table("cluster"))
    yield store
    store.drop()
    store.close()


@pytest.fixture
def client_store(redis_cluster: LocalRedisCluster) -> Iterator[RedisStore]:
    """A RedisStore on a caller's ``redis.cluster.RedisCluster`` client; keys dropped after."""
    client = redis_cluster.client()
    store = RedisStore(client, prefix=unique_table("cluster"))
    yield store
    store.drop()
    client.close()


class TestRedisClusterStore(StoreContract):
    @pytest.fixture
    def store(self, cluster_store: RedisStore) -> RedisStore:
        return cluster_store


class TestRedisClusterClientStore(StoreContract):
    @pytest.fixture
    def store(self, client_store: RedisStore) -> RedisStore:
        return client_store


class TestRedisClusterMaintenance(MaintenanceContract):
    @pytest.fixture
    def store(self, client_store: RedisStore) -> RedisStore:
        return client_store

    def corrupt(self, store: Any, name: str, **fields: Any) -> None:
        store.client.hset(store.key(name), mapping={k: str(v) for k, v in fields.items()})


def shards(cluster: LocalRedisCluster, prefix: str) -> dict[int, int]:
    """How many sequence rows of ``prefix`` each primary holds, read from each node itself."""
    return {
        port: sum(1 for _ in cluster.node(port).client.scan_iter(match=f"{{{prefix}:*}}:seq"))
        for port in cluster.primary_ports()
    }


def test_sequences_spread_over_the_shards(
    redis_cluster: LocalRedisCluster, cluster_store: RedisStore
) -> None:
    """100 sequences over three primaries: every shard holds some, none holds most."""
    for number in range(100):
        cluster_store.create(SequenceConfig(f"table_{number}"))
        cluster_store.reserve(f"table_{number}", 10)
    per_shard = shards(redis_cluster, cluster_store.prefix)
    print(f"rows per shard: {sorted(per_shard.values())}")
    assert sum(per_shard.values()) == 100
    assert len(per_shard) == 3
    assert min(per_shard.values()) >= 15, per_shard
    assert len(cluster_store.read_all()) == 100


def test_a_sequences_keys_share_one_slot(cluster_store: RedisStore) -> None:
    """Every key of one name (row, worker leases) carries one hash tag: one slot."""
    client = cluster_store.client
    for name in ("orders", "a:b", "{x}", "a b"):
        slots = {client.keyslot(cluster_store.key(name, kind)) for kind in ("seq", "worker")}
        assert len(slots) == 1, name


def take(store: RedisStore, names: list[str], each: int) -> list[int]:
    """``each`` values from every sequence in ``names`` through a lock (the serving path)."""
    values: list[int] = []
    for name in names:
        lock = SequenceLock(name, store, batch_count=50)
        while len(values) < each * (names.index(name) + 1):
            values += lock.next_many(37)
        lock.close(release=False)
    return values


def test_processes_never_share_a_value(cluster_store: RedisStore) -> None:
    """Four forked processes and their parent take from three sequences at once: none twice."""
    names = ["orders", "invoices", "payments"]
    for name in names:
        cluster_store.create(SequenceConfig(name, start=1 + names.index(name) * 10**9))
    cluster_store.reserve("orders", 1)  # connections open before the fork
    children: list[tuple[int, int]] = []
    for _ in range(4):
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            code = 1
            try:
                cluster_store.after_fork()
                os.write(writer, json.dumps(take(cluster_store, names, 2000)).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(writer)
        children.append((pid, reader))
    values = take(cluster_store, names, 2000)
    for pid, reader in children:
        data = b""
        while chunk := os.read(reader, 1 << 16):
            data += chunk
        os.close(reader)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "a child failed"
        values += json.loads(data)
    twice = sum(n - 1 for n in Counter(values).values() if n > 1)
    print(f"cluster processes: {len(values):,} values, {twice:,} handed out twice")
    assert len(values) >= 5 * 3 * 2000
    assert twice == 0


def test_warm_sends_one_pipeline_per_primary(
    redis_cluster: LocalRedisCluster, cluster_store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: warm() of 300 loaded sequences over three primaries sends the reserve
    scripts in pipelines per primary (one key a script: slots never meet), each followed
    by WAIT as reserve is; every first value then comes from memory and none repeats what
    another store reserves."""
    names = [f"w{i:03d}" for i in range(300)]
    SequenceRegistry(cluster_store).register_many([SequenceConfig(name) for name in names])
    probes: dict[int, str] = {}  # a sequence on each primary: reserving loads the script
    for name in (f"probe{number}" for number in range(20)):
        probes.setdefault(
            cluster_store.client.get_node_from_key(cluster_store.key(name)).port, name
        )
    assert sorted(probes) == sorted(redis_cluster.primary_ports())
    for name in probes.values():
        cluster_store.create(SequenceConfig(name))
        cluster_store.reserve(name, 1)
    store = RedisStore(redis_cluster.url(), prefix=cluster_store.prefix)
    registry = SequenceRegistry(store)
    registry.load()
    locks = [registry.get(name) for name in names]
    store.persistence()  # connects to each primary (a connection's handshake is not warm's)
    sent = redis_requests(monkeypatch)
    warmed = registry.warm(names)
    warm, sent[0] = sent[0], 0
    assert [lock.next() for lock in locks] == [1] * 300
    # per primary: INFO replication (once per store), the reservations
    assert (warmed, warm, sent[0]) == (300, 6, 0)
    assert {cluster_store.reserve(name, 1).first for name in names} == {101}
    registry.close_locks(release=False)
    store.close()


def test_reserve_many_with_a_primary_lost_serves_the_other_shards(
    own_redis_cluster: Callable[..., LocalRedisCluster],
) -> None:
    """A primary killed: reserve_many gives the rows of the other shards their blocks and
    None to the lost shard's (reserved alone, they say StoreUnavailable); asked only for the
    lost shard's rows, it raises StoreUnavailable."""
    cluster = own_redis_cluster()
    store = RedisStore(cluster.url(), prefix=unique_table("lost"), socket_timeout=0.5)
    try:
        names = [f"t{number}" for number in range(30)]
        for name in names:
            store.create(SequenceConfig(name))
        store.read_all()
        victim = cluster.primary_ports()[1]
        on_victim = [n for n in names if holder(cluster, store.key(n)) == victim]
        cluster.node(victim).kill()
        blocks = reserve_many(store, [(name, 10) for name in names])
        assert [block is None for block in blocks] == [name in on_victim for name in names]
        assert {block.first for block in blocks if block is not None} == {1}
        with pytest.raises(StoreUnavailable, match="redis"):
            reserve_many(store, [(name, 10) for name in on_victim])
    finally:
        store.close()


def test_after_fork_on_a_callers_cluster_client(client_store: RedisStore) -> None:
    """after_fork() on a store given a RedisCluster client makes a client of its own that works."""
    client_store.create(SequenceConfig("forked"))
    before = client_store.client
    client_store.after_fork()
    assert client_store.client is not before
    assert list(client_store.reserve("forked", 5).values()) == [1, 2, 3, 4, 5]
    client_store.close()  # its own client now
    assert before.ping()


def test_snowflake_leases_on_a_cluster(cluster_store: RedisStore) -> None:
    """Snowflake generators of two layouts lease worker ids on the cluster; ids never repeat."""
    generators = [Snowflake(cluster_store, name=name) for name in ("a", "a", "b")]
    try:
        assert [g.worker_id for g in generators] == [0, 1, 0]
        ids = [i for g in generators for i in g.next_many(500)]
        assert len(set(ids[:1000])) == 1000
        leases = worker_leases(cluster_store).list_workers()
        assert [(lease.name, lease.worker) for lease in leases] == [("a", 0), ("a", 1), ("b", 0)]
    finally:
        for generator in generators:
            generator.close()


def test_cli_lists_a_cluster_by_url(
    redis_cluster: LocalRedisCluster, cluster_store: RedisStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """``autoseq --url redis+cluster://... list`` reads the rows of every shard."""
    from autoseq.cli import main

    for name in ("orders", "invoices", "payments"):
        cluster_store.create(SequenceConfig(name))
    code = main(["--url", redis_cluster.url(), "--sequence-table", cluster_store.prefix, "list"])
    out = capsys.readouterr().out
    assert code == 0
    assert all(name in out for name in ("orders", "invoices", "payments"))


def test_doctor_checks_every_primary(cluster_store: RedisStore) -> None:
    """doctor's replication check reads each shard's primary (none has replicas here)."""
    from autoseq import doctor

    cluster_store.create(SequenceConfig("orders"))
    report = doctor.examine(cluster_store)  # type: ignore[arg-type]
    persistence = [f for f in report.findings if f.check == "redis_persistence"]
    assert [f.level for f in persistence] == ["error"]  # the nodes run appendonly no
    assert [f for f in report.findings if f.check == "replication"] == []


def test_a_lost_node_is_store_unavailable(
    own_redis_cluster: Callable[..., LocalRedisCluster],
) -> None:
    """A primary killed: its sequences fail with StoreUnavailable naming the cluster; the
    sequences of the other shards keep being served."""
    cluster = own_redis_cluster()
    store = RedisStore(cluster.url(), prefix=unique_table("lost"), socket_timeout=0.5)
    try:
        names = [f"t{number}" for number in range(30)]
        for name in names:
            store.create(SequenceConfig(name))
        victim = cluster.primary_ports()[1]
        on_victim = [n for n in names if holder(cluster, store.key(n)) == victim]
        elsewhere = [n for n in names if n not in on_victim]
        cluster.node(victim).kill()
        with pytest.raises(StoreUnavailable) as caught:
            store.reserve(on_victim[0], 10)
        assert "redis+cluster://" in str(caught.value)
        assert caught.value.name == on_victim[0]
        assert all(store.reserve(name, 10).first == 1 for name in elsewhere)
    finally:
        store.close()


def test_an_unreachable_cluster_is_store_unavailable() -> None:
    """A redis+cluster:// URL where nothing listens: StoreUnavailable at once, never a crash."""
    with pytest.raises(StoreUnavailable, match="redis"):
        RedisStore("redis+cluster://127.0.0.1:1", socket_connect_timeout=0.5)


def holder(cluster: LocalRedisCluster, key: str) -> int:
    """The port of the primary holding ``key``'s slot now."""
    client = cluster.client()
    try:
        return int(client.get_node_from_key(key).port)
    finally:
        client.close()


def test_a_shard_failover_never_repeats(
    own_redis_cluster: Callable[..., LocalRedisCluster],
) -> None:
    """Three primaries with a replica each; the primary holding the sequence is killed and
    its replica takes over: the processes go on from it and no value is handed out twice."""
    cluster = own_redis_cluster(3, 1)
    stores = [RedisStore(cluster.url(), socket_timeout=0.5) for _ in range(3)]
    try:
        stores[0].create(SequenceConfig("orders", batch_count=100))
        clients = [
            Client(SequenceLock("orders", store, batch_count=100, policy=POLICY))
            for store in stores
        ]
        key = stores[0].key("orders")
        victim = holder(cluster, key)

        def fail_over() -> None:
            cluster.node(victim).kill()
            deadline = time.monotonic() + 60
            while holder(cluster, key) == victim and time.monotonic() < deadline:
                time.sleep(0.1)  # the replica is promoted after cluster-node-timeout

        count = run(clients, lambda: None, fail_over)
        assert holder(cluster, key) != victim
    finally:
        for store in stores:
            store.close()
    assert count.after_failover > 0, count
    assert count.twice == 0, str(count)


def test_after_fork_with_the_cluster_gone_neither_waits_nor_fails(
    own_redis_cluster: Callable[..., LocalRedisCluster],
) -> None:
    """after_fork() (run for every store in a forked child) makes no connection: with the
    cluster gone it returns at once, and the next use says StoreUnavailable."""
    cluster = own_redis_cluster()
    store = RedisStore(cluster.url(), prefix=unique_table("gone"), socket_timeout=0.5)
    store.create(SequenceConfig("orders"))
    for node in cluster.nodes:
        node.kill()
    started = time.monotonic()
    store.after_fork()
    assert time.monotonic() - started < 0.5
    with pytest.raises(StoreUnavailable, match="redis"):
        store.reserve("orders", 10)
    store.close()
