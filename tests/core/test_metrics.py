"""Prometheus metrics: scraped over HTTP after real traffic, counters moved by the right amounts."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from backends import REDIS_URL, drop_sql_store, unavailable, unique_table
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from autoseq import BufferPolicy, SequenceConfig, SequenceRegistry, StoreUnavailable, metrics
from autoseq.stores import SQLStore

Scrape = Callable[[], dict[tuple[str, tuple[tuple[str, str], ...]], float]]


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def scrape() -> Iterator[Scrape]:
    """Serves a fresh registry's metrics over HTTP; returns a function that scrapes them."""
    registry = CollectorRegistry()
    app = metrics.wsgi_app(registry)
    server = make_server("127.0.0.1", 0, app, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}/metrics"

    def read() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        samples = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    yield read
    server.shutdown()
    server.server_close()
    metrics._installed.pop(id(registry), None)


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    """The sample of ``name`` whose labels include ``labels`` (0 when there is none)."""
    found = [
        number
        for (sample, sample_labels), number in samples.items()
        if sample == name and set(labels.items()) <= set(sample_labels)
    ]
    assert len(found) <= 1, f"{name} {labels}: several samples {found}"
    return found[0] if found else 0.0


def test_counters_move_by_the_traffic_served(db_url: str, scrape: Scrape) -> None:
    """250 values in blocks of 100: 3 reservations, 300 reserved, 250 served, 3 waits."""
    store = SQLStore(db_url, table=unique_table())
    store.create_table()
    registry = SequenceRegistry(store, policy=BufferPolicy(prefetch=False, max_batch_count=100))
    name = unique_table("m")
    try:
        lock = registry.register(SequenceConfig(name, end=10_000, batch_count=100))
        before = scrape()
        values = [lock.next() for _ in range(200)] + lock.next_many(50)
        assert len(set(values)) == 250
        after = scrape()

        def moved(metric: str, **labels: str) -> float:
            return value(after, metric, **labels) - value(before, metric, **labels)

        assert moved("autoseq_reservations_total", sequence=name, mode="caller") == 3
        assert moved("autoseq_reservations_total", sequence=name, mode="prefetch") == 0
        assert moved("autoseq_reserved_values_total", sequence=name) == 300
        assert moved("autoseq_reservation_seconds_count", sequence=name) == 3
        assert moved("autoseq_reservation_seconds_sum", sequence=name) > 0
        assert moved("autoseq_values_served_total", sequence=name) == 250
        assert moved("autoseq_caller_waits_total", sequence=name) == 3
        assert value(after, "autoseq_values_left", sequence=name) == 10_000 - 250
        assert value(after, "autoseq_buffered_values", sequence=name) == 50
        assert value(after, "autoseq_store_up", sequence=name) == 1
        assert value(after, "autoseq_store_unavailable_seconds_total", sequence=name) == 0

        lock.close()  # hands the 50 unused values back: they were never served
        closed = scrape()
        assert value(closed, "autoseq_released_values_total", sequence=name) == 50
        assert value(closed, "autoseq_values_served_total", sequence=name) == 250
    finally:
        registry.close()
        store.drop()
        store.close()


def test_a_prefetching_lock_reports_its_next_block_and_the_prefetches(
    db_url: str, scrape: Scrape
) -> None:
    """With prefetch the next block is reserved in the background and counted as such."""
    store = SQLStore(db_url, table=unique_table())
    store.create_table()
    registry = SequenceRegistry(store, policy=BufferPolicy(prefetch_at=0.1, max_batch_count=10))
    name = unique_table("p")
    try:
        lock = registry.register(SequenceConfig(name, batch_count=10))
        lock.next()
        lock.next()  # past the prefetch point: the worker reserves the next block
        deadline = time.monotonic() + 10
        while lock.stats()["next_block_left"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        samples = scrape()
        assert value(samples, "autoseq_reservations_total", sequence=name, mode="caller") == 1
        assert value(samples, "autoseq_reservations_total", sequence=name, mode="prefetch") == 1
        assert value(samples, "autoseq_next_block_ready", sequence=name) == 1
        assert value(samples, "autoseq_buffered_values", sequence=name) == 18
    finally:
        registry.close()
        store.drop()
        store.close()


@pytest.mark.redis
def test_an_outage_counts_prefetch_failures_and_unavailable_time(scrape: Scrape) -> None:
    """Cutting the store: prefetch failures and caller errors count, down time accumulates."""
    import redis
    from reliability.faultproxy import FaultProxy

    from autoseq.stores import RedisStore

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        unavailable("redis", str(exc))
    port = int(REDIS_URL.split(":")[-1].split("/")[0])
    database = REDIS_URL.rsplit("/", 1)[-1]
    with FaultProxy(port) as proxy:
        store = RedisStore(f"redis://127.0.0.1:{proxy.port}/{database}", prefix=unique_table("o"))
        policy = BufferPolicy(prefetch_at=0.5, max_batch_count=10, retry_max=0.1)
        registry = SequenceRegistry(store, policy=policy)
        name = "outage"
        try:
            lock = registry.register(SequenceConfig(name, batch_count=10))
            assert [lock.next() for _ in range(6)] == [1, 2, 3, 4, 5, 6]  # past the half
            deadline = time.monotonic() + 10
            while lock.stats()["next_block_left"] == 0:
                assert time.monotonic() < deadline, "the prefetch of 11..20 never arrived"
                time.sleep(0.01)
            proxy.cut()
            served = [lock.next() for _ in range(14)]  # the buffer carries callers through
            assert served == list(range(7, 21))
            # The prefetch of 21..30 queued at 16 meets the cut on a worker (a
            # caller reaching 21 first would take it back and reserve inline).
            deadline = time.monotonic() + 10
            while lock.stats()["loading"]:
                assert time.monotonic() < deadline, "the prefetch of 21..30 never ended"
                time.sleep(0.01)
            outage_started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                lock.next()  # may fail fast: the failed prefetch started a back-off
            time.sleep(0.4)  # past the back-off (retry_max): this caller tries the store
            with pytest.raises(StoreUnavailable):
                lock.next()
            during = scrape()
            assert value(during, "autoseq_prefetch_failures_total", sequence=name) >= 1
            assert value(during, "autoseq_store_errors_total", sequence=name) in (1, 2)
            assert value(during, "autoseq_store_up", sequence=name) == 0
            assert value(during, "autoseq_store_unavailable_seconds_total", sequence=name) >= 0.4
            proxy.heal()
            deadline = time.monotonic() + 10
            while True:
                try:
                    assert lock.next() == 21
                    break
                except StoreUnavailable:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            outage = time.monotonic() - outage_started
            after = scrape()
            assert value(after, "autoseq_store_up", sequence=name) == 1
            down = value(after, "autoseq_store_unavailable_seconds_total", sequence=name)
            assert 0.4 <= down <= outage + 5  # from the first failure (a prefetch) on
        finally:
            proxy.heal()
            registry.close(release=False)
            store.drop()
            store.close()


def test_one_sequence_name_in_two_stores_gets_two_label_sets(tmp_path: Any, scrape: Scrape) -> None:
    """Two databases each with an "orders" sequence are told apart by the store label."""
    stores = [SQLStore(f"sqlite:///{tmp_path / f'{db}.db'}") for db in ("east", "west")]
    registries = [
        SequenceRegistry(store, policy=BufferPolicy(prefetch=False, max_batch_count=10))
        for store in stores
    ]
    try:
        for registry, count in zip(registries, (5, 12), strict=True):
            lock = registry.register(SequenceConfig("orders", batch_count=10))
            lock.next_many(count)
        samples = scrape()
        served = {
            dict(labels)["store"]: number
            for (name, labels), number in samples.items()
            if name == "autoseq_values_served_total" and dict(labels)["sequence"] == "orders"
        }
        assert len(served) == 2
        assert sorted(served.values()) == [5, 12]
        assert all("east.db" in store or "west.db" in store for store in served)
    finally:
        for registry in registries:
            registry.close()


def test_a_senders_store_labels_its_counts_and_a_sender_without_one_is_dash(
    tmp_path: Any, scrape: Scrape
) -> None:
    """Any sender with a `store` is counted under it (not only a lock); others under "-"."""
    from autoseq import signals
    from autoseq.stores.capabilities import describe

    store = SQLStore(f"sqlite:///{tmp_path / 'labels.db'}")

    class Holder:
        def __init__(self) -> None:
            self.store = store

    name = unique_table("cycled")
    try:
        signals.sequence_cycled.send(Holder(), name=name, first=1)
        signals.sequence_cycled.send(object(), name=name, first=1)
        samples = scrape()
        assert value(samples, "autoseq_cycled_total", store=describe(store), sequence=name) == 1
        assert value(samples, "autoseq_cycled_total", store="-", sequence=name) == 1
    finally:
        store.close()


def test_the_asgi_app_serves_the_same_metrics() -> None:
    """asgi_app() answers an HTTP request with the text format, autoseq's metrics included."""
    import asyncio

    from autoseq.stores import MemoryStore

    registry_ = CollectorRegistry()
    app = metrics.asgi_app(registry_)
    sequences = SequenceRegistry(MemoryStore())
    sequences.register(SequenceConfig("asgi", batch_count=10)).next()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/metrics",
        "query_string": b"",
        "headers": [],
    }
    try:
        asyncio.run(app(scope, receive, send))
    finally:
        sequences.close()
        metrics._installed.pop(id(registry_), None)
    assert sent[0]["status"] == 200
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert (
        b'autoseq_reservations_total{mode="caller",sequence="asgi",store="MemoryStore"} 1.0' in body
    )


def test_snowflake_leases_and_lifetime_are_scraped(db_url: str, scrape: Scrape) -> None:
    """A generator's lease: acquired counted, held while open, 0 after close; years left shown."""
    from autoseq.snowflake import Snowflake

    store = SQLStore(db_url, table=unique_table())
    store.create_table()
    name = unique_table("flake")
    generator = Snowflake(store, name=name, lease_ttl=30.0)
    try:
        generator.next()
        worker = str(generator.worker_id)
        open_ = scrape()
        assert value(open_, "autoseq_worker_leases_acquired_total", sequence=name) == 1
        assert value(open_, "autoseq_worker_lease_held", sequence=name, worker=worker) == 1
        years = value(open_, "autoseq_snowflake_years_left", sequence=name)
        assert abs(years - generator.years_left) < 0.01
        assert years > 10
    finally:
        generator.close()
    closed = scrape()
    assert value(closed, "autoseq_worker_lease_held", sequence=name, worker="-") == 0
    assert value(closed, "autoseq_worker_leases_lost_total", sequence=name) == 0
    drop_sql_store(store)


def documented_metrics() -> set[str]:
    """The metric names in the table of docs/operations.md's Metrics section."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = text.split("## Metrics (Prometheus)", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {name for cell in rows for name in re.findall(r"`(autoseq_\w+)", cell)}


def test_every_metric_registered_is_in_the_docs_table() -> None:
    """The docs' metrics table names every metric the code registers, and no other."""
    registry = CollectorRegistry()
    metrics.AutoseqMetrics(registry)
    registered = {
        f"{family.name}_total" if family.type == "counter" else family.name
        for family in registry.collect()
    }
    assert len(registered) >= 20  # the collection itself worked
    assert documented_metrics() == registered


HEAP_PER_SEQUENCE = """
import gc, sys, tracemalloc
from prometheus_client import CollectorRegistry, generate_latest
from autoseq import SequenceConfig, SequenceRegistry, metrics
from autoseq.stores import MemoryStore
installed = sys.argv[1] == "metrics"
target = CollectorRegistry()
if installed:
    metrics.install(target)
# What the process pays once (the first series of each metric, a scrape's own objects).
first = SequenceRegistry(MemoryStore())
first.register(SequenceConfig("first")).next()
generate_latest(target)
names = [f"m{i:05d}" for i in range(2_000)]
registry = SequenceRegistry(MemoryStore())
registry.register_many([SequenceConfig(name) for name in names])
gc.collect()
tracemalloc.start()
before = tracemalloc.get_traced_memory()[0]
locks = [registry.get(name) for name in names]
registry.warm()
for lock in locks:
    lock.next()
generate_latest(target)
gc.collect()
print((tracemalloc.get_traced_memory()[0] - before) / len(locks))
tracemalloc.stop()
registry.close_locks()
first.close_locks()
"""


def test_the_metrics_of_a_sequence_that_reserved_cost_a_few_hundred_bytes() -> None:
    """2,000 MemoryStore sequences holding their first block, scraped once: the Python heap
    they take (tracemalloc, fresh interpreter) grows by under 1,000 bytes each with the
    metrics installed (588 measured; issue 34's 4 KB per idle sequence is the whole
    budget). With prometheus_client's children for each sequence (two counters, a
    histogram of 15 buckets each an object with its lock) and a finalizer, 5,872."""
    import subprocess
    import sys

    def heap(mode: str) -> float:
        done = subprocess.run(
            [sys.executable, "-c", HEAP_PER_SEQUENCE, mode],
            capture_output=True,
            text=True,
            check=True,
        )
        return float(done.stdout.split()[-1])

    plain, installed = heap("plain"), heap("metrics")
    assert installed - plain < 1_000, f"{installed - plain:,.0f} bytes more a sequence"


FORK_WHILE_HELD = """
import os, threading, time
from prometheus_client import CollectorRegistry
from autoseq import SequenceConfig, SequenceRegistry, metrics
from autoseq.stores import MemoryStore
found = metrics.install(CollectorRegistry())
registry = SequenceRegistry(MemoryStore())
held, done = threading.Event(), threading.Event()
def hold():
    with found._guard:  # as a receiver on a prefetch worker holds it
        held.set()
        done.wait()
threading.Thread(target=hold, daemon=True).start()
held.wait()
child = os.fork()
if child == 0:
    registry.register(SequenceConfig("after_fork")).next()
    os._exit(0)
deadline = time.monotonic() + 10
while os.waitpid(child, os.WNOHANG) == (0, 0):
    if time.monotonic() > deadline:
        os.kill(child, 9)
        print("hung")
        break
    time.sleep(0.05)
else:
    print("served")
done.set()
"""


def test_a_child_forked_while_a_receiver_held_the_guard_still_counts() -> None:
    """A fork while another thread is inside a receiver: the child's first reservation
    does not wait forever for a guard no thread of the child holds."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", FORK_WHILE_HELD], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["served"], done.stderr


def test_counts_stay_exact_while_threads_reserve_and_a_scrape_runs() -> None:
    """Eight threads first-using 50 sequences each (prefetch on) while another scrapes
    without pause: no scrape fails, and the last one counts every reservation, value
    and latency the locks say they made."""
    from prometheus_client import generate_latest

    from autoseq.stores import MemoryStore

    target = CollectorRegistry()
    metrics.install(target)
    registry = SequenceRegistry(MemoryStore(), policy=BufferPolicy(max_batch_count=5))
    failures: list[BaseException] = []
    done = threading.Event()

    def scrape_until_done() -> None:
        while not done.is_set():
            try:
                generate_latest(target)
            except BaseException as exc:  # kept for the assert below to report
                failures.append(exc)

    def serve(thread: int) -> None:
        for index in range(50):
            lock = registry.register(SequenceConfig(f"t{thread}_{index}", batch_count=5))
            lock.next_many(12)

    scraper = threading.Thread(target=scrape_until_done)
    scraper.start()
    workers = [threading.Thread(target=serve, args=(thread,)) for thread in range(8)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        for name in registry.names():
            while registry.get(name).stats()["loading"]:
                time.sleep(0.001)
    finally:
        done.set()
        scraper.join()
    try:
        assert failures == []
        stats = [registry.get(name).stats() for name in registry.names()]
        samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(generate_latest(target).decode())
            for sample in family.samples
        }

        def total(metric: str) -> float:
            return sum(number for (name, _), number in samples.items() if name == metric)

        assert len(stats) == 400
        reservations = sum(figures["reservations"] for figures in stats)
        assert total("autoseq_reservations_total") == reservations
        assert total("autoseq_reservation_seconds_count") == reservations
        assert total("autoseq_reserved_values_total") == sum(s["reserved_values"] for s in stats)
        assert total("autoseq_values_served_total") == 400 * 12
    finally:
        registry.close()
        metrics._installed.pop(id(target), None)
