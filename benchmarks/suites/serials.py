"""Serial numbers (issue 14): formatted serials from memory, and gapless numbering.

Three comparisons, each against django-sequences on the same Django alias:

* **Formatted serials per call.** autoseq's ``Serial.next()`` (a monthly
  ``INV-YYYYMM-NNNNNN`` from blocks in memory) against django-sequences'
  ``get_next_value`` on a per-month name, formatted by the caller the same
  way. Target: at least 100x.
* **Gapless, one transaction per value.** ``atomic()`` around autoseq's
  gapless take on Django's connection (``autoseq_django.serials.take_gapless``)
  against ``atomic()`` around ``get_next_value``, django-sequences' gapless
  path: both hold the row lock until the commit. Target: at least 1.0x.
* **Gapless under 4 writers.** Four threads, each committing one value per
  transaction; reported: the time each take waited (median and p99, ms)
  and the committed values per second.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from benchmarks import django_setup
from benchmarks.harness import (
    Contender,
    Group,
    Sample,
    Unavailable,
    percentile,
    run_group,
    stopwatch,
)
from benchmarks.servers import BACKEND_LABELS, Context, unique_name

# Nine digits: a full run takes over a million values from one month's row.
TEMPLATE = "INV-{date:%Y%m}-{n:09d}"
WRITERS = 4


def _django(ctx: Context, backend: str) -> str:
    using = django_setup.alias(ctx, backend)
    if not django_setup.has_autoseq_django():
        raise Unavailable("autoseq_django is not importable")
    from django.apps import apps

    if not apps.is_installed("autoseq_django"):
        raise Unavailable("autoseq_django appeared after Django was set up in this run")
    return using


class Peers:
    """autoseq serials and django-sequences on one Django alias, each on tables of its own."""

    def __init__(self, ctx: Context, backend: str) -> None:
        self.using = _django(ctx, backend)
        from sequences.models import Sequence

        from autoseq import Serial
        from autoseq_django import registry as sequences

        # django-sequences' table name is fixed; a unique one keeps runs apart.
        django_setup.rename_table(Sequence, "djseq")
        django_setup.create_table(Sequence, self.using)
        self.model = Sequence
        registry = sequences.registry(sequences.sequence_database(self.using))
        self.serial = Serial(registry, unique_name("inv"), TEMPLATE, period="month")
        self.gapless = Serial(registry, unique_name("gap"), TEMPLATE, period="month")
        self.name = unique_name("dj")

    def formatted(self, n: int) -> Sample:
        take = self.serial.next
        with stopwatch() as elapsed:
            for _ in range(n):
                take()
        return Sample(n, elapsed[0])

    def djseq_formatted(self, n: int) -> Sample:
        from sequences import get_next_value

        with stopwatch() as elapsed:
            for _ in range(n):
                now = datetime.now(UTC)
                value = get_next_value(f"{self.name}-{now:%Y%m}", using=self.using)
                f"INV-{now:%Y%m}-{value:09d}"
        return Sample(n, elapsed[0])

    def take_gapless(self) -> str:
        from django.db import connections, transaction

        from autoseq_django.serials import take_gapless

        with transaction.atomic(using=self.using):
            return take_gapless(self.gapless, connections[self.using])

    def djseq_gapless(self) -> str:
        from django.db import transaction
        from sequences import get_next_value

        with transaction.atomic(using=self.using):
            now = datetime.now(UTC)
            value = get_next_value(f"{self.name}-gap-{now:%Y%m}", using=self.using)
            return f"INV-{now:%Y%m}-{value:09d}"

    def per_transaction(self, take: Callable[[], str], n: int) -> Sample:
        with stopwatch() as elapsed:
            for _ in range(n):
                take()
        return Sample(n, elapsed[0])

    def writers(self, take: Callable[[], str], per_writer: int) -> Sample:
        """``WRITERS`` threads committing one value per transaction; waits per take."""
        waits: list[float] = []
        taken: list[str] = []
        guard = threading.Lock()
        errors: list[BaseException] = []

        def work() -> None:
            from django.db import connections

            mine, got = [], []
            try:
                for _ in range(per_writer):
                    started = time.perf_counter()
                    got.append(take())
                    mine.append(time.perf_counter() - started)
            except BaseException as exc:  # reported by the trial
                errors.append(exc)
            finally:
                connections.close_all()
            with guard:
                waits.extend(mine)
                taken.extend(got)

        threads = [threading.Thread(target=work) for _ in range(WRITERS)]
        with stopwatch() as elapsed:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        if errors:
            raise errors[0]
        if len(set(taken)) != len(taken):
            raise AssertionError("a gapless value was taken twice")
        waits.sort()
        return Sample(
            len(taken),
            elapsed[0],
            {
                "ms per value, median": statistics.median(waits) * 1000,
                "ms per value, p99": percentile(waits, 0.99) * 1000,
            },
        )

    def close(self) -> None:
        from django.db import connections

        self.serial.close()
        django_setup.drop_table(self.model, self.using)
        connections[self.using].close()


def backend_groups(ctx: Context, backend: str) -> list[Group]:
    label = BACKEND_LABELS[backend]
    formatted = Group(
        "serials",
        f"formatted serials per call, {label}",
        "serials/s",
        subject="autoseq Serial.next()",
    )
    gapless = Group(
        "serials",
        f"gapless serial, one transaction per value, {label}",
        "values/s",
        subject="autoseq gapless in atomic()",
    )
    contended = Group(
        "serials",
        f"gapless serial, {WRITERS} writers, {label}",
        "values/s",
        subject="autoseq gapless in atomic()",
    )
    groups = [formatted, gapless, contended]
    fast, slow = ctx.n(200_000, 20_000), ctx.n(5_000, 500)
    per_writer = ctx.n(500, 100)
    try:
        peers = Peers(ctx, backend)
    except Unavailable as exc:
        for group in groups:
            group.unavailable = str(exc)
        return groups
    try:
        run_group(
            formatted,
            [
                Contender(formatted.subject, lambda: peers.formatted(fast)),
                Contender(
                    "django-sequences get_next_value + caller's format",
                    lambda: peers.djseq_formatted(slow),
                ),
            ],
            ctx.repeats,
            log=ctx.log,
        )
        run_group(
            gapless,
            [
                Contender(gapless.subject, lambda: peers.per_transaction(peers.take_gapless, slow)),
                Contender(
                    "django-sequences get_next_value in atomic()",
                    lambda: peers.per_transaction(peers.djseq_gapless, slow),
                ),
            ],
            ctx.repeats,
            log=ctx.log,
        )
        if backend != "sqlite":
            run_group(
                contended,
                [
                    Contender(
                        contended.subject, lambda: peers.writers(peers.take_gapless, per_writer)
                    ),
                    Contender(
                        "django-sequences get_next_value in atomic()",
                        lambda: peers.writers(peers.djseq_gapless, per_writer),
                    ),
                ],
                ctx.n(3, 2),
                log=ctx.log,
            )
        else:
            contended.unavailable = "SQLite: one writer per file, measured on the servers only"
    finally:
        with contextlib.suppress(Exception):
            peers.close()
    formatted.notes.append(f"autoseq: {fast:,} serials per trial; django-sequences {slow:,}")
    gapless.notes.append(f"{slow:,} transactions per trial, each committing one value")
    contended.notes.append(f"{WRITERS} threads x {per_writer:,} transactions per trial")
    _checks(ctx, label, formatted, gapless, contended)
    return groups


def _checks(ctx: Context, label: str, formatted: Group, gapless: Group, contended: Group) -> None:
    ratio = formatted.ratio("django-sequences get_next_value + caller's format")
    if ratio:
        ctx.check(
            f"issue 14: formatted serials >= 100x django-sequences get_next_value ({label})",
            ratio[0] >= 100,
            f"{ratio[0]:.0f}x (repeats {ratio[1]:.0f}..{ratio[2]:.0f})",
        )
    ratio = gapless.ratio("django-sequences get_next_value in atomic()")
    if ratio:
        ctx.check(
            f"issue 14: gapless >= 1.0x django-sequences gapless ({label})",
            ratio[0] >= 1.0,
            f"{ratio[0]:.2f}x (repeats {ratio[1]:.2f}..{ratio[2]:.2f})",
        )
    mine = contended.get(contended.subject)
    if mine is not None and mine.samples:
        counters = mine.counters()
        ctx.log(
            f"  {label}: gapless under {WRITERS} writers: "
            f"{counters.get('ms per value, median', 0):.2f} ms per value (median), "
            f"{counters.get('ms per value, p99', 0):.2f} ms (p99)"
        )


class ByHand:
    """``Serial.next()`` and ``lock.next()`` formatted by the caller, on one memory store.

    The caller's version formats the counter into the month's template
    with the date already filled in, which is all a caller can do faster:
    issue 34 measured ``Serial.next()`` at 0.16x of it, 41% of its time
    spent reading and converting the clock.
    """

    def __init__(self) -> None:
        from autoseq import SequenceConfig, SequenceRegistry, Serial
        from autoseq.stores import MemoryStore

        registry = SequenceRegistry(MemoryStore())
        self.serial = Serial(registry, unique_name("inv"), TEMPLATE, period="month")
        self.lock = registry.register(SequenceConfig(unique_name("hand"), end=10**9 - 1))
        self.month = TEMPLATE.replace("{date:%Y%m}", datetime.now(UTC).strftime("%Y%m"))

    def serials(self, n: int) -> Sample:
        take = self.serial.next
        with stopwatch() as elapsed:
            for _ in range(n):
                take()
        return Sample(n, elapsed[0])

    def by_hand(self, n: int) -> Sample:
        take, fmt = self.lock.next, self.month.format
        with stopwatch() as elapsed:
            for _ in range(n):
                fmt(n=take())
        return Sample(n, elapsed[0])


def by_hand_group(ctx: Context) -> Group:
    """Issue 34: ``Serial.next()`` >= 0.5x formatting ``lock.next()`` by hand."""
    n = ctx.n(500_000, 100_000)
    peers = ByHand()
    group = Group(
        "serials",
        "formatted serials, Serial.next() vs lock.next() formatted by the caller, memory store",
        "serials/s",
        subject="autoseq Serial.next()",
    )
    run_group(
        group,
        [
            Contender(group.subject, lambda: peers.serials(n)),
            Contender("lock.next() formatted by hand", lambda: peers.by_hand(n)),
        ],
        ctx.repeats,
        log=ctx.log,
    )
    ratio = group.ratio("lock.next() formatted by hand")
    if ratio is not None:
        ctx.check(
            "issue 34: Serial.next() >= 0.5x formatting lock.next() by hand",
            ratio[0] >= 0.5,
            f"{ratio[0]:.2f}x (repeats {ratio[1]:.2f}..{ratio[2]:.2f})",
            ratio=ratio[0],
        )
    return group


def run(ctx: Context) -> list[Group]:
    groups: list[Group] = [by_hand_group(ctx)]
    for backend in ("postgres", "sqlite", "mysql"):
        try:
            groups.extend(backend_groups(ctx, backend))
        except Unavailable as exc:
            groups.append(Group("serials", f"serials, {backend}", "", "", unavailable=str(exc)))
    return groups


__all__ = ["run"]
