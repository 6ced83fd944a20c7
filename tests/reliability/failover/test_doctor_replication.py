"""doctor says, per store, whether a failover could repeat values today, and what fixes it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from backends import REDIS_URL, unique_table

from autoseq import doctor
from autoseq.stores import RedisStore, SQLStore

from .servers import PostgresPair, RedisPair


def replication(store: object) -> list[tuple[str, str]]:
    """The ``replication`` findings of a doctor run on ``store``."""
    report = doctor.examine(store)  # type: ignore[arg-type]
    return [(f.level, f.message) for f in report.findings if f.check == "replication"]


@pytest.mark.postgres
def test_async_standby_only_is_a_warning_naming_the_fix(
    postgres_pair: Callable[..., PostgresPair],
) -> None:
    """An async standby and no sync one: doctor warns and says to make one synchronous."""
    pair = postgres_pair()
    store = SQLStore(pair.url(), table=unique_table())
    try:
        (finding,) = replication(store)
    finally:
        store.close()
    assert finding[0] == "warning"
    assert "asynchronous standby" in finding[1]
    assert "synchronous_standby_names" in finding[1]


@pytest.mark.postgres
def test_async_standby_says_whether_a_failover_is_treated(
    postgres_pair: Callable[..., PostgresPair],
) -> None:
    """Async standby: doctor says the treatment's margin once the epoch record exists, else not."""
    pair = postgres_pair()
    bare = SQLStore(pair.url(), table=unique_table())
    made = SQLStore(pair.url(), table=unique_table())
    made.create_table()
    off = SQLStore(pair.url(), table=made.table_name, failover_skip_blocks=0)
    try:
        ((_, untreated),) = replication(bare)
        ((level, treated),) = replication(made)
        ((_, skipping_nothing),) = replication(off)
    finally:
        for store in (bare, made, off):
            store.close()
    assert "no epoch record" in untreated
    assert level == "warning"
    assert "is treated before the new primary serves" in treated
    assert "16 of its largest blocks" in treated
    assert "failover_skip_blocks=0" in skipping_nothing


@pytest.mark.postgres
def test_sync_standby_is_ok_and_server_off_is_an_error_when_kept(
    postgres_pair: Callable[..., PostgresPair],
) -> None:
    """Sync standby: ok; synchronous_commit=off kept by SQLStore(synchronous_commit=None): error."""
    pair = postgres_pair(sync=True)
    pair.primary.configure(synchronous_commit="off")
    default = SQLStore(pair.url(), table=unique_table())
    kept = SQLStore(pair.url(), table=unique_table(), synchronous_commit=None)
    try:
        assert [level for level, _ in replication(default)] == ["ok"]
        levels = [level for level, message in replication(kept) if "off" in message]
    finally:
        default.close()
        kept.close()
    assert levels == ["error"]


@pytest.mark.redis
def test_redis_replicas_not_waited_for_is_a_warning(redis_pair: RedisPair) -> None:
    """Replicas connected and RedisStore(replicas=0): doctor warns; the default waits: ok."""
    never = RedisStore(redis_pair.url(), replicas=0)
    default = RedisStore(redis_pair.url())
    try:
        (warned,) = replication(never)
        (fine,) = replication(default)
    finally:
        never.close()
        default.close()
    assert warned[0] == "warning"
    assert "replicas=0" in warned[1]
    assert fine == ("ok", "each reservation waits for 1 of 1 replica(s)")


@pytest.mark.redis
def test_lone_redis_has_no_replication_finding() -> None:
    """The machine's Redis without replicas: nothing to say about failover."""
    store = RedisStore(REDIS_URL, prefix=unique_table("doctor"))
    try:
        assert replication(store) == []
    finally:
        store.close()


@pytest.mark.redis
def test_redis_replica_dropped_off_is_a_warning(redis_pair: RedisPair) -> None:
    """The replica's link cut: doctor warns that reservations wait for it until it is back."""
    redis_pair.cut_replica()
    store = RedisStore(redis_pair.url())
    try:
        (finding,) = replication(store)
    finally:
        store.close()
    assert finding[0] == "warning"
    assert "replication backlog" in finding[1]
    assert "replicas=0" in finding[1]
