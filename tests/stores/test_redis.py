"""The store contract on RedisStore, plus what only Redis has: keys, Lua arithmetic, fork."""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from backends import REDIS_URL, redis_requests, unavailable, unique_table
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autoseq import (
    MAX_VALUE,
    InvalidSequenceConfig,
    SequenceConfig,
    SequenceExhausted,
    SequenceNotFound,
    SequenceRegistry,
    StoreUnavailable,
)
from autoseq.stores import Block, MemoryStore, RedisStore
from autoseq.stores.base import release_many, reserve_many
from autoseq.stores.capabilities import ReservesMany
from autoseq.testing.contract import MaintenanceContract, StoreContract

pytestmark = pytest.mark.redis
MIN_VALUE = -MAX_VALUE - 1


@functools.cache
def _redis_problem() -> str | None:
    try:
        client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2, socket_timeout=2)
        client.ping()
        client.close()
    except redis.RedisError as exc:
        return f"cannot reach {REDIS_URL}: {type(exc).__name__}: {exc}"
    return None


def _make_store(**kwargs: Any) -> RedisStore:
    problem = _redis_problem()
    if problem:
        unavailable("redis", problem)
    return RedisStore(REDIS_URL, prefix=unique_table("autoseq_test"), **kwargs)


@pytest.fixture
def redis_store() -> Iterator[RedisStore]:
    """A RedisStore under a key prefix no other test uses, its keys deleted afterwards."""
    store = _make_store()
    yield store
    store.drop()
    store.close()


class TestRedisStore(StoreContract):
    @pytest.fixture
    def store(self, redis_store: RedisStore) -> RedisStore:
        return redis_store

    @pytest.fixture
    def unavailable_store(self) -> Iterator[RedisStore]:
        store = RedisStore("redis://127.0.0.1:1/0", prefix=unique_table("autoseq_test"))
        yield store
        store.close()


class TestRedisMaintenance(MaintenanceContract):
    @pytest.fixture
    def store(self, redis_store: RedisStore) -> RedisStore:
        return redis_store

    def corrupt(self, store: Any, name: str, **fields: Any) -> None:
        store.client.hset(store.key(name), mapping={k: str(v) for k, v in fields.items()})


def test_a_hash_without_version_reads_as_zero_and_is_upgraded(redis_store: RedisStore) -> None:
    """A hash written before versions existed reads as version 0; a reservation adds it."""
    redis_store.create(SequenceConfig("old"))
    redis_store.client.hdel(redis_store.key("old"), "version")
    row = redis_store.read("old")
    assert row is not None
    assert row.version == 0
    block = redis_store.reserve("old", 10)
    assert block.version == 1
    assert redis_store.client.hget(redis_store.key("old"), "version") == b"1"
    assert redis_store.release(block) is True
    assert redis_store.compare_and_set(row.replace(current=500), 0) is None


def _peer(store: RedisStore, **kwargs: Any) -> RedisStore:
    """A second store on the same keys: another process's view."""
    return RedisStore(REDIS_URL, prefix=store.prefix, **kwargs)


# Lua arithmetic = plan_reservation --------------------------------------------


@st.composite
def rows_and_counts(draw: st.DrawFn) -> tuple[SequenceConfig, list[int]]:
    """A valid stored row (exhausted ones included) and the counts to reserve from it."""
    step = draw(st.one_of(st.integers(1, 10), st.integers(1, MAX_VALUE)))
    edge = st.sampled_from([MIN_VALUE, MIN_VALUE + 1, -1, 0, 1, MAX_VALUE - step])
    start = draw(st.one_of(edge, st.integers(MIN_VALUE, MAX_VALUE - step)))
    start = min(start, MAX_VALUE - step)
    end = draw(st.one_of(st.just(MAX_VALUE), st.integers(start, MAX_VALUE)))
    row = SequenceConfig(
        "eq", start=start, end=end, step=step, cycle=draw(st.booleans()), batch_count=7
    )
    taken = draw(st.integers(0, (row.last_value - start) // step + 1))
    row = row.with_current(start + taken * step)
    counts = draw(
        st.lists(st.one_of(st.integers(1, 5), st.integers(1, MAX_VALUE)), min_size=1, max_size=4)
    )
    return row, counts


_names = itertools.count()


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(case=rows_and_counts())
@example(case=(SequenceConfig("eq", start=MIN_VALUE, end=MAX_VALUE), [MAX_VALUE, MAX_VALUE, 1]))
@example(case=(SequenceConfig("eq", start=MIN_VALUE, end=-1, step=MAX_VALUE), [1, 1, 1]))
@example(case=(SequenceConfig("eq", start=MAX_VALUE - 1, cycle=True), [1, 1, 3]))
@example(case=(SequenceConfig("eq", start=-999_999_999, end=1_000_000_001), [10**9, 5]))
@example(case=(SequenceConfig("eq", start=1_000_000_001, step=3), [333_333_334, 1]))
def test_blocks_equal_plan_reservation(
    redis_store: RedisStore, case: tuple[SequenceConfig, list[int]]
) -> None:
    """For any row and counts, the Lua script reserves exactly what plan_reservation plans."""
    template, counts = case
    name = f"eq-{next(_names)}"
    row = SequenceConfig.from_row({**template.as_row(), "name": name, "updated_at": None})
    memory = MemoryStore()
    memory.create(row)
    redis_store.create(row)
    for count in counts:
        outcomes = []
        for store in (memory, redis_store):
            try:
                outcomes.append(store.reserve(name, count))
            except SequenceExhausted as exc:
                outcomes.append((exc.name, exc.current, exc.end))  # type: ignore[arg-type]
        assert outcomes[1] == outcomes[0]
    assert redis_store.read(name) == memory.read(name)


def test_values_past_two_to_the_53_are_exact(redis_store: RedisStore) -> None:
    """Values a double cannot hold (2**53 + 1 and up) come back exactly."""
    redis_store.create(SequenceConfig("wide", start=2**53 + 1, step=2))
    block = redis_store.reserve("wide", 3)
    assert list(block.values()) == [2**53 + 1, 2**53 + 3, 2**53 + 5]
    assert redis_store.client.hget(redis_store.key("wide"), "current") == b"9007199254740999"


# keys ---------------------------------------------------------------------------

TRICKY_NAMES = ["a", "a:b", "a%3Ab", "a*", "*", "{a}", "{x}:seq:a", "a b", "names", "seq:a", "?[]"]


def test_names_never_share_a_key(redis_store: RedisStore) -> None:
    """Names with ':', '*', '{', '%' or spaces each get their own row, apart from the index."""
    for offset, name in enumerate(TRICKY_NAMES):
        redis_store.create(SequenceConfig(name, start=1000 * (offset + 1)))
    keys = {redis_store.key(name) for name in TRICKY_NAMES}
    assert len(keys) == len(TRICKY_NAMES)
    assert redis_store.index_key not in keys
    for offset, name in enumerate(TRICKY_NAMES):
        assert redis_store.reserve(name, 1).first == 1000 * (offset + 1)
    assert [row.name for row in redis_store.read_all()] == sorted(TRICKY_NAMES)
    assert all(key.startswith(f"{{{redis_store.prefix}:") for key in keys)
    assert all(key.endswith("}:seq") and key.count("}") == 1 for key in keys)


def test_prefixes_keep_stores_apart(redis_store: RedisStore) -> None:
    """Two prefixes on one server see only their own rows."""
    other = _make_store()
    try:
        redis_store.create(SequenceConfig("orders", start=5))
        other.create(SequenceConfig("orders", start=900))
        assert redis_store.reserve("orders", 1).first == 5
        assert other.reserve("orders", 1).first == 900
        assert [row.name for row in other.read_all()] == ["orders"]
    finally:
        other.drop()
        other.close()


@pytest.mark.parametrize("bad", ["", "a:b", "{x}", "has space", "x" * 101, 7])
def test_bad_prefix_is_refused(bad: object) -> None:
    """A prefix that could run into another store's keys gets InvalidSequenceConfig."""
    with pytest.raises(InvalidSequenceConfig, match="prefix"):
        RedisStore(REDIS_URL, prefix=bad)  # type: ignore[arg-type]


def test_bad_client_is_refused() -> None:
    """Anything but a redis.Redis or a URL gets InvalidSequenceConfig saying what is needed."""
    with pytest.raises(InvalidSequenceConfig, match=r"redis\.Redis"):
        RedisStore(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidSequenceConfig, match="redis://"):
        RedisStore("http://127.0.0.1:6379/0")


# rows written by others -------------------------------------------------------


def test_warm_reservation_is_one_round_trip(redis_store: RedisStore) -> None:
    """Once the row's settings are known, each reservation is one round trip: EVALSHA, INFO."""
    sent: list[list[str]] = []

    class CountingPipeline(redis.client.Pipeline):  # type: ignore[misc]
        def execute(self, *args: Any, **options: Any) -> Any:
            sent.append([str(command[0][0]) for command in self.command_stack])
            return super().execute(*args, **options)

    class CountingRedis(redis.Redis):  # type: ignore[misc]
        def execute_command(self, *args: Any, **options: Any) -> Any:
            sent.append([str(args[0])])
            return super().execute_command(*args, **options)

        def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
            return CountingPipeline(
                self.connection_pool, self.response_callbacks, transaction, None
            )

    client = CountingRedis.from_url(REDIS_URL)
    store = RedisStore(client, prefix=redis_store.prefix)
    store.create(SequenceConfig("orders"))
    store.reserve("orders", 100)  # learns the row's settings
    sent.clear()
    for _ in range(10):
        store.reserve("orders", 100)
    # The machine's Redis has no replicas: nothing to WAIT for.
    assert sent == [["EVALSHA", "INFO"]] * 10
    assert store.read("orders").current == 1101
    client.close()


def test_racing_creators_agree_on_one_row(redis_store: RedisStore) -> None:
    """Eight stores creating one name at once with different starts all get the same row."""
    stores = [_peer(redis_store) for _ in range(8)]
    barrier = threading.Barrier(len(stores))
    rows: list[SequenceConfig] = []

    def create(offset: int) -> None:
        barrier.wait()
        rows.append(stores[offset].create(SequenceConfig("race", start=100 * offset)))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(rows) == 8
    assert all(row == rows[0] for row in rows)
    assert redis_store.read("race") == rows[0]
    for store in stores:
        store.close()


def test_settings_changed_elsewhere_are_honoured(redis_store: RedisStore) -> None:
    """A store whose remembered settings predate another store's update() follows the new ones."""
    admin = _peer(redis_store)
    row = redis_store.create(SequenceConfig("capped"))
    redis_store.reserve("capped", 10)
    admin.update(row.replace(current=11, end=15))
    assert list(redis_store.reserve("capped", 100).values()) == [11, 12, 13, 14, 15]
    admin.update(SequenceConfig("capped", current=16, end=100, step=2, start=2))
    assert list(redis_store.reserve("capped", 3).values()) == [16, 18, 20]
    admin.close()


def test_exhausted_row_raised_elsewhere_serves_again(redis_store: RedisStore) -> None:
    """An exhausted sequence whose end another store raised serves the new range."""
    admin = _peer(redis_store)
    redis_store.create(SequenceConfig("grow", end=5))
    redis_store.reserve("grow", 10)
    with pytest.raises(SequenceExhausted):
        redis_store.reserve("grow", 1)
    admin.update(SequenceConfig("grow", end=100, current=admin.read("grow").current))
    assert redis_store.reserve("grow", 2).first == 6
    admin.close()


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("current", b"abc", "current"),
        ("current", b"0", "current"),  # below start=1
        ("current", b"4", "current"),  # not start + k * step
        ("step", b"1.5", "step"),
        ("cycle", b"yes", "cycle"),
    ],
)
def test_rows_edited_by_hand_are_refused(
    redis_store: RedisStore, field: str, value: bytes, says: str
) -> None:
    """A hand-edited impossible row raises InvalidSequenceConfig naming it, never serves."""
    redis_store.create(SequenceConfig("edited", step=2))
    redis_store.reserve("edited", 1)
    redis_store.client.hset(redis_store.key("edited"), field, value)
    with pytest.raises(InvalidSequenceConfig, match=f"'edited'.*{says}"):
        redis_store.reserve("edited", 5)
    with pytest.raises(InvalidSequenceConfig):
        _peer(redis_store).read("edited")


@pytest.mark.parametrize(
    ("start", "step", "k", "off"),
    [
        (1, 2, 3, 1),
        (-(2**62), 2**61 + 7, 2, 1),  # a remainder past 2**53
        (5, 999_999_999_989, 9_000, 999_999_999_988),  # ten times the remainder > 2**53
        (0, 2**62 + 1, 0, 2**62),  # one below the next grid value
    ],
)
def test_current_off_the_step_grid_is_refused_before_anything_is_written(
    redis_store: RedisStore, start: int, step: int, k: int, off: int
) -> None:
    """A warm store's script refuses current = start + k * step + off unwritten; k * step serves."""
    redis_store.create(SequenceConfig("grid", start=start, step=step))
    redis_store.reserve("grid", 1)  # the plan is cached: the script alone must catch the edit
    key = redis_store.key("grid")
    on_grid = start + k * step
    redis_store.client.hset(key, "current", str(on_grid + off))
    with pytest.raises(InvalidSequenceConfig, match=r"'grid'.*current"):
        redis_store.reserve("grid", 1)
    assert redis_store.client.hget(key, "current") == str(on_grid + off).encode()
    redis_store.client.hset(key, "current", str(on_grid))
    assert redis_store.reserve("grid", 1).first == on_grid


def test_batch_count_edited_to_zero_is_refused_before_anything_is_written(
    redis_store: RedisStore,
) -> None:
    """A warm store (its plan cached) still refuses a row whose batch_count became 0."""
    redis_store.create(SequenceConfig("warm"))
    redis_store.reserve("warm", 5)
    key = redis_store.key("warm")
    redis_store.client.hset(key, "batch_count", "0")
    with pytest.raises(InvalidSequenceConfig, match=r"'warm'.*batch_count"):
        redis_store.reserve("warm", 5)
    assert redis_store.client.hget(key, "current") == b"6"


def test_decoding_client_is_accepted(redis_store: RedisStore) -> None:
    """A caller's client with decode_responses=True works like any other."""
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    store = RedisStore(client, prefix=redis_store.prefix)
    store.create(SequenceConfig("text"))
    assert list(store.reserve("text", 3).values()) == [1, 2, 3]
    assert [row.name for row in store.read_all()] == ["text"]
    [block] = reserve_many(store, [("text", 3)])
    assert block is not None
    assert list(block.values()) == [4, 5, 6]
    store.close()
    assert client.ping()  # the caller's client stays open
    client.close()


# lost data ------------------------------------------------------------------------


def test_row_lost_under_a_running_store_is_reported(redis_store: RedisStore) -> None:
    """A row that vanished (Redis restarted empty) raises SequenceNotFound saying where it was."""
    redis_store.create(SequenceConfig("lost"))
    redis_store.reserve("lost", 500)
    redis_store.client.delete(redis_store.key("lost"))
    with pytest.raises(SequenceNotFound, match="current was 501"):
        redis_store.reserve("lost", 1)
    assert redis_store.create(SequenceConfig("lost")).current == 501


def test_floor_lifts_a_recreated_row(redis_store: RedisStore) -> None:
    """With floor=, a row created after data loss starts at the floor (aligned to step)."""
    asked: list[str] = []

    def floor(name: str) -> int | None:
        asked.append(name)
        return 1234 if name == "orders" else None

    store = _peer(redis_store, floor=floor)
    assert store.create(SequenceConfig("orders", start=10, step=10)).current == 1240
    assert store.create(SequenceConfig("other", start=10)).current == 10
    assert store.create(SequenceConfig("orders", start=10, step=10)).current == 1240
    assert asked == ["orders", "other"]  # not asked again once the row exists
    assert store.create(SequenceConfig("near-end", end=100)).current == 1
    asked.clear()
    far = _peer(redis_store, floor=lambda name: 10**6)
    assert far.create(SequenceConfig("tiny", end=100)).current == 101  # exhausted, not wrapped
    with pytest.raises(SequenceExhausted):
        far.reserve("tiny", 1)
    store.close()
    far.close()


class PrivateRedis:
    """A redis-server of this test's own, which it may kill -9 and start again."""

    def __init__(self, directory: Path, *, appendonly: bool, policy: str = "noeviction") -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            unavailable("redis", "no redis-server binary to start a private server")
        self.port = _closed_port()
        self.command = [
            binary,
            *("--port", str(self.port), "--bind", "127.0.0.1", "--save", ""),
            *("--dir", str(directory), "--appendfsync", "always"),
            *("--appendonly", "yes" if appendonly else "no", "--maxmemory-policy", policy),
        ]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.close()

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()


@pytest.mark.parametrize("appendonly", [True, False], ids=["aof-always", "no-persistence"])
def test_reservations_survive_kill_only_with_aof_always(tmp_path: Path, appendonly: bool) -> None:
    """After kill -9, AOF with fsync always keeps every block; without it, no value repeats."""
    server = PrivateRedis(tmp_path, appendonly=appendonly)
    server.start()
    store = RedisStore(server.url)
    try:
        store.create(SequenceConfig("orders"))
        assert store.reserve("orders", 1000).last == 1000
        server.kill()
        server.start()
        if appendonly:
            assert store.reserve("orders", 1).first == 1001
        else:
            with pytest.raises(SequenceNotFound, match="current was 1001"):
                store.reserve("orders", 1)
            assert store.create(SequenceConfig("orders")).current == 1001
    finally:
        store.close()
        server.kill()


@pytest.mark.parametrize(
    ("appendonly", "policy", "warned"),
    [
        (True, "noeviction", []),
        (False, "noeviction", ["appendfsync"]),
        (True, "allkeys-lru", ["evict"]),
    ],
)
def test_unsafe_server_settings_are_warned_about_once(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    appendonly: bool,
    policy: str,
    warned: list[str],
) -> None:
    """Creating rows on a Redis that can lose or evict them logs why, once per store."""
    server = PrivateRedis(tmp_path, appendonly=appendonly, policy=policy)
    server.start()
    store = RedisStore(server.url)
    try:
        with caplog.at_level(logging.WARNING, logger="autoseq"):
            store.create(SequenceConfig("a"))
            store.create(SequenceConfig("b"))
    finally:
        store.close()
        server.kill()
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == len(warned)
    for word, message in zip(warned, messages, strict=True):
        assert word in message
        assert "docs/redis.md" in message


# outages --------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_outage_fails_fast_as_store_unavailable() -> None:
    """An unreachable server raises StoreUnavailable naming the sequence, cause chained, fast."""
    store = RedisStore(f"redis://127.0.0.1:{_closed_port()}/0")
    started = time.monotonic()
    for operation, call in (
        ("reserve", lambda: store.reserve("orders", 10)),
        ("create", lambda: store.create(SequenceConfig("orders"))),
        ("read", lambda: store.read("orders")),
    ):
        with pytest.raises(StoreUnavailable, match="'orders'") as caught:
            call()
        assert caught.value.name == "orders"
        assert isinstance(caught.value.__cause__, redis.ConnectionError)
        assert caught.value.operation == operation
        assert caught.value.reason is not None
        assert caught.value.reason.startswith("ConnectionError: ")
        assert caught.value.reason in str(caught.value)
    with pytest.raises(StoreUnavailable, match=r"redis://127\.0\.0\.1"):
        store.read_all()
    assert time.monotonic() - started < 5
    store.close()


# processes ------------------------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("given_as", ["url", "client"])
def test_forked_child_uses_its_own_connections(redis_store: RedisStore, given_as: str) -> None:
    """After fork the child reserves on a fresh pool; the parent's connection keeps working."""
    client = redis.Redis.from_url(REDIS_URL)
    store = RedisStore(REDIS_URL if given_as == "url" else client, prefix=redis_store.prefix)
    store.create(SequenceConfig("forked"))
    parent_pool = store.client.connection_pool
    assert store.reserve("forked", 10).last == 10
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            block = store.reserve("forked", 10)
            own = store.client.connection_pool is not parent_pool
            os.write(write_end, f"{block.first} {block.last} {own}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    first, last, own = os.read(read_end, 100).decode().split()
    os.close(read_end)
    assert (status, own, int(first), int(last)) == (0, "True", 11, 20)
    assert store.reserve("forked", 1).first == 21
    store.close()
    client.close()


WORKER = textwrap.dedent(
    """
    import json, sys, threading
    from autoseq import SequenceConfig, SequenceRegistry
    from autoseq.stores import RedisStore

    url, prefix, name, batch, per_thread = sys.argv[1:6]
    registry = SequenceRegistry(RedisStore(url, prefix=prefix))
    lock = registry.register(SequenceConfig(name, batch=batch == "1", batch_count=50))
    results = [None] * 4

    def work(slot):
        results[slot] = [lock.next() for _ in range(int(per_thread))]

    threads = [threading.Thread(target=work, args=(slot,)) for slot in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    registry.close()
    print(json.dumps(results))
    """
)


def _four_processes(store: RedisStore, name: str, batch: bool, per_thread: int) -> None:
    args = [REDIS_URL, store.prefix, name, "1" if batch else "0", str(per_thread)]
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    threads: list[list[int]] = []
    for worker in workers:
        out, err = worker.communicate(timeout=240)
        assert worker.returncode == 0, err
        threads += json.loads(out)
    values = [value for thread in threads for value in thread]
    assert len(threads) == 16
    assert len(values) == len(set(values)) == 16 * per_thread
    for thread in threads:
        assert all(a < b for a, b in itertools.pairwise(thread))


@pytest.mark.parametrize(("batch", "per_thread"), [(True, 5000), (False, 1000)])
def test_four_processes_of_four_threads_never_share_a_value(
    redis_store: RedisStore, batch: bool, per_thread: int
) -> None:
    """4 processes x 4 threads through SequenceRegistry: no duplicates, increasing per thread."""
    _four_processes(redis_store, f"procs-{batch}", batch, per_thread)


@pytest.mark.slow
def test_four_processes_of_four_threads_without_batching_soak(redis_store: RedisStore) -> None:
    """The same with 5,000 single-value round trips per thread."""
    _four_processes(redis_store, "soak", False, 5000)


# keys kept by autoseq 0.1.0 ----------------------------------------------------


def _legacy_row(store: RedisStore, name: str, current: int) -> None:
    """A row as autoseq 0.1.0 wrote it: under the store-wide hash tag, listed in the index."""
    fields = {"name": name, "start": 1, "end": MAX_VALUE, "step": 1, "current": current}
    fields |= {"batch": 1, "batch_count": 100, "cycle": 0, "version": 3}
    store.client.hset(store.legacy_key(name), mapping=fields)
    store.client.zadd(store.index_key, {name: 0})


def test_rows_under_the_old_key_names_are_used_where_they_are(redis_store: RedisStore) -> None:
    """A row kept under autoseq 0.1.0's key is read and reserved in place: old processes
    sharing it go on, and nothing starts over under the new name."""
    _legacy_row(redis_store, "orders", 501)
    row = redis_store.read("orders")
    assert row is not None
    assert row.current == 501
    assert redis_store.reserve("orders", 10).first == 501
    assert redis_store.client.hget(redis_store.legacy_key("orders"), "current") == b"511"
    assert not redis_store.client.exists(redis_store.key("orders"))
    assert [r.name for r in redis_store.read_all()] == ["orders"]
    assert redis_store.create(SequenceConfig("orders")).current == 511


def test_migrate_keys_moves_rows_and_leases_and_running_stores_follow(
    redis_store: RedisStore,
) -> None:
    """migrate_keys() renames old keys to each name's own slot; a store that used the old
    key finds the row under the new one and goes on from where it was."""
    from autoseq.stores.redis.workers import RedisWorkers

    _legacy_row(redis_store, "orders", 501)
    assert redis_store.reserve("orders", 10).first == 501  # the old key, remembered
    lease = f"{2**62} 0 1 old-holder"
    redis_store.client.hset(redis_store.legacy_key("flake", "worker"), "0", lease)
    peer = _peer(redis_store)
    try:
        assert peer.migrate_keys() == 2
        assert not redis_store.client.exists(redis_store.legacy_key("orders"))
        assert redis_store.reserve("orders", 10).first == 511
        assert peer.reserve("orders", 10).first == 521
        (held,) = RedisWorkers(peer).list_workers("flake")
        assert (held.worker, held.owner) == (0, "old-holder")
    finally:
        peer.close()


def test_a_lease_held_under_the_old_key_is_respected(redis_store: RedisStore) -> None:
    """A worker id leased by a generator of autoseq 0.1.0 is not handed to a new one."""
    from autoseq.snowflake import Snowflake

    lease = f"{2**62} 0 1 old-holder"
    redis_store.client.hset(redis_store.legacy_key("flake", "worker"), "0", lease)
    with Snowflake(redis_store, name="flake") as generator:
        assert generator.worker_id == 1


def test_release_many_is_one_pipeline(redis_store: RedisStore, monkeypatch: Any) -> None:
    """Issue 34: handing back 300 blocks sends one pipeline, not a command per block;
    each is still its own compare-and-set (a block reserved past stays a gap)."""
    names = [f"h{i:03d}" for i in range(300)]
    for name in names:
        redis_store.create(SequenceConfig(name))
    blocks = [redis_store.reserve(name, 10) for name in names]
    redis_store.reserve("h007", 5)  # reserved past h007's block
    tails = [Block(block.name, 4, 10, 1, block.row) for block in blocks]
    commands: list[object] = []
    pipelines: list[int] = []
    client = redis_store.client
    execute_command = client.execute_command
    monkeypatch.setattr(
        client, "execute_command", lambda *a, **k: commands.append(a[0]) or execute_command(*a, **k)
    )
    execute = redis.client.Pipeline.execute

    def counted(pipe: Any, *args: Any, **kwargs: Any) -> Any:
        pipelines.append(len(pipe.command_stack))
        return execute(pipe, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", counted)
    went = release_many(redis_store, tails)
    assert went == [name != "h007" for name in names]
    assert commands == []
    assert pipelines == [300]
    assert {redis_store.read(name).current for name in names if name != "h007"} == {4}
    assert redis_store.read("h007").current == 16


# many sequences (issue 34) ---------------------------------------------------------


def test_load_and_warm_of_1000_sequences_are_a_few_round_trips(
    redis_store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: load() of 1,000 sequences is three round trips (not one per row to find its
    key), and warm() then sends the reserve script of every row in one pipeline, not one
    or two round trips per sequence on first use; each first value comes from memory."""
    names = [f"w{i:04d}" for i in range(1000)]
    SequenceRegistry(redis_store).register_many([SequenceConfig(name) for name in names])
    store = _peer(redis_store)  # another process's: it knows nothing yet
    registry = SequenceRegistry(store)
    store.client.ping()  # connected (a connection's handshake is not load's)
    sent = redis_requests(monkeypatch)
    registry.load()
    load, sent[0] = sent[0], 0
    locks = [registry.get(name) for name in names]
    warmed = registry.warm()
    warm, sent[0] = sent[0], 0
    assert [lock.next() for lock in locks] == [1] * 1000
    # load: the index, the keys (old or new names), the rows; warm: INFO replication (once
    # per store), the reservations
    assert (load, warmed, warm, sent[0]) == (3, 1000, 2, 0)
    assert isinstance(store, ReservesMany)
    # Each first block is sized for the 1,000 sequences warm() starts (the reservation
    # budget: 1,000 / 200 x batch_count), and the row moved past exactly that block.
    assert {lock.stats()["reserved_values"] for lock in locks} == {500}
    assert {redis_store.read(name).current for name in names[:5]} == {501}
    registry.close_locks()
    store.close()


def test_reserve_many_gives_each_row_reserves_block(redis_store: RedisStore) -> None:
    """Rows under the old and the new key names, one moved by another store meanwhile, a
    missing and an exhausted one: reserve_many gives each what reserve would (None where
    reserve would raise), the rows unknown to the store read in the same pipelines."""
    _legacy_row(redis_store, "old", 501)
    for name in ("a", "b"):
        redis_store.create(SequenceConfig(name))
    redis_store.create(SequenceConfig("done", end=3))
    redis_store.reserve("done", 3)
    store = _peer(redis_store)
    store.read_all()
    redis_store.reserve("b", 7)  # store's plan of b still holds: current is the script's
    asked = [("old", 10), ("a", 5), ("b", 5), ("missing", 5), ("done", 1), ("a", 3)]
    blocks = reserve_many(store, asked)
    got = [(block.first, block.last, block.version) if block else None for block in blocks]
    assert got == [(501, 510, 4), (1, 5, 1), (8, 12, 2), None, None, None]
    assert redis_store.client.hget(redis_store.legacy_key("old"), "current") == b"511"
    assert [redis_store.read(name).current for name in ("a", "b", "done")] == [6, 13, 4]
    store.close()


def test_reserve_many_uses_no_block_the_replicas_did_not_acknowledge(
    redis_store: RedisStore,
) -> None:
    """replicas=1 on a Redis without one: the reservations are written, WAIT says none has
    them, so reserve_many raises StoreUnavailable and hands out nothing, as reserve does;
    the values written are skipped."""
    for name in ("a", "b"):
        redis_store.create(SequenceConfig(name))
    store = _peer(redis_store, replicas=1, replica_timeout=0.05)
    with pytest.raises(StoreUnavailable, match="0 of 1 Redis replica"):
        reserve_many(store, [("a", 10), ("b", 10)])
    with pytest.raises(StoreUnavailable, match="0 of 1 Redis replica"):
        store.reserve("a", 10)
    assert [redis_store.reserve(name, 1).first for name in ("a", "b")] == [21, 11]
    store.close()


def test_drop_all_is_a_deprecated_name_of_drop(redis_store: RedisStore) -> None:
    """`drop()` is every store's name; `drop_all()` still deletes and counts, with a warning."""
    redis_store.create(SequenceConfig("a"))
    redis_store.create(SequenceConfig("b"))
    with pytest.warns(DeprecationWarning, match=r"drop_all\(\) is deprecated: call drop\(\)"):
        assert redis_store.drop_all() == 2
    assert redis_store.read("a") is None
    redis_store.create(SequenceConfig("c"))
    assert redis_store.drop() == 1
    assert redis_store.read("c") is None
