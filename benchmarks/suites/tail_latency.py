"""Tail latency (issue 5): ``next()`` against a store that takes 20 ms per reservation.

The consumer is paced below the store's capacity (blocks of 500 every 20 ms
= 25,000 values/s; the consumer asks for 10,000/s in bursts of 10), the way
an application inserting rows is. Block growth is turned off so both runs
switch blocks equally often. Without double buffering every block switch
waits the full 20 ms; with it the next block is already there. Target:
p99.9 under 200 µs with double buffering.
"""

from __future__ import annotations

import itertools
import time

from autoseq import BufferPolicy, SequenceConfig, SequenceLock
from autoseq.stores import MemoryStore
from autoseq.testing import FlakyStore
from benchmarks.harness import Contender, Group, Sample, percentile, run_group
from benchmarks.servers import Context, unique_name

DELAY = 0.020
BLOCK = 500
RATE = 10_000.0
BURST = 10
WITH = "autoseq, double buffering"
WITHOUT = "autoseq, no prefetch"


def paced_latencies(lock: SequenceLock, n: int) -> list[int]:
    """Latency of each of ``n`` ``next()`` calls (ns), paced at RATE values/s."""
    clock = time.perf_counter_ns
    take = lock.next
    latencies = [0] * n
    values = [0] * n
    interval = 1e9 / RATE * BURST
    due = clock()
    for i in range(n):
        started = clock()
        values[i] = take()
        latencies[i] = clock() - started
        if i % BURST == BURST - 1:
            due += interval
            ahead = due - clock()
            if ahead > 0:
                time.sleep(ahead / 1e9)
    if any(b <= a for a, b in itertools.pairwise(values)):
        raise AssertionError("next() returned a value twice or out of order")
    return latencies


def trial(store: FlakyStore, n: int, policy: BufferPolicy) -> Sample:
    name = unique_name("tail")
    store.create(SequenceConfig(name, batch_count=BLOCK))
    lock = SequenceLock(name, store, batch_count=BLOCK, policy=policy)
    lock.next()  # the first block always waits: that is start-up, not serving
    before = store.reservations
    started = time.perf_counter()
    try:
        latencies = sorted(paced_latencies(lock, n))
    finally:
        lock.close(release=False)
    seconds = time.perf_counter() - started
    micro = [ns / 1000 for ns in latencies]
    return Sample(
        n,
        seconds,
        {
            "p50 µs": percentile(micro, 0.50),
            "p99 µs": percentile(micro, 0.99),
            "p99.9 µs": percentile(micro, 0.999),
            "max µs": micro[-1],
            "calls over 1 ms": sum(1 for value in micro if value > 1000),
            "reservations": store.reservations - before,
        },
    )


def run(ctx: Context) -> list[Group]:
    n = ctx.n(100_000, 10_000)
    store = FlakyStore(MemoryStore(), delay=DELAY)
    headline = Group(
        "tail_latency",
        "next() latency p99.9, store delayed 20 ms per reservation",
        "µs",
        subject=WITH,
        metric="p99.9 µs",
        higher_is_better=False,
    )
    run_group(
        headline,
        [
            Contender(WITH, lambda: trial(store, n, BufferPolicy(max_batch_count=BLOCK))),
            Contender(
                WITHOUT,
                lambda: trial(store, n, BufferPolicy(prefetch=False, max_batch_count=BLOCK)),
            ),
        ],
        repeats=3,
        warmup=False,
        log=ctx.log,
    )
    headline.notes.append(
        f"{n:,} calls paced at {RATE:,.0f}/s, fixed blocks of {BLOCK}, FlakyStore(delay={DELAY})"
    )
    groups = [headline]
    for metric in ("p50 µs", "p99 µs", "max µs"):
        groups.append(
            headline.view(
                f"next() latency {metric.split()[0]}, store delayed 20 ms per reservation",
                "µs",
                metric,
                higher_is_better=False,
            )
        )
    with_series = headline.get(WITH)
    without_series = headline.get(WITHOUT)
    if with_series and with_series.samples and without_series and without_series.samples:
        p999 = with_series.median("p99.9 µs") or 0.0
        worst = max(with_series.values("p99.9 µs"))
        without = without_series.median("p99.9 µs") or 0.0
        ctx.check(
            "issue 5: p99.9 of next() < 200 µs with double buffering (20 ms store)",
            p999 < 200,
            f"p99.9 {p999:.1f} µs with (worst repeat {worst:.1f}), {without:,.0f} µs without; "
            f"calls over 1 ms: {with_series.median('calls over 1 ms'):.0f} with, "
            f"{without_series.median('calls over 1 ms'):.0f} without",
            p999_with_us=p999,
            p999_without_us=without,
        )
    return groups
