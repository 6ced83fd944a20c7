"""Asyncio: how long the event loop stalls while 200 tasks insert through ``AsyncSession``.

Issue 16, target 4: a reservation never blocks the loop. It is made off the
loop (a worker thread, awaited from SQLAlchemy's greenlet), so the loop's
worst stall with autoseq keys should be no worse than with the database's
own ``Identity()`` keys, on the same server (PostgreSQL, asyncpg).

Each trial: ``TASKS`` tasks, each committing ``COMMITS`` ``add_all`` of
``ROWS`` rows in its own ``AsyncSession``, while a ticker task sleeps
``TICK`` seconds at a time and records how late it wakes up: the loop's
stalls. A stall is a pass of the loop that ran longer than the tick, that
is the ready callbacks of the 200 tasks, plus anything that blocked.

Three contenders: autoseq with its defaults (blocks sized by time, so a
trial makes few reservations), ``Identity()``, and autoseq on a store that
takes ``DELAY`` seconds per reservation with small fixed blocks, so every
trial makes several slow reservations: were one made on the loop, the
worst stall would be at least ``DELAY``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import time
from typing import Any

from benchmarks.harness import (
    Contender,
    Group,
    Sample,
    Unavailable,
    percentile,
    run_group,
)
from benchmarks.servers import Context, unique_name
from benchmarks.suites.orm_sqlalchemy import empty, verify

TASKS = 200
TICK = 0.001
DELAY = 0.1
SLOW_BLOCK = 1000
AUTOSEQ = "autoseq SequenceField"
IDENTITY = "Identity()"
SLOW = f"autoseq, store delayed {DELAY * 1000:.0f} ms per reservation"
WORST = "worst stall ms"


class Setup:
    """One model per contender on PostgreSQL, an async engine, and autoseq installed."""

    def __init__(self, ctx: Context) -> None:
        try:
            import sqlalchemy as sa
            from sqlalchemy.engine import make_url
            from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
            from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

            import autoseq.sqlalchemy as integration
            from autoseq import BufferPolicy, SequenceRegistry
            from autoseq.stores import SQLStore
            from autoseq.testing import FlakyStore
        except ImportError as exc:
            raise Unavailable(f"cannot import the asyncio stack: {exc}") from exc
        if importlib.util.find_spec("asyncpg") is None:
            raise Unavailable("asyncpg is not installed")
        url = ctx.sql_url("postgres")
        self.engine = sa.create_engine(url)
        self.async_engine = create_async_engine(
            make_url(url).set(drivername="postgresql+asyncpg"), pool_size=20, max_overflow=0
        )
        # A store per autoseq contender, so each trial counts its own reservations.
        self.store = SQLStore(self.engine, table=unique_name("sys"))
        self.slow_store = SQLStore(self.engine, table=unique_name("sys"))
        for store in (self.store, self.slow_store):
            store.create_table()

        class Base(DeclarativeBase):
            pass

        def model(label: str, key: Any) -> Any:
            return type(
                f"Async{label}Row",
                (Base,),
                {
                    "__tablename__": unique_name(f"as_{label.lower()}"),
                    "id": key,
                    "name": mapped_column(sa.String(50)),
                    "__annotations__": {"id": Mapped[int], "name": Mapped[str]},
                },
            )

        self.models = {
            AUTOSEQ: model("Autoseq", integration.SequenceField(primary_key=True)),
            IDENTITY: model(
                "Identity", mapped_column(sa.BigInteger, sa.Identity(), primary_key=True)
            ),
            SLOW: model("Slow", integration.SequenceField(primary_key=True)),
        }
        self.metadata = Base.metadata
        # Only the benchmark's own tables: the store here is on a table of its own, and the
        # declared default sys_sequence of a shared server is not the benchmark's to drop.
        self.own_tables = integration.application_tables(self.metadata)
        self.metadata.create_all(self.engine, tables=self.own_tables)
        self.makers = {
            name: async_sessionmaker(self.async_engine, expire_on_commit=False)
            for name in self.models
        }
        integration.install(self.makers[AUTOSEQ], registry=SequenceRegistry(self.store))
        slow = SequenceRegistry(
            FlakyStore(self.slow_store, delay=DELAY),
            policy=BufferPolicy(max_batch_count=SLOW_BLOCK),
        )
        integration.install(self.makers[SLOW], registry=slow)
        self.stores = {AUTOSEQ: self.store, SLOW: self.slow_store}
        self.integration = integration
        self.loop = asyncio.new_event_loop()

    def trial(self, name: str, commits: int, rows: int) -> Sample:
        model, maker, store = self.models[name], self.makers[name], self.stores.get(name)
        empty(self.engine, model)
        before = store.reservations if store else 0
        gaps, seconds = self.loop.run_until_complete(_measure(maker, model, commits, rows))
        reservations = store.reservations - before if store else 0
        n = TASKS * commits * rows
        verify(self.engine, model, n)
        stalls = sorted(max(0.0, gap - TICK) * 1000 for gap in gaps)
        return Sample(
            n,
            seconds,
            {
                WORST: stalls[-1],
                "p99 stall ms": percentile(stalls, 0.99),
                "median stall ms": percentile(stalls, 0.5),
                "reservations": reservations,
            },
        )

    def close(self) -> None:
        for maker in self.makers.values():
            with contextlib.suppress(Exception):
                self.integration.uninstall(maker)
        self.loop.run_until_complete(self.async_engine.dispose())
        self.loop.close()
        with contextlib.suppress(Exception):
            self.metadata.drop_all(self.engine, tables=self.own_tables)
        for store in (self.store, self.slow_store):
            store.drop()
            store.close()
        self.engine.dispose()


async def _measure(maker: Any, model: Any, commits: int, rows: int) -> tuple[list[float], float]:
    """Run the tasks with the ticker beside them: (the ticker's gaps, the tasks' wall time)."""
    gaps: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(TICK)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async def task(t: int) -> None:
        for c in range(commits):
            async with maker() as session:
                session.add_all([model(name=f"t{t} c{c} r{r}") for r in range(rows)])
                await session.commit()

    watching = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    try:
        await asyncio.gather(*(task(t) for t in range(TASKS)))
    finally:
        seconds = time.perf_counter() - started
        stop.set()
        await watching
    return gaps, seconds


def run(ctx: Context) -> list[Group]:
    commits, rows = ctx.n(5, 2), ctx.n(10, 5)
    title = f"event loop's worst stall, {TASKS} tasks inserting through AsyncSession, PostgreSQL"
    worst = Group("asyncio", title, "ms", subject=AUTOSEQ, metric=WORST, higher_is_better=False)
    try:
        setup = Setup(ctx)
    except Unavailable as exc:
        worst.unavailable = str(exc)
        return [worst]
    try:
        contenders: list[Contender | tuple[str, str]] = [
            Contender(name, functools.partial(setup.trial, name, commits, rows))
            for name in setup.models
        ]
        run_group(worst, contenders, ctx.n(7, 2), log=ctx.log)
    finally:
        setup.close()
    worst.notes.append(
        f"{TASKS} tasks x {commits} commits x {rows} rows (add_all); ticker sleeps "
        f"{TICK * 1000:.0f} ms, a stall is how late it wakes; slow store: blocks of "
        f"{SLOW_BLOCK}, {DELAY * 1000:.0f} ms per reservation"
    )
    where = f"{TASKS} tasks inserting through AsyncSession, PostgreSQL"
    groups = [
        worst,
        worst.view(f"p99 stall, {where}", "ms", "p99 stall ms", higher_is_better=False),
        worst.view(f"rows/s, {where}", "rows/s", "rate", higher_is_better=True),
    ]
    _check(ctx, worst)
    return groups


def _check(ctx: Context, worst: Group) -> None:
    ours, native, slow = worst.get(AUTOSEQ), worst.get(IDENTITY), worst.get(SLOW)
    if not (ours and native and ours.samples and native.samples):
        return
    mine, theirs = ours.median(WORST) or 0.0, native.median(WORST) or 0.0
    detail = (
        f"median of the worst stalls {mine:.1f} ms vs {theirs:.1f} ms with Identity() "
        f"(repeats {min(ours.values(WORST)):.1f}..{max(ours.values(WORST)):.1f} vs "
        f"{min(native.values(WORST)):.1f}..{max(native.values(WORST)):.1f})"
    )
    if slow and slow.samples:
        detail += (
            f"; with a {DELAY * 1000:.0f} ms store: {slow.median(WORST):.1f} ms worst stall, "
            f"{slow.median('reservations'):.0f} reservations per trial"
        )
    ctx.check(
        "issue 16: asyncio, the loop's worst stall with autoseq <= with Identity()",
        mine <= theirs,
        detail,
    )
