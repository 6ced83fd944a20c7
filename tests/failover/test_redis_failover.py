"""Redis: the primary is lost mid-traffic and its replica is promoted; no value is served twice."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from autoseq import BufferPolicy, SequenceConfig, SequenceLock
from autoseq.stores import RedisStore

from .servers import RedisPair
from .traffic import Client, run

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
