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

What is counted comes from the blinker signals of [`autoseq.signals`][autoseq.signals]
(each reservation, failure, hand-back) and, at scrape time, from
[`stats`][autoseq.lock.SequenceLock.stats] of every lock that has reserved in this
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
``autoseq_failovers_total``                counter  reservations that found another primary
``autoseq_rows_went_back_total``           counter  reservations below values reserved before
``autoseq_failover_skipped_values_total``  counter  values a new primary's treatment skipped
                                                   (PostgreSQL, this process ran it)
``autoseq_failover_short_total``           counter  rows whose range was too short for the margin
``autoseq_worker_leases_acquired_total``  counter  snowflake worker-id leases taken (``sequence``
                                                   is the snowflake layout's name)
``autoseq_worker_leases_lost_total``      counter  leases lost (not renewed in time, taken over)
``autoseq_worker_lease_held``             gauge    1 while a generator holds its lease, per
                                                   generator of this process (``worker`` label)
``autoseq_snowflake_years_left``          gauge    years until the layout's timestamp bits end
========================================  =======  ===============================================

Each (store, sequence) that reserved keeps its reservation counts and latency
histogram as one array of numbers, made into metric families at each scrape,
and a weak reference to its lock for the scrape to read: about 560 bytes of heap
a sequence in all. The rarer counters (failures, exhaustion, cycles, failovers,
hand-backs) are prometheus_client metrics whose series appear when they first move.

Under gunicorn and other pre-fork servers, set ``PROMETHEUS_MULTIPROC_DIR``
(prometheus_client's multi-process mode) and call
``prometheus_client.multiprocess.mark_process_dead`` in ``child_exit``: each
worker then writes its figures to that directory and [`wsgi_app`][autoseq.metrics.wsgi_app]
serves the sum over workers, whichever answers (docs/operations.md). There the
reservation counters and histogram are prometheus_client's own metrics, written
to the files as they move: about 15 KB of heap a sequence that reserved (an
object and a file key for each series and each bucket), 20 KB once its
stats() figures are published too.

This module imports prometheus_client; ``import autoseq`` never imports it.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import threading
import time
import weakref
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import make_asgi_app as _make_asgi_app
from prometheus_client import make_wsgi_app as _make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from autoseq import _hooks, signals
from autoseq.errors import StoreUnavailable
from autoseq.lock import SequenceLock
from autoseq.stores.capabilities import describe

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

logger = logging.getLogger(__name__)

#: The metrics counted at each reservation: name -> help.
_RESERVATION_HELP = {
    "reservations": "Blocks reserved from the store.",
    "reserved_values": "Values in the blocks reserved.",
    "reservation_seconds": "Store round trip of a reservation, in seconds.",
}
_MODES = ("caller", "prefetch")

# What a (store, sequence) reserved in this process, one array of floats for each
# (prometheus_client keeps its counts as floats too): reservations by mode, when each
# mode's series and the others began (0: not yet), values, seconds in all, then the
# latency histogram's count per bucket (+Inf last). prometheus_client's children cost
# 5.6 KB a sequence, each bucket an object with its own lock; this array, under 300 bytes.
_CALLER, _PREFETCH = 0, 1  # counts; the time each series began is 2 places further
_SINCE = 2
_FIRST_SINCE = 4
_VALUES = 5
_SECONDS = 6
_BUCKETS = 7
_BLANK = array("d", bytes(8 * (_BUCKETS + len(LATENCY_BUCKETS) + 1)))
_LE = tuple(
    floatToGoString(bound)  # type: ignore[no-untyped-call]
    for bound in (*LATENCY_BUCKETS, float("inf"))
)

#: The figures read from stats() at scrape time: name -> (kind, help, labels).
_STATS_METRICS: dict[str, tuple[Callable[..., Metric], str, tuple[str, ...]]] = {
    "values_served": (CounterMetricFamily, "Values handed to callers.", LABELS),
    "caller_waits": (
        CounterMetricFamily,
        "Calls that found the buffer empty and waited for the store.",
        LABELS,
    ),
    "store_unavailable_seconds": (
        CounterMetricFamily,
        "Seconds between a store failure and the next successful reservation.",
        LABELS,
    ),
    "values_left": (GaugeMetricFamily, "Values not yet served before end.", LABELS),
    "buffered_values": (
        GaugeMetricFamily,
        "Values held in this process's memory (current and next blocks).",
        LABELS,
    ),
    "consumption_rate": (
        GaugeMetricFamily,
        "Values per second between the latest reservations.",
        LABELS,
    ),
    "next_block_ready": (
        GaugeMetricFamily,
        "1 when the next block is already reserved in memory.",
        LABELS,
    ),
    "store_up": (
        GaugeMetricFamily,
        "0 from a store failure until a reservation succeeds again.",
        LABELS,
    ),
    "worker_lease_held": (
        GaugeMetricFamily,
        "1 while the generator holds its worker-id lease, else 0.",
        (*LABELS, "worker"),
    ),
    "snowflake_years_left": (
        GaugeMetricFamily,
        "Years until the layout's timestamp bits run out.",
        LABELS,
    ),
}

#: How the workers' gauges combine in multi-process mode (only live processes
#: count, so gunicorn's ``child_exit`` must call ``mark_process_dead``): what
#: is held adds up; what must hold everywhere (ready, up, time left) is the
#: worst worker's.
_GAUGE_MODES: dict[str, Literal["livemin", "livesum"]] = {
    "values_left": "livemin",
    "buffered_values": "livesum",
    "consumption_rate": "livesum",
    "next_block_ready": "livemin",
    "store_up": "livemin",
    "worker_lease_held": "livesum",
    "snowflake_years_left": "livemin",
}


def multiprocess_dir() -> str | None:
    """prometheus_client's multi-process directory, or None when each process counts alone."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


@runtime_checkable
class _ServesFromStore(Protocol):
    """A signal's sender serving from a store (a `SequenceLock`, a snowflake generator)."""

    store: Any


@dataclass
class _Snapshot:
    """The stats() figures of one process at one moment, per (store, sequence)."""

    counts: dict[_Key, list[int]] = field(default_factory=dict)  # served, waits
    lefts: dict[_Key, float] = field(default_factory=dict)
    held: dict[_Key, float] = field(default_factory=dict)
    rates: dict[_Key, float] = field(default_factory=dict)
    readiness: dict[_Key, float] = field(default_factory=dict)
    outages: dict[_Key, float] = field(default_factory=dict)
    failing: set[_Key] = field(default_factory=set)
    leases: dict[tuple[str, str, str], float] = field(default_factory=dict)
    years: dict[_Key, float] = field(default_factory=dict)

    def gauges(self) -> Iterator[tuple[str, tuple[str, ...], float]]:
        """(metric, labels, value) of every gauge sample."""
        named: tuple[tuple[str, dict[Any, float]], ...] = (
            ("values_left", self.lefts),
            ("buffered_values", self.held),
            ("consumption_rate", self.rates),
            ("next_block_ready", self.readiness),
            ("worker_lease_held", self.leases),
            ("snowflake_years_left", self.years),
        )
        for name, values in named:
            for key, number in sorted(values.items()):
                yield name, key, number
        for key in sorted(self.outages):
            yield "store_up", key, 0.0 if key in self.failing else 1.0


class _Watched(weakref.ref[SequenceLock]):
    """A lock whose stats() a scrape reads, and what it had served and waited then.

    When the lock is collected, the callback moves that share into the totals
    kept for its (store, sequence), so it stays in the counters.
    """

    __slots__ = ("key", "served", "waits")

    def __new__(cls, lock: SequenceLock, retire: Callable[[_Watched], None], key: _Key) -> _Watched:
        return super().__new__(cls, lock, retire)

    def __init__(self, lock: SequenceLock, retire: Callable[[_Watched], None], key: _Key) -> None:
        # weakref.ref's own __init__ only checks the arguments __new__ took.
        self.key = key
        self.served: int | None = None  # None: no scrape has seen the lock yet
        self.waits = 0


class _ReservationFamilies(Collector):
    """The reservation counters and latency histogram, made from ``metrics``'
    arrays at each scrape, where prometheus_client's own metrics would sit."""

    def __init__(self, metrics: AutoseqMetrics) -> None:
        self._metrics = metrics
        self._namespace = metrics.namespace

    def _empty(self) -> tuple[CounterMetricFamily, CounterMetricFamily, HistogramMetricFamily]:
        def name(metric: str) -> str:
            return f"{self._namespace}_{metric}"

        help_ = _RESERVATION_HELP
        return (
            CounterMetricFamily(
                name("reservations"), help_["reservations"], labels=(*LABELS, "mode")
            ),
            CounterMetricFamily(name("reserved_values"), help_["reserved_values"], labels=LABELS),
            HistogramMetricFamily(
                name("reservation_seconds"), help_["reservation_seconds"], labels=LABELS
            ),
        )

    def describe(self) -> Iterable[Metric]:
        """The three families, empty: the registry refuses a second set of these names."""
        return self._empty()

    def collect(self) -> Iterator[Metric]:
        """Each series as prometheus_client's children would show it, in their order."""
        families = self._empty()
        self._metrics._reservation_samples(*families, created=_created_series())
        yield from families


class AutoseqMetrics(Collector):
    """The autoseq metrics of this process, registered in ``registry``.

    Keep the object (``install`` does): the signal receivers are held
    weakly, so dropping it disconnects them.
    """

    def __init__(
        self,
        registry: CollectorRegistry = REGISTRY,
        namespace: str = "autoseq",
        publish_interval: float = 1.0,
    ) -> None:
        self.namespace = namespace
        self.publish_interval = publish_interval
        # Re-entrant: a lock collected while we hold it runs _retire on this thread.
        self._guard = threading.RLock()
        self._watched: set[_Watched] = set()
        self._retire_watched = self._retire  # one callback for every _Watched
        self._store_labels: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        # What the locks collected had served and waited, when a scrape last saw them.
        self._retired: dict[_Key, tuple[int, int]] = {}
        # Values each lock handed back on close: stats() counts them as served.
        self._released: weakref.WeakKeyDictionary[SequenceLock, int] = weakref.WeakKeyDictionary()
        self._down_since: dict[_Key, float] = {}
        self._down_total: dict[_Key, float] = {}
        # Each (store, sequence) that reserved: its figures (see _BLANK), and the
        # order prometheus_client would have made their series in. Not kept in
        # multi-process mode, where prometheus_client's own metrics count.
        self._figures: dict[_Key, array[float]] = {}
        self._mode_keys: list[_Key] = []
        self._modes = bytearray()
        self._registries: list[weakref.ref[Any]] = []
        # Multi-process mode: the stats() figures as metrics in the shared files,
        # what each counter already published, and which process publishes.
        self._shared = None if multiprocess_dir() is None else _shared_metrics(namespace)
        self._published: dict[tuple[str, tuple[str, ...]], float] = {}
        self._publish_guard = threading.Lock()
        self._publisher_pid: int | None = None

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(f"{namespace}_{name}", doc, [*LABELS, *labels], registry=registry)

        # Multi-process mode: prometheus_client writes these to the shared files as
        # they move; otherwise a scrape makes them from self._figures.
        self._written: tuple[Counter, Counter, Histogram] | None = None
        if self._shared is None:
            registry.register(_ReservationFamilies(self))
        else:
            self._written = (
                counter("reservations", _RESERVATION_HELP["reservations"], "mode"),
                counter("reserved_values", _RESERVATION_HELP["reserved_values"]),
                Histogram(
                    f"{namespace}_reservation_seconds",
                    _RESERVATION_HELP["reservation_seconds"],
                    LABELS,
                    buckets=LATENCY_BUCKETS,
                    registry=registry,
                ),
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
        self.failover_skipped = counter(
            "failover_skipped_values",
            "Values a new primary's failover treatment skipped (run by this process).",
        )
        self.failover_short = counter(
            "failover_short",
            "Rows a failover treatment left at their end: the range was shorter than the margin.",
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
        signals.failover_skipped.connect(self._on_failover_skipped)

    # what the signals say ------------------------------------------------------

    def _key(self, sender: Any, name: object) -> _Key:
        """(store, sequence): two databases may each have a sequence of the same name."""
        # SequenceLock first: a runtime Protocol check costs about 10 µs a call.
        store = sender.store if isinstance(sender, (SequenceLock, _ServesFromStore)) else None
        return self._store_key(store, name)

    def _store_key(self, store: Any, name: object) -> _Key:
        """(store, sequence) for a signal whose sender is the store itself."""
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

    def _track(self, sender: Any, key: _Key | None = None) -> None:
        """Read ``sender``'s stats() at each scrape from now on, if it is a lock."""
        self._start_publishing()
        if not isinstance(sender, SequenceLock):
            return
        probe = weakref.ref(sender)
        if probe in self._watched:
            return
        if key is None:
            key = self._key(sender, sender.name)
        with self._guard:
            if probe not in self._watched:
                self._watched.add(_Watched(sender, self._retire_watched, key))

    def _on_reserved(self, sender: Any, **kw: Any) -> None:
        key = self._key(sender, kw["name"])
        self._track(sender, key)
        mode = _PREFETCH if kw.get("prefetch") else _CALLER
        count = int(kw["count"])
        latency = float(kw["latency"])
        if self._written is None:
            self._count(key, mode, count, latency)
        else:
            reservations, values, seconds = self._written
            reservations.labels(*key, _MODES[mode]).inc()
            values.labels(*key).inc(count)
            seconds.labels(*key).observe(latency)
        self._up(key)

    def _count(self, key: _Key, mode: int, count: int, latency: float) -> None:
        """What prometheus_client's counters and histogram would count, in the arrays."""
        with self._guard:
            figures = self._figures.get(key)
            if figures is None:
                figures = self._figures[key] = array("d", _BLANK)
                figures[_FIRST_SINCE] = time.time()
            if not figures[_SINCE + mode]:
                figures[_SINCE + mode] = time.time()
                self._mode_keys.append(key)
                self._modes.append(mode)
            figures[mode] += 1
            figures[_VALUES] += count
            figures[_SECONDS] += latency
            figures[_BUCKETS + bisect_left(LATENCY_BUCKETS, latency)] += 1

    def _on_prefetch_failed(self, sender: Any, **kw: Any) -> None:
        key = self._key(sender, kw["name"])
        self._track(sender, key)
        self.prefetch_failures.labels(*key).inc()
        if isinstance(kw.get("error"), StoreUnavailable):
            self._down(key)

    def _on_store_unavailable(self, sender: Any, **kw: Any) -> None:
        key = self._key(sender, kw["name"])
        self._track(sender, key)
        self.store_errors.labels(*key).inc()
        self._down(key)

    def _on_exhausted(self, sender: Any, **kw: Any) -> None:
        self.exhausted.labels(*self._key(sender, kw["name"])).inc()

    def _on_cycled(self, sender: Any, **kw: Any) -> None:
        self.cycled.labels(*self._key(sender, kw["name"])).inc()

    def _on_failover(self, sender: Any, **kw: Any) -> None:
        self.failovers.labels(*self._key(sender, kw["name"])).inc()

    def _on_failover_skipped(self, sender: Any, **kw: Any) -> None:
        key = self._store_key(sender, kw["name"])
        self.failover_skipped.labels(*key).inc(int(kw["skipped"]))
        if kw.get("short"):
            self.failover_short.labels(*key).inc()

    def _on_went_back(self, sender: Any, **kw: Any) -> None:
        self.rows_went_back.labels(*self._key(sender, kw["name"])).inc()

    def _on_released(self, sender: Any, **kw: Any) -> None:
        self.released_values.labels(*self._key(sender, kw["name"])).inc(int(kw["count"]))
        if isinstance(sender, SequenceLock):
            with self._guard:
                self._released[sender] = self._released.get(sender, 0) + int(kw["count"])

    def _on_lease_acquired(self, sender: Any, **kw: Any) -> None:
        self.leases_acquired.labels(*self._key(sender, kw["name"])).inc()
        self._start_publishing()
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

    def _retire(self, watched: _Watched) -> None:
        with self._guard:
            self._watched.discard(watched)
            if watched.served is not None:
                old_served, old_waits = self._retired.get(watched.key, (0, 0))
                self._retired[watched.key] = (
                    old_served + watched.served,
                    old_waits + watched.waits,
                )

    def _reservation_samples(
        self,
        reservations: CounterMetricFamily,
        values: CounterMetricFamily,
        seconds: HistogramMetricFamily,
        *,
        created: bool,
    ) -> None:
        """Add each (store, sequence)'s samples to the three families, ``_created`` too if
        ``created``. The arrays are read without the guard, as prometheus_client reads
        its children: each number is whole, the count of a mode may be one ahead of the
        histogram's."""
        with self._guard:
            figures = dict(self._figures)
            modes = list(zip(self._mode_keys, self._modes, strict=True))
        for key, mode in modes:
            counts = figures[key]
            since = counts[_SINCE + mode] if created else None
            reservations.add_metric([*key, _MODES[mode]], counts[mode], created=since)
        histogram = seconds.name
        for key, counts in figures.items():
            first = counts[_FIRST_SINCE] if created else None
            values.add_metric(list(key), counts[_VALUES], created=first)
            buckets = []
            running = 0.0
            for index, le in enumerate(_LE, _BUCKETS):
                running += counts[index]
                buckets.append((le, running))
            seconds.add_metric(list(key), buckets, counts[_SECONDS])
            if first is not None:
                seconds.add_sample(
                    f"{histogram}_created", dict(zip(LABELS, key, strict=True)), first
                )

    # what stats() says, at scrape time --------------------------------------------

    def watch(self, registry: Any) -> None:
        """Include every lock of a ``SequenceRegistry`` (even before it has reserved)."""
        self._start_publishing()
        with self._guard:
            self._registries.append(weakref.ref(registry))

    def _all_watched(self) -> list[_Watched]:
        with self._guard:
            refs = list(self._registries)
        for ref in refs:
            registry = ref()
            if registry is not None:
                for name in registry.names():
                    self._track(registry.get(name))
        with self._guard:
            return list(self._watched)

    def _snapshot(self) -> _Snapshot:
        """What stats() of every lock (and each snowflake generator) says now."""
        # Several locks of one (store, sequence) in a process (two registries
        # on one database) add up; one sample per label set, as Prometheus needs.
        snap = _Snapshot()
        for watched in self._all_watched():
            lock = watched()
            if lock is not None:
                self._add_lock(snap, lock, watched)
        now = time.monotonic()
        with self._guard:
            for key, (old_served, old_waits) in self._retired.items():
                count = snap.counts.setdefault(key, [0, 0])
                count[0] += old_served
                count[1] += old_waits
            snap.outages = dict(self._down_total)
            for key, since in self._down_since.items():
                snap.outages[key] = snap.outages.get(key, 0.0) + (now - since)
            snap.failing = set(self._down_since)
            generators = list(self._generators)
        for generator in generators:
            key = self._key(generator, generator.name)
            worker = generator.worker_id
            snap.leases[(*key, "-" if worker is None else str(worker))] = float(worker is not None)
            years_left = generator.years_left
            snap.years[key] = min(snap.years.get(key, years_left), years_left)
        return snap

    def _add_lock(self, snap: _Snapshot, lock: SequenceLock, watched: _Watched) -> None:
        stats = lock.stats()
        key = watched.key
        with self._guard:
            given = int(stats["served_values"]) - self._released.get(lock, 0)
            watched.served = given
            watched.waits = int(stats["caller_waits"])
        count = snap.counts.setdefault(key, [0, 0])
        count[0] += given
        count[1] += int(stats["caller_waits"])
        if stats["values_until_end"] is not None:
            until_end = float(stats["values_until_end"])
            snap.lefts[key] = min(snap.lefts.get(key, until_end), until_end)
        in_memory = int(stats["current_block_left"]) + int(stats["next_block_left"])
        snap.held[key] = snap.held.get(key, 0.0) + in_memory
        if stats["consumption_rate"] is not None:
            snap.rates[key] = snap.rates.get(key, 0.0) + float(stats["consumption_rate"])
        is_ready = 1.0 if int(stats["next_block_left"]) > 0 else 0.0
        snap.readiness[key] = min(snap.readiness.get(key, is_ready), is_ready)

    def collect(self) -> Iterator[Metric]:
        """The stats() part of the metrics, computed at each scrape.

        In multi-process mode the figures go to the shared files instead
        (``MultiProcessCollector`` reads them), so nothing is yielded here.
        """
        if self._shared is not None:
            self.publish()
            return
        snap = self._snapshot()
        families: dict[str, Any] = {
            name: kind(f"{self.namespace}_{name}", doc, labels=labels)
            for name, (kind, doc, labels) in _STATS_METRICS.items()
        }
        for served_key, (served_count, wait_count) in sorted(snap.counts.items()):
            families["values_served"].add_metric(list(served_key), served_count)
            families["caller_waits"].add_metric(list(served_key), wait_count)
        for down_key, seconds in sorted(snap.outages.items()):
            families["store_unavailable_seconds"].add_metric(list(down_key), seconds)
        for name, labels, number in snap.gauges():
            families[name].add_metric(list(labels), number)
        yield from families.values()

    # multi-process mode -------------------------------------------------------------

    def publish(self) -> None:
        """Write this process's stats() figures to the multi-process files (else nothing).

        A thread does it every ``publish_interval`` seconds in each process
        that reserves, a scrape does it for the process answering, and exit
        does it last; counters move by what changed since the last time.
        """
        shared = self._shared
        if shared is None:
            return
        snap = self._snapshot()
        with self._publish_guard:
            for key, (served_count, wait_count) in snap.counts.items():
                self._advance("values_served", key, served_count)
                self._advance("caller_waits", key, wait_count)
            for key, seconds in snap.outages.items():
                self._advance("store_unavailable_seconds", key, seconds)
            for name, labels, number in snap.gauges():
                shared[name].labels(*labels).set(number)

    def _advance(self, name: str, key: tuple[str, ...], total: float) -> None:
        """Move counter ``name`` up to ``total`` for ``key`` (a process's counters only grow)."""
        assert self._shared is not None
        grown = total - self._published.get((name, key), 0)
        if grown > 0:
            self._shared[name].labels(*key).inc(grown)
            self._published[(name, key)] = total

    def _start_publishing(self) -> None:
        """Start this process's publishing thread (once; again in a forked child)."""
        if self._shared is None or self._publisher_pid == os.getpid():
            return
        with self._guard:
            if self._publisher_pid == os.getpid():
                return
            self._publisher_pid = os.getpid()
        thread = threading.Thread(
            target=_publish_every,
            args=(weakref.ref(self), self.publish_interval),
            name="autoseq-metrics-publish",
            daemon=True,
        )
        thread.start()

    def _after_fork_in_child(self) -> None:
        """New guards: a thread of the parent inside a receiver did not come along to let
        go. In multi-process mode the child also starts from zero: what the parent
        counted is in the parent's files."""
        self._guard = threading.RLock()
        self._publish_guard = threading.Lock()
        if self._shared is None:
            return
        for watched in self._watched:
            watched.served = None
        self._retired.clear()
        self._released.clear()
        self._published.clear()
        self._down_since.clear()
        self._down_total.clear()
        self._publisher_pid = None

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: the names are in ``collect`` (no stats are read at register)."""
        return []


def _created_series() -> bool:
    """Whether prometheus_client shows ``_created`` samples now (it does unless
    ``PROMETHEUS_DISABLE_CREATED_SERIES`` or ``disable_created_metrics()`` says not)."""
    probe = Counter("autoseq_probe", "", registry=None)
    return any(
        sample.name.endswith("_created") for metric in probe.collect() for sample in metric.samples
    )


def _shared_metrics(namespace: str) -> dict[str, Any]:
    """The stats() figures as prometheus_client metrics kept in the multi-process files."""
    shared: dict[str, Any] = {}
    for name, (kind, doc, labels) in _STATS_METRICS.items():
        full = f"{namespace}_{name}"
        if kind is CounterMetricFamily:
            shared[name] = Counter(full, doc, labels, registry=None)
        else:
            mode = _GAUGE_MODES[name]
            shared[name] = Gauge(full, doc, labels, registry=None, multiprocess_mode=mode)
    return shared


def _publish_every(target: weakref.ref[AutoseqMetrics], interval: float) -> None:
    """Publish ``target`` every ``interval`` seconds until it goes or the process forks."""
    pid = os.getpid()
    while True:
        time.sleep(interval)
        found = target()
        if found is None or found._publisher_pid != pid:
            return
        try:
            found.publish()
        except Exception:  # a scrape still reads the last figures; say why they are old
            logger.exception("autoseq metrics: publishing to the multi-process files failed")
        del found


_installed: dict[int, AutoseqMetrics] = {}
_install_guard = threading.Lock()


def install(
    registry: CollectorRegistry | None = None, *, publish_interval: float = 1.0
) -> AutoseqMetrics:
    """The metrics of ``registry`` (default: prometheus_client's), created once per registry.

    With ``PROMETHEUS_MULTIPROC_DIR`` set (gunicorn and other pre-fork
    servers), each process also writes its stats() figures to that
    directory every ``publish_interval`` seconds, so a scrape of any worker
    adds up every worker: serve [`wsgi_app`][autoseq.metrics.wsgi_app] or
    [`scrape_registry`][autoseq.metrics.scrape_registry].
    """
    target = REGISTRY if registry is None else registry
    with _install_guard:
        found = _installed.get(id(target))
        if found is None:
            found = AutoseqMetrics(target, publish_interval=publish_interval)
            _installed[id(target)] = found
    return found


class _SettledFiles(MultiProcessCollector):
    """prometheus_client's collector, skipping files a starting worker has not sized yet.

    A worker creates its ``*.db`` file empty and then grows it to its first
    size; a scrape landing between the two would fail on the empty file
    (``struct.error``) and answer 500. Such a file holds no figure yet.
    """

    def collect(self) -> Any:
        files = glob.glob(os.path.join(self._path, "*.db"))
        settled = [name for name in files if _sized(name)]
        return self.merge(settled, accumulate=True)  # type: ignore[no-untyped-call]


def _sized(name: str) -> bool:
    try:
        return os.path.getsize(name) >= 8
    except OSError:  # the worker was marked dead meanwhile
        return False


def scrape_registry(registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """What a scrape reads: ``registry``, or in multi-process mode every process's figures.

    In multi-process mode the answer is a registry holding a
    ``MultiProcessCollector`` of ``PROMETHEUS_MULTIPROC_DIR``, after this
    process's own figures are published, as prometheus_client advises.
    """
    found = install(registry)
    if multiprocess_dir() is None:
        return REGISTRY if registry is None else registry
    everyone = CollectorRegistry()
    everyone.register(found)  # publishes this process's figures first; yields nothing
    _SettledFiles(everyone)  # type: ignore[no-untyped-call]
    return everyone


def wsgi_app(registry: CollectorRegistry | None = None) -> Callable[..., Any]:
    """A WSGI app serving ``registry``'s metrics (every worker's in multi-process mode)."""
    return _make_wsgi_app(scrape_registry(registry))


def asgi_app(registry: CollectorRegistry | None = None) -> Callable[..., Any]:
    """An ASGI app serving ``registry``'s metrics (every worker's in multi-process mode)."""
    return _make_asgi_app(scrape_registry(registry))


def _after_fork_in_child() -> None:
    for found in list(_installed.values()):
        found._after_fork_in_child()


def _publish_at_exit() -> None:
    with contextlib.suppress(Exception):  # the interpreter is exiting
        for found in list(_installed.values()):
            found.publish()


_hooks.on_fork(after_in_child=_after_fork_in_child)
_hooks.at_exit(_publish_at_exit)
