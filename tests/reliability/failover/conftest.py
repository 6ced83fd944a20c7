"""Fixtures building replicated servers for the failover trials, stopped at teardown.

A missing tool skips the trials with the reason, unless
``AUTOSEQ_REQUIRE_BACKENDS`` names the backend (``postgres``, ``redis``,
``redis-cluster``): then they fail. The machine's own servers (5432, 6379) are never touched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from backends import unavailable

from .servers import (
    LocalRedisCluster,
    PgBouncer,
    PostgresPair,
    RedisPair,
    cluster_missing,
    pg_missing,
    pgbouncer_missing,
    redis_missing,
)


@pytest.fixture
def postgres_pair() -> Iterator[Callable[..., PostgresPair]]:
    """Build a PostgreSQL primary + standby (``sync=True``: synchronous); stopped afterwards."""
    problem = pg_missing()
    if problem:
        unavailable("postgres", problem)
    pairs: list[PostgresPair] = []

    def build(*, sync: bool = False) -> PostgresPair:
        pair = PostgresPair(sync=sync)
        pairs.append(pair)
        return pair

    yield build
    for pair in pairs:
        pair.close()


@pytest.fixture
def redis_pair() -> Iterator[RedisPair]:
    """A Redis primary + replica behind a client address (``vip``); stopped afterwards."""
    problem = redis_missing()
    if problem:
        unavailable("redis", problem)
    pair = RedisPair()
    yield pair
    pair.close()


@pytest.fixture
def pgbouncer() -> Iterator[PgBouncer]:
    """A PgBouncer in transaction pooling mode before the local PostgreSQL; stopped afterwards."""
    problem = pgbouncer_missing()
    if problem:
        unavailable("pgbouncer", problem)
    from backends import POSTGRES_URL, sql_url
    from sqlalchemy.engine import make_url

    sql_url("postgres", "")  # skips (or fails) first when PostgreSQL itself is absent
    server = make_url(POSTGRES_URL)
    bouncer = PgBouncer(server.host or "127.0.0.1", server.port or 5432)
    yield bouncer
    bouncer.close()


def build_cluster(primaries: int = 3, replicas: int = 0) -> LocalRedisCluster:
    """A Redis Cluster on spare ports, or a skip (a failure when ``redis-cluster`` is required)."""
    problem = cluster_missing()
    if problem:
        unavailable("redis-cluster", problem)
    return LocalRedisCluster(primaries, replicas)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    """Three primaries shared by the tests that only read and write (none kills a node)."""
    cluster = build_cluster()
    yield cluster
    cluster.close()


@pytest.fixture
def own_redis_cluster() -> Iterator[Callable[..., LocalRedisCluster]]:
    """Build a cluster a test may break (kill a node); stopped afterwards."""
    built: list[LocalRedisCluster] = []

    def build(primaries: int = 3, replicas: int = 0) -> LocalRedisCluster:
        built.append(build_cluster(primaries, replicas))
        return built[-1]

    yield build
    for cluster in built:
        cluster.close()
