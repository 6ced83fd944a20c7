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
Every metric has a ``sequence`` label:

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
        # What a lock had served (and waited) when last seen, so its share
        # stays in the counters after the lock is closed and collected.
        self._seen: dict[int, tuple[str, int, int]] = {}
        self._retired: dict[str, tuple[int, int]] = {}
        # Values each lock handed back on close: stats() counts them as served.
        self._released: dict[int, int] = {}
        self._down_since: dict[str, float] = {}
        self._down_total: dict[str, float] = {}
        self._registries: list[weakref.ref[Any]] = []

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(f"{namespace}_{name}", doc, ["sequence", *labels], registry=registry)

        self.reservations = counter("reservations", "Blocks reserved from the store.", "mode")
        self.reserved_values = counter("reserved_values", "Values in the blocks reserved.")
        self.latency = Histogram(
            f"{namespace}_reservation_seconds",
            "Store round trip of a reservation, in seconds.",
            ["sequence"],
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
        registry.register(self)
        signals.block_reserved.connect(self._on_reserved)
        signals.prefetch_failed.connect(self._on_prefetch_failed)
        signals.store_unavailable.connect(self._on_store_unavailable)
        signals.sequence_exhausted.connect(self._on_exhausted)
        signals.sequence_cycled.connect(self._on_cycled)
        signals.block_released.connect(self._on_released)

    # what the signals say ------------------------------------------------------

    def _track(self, sender: Any) -> None:
        if isinstance(sender, SequenceLock) and sender not in self._locks:
            with self._guard:
                self._locks.add(sender)
                weakref.finalize(sender, self._retire, id(sender))

    def _on_reserved(self, sender: Any, **kw: Any) -> None:
        name = str(kw["name"])
        self._track(sender)
        self.reservations.labels(name, "prefetch" if kw.get("prefetch") else "caller").inc()
        self.reserved_values.labels(name).inc(int(kw["count"]))
        self.latency.labels(name).observe(float(kw["latency"]))
        self._up(name)

    def _on_prefetch_failed(self, sender: Any, **kw: Any) -> None:
        self._track(sender)
        self.prefetch_failures.labels(str(kw["name"])).inc()
        if isinstance(kw.get("error"), StoreUnavailable):
            self._down(str(kw["name"]))

    def _on_store_unavailable(self, sender: Any, **kw: Any) -> None:
        self._track(sender)
        self.store_errors.labels(str(kw["name"])).inc()
        self._down(str(kw["name"]))

    def _on_exhausted(self, sender: Any, **kw: Any) -> None:
        self.exhausted.labels(str(kw["name"])).inc()

    def _on_cycled(self, sender: Any, **kw: Any) -> None:
        self.cycled.labels(str(kw["name"])).inc()

    def _on_released(self, sender: Any, **kw: Any) -> None:
        self.released_values.labels(str(kw["name"])).inc(int(kw["count"]))
        with self._guard:
            self._released[id(sender)] = self._released.get(id(sender), 0) + int(kw["count"])

    def _down(self, name: str) -> None:
        with self._guard:
            self._down_since.setdefault(name, time.monotonic())

    def _up(self, name: str) -> None:
        with self._guard:
            since = self._down_since.pop(name, None)
            if since is not None:
                self._down_total[name] = self._down_total.get(name, 0.0) + (
                    time.monotonic() - since
                )
            else:
                self._down_total.setdefault(name, 0.0)

    def _retire(self, key: int) -> None:
        with self._guard:
            seen = self._seen.pop(key, None)
            self._released.pop(key, None)
            if seen is not None:
                name, served, waits = seen
                old_served, old_waits = self._retired.get(name, (0, 0))
                self._retired[name] = (old_served + served, old_waits + waits)

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
        served = CounterMetricFamily(
            f"{ns}_values_served", "Values handed to callers.", labels=["sequence"]
        )
        waits = CounterMetricFamily(
            f"{ns}_caller_waits",
            "Calls that found the buffer empty and waited for the store.",
            labels=["sequence"],
        )
        left = GaugeMetricFamily(
            f"{ns}_values_left", "Values not yet served before end.", labels=["sequence"]
        )
        buffered = GaugeMetricFamily(
            f"{ns}_buffered_values",
            "Values held in this process's memory (current and next blocks).",
            labels=["sequence"],
        )
        rate = GaugeMetricFamily(
            f"{ns}_consumption_rate",
            "Values per second between the latest reservations.",
            labels=["sequence"],
        )
        ready = GaugeMetricFamily(
            f"{ns}_next_block_ready",
            "1 when the next block is already reserved in memory.",
            labels=["sequence"],
        )
        up = GaugeMetricFamily(
            f"{ns}_store_up",
            "0 from a store failure until a reservation succeeds again.",
            labels=["sequence"],
        )
        down = CounterMetricFamily(
            f"{ns}_store_unavailable_seconds",
            "Seconds between a store failure and the next successful reservation.",
            labels=["sequence"],
        )
        totals: dict[str, list[int]] = {}
        for lock in self._all_locks():
            stats = lock.stats()
            name = str(stats["name"])
            with self._guard:
                given = int(stats["served_values"]) - self._released.get(id(lock), 0)
                self._seen[id(lock)] = (name, given, int(stats["caller_waits"]))
            count = totals.setdefault(name, [0, 0])
            count[0] += given
            count[1] += int(stats["caller_waits"])
            if stats["values_until_end"] is not None:
                left.add_metric([name], float(stats["values_until_end"]))
            buffered.add_metric(
                [name], float(int(stats["current_block_left"]) + int(stats["next_block_left"]))
            )
            if stats["consumption_rate"] is not None:
                rate.add_metric([name], float(stats["consumption_rate"]))
            ready.add_metric([name], 1.0 if int(stats["next_block_left"]) > 0 else 0.0)
        now = time.monotonic()
        with self._guard:
            for name, (old_served, old_waits) in self._retired.items():
                count = totals.setdefault(name, [0, 0])
                count[0] += old_served
                count[1] += old_waits
            outages = dict(self._down_total)
            for name, since in self._down_since.items():
                outages[name] = outages.get(name, 0.0) + (now - since)
            failing = set(self._down_since)
        for name, (served_count, wait_count) in sorted(totals.items()):
            served.add_metric([name], served_count)
            waits.add_metric([name], wait_count)
        for name, seconds in sorted(outages.items()):
            down.add_metric([name], seconds)
            up.add_metric([name], 0.0 if name in failing else 1.0)
        yield from (served, waits, left, buffered, rate, ready, up, down)

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
