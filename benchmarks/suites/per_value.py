"""Per-value generators on the same server: what one value costs with each.

Peers: django-sequences (``get_next_value``: one upsert per value;
``get_next_values``: one per bulk), the database's own sequence
(PostgreSQL ``nextval()``, MariaDB ``NEXTVAL()``) called once per value,
mongoengine's builtin ``SequenceField`` (one ``findAndModify`` per value) and
snowflake-id (no server at all), Redis ``INCR`` per value. autoseq runs on the same server with its
default settings (blocks of 100, growing adaptively). Round trips are counted
where they happen (Django's ``execute_wrapper``, pymongo command monitoring,
autoseq's store counter) and given per 100,000 values.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from autoseq import SequenceConfig, SequenceLock
from autoseq.stores import MemoryStore
from autoseq.testing import FlakyStore
from benchmarks import django_setup
from benchmarks.harness import Contender, Group, Sample, Unavailable, run_group, stopwatch
from benchmarks.servers import (
    BACKEND_LABELS,
    MYSQL_URL,
    POSTGRES_URL,
    REDIS_URL,
    Context,
    unique_name,
)
from benchmarks.suites.snowflake import ids

BULK = 1000
PER_100K = 100_000


class AutoseqSource:
    """A sequence on a store of the server under test, default settings."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.name = unique_name("pv")
        store.create(SequenceConfig(self.name))
        self.lock = SequenceLock(self.name, store)
        self.statements = 0
        engine = getattr(store, "engine", None)
        if engine is not None:
            from sqlalchemy import event

            event.listen(engine, "before_cursor_execute", self._count_statement)

    def _count_statement(self, *_args: Any) -> None:
        self.statements += 1

    def _sample(self, n: int, seconds: float, reservations: int, statements: int) -> Sample:
        counters = _per_100k(reservations, n)
        if getattr(self.store, "engine", None) is not None:
            counters["SQL statements per 100k values"] = statements * PER_100K / n
        return Sample(n, seconds, counters)

    def values(self, n: int) -> Sample:
        take = self.lock.next
        before, statements = self.store.reservations, self.statements
        with stopwatch() as elapsed:
            for _ in range(n):
                take()
        return self._sample(
            n, elapsed[0], self.store.reservations - before, self.statements - statements
        )

    def bulks(self, n: int) -> Sample:
        before, statements = self.store.reservations, self.statements
        with stopwatch() as elapsed:
            for _ in range(n // BULK):
                self.lock.next_many(BULK)
        return self._sample(
            n, elapsed[0], self.store.reservations - before, self.statements - statements
        )

    def close(self) -> None:
        self.lock.close(release=False)


def _per_100k(round_trips: float, values: int) -> dict[str, float]:
    """Calls that reach the server (reservations, upserts, findAndModify) per 100k values."""
    return {"server calls per 100k values": round_trips * PER_100K / values}


@contextlib.contextmanager
def sql_store(ctx: Context, backend: str) -> Iterator[Any]:
    from autoseq.stores import SQLStore

    store = SQLStore(ctx.sql_url(backend), table=unique_name("pv_sys"))
    store.create_table()
    try:
        yield store
    finally:
        store.drop()
        store.close()


class DjangoSequences:
    """django-sequences on one Django alias and its own table; each SQL statement is a call."""

    def __init__(self, ctx: Context, backend: str) -> None:
        self.using = django_setup.alias(ctx, backend)
        from sequences.models import Sequence

        # The app's table name is fixed; a unique one keeps shared servers apart.
        self.table = django_setup.rename_table(Sequence, "djseq")
        django_setup.create_table(Sequence, self.using)
        self.model = Sequence
        self.name = unique_name("s")

    @contextlib.contextmanager
    def counting(self) -> Iterator[list[int]]:
        from django.db import connections

        count = [0]

        def wrapper(execute: Callable[..., Any], *args: Any) -> Any:
            count[0] += 1
            return execute(*args)

        with connections[self.using].execute_wrapper(wrapper):
            yield count

    def values(self, n: int) -> Sample:
        from sequences import get_next_value

        with self.counting() as count, stopwatch() as elapsed:
            for _ in range(n):
                get_next_value(self.name, using=self.using)
        return Sample(n, elapsed[0], _per_100k(count[0], n))

    def bulks(self, n: int) -> Sample:
        from sequences import get_next_values

        with self.counting() as count, stopwatch() as elapsed:
            for _ in range(n // BULK):
                get_next_values(BULK, self.name, using=self.using)
        return Sample(n, elapsed[0], _per_100k(count[0], n))

    def close(self) -> None:
        from django.db import connections

        django_setup.drop_table(self.model, self.using)
        connections[self.using].close()


class PostgresNextval:
    """A PostgreSQL sequence, ``SELECT nextval()`` per value over psycopg (autocommit)."""

    def __init__(self) -> None:
        import psycopg
        from sqlalchemy.engine import make_url

        url = make_url(POSTGRES_URL)
        self.connection = psycopg.connect(
            host=url.host,
            port=url.port or 5432,
            user=url.username,
            password=url.password,
            dbname=url.database,
            autocommit=True,
        )
        self.name = unique_name("nextval")
        self.connection.execute(f'CREATE SEQUENCE "{self.name}"')

    def values(self, n: int) -> Sample:
        cursor = self.connection.cursor()
        query, params = "SELECT nextval(%s)", (self.name,)
        with stopwatch() as elapsed:
            for _ in range(n):
                cursor.execute(query, params)
                cursor.fetchone()
        return Sample(n, elapsed[0], _per_100k(n, n))

    def bulks(self, n: int) -> Sample:
        cursor = self.connection.cursor()
        query = "SELECT nextval(%s) FROM generate_series(1, %s)"
        with stopwatch() as elapsed:
            for _ in range(n // BULK):
                cursor.execute(query, (self.name, BULK))
                cursor.fetchall()
        return Sample(n, elapsed[0], _per_100k(n // BULK, n))

    def close(self) -> None:
        self.connection.execute(f'DROP SEQUENCE IF EXISTS "{self.name}"')
        self.connection.close()


class MariaDBNextval:
    """A MariaDB sequence (10.3+), ``SELECT NEXTVAL()`` per value over PyMySQL (autocommit)."""

    def __init__(self) -> None:
        import pymysql
        from sqlalchemy.engine import make_url

        url = make_url(MYSQL_URL)
        self.connection = pymysql.connect(
            host=url.host,
            port=url.port or 3306,
            user=url.username,
            password=url.password or "",
            database=url.database,
            autocommit=True,
        )
        self.name = unique_name("nextval")
        with self.connection.cursor() as cursor:
            cursor.execute(f"CREATE SEQUENCE `{self.name}`")

    def values(self, n: int) -> Sample:
        query = f"SELECT NEXTVAL(`{self.name}`)"
        with self.connection.cursor() as cursor, stopwatch() as elapsed:
            for _ in range(n):
                cursor.execute(query)
                cursor.fetchone()
        return Sample(n, elapsed[0], _per_100k(n, n))

    def close(self) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute(f"DROP SEQUENCE IF EXISTS `{self.name}`")
        self.connection.close()


def snowflake_values(n: int) -> Sample:
    """snowflake-id: no server; at most 4,096 values per millisecond by design."""
    try:
        from snowflake import SnowflakeGenerator
    except ImportError as exc:
        raise Unavailable("snowflake-id is not installed") from exc
    sample = ids(SnowflakeGenerator(1).__next__, n)
    sample.counters.update(_per_100k(0, n))
    return sample


def open_or_unavailable(factory: Callable[[], Any], label: str) -> Any:
    try:
        return factory()
    except Unavailable:
        raise
    except Exception as exc:
        raise Unavailable(f"{label}: {type(exc).__name__}: {exc}".splitlines()[0]) from exc


def sql_groups(ctx: Context, backend: str) -> list[Group]:
    label = BACKEND_LABELS[backend]
    single = Group(
        "per_value",
        f"one value per call, {label}",
        "values/s",
        subject=f"autoseq next() on {label}",
    )
    bulk = Group(
        "per_value",
        f"bulks of {BULK:,} values per call, {label}",
        "values/s",
        subject=f"autoseq next_many({BULK}) on {label}",
    )
    fast, slow = ctx.n(200_000, 20_000), ctx.n(5_000, 500)
    closers: list[Callable[[], None]] = []
    try:
        with sql_store(ctx, backend) as store:
            autoseq = AutoseqSource(store)
            closers.append(autoseq.close)
            singles: list[Contender | tuple[str, str]] = [
                Contender(single.subject, lambda: autoseq.values(fast))
            ]
            bulks: list[Contender | tuple[str, str]] = [
                Contender(bulk.subject, lambda: autoseq.bulks(fast))
            ]
            try:
                djseq = open_or_unavailable(
                    lambda: DjangoSequences(ctx, backend), "django-sequences"
                )
                closers.append(djseq.close)
                singles.append(
                    Contender("django-sequences get_next_value", lambda: djseq.values(slow))
                )
                bulks.append(
                    Contender(
                        f"django-sequences get_next_values({BULK})",
                        lambda: djseq.bulks(ctx.n(50_000, 10_000)),
                    )
                )
            except Unavailable as exc:
                singles.append(("django-sequences get_next_value", str(exc)))
                bulks.append((f"django-sequences get_next_values({BULK})", str(exc)))
            if backend == "postgres":
                nextval = open_or_unavailable(PostgresNextval, "nextval")
                closers.append(nextval.close)
                singles.append(
                    Contender("PostgreSQL nextval() per call", lambda: nextval.values(slow))
                )
                bulks.append(
                    Contender(
                        f"nextval() FROM generate_series(1, {BULK})",
                        lambda: nextval.bulks(ctx.n(50_000, 10_000)),
                    )
                )
                singles.append(
                    Contender(
                        "snowflake-id SnowflakeGenerator",
                        lambda: snowflake_values(fast),
                        note="no server",
                    )
                )
                # The same lock on a store with no server: what the PostgreSQL
                # store costs once its blocks are sized for the rate.
                memory = AutoseqSource(FlakyStore(MemoryStore()))
                closers.append(memory.close)
                singles.append(
                    Contender(
                        "autoseq next() on MemoryStore",
                        lambda: memory.values(fast),
                        note="no server",
                    )
                )
            if backend == "mysql":
                try:
                    mariadb = open_or_unavailable(MariaDBNextval, "NEXTVAL")
                    closers.append(mariadb.close)
                    singles.append(
                        Contender("MariaDB NEXTVAL() per call", lambda: mariadb.values(slow))
                    )
                except Unavailable as exc:
                    singles.append(("MariaDB NEXTVAL() per call", str(exc)))
            run_group(single, singles, ctx.repeats, log=ctx.log)
            run_group(bulk, bulks, ctx.repeats, log=ctx.log)
            for closer in reversed(closers):
                closer()
            closers.clear()
    except Unavailable as exc:
        single.unavailable = bulk.unavailable = str(exc)
    finally:
        for closer in reversed(closers):
            with contextlib.suppress(Exception):
                closer()
    single.notes.append(f"autoseq and snowflake: {fast:,} values per trial; others {slow:,}")
    return [single, bulk]


class MongoengineBuiltin:
    """mongoengine's own ``SequenceField``: one ``findAndModify`` per value."""

    def __init__(self, url: str, database: str) -> None:
        import mongoengine
        from pymongo import monitoring

        self.alias = unique_name("alias")
        self.collection = unique_name("counters")
        self.commands = 0
        outer = self

        class Listener(monitoring.CommandListener):
            def started(self, event: monitoring.CommandStartedEvent) -> None:
                if event.command_name.lower() == "findandmodify":
                    outer.commands += 1

            def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
                pass

            def failed(self, event: monitoring.CommandFailedEvent) -> None:
                pass

        mongoengine.connect(
            db=database, host=url, alias=self.alias, event_listeners=[Listener()], tz_aware=True
        )
        self.field = mongoengine.SequenceField(
            collection_name=self.collection, db_alias=self.alias, sequence_name=unique_name("s")
        )
        self.field.name = "id"

    def values(self, n: int) -> Sample:
        generate = self.field.generate
        before = self.commands
        with stopwatch() as elapsed:
            for _ in range(n):
                generate()
        return Sample(n, elapsed[0], _per_100k(self.commands - before, n))

    def close(self) -> None:
        import mongoengine
        from mongoengine.connection import get_db

        get_db(self.alias).drop_collection(self.collection)
        mongoengine.disconnect(self.alias)


def mongo_group(ctx: Context) -> Group:
    group = Group(
        "per_value",
        "one value per call, MongoDB protocol (secantusdb)",
        "values/s",
        subject="autoseq next() on MongoStore",
    )
    closers: list[Callable[[], None]] = []
    fast, slow = ctx.n(100_000, 10_000), ctx.n(3_000, 300)
    try:
        url = ctx.mongo_url()
        database = unique_name("db")
        try:
            from autoseq.stores.mongo import MongoStore
        except ImportError as exc:
            raise Unavailable(f"autoseq's MongoStore cannot be imported: {exc}") from exc
        store = MongoStore(url, collection=unique_name("sys"), database=database)
        closers.append(store.close)
        closers.append(store.drop)
        autoseq = AutoseqSource(store)
        closers.append(autoseq.close)
        contenders: list[Contender | tuple[str, str]] = [
            Contender(group.subject, lambda: autoseq.values(fast))
        ]
        try:
            builtin = open_or_unavailable(
                lambda: MongoengineBuiltin(url, database), "mongoengine SequenceField"
            )
            closers.append(builtin.close)
            contenders.append(
                Contender("mongoengine SequenceField.generate()", lambda: builtin.values(slow))
            )
        except Unavailable as exc:
            contenders.append(("mongoengine SequenceField.generate()", str(exc)))
        run_group(group, contenders, ctx.repeats, log=ctx.log)
        group.notes.append(f"autoseq: {fast:,} values per trial; mongoengine {slow:,}")
    except Unavailable as exc:
        group.unavailable = str(exc)
    finally:
        for closer in reversed(closers):
            with contextlib.suppress(Exception):
                closer()
    return group


class RedisIncr:
    """A Redis counter, ``INCR`` per value (the serial-number recipe)."""

    def __init__(self, url: str) -> None:
        import redis

        self.client = redis.Redis.from_url(url)
        self.key = unique_name("incr")

    def values(self, n: int) -> Sample:
        incr, key = self.client.incr, self.key
        with stopwatch() as elapsed:
            for _ in range(n):
                incr(key)
        return Sample(n, elapsed[0], _per_100k(n, n))

    def close(self) -> None:
        self.client.delete(self.key)
        self.client.close()


def redis_group(ctx: Context) -> Group:
    group = Group(
        "per_value",
        "one value per call, Redis",
        "values/s",
        subject="autoseq next() on RedisStore",
    )
    closers: list[Callable[[], None]] = []
    fast, slow = ctx.n(200_000, 20_000), ctx.n(5_000, 500)
    try:
        try:
            import redis

            from autoseq.stores.redis import RedisStore
        except ImportError as exc:
            raise Unavailable(f"redis or autoseq's RedisStore cannot be imported: {exc}") from exc
        try:
            redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
        except Exception as exc:
            raise Unavailable(f"Redis at {REDIS_URL}: {type(exc).__name__}: {exc}") from exc
        prefix = unique_name("redis")
        store = RedisStore(REDIS_URL, prefix=prefix)

        def drop_keys() -> None:
            keys = list(store.client.scan_iter(match=f"{{{prefix}}}*"))
            if keys:
                store.client.delete(*keys)

        closers += [store.close, drop_keys]
        autoseq = AutoseqSource(store)
        closers.append(autoseq.close)
        incr = RedisIncr(REDIS_URL)
        closers.append(incr.close)
        run_group(
            group,
            [
                Contender(group.subject, lambda: autoseq.values(fast)),
                Contender("Redis INCR per call", lambda: incr.values(slow)),
            ],
            ctx.repeats,
            log=ctx.log,
        )
        group.notes.append(f"autoseq: {fast:,} values per trial; INCR {slow:,}")
    except Unavailable as exc:
        group.unavailable = str(exc)
    finally:
        for closer in reversed(closers):
            with contextlib.suppress(Exception):
                closer()
    return group


def run(ctx: Context) -> list[Group]:
    groups: list[Group] = []
    started = time.perf_counter()
    for backend in ("postgres", "mysql", "sqlite"):
        groups.extend(sql_groups(ctx, backend))
    groups.append(mongo_group(ctx))
    groups.append(redis_group(ctx))
    ctx.log(f"   per-value groups took {time.perf_counter() - started:.1f} s")
    return groups
