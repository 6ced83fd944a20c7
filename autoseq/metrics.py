"""Prometheus metrics for autoseq: ``pip install 'autoseq[prometheus]'``.

::

    from autoseq import metrics

    metrics.install()                      # the default registry (prometheus_client.REGISTRY)
    metrics.install(my_registry)           # or your own CollectorRegistry
    app = metrics.wsgi_app()               # a WSGI app serving /metrics text
    app = metrics.asgi_app()               # the same for ASGI

Django: ``path("autoseq/", include("autoseq_django.urls"))`` serves
``autoseq/metrics`` (installed on the default registry at start-up when
prometheus_client is importable).

What is counted comes from the blinker signals of :mod:`autoseq.signals`
(each reservation, failure, hand-back) and, at scrape time, from
:meth:`~autoseq.SequenceLock.stats` of every lock that has reserved in this
process (values served, caller waits, values left, what is buffered).
Every metric has a ``store`` label (the store's URL without a password, as
``autoseq doctor`` prints it) and a ``sequence`` label:

========================================  =======  ===============================================
``autoseq_reservations_total``            counter  blocks reserved; ``mode`` = caller / prefetch
``autoseq_reserved_values_total``         counter  values in those blocks
``autoseq_reservation_seconds``           histog.  store round trip of a reservation
``autoseq_values_served_total``           counter  values handed to callers
``autoseq_caller_waits_total``            counter  calls that found the buffer empty and waited
``autoseq_values_left``                   gauge    values not yet served before ``end``
``autoseq_buffered_values``               gauge    values held in memory (current + next block)
``autoseq_consumption_rate``              gauge    values per second between the last blocks
``autoseq_next_block_ready``              gauge    1 when the next block is already reserved
``autoseq_prefetch_failures_total``       counter  background reservations that failed
``autoseq_store_errors_total``            counter  callers that met ``StoreUnavailable``
``autoseq_store_up``                      gauge    0 from a store failure until a reservation works
``autoseq_store_unavailable_seconds``     counter  time spent in that state (``_total``)
``autoseq_exhausted_total``               counter  reservations refused at ``end``
``autoseq_cycled_total``                  counter  wraps from ``end`` to ``start``
``autoseq_released_values_total``         counter  unused values handed back on close
``autoseq_worker_leases_acquired_total``  counter  snowflake worker-id leases taken (``sequence``
                                                   is the snowflake layout's name)
``autoseq_worker_leases_lost_total``      counter  leases lost (not renewed in time, taken over)
``autoseq_worker_lease_held``             gauge    1 while a generator holds its lease, per
                                                   generator of this process (``worker`` label)
``autoseq_snowflake_years_left``          gauge    years until the layout's timestamp bits end
========================================  =======  ===============================================

This module imports prometheus_client; ``import autoseq`` never imports it.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client import make_asgi_app as _make_asgi_app
from prometheus_client import make_wsgi_app as _make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from autoseq import signals
from autoseq.doctor import describe
from autoseq.errors import StoreUnavailable
from autoseq.lock import SequenceLock

#: Reservation latency buckets (seconds): a warm reservation is about a
#: millisecond; the tail is a contended row or a server failing over.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


#: Labels of every metric: the store (as ``autoseq doctor`` names it, no
#: password) and the sequence.
LABELS = ("store", "sequence")
_Key = tuple[str, str]


class AutoseqMetrics(Collector):
    """The autoseq metrics of this process, registered in ``registry``.

    Keep the object (``install`` does): the signal receivers are held
    weakly, so dropping it disconnects them.
    """

    def __init__(self, registry: CollectorRegistry = REGISTRY, namespace: str = "autoseq") -> None:
        self.namespace = namespace
        # Re-entrant: a lock collected while we hold it runs _retire on this thread.
        self._guard = threading.RLock()
        self._locks: weakref.WeakSet[SequenceLock] = weakref.WeakSet()
        self._store_labels: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        # What a lock had served (and waited) when last seen, so its share
        # stays in the counters after the lock is closed and collected.
        self._seen: dict[int, tuple[_Key, int, int]] = {}
        self._retired: dict[_Key, tuple[int, int]] = {}
        # Values each lock handed back on close: stats() counts them as served.
        self._released: dict[int, int] = {}
        self._down_since: dict[_Key, float] = {}
        self._down_total: dict[_Key, float] = {}
        self._registries: list[weakref.ref[Any]] = []

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(f"{namespace}_{name}", doc, [*LABELS, *labels], registry=registry)

        self.reservations = counter("reservations", "Blocks reserved from the store.", "mode")
        self.reserved_values = counter("reserved_values", "Values in the blocks reserved.")
        self.latency = Histogram(
            f"{namespace}_reservation_seconds",
            "Store round trip of a reservation, in seconds.",
            LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.prefetch_failures = counter(
            "prefetch_failures", "Background reservations that failed."
        )
        self.store_errors = counter(
            "store_errors", "Callers that found no buffered value while the store failed."
        )
        self.exhausted = counter("exhausted", "Reservations refused at end (no cycle).")
        self.cycled = counter("cycled", "Reservations that wrapped from end to start.")
        self.released_values = counter("released_values", "Unused values handed back on close.")
        self.leases_acquired = counter(
            "worker_leases_acquired", "Snowflake worker-id leases taken by this process."
        )
        self.leases_lost = counter(
            "worker_leases_lost", "Snowflake worker-id leases lost (not renewed in time)."
        )
        self.failovers = counter(
            "failovers", "Reservations that found another primary (buffered blocks dropped)."
        )
        self.rows_went_back = counter(
            "rows_went_back", "Reservations below values reserved before, skipped (lost writes)."
        )
        self._generators: weakref.WeakSet[Any] = weakref.WeakSet()
        registry.register(self)
        signals.block_reserved.connect(self._on_reserved)
        signals.prefetch_failed.connect(self._on_prefetch_failed)
        signals.store_unavailable.connect(self._on_store_unavailable)
        signals.sequence_exhausted.connect(self._on_exhausted)
        signals.sequence_cycled.connect(self._on_cycled)
        signals.block_released.connect(self._on_released)
        signals.worker_lease_acquired.connect(self._on_lease_acquired)
        signals.worker_lease_lost.connect(self._on_lease_lost)
        signals.store_failover.connect(self._on_failover)
        signals.row_went_back.connect(self._on_went_back)

    # what the signals say ------------------------------------------------------

    def _key(self, sender: Any, name: object) -> _Key:
        """(store, sequence): two databases may each have a sequence of the same name."""
        store = getattr(sender, "store", None)
        if store is None:
            return ("-", str(name))
        try:
            label = self._store_labels.get(store)
        except TypeError:  # a store that cannot be weakly referenced: no cache
            return (describe(store), str(name))
        if label is None:
            label = describe(store)
            self._store_labels[store] = label
        return (label, str(name))

    def _track(self, sender: Any) -> None:
        if isinstance(sender, SequenceLock) and sender not in self._locks:
            with self._guard:
                self._locks.add(sender)
                weakref.finalize(sender, self._retire, id(sender))

    def _on_reserved(self, sender: Any, **kw: Any) -> None:
        key = self._key(sender, kw["name"])
        self._track(sender)
        self.reservations.labels(*key, "prefetch" if kw.get("prefetch") else "caller").inc()
        self.reserved_values.labels(*key).inc(int(kw["count"]))
        self.latency.labels(*key).observe(float(kw["latency"]))
        self._up(key)

    def _on_prefetch_failed(self, sender: Any, **kw: Any) -> None:
        key = self._key(sender, kw["name"])
        self._track(sender)
        self.prefetch_failures.labels(*key).inc()
        if isinstance(kw.get("error"), StoreUnavailable):
            self._down(key)

    def _on_store_unavailable(self, sender: Any, **kw: Any) -> None:
        key = self._key(sender, kw["name"])
        self._track(sender)
        self.store_errors.labels(*key).inc()
        self._down(key)

    def _on_exhausted(self, sender: Any, **kw: Any) -> None:
        self.exhausted.labels(*self._key(sender, kw["name"])).inc()

    def _on_cycled(self, sender: Any, **kw: Any) -> None:
        self.cycled.labels(*self._key(sender, kw["name"])).inc()

    def _on_failover(self, sender: Any, **kw: Any) -> None:
        self.failovers.labels(*self._key(sender, kw["name"])).inc()

    def _on_went_back(self, sender: Any, **kw: Any) -> None:
        self.rows_went_back.labels(*self._key(sender, kw["name"])).inc()

    def _on_released(self, sender: Any, **kw: Any) -> None:
        self.released_values.labels(*self._key(sender, kw["name"])).inc(int(kw["count"]))
        with self._guard:
            self._released[id(sender)] = self._released.get(id(sender), 0) + int(kw["count"])

    def _on_lease_acquired(self, sender: Any, **kw: Any) -> None:
        self.leases_acquired.labels(*self._key(sender, kw["name"])).inc()
        with self._guard:
            self._generators.add(sender)

    def _on_lease_lost(self, sender: Any, **kw: Any) -> None:
        self.leases_lost.labels(*self._key(sender, kw["name"])).inc()
        with self._guard:
            self._generators.add(sender)

    def _down(self, key: _Key) -> None:
        with self._guard:
            self._down_since.setdefault(key, time.monotonic())

    def _up(self, key: _Key) -> None:
        with self._guard:
            since = self._down_since.pop(key, None)
            lasted = 0.0 if since is None else time.monotonic() - since
            self._down_total[key] = self._down_total.get(key, 0.0) + lasted

    def _retire(self, lock_id: int) -> None:
        with self._guard:
            seen = self._seen.pop(lock_id, None)
            self._released.pop(lock_id, None)
            if seen is not None:
                key, served, waits = seen
                old_served, old_waits = self._retired.get(key, (0, 0))
                self._retired[key] = (old_served + served, old_waits + waits)

    # what stats() says, at scrape time --------------------------------------------

    def watch(self, registry: Any) -> None:
        """Include every lock of a ``SequenceRegistry`` (even before it has reserved)."""
        with self._guard:
            self._registries.append(weakref.ref(registry))

    def _all_locks(self) -> list[SequenceLock]:
        with self._guard:
            refs = list(self._registries)
        for ref in refs:
            registry = ref()
            if registry is not None:
                for name in registry.names():
                    self._track(registry.get(name))
        with self._guard:
            return list(self._locks)

    def collect(self) -> Iterator[Metric]:
        """The stats() part of the metrics, computed at each scrape."""
        ns = self.namespace

        def family(kind: Callable[..., Metric], name: str, doc: str) -> Any:
            return kind(f"{ns}_{name}", doc, labels=LABELS)

        served = family(CounterMetricFamily, "values_served", "Values handed to callers.")
        waits = family(
            CounterMetricFamily,
            "caller_waits",
            "Calls that found the buffer empty and waited for the store.",
        )
        left = family(GaugeMetricFamily, "values_left", "Values not yet served before end.")
        buffered = family(
            GaugeMetricFamily,
            "buffered_values",
            "Values held in this process's memory (current and next blocks).",
        )
        rate = family(
            GaugeMetricFamily,
            "consumption_rate",
            "Values per second between the latest reservations.",
        )
        ready = family(
            GaugeMetricFamily,
            "next_block_ready",
            "1 when the next block is already reserved in memory.",
        )
        up = family(
            GaugeMetricFamily,
            "store_up",
            "0 from a store failure until a reservation succeeds again.",
        )
        down = family(
            CounterMetricFamily,
            "store_unavailable_seconds",
            "Seconds between a store failure and the next successful reservation.",
        )
        # Several locks of one (store, sequence) in a process (two registries
        # on one database) add up; one sample per label set, as Prometheus needs.
        counts: dict[_Key, list[int]] = {}
        lefts: dict[_Key, float] = {}
        held: dict[_Key, float] = {}
        rates: dict[_Key, float] = {}
        readiness: dict[_Key, float] = {}
        for lock in self._all_locks():
            stats = lock.stats()
            key = self._key(lock, stats["name"])
            with self._guard:
                given = int(stats["served_values"]) - self._released.get(id(lock), 0)
                self._seen[id(lock)] = (key, given, int(stats["caller_waits"]))
            count = counts.setdefault(key, [0, 0])
            count[0] += given
            count[1] += int(stats["caller_waits"])
            if stats["values_until_end"] is not None:
                until_end = float(stats["values_until_end"])
                lefts[key] = min(lefts.get(key, until_end), until_end)
            in_memory = int(stats["current_block_left"]) + int(stats["next_block_left"])
            held[key] = held.get(key, 0.0) + in_memory
            if stats["consumption_rate"] is not None:
                rates[key] = rates.get(key, 0.0) + float(stats["consumption_rate"])
            is_ready = 1.0 if int(stats["next_block_left"]) > 0 else 0.0
            readiness[key] = min(readiness.get(key, is_ready), is_ready)
        now = time.monotonic()
        with self._guard:
            for key, (old_served, old_waits) in self._retired.items():
                count = counts.setdefault(key, [0, 0])
                count[0] += old_served
                count[1] += old_waits
            outages = dict(self._down_total)
            for key, since in self._down_since.items():
                outages[key] = outages.get(key, 0.0) + (now - since)
            failing = set(self._down_since)
        for key, (served_count, wait_count) in sorted(counts.items()):
            served.add_metric(list(key), served_count)
            waits.add_metric(list(key), wait_count)
        for target, values in ((left, lefts), (buffered, held), (rate, rates), (ready, readiness)):
            for key, number in sorted(values.items()):
                target.add_metric(list(key), number)
        for key, seconds in sorted(outages.items()):
            down.add_metric(list(key), seconds)
            up.add_metric(list(key), 0.0 if key in failing else 1.0)
        yield from (served, waits, left, buffered, rate, ready, up, down)
        yield from self._collect_generators()

    def _collect_generators(self) -> Iterator[Metric]:
        """Lease state and lifetime of each snowflake generator that took a lease here."""
        ns = self.namespace
        held = GaugeMetricFamily(
            f"{ns}_worker_lease_held",
            "1 while the generator holds its worker-id lease, else 0.",
            labels=[*LABELS, "worker"],
        )
        years = GaugeMetricFamily(
            f"{ns}_snowflake_years_left",
            "Years until the layout's timestamp bits run out.",
            labels=LABELS,
        )
        with self._guard:
            generators = list(self._generators)
        lifetimes: dict[_Key, float] = {}
        for generator in generators:
            key = self._key(generator, generator.name)
            worker = generator.worker_id
            held.add_metric(
                [*key, "-" if worker is None else str(worker)], float(worker is not None)
            )
            years_left = generator.years_left
            lifetimes[key] = min(lifetimes.get(key, years_left), years_left)
        for key, value in sorted(lifetimes.items()):
            years.add_metric(list(key), value)
        yield from (held, years)

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: the names are in ``collect`` (no stats are read at register)."""
        return []


_installed: dict[int, AutoseqMetrics] = {}
_install_guard = threading.Lock()


def install(registry: CollectorRegistry | None = None) -> AutoseqMetrics:
    """The metrics of ``registry`` (default: prometheus_client's), created once per registry."""
    target = REGISTRY if registry is None else registry
    with _install_guard:
        found = _installed.get(id(target))
        if found is None:
            found = AutoseqMetrics(target)
            _installed[id(target)] = found
    return found


def wsgi_app(registry: CollectorRegistry | None = None) -> Callable[..., Any]:
    """A WSGI app serving ``registry``'s metrics (autoseq's installed in it)."""
    install(registry)
    return _make_wsgi_app(REGISTRY if registry is None else registry)


def asgi_app(registry: CollectorRegistry | None = None) -> Callable[..., Any]:
    """An ASGI app serving ``registry``'s metrics (autoseq's installed in it)."""
    install(registry)
    return _make_asgi_app(REGISTRY if registry is None else registry)
