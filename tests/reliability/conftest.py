"""Reliability suite: the stores under test, one ``pytest.param`` line each.

A *target* is a real store on its real server, with what the scenarios need
beyond the store protocol: a JSON spec for worker processes, the server's
TCP address (for the fault proxy), raw access to the rows (to check that
nothing was written, or to corrupt a row by hand) and a recorder of the
queries sent. A new store plugs in with a target class and one line in
``TARGETS``.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from backends import sql_url, unavailable, unique_table
from sqlalchemy import event
from sqlalchemy.engine import make_url

from autoseq.stores.sql import store_url

from .harness import TALLIES
from .storespec import Spec, open_store

#: Scenarios tallied as a count of cases rather than line by line.
COUNTED = ("bad input", "security")


class SQLTarget:
    """``SQLStore`` on SQLite (file), PostgreSQL or MariaDB, on a fresh table."""

    kind = "sql"
    #: Table names that try to smuggle SQL in, or are no identifier at all.
    BAD_TABLES = ("seq; DROP TABLE sys_sequence; --", 'sys"sequence', "1seq", "x" * 64, None)

    def __init__(self, backend: str, tmp_path: Path) -> None:
        self.id = backend
        self.url = sql_url(backend, tmp_path)
        self.table = unique_table("rel")
        self.spec: Spec = {"kind": "sql", "url": self.url, "table": self.table}
        self._raw: sa.Engine | None = None
        self._stores: list[Any] = []

    # stores -----------------------------------------------------------------

    def open(self, spec: Spec | None = None, **options: Any) -> Any:
        """A store on this target (closed at teardown); ``spec`` defaults to ``self.spec``."""
        store = open_store(spec or self.spec, **options)
        self._stores.append(store)
        return store

    def fail_fast(self) -> dict[str, Any]:
        """Constructor options that make an unreachable server fail within a second or two."""
        return {"connect_timeout": 1, "max_retries": 3, "statement_timeout": 2.0}

    @property
    def address(self) -> tuple[str, int] | None:
        """The server's TCP address, or None when it has none (SQLite)."""
        url = make_url(self.url)
        if url.get_backend_name() == "sqlite":
            return None
        return url.host or "127.0.0.1", int(
            url.port or {"postgresql": 5432}.get(url.get_backend_name(), 3306)
        )

    def spec_via(self, port: int) -> Spec:
        """The spec with the server reached through ``127.0.0.1:port`` (a FaultProxy)."""
        url = make_url(self.url).set(host="127.0.0.1", port=port)
        return {**self.spec, "url": url.render_as_string(hide_password=False)}

    def open_source(self, source: Any) -> Any:
        """``SQLStore(source)``: what a caller passing something odd gets."""
        from autoseq.stores.sql import SQLStore

        return SQLStore(source)

    def open_table(self, index: int) -> Any:
        """A store on the ``index``-th of ``BAD_TABLES``."""
        return open_store({**self.spec, "table": self.BAD_TABLES[index]})

    # raw access -------------------------------------------------------------

    def tables(self) -> set[str]:
        """Which of our table and the bad table names exist (the database is shared)."""
        inspector = sa.inspect(self.raw)
        names = [self.table, *(t for t in self.BAD_TABLES if isinstance(t, str))]
        return {name for name in names if inspector.has_table(name)}

    @property
    def raw(self) -> sa.Engine:
        """An engine of our own on the database that holds the sequence table."""
        if self._raw is None:
            self._raw = sa.create_engine(store_url(make_url(self.url))[0])
        return self._raw

    def raw_table(self) -> sa.Table:
        return sa.Table(self.table, sa.MetaData(), autoload_with=self.raw)

    def rows(self) -> list[dict[str, Any]]:
        """Every stored row as plain data (``updated_at`` left out); [] without a table."""
        if not sa.inspect(self.raw).has_table(self.table):
            return []
        table = self.raw_table()
        with self.raw.connect() as connection:
            result = connection.execute(sa.select(table).order_by(table.c.name)).mappings()
            return [
                {
                    k: (bool(v) if k in ("batch", "cycle") else v)
                    for k, v in row.items()
                    if k != "updated_at"
                }
                for row in result
            ]

    def write_raw(self, name: str, **fields: Any) -> None:
        """Edit a row behind autoseq's back, as a person with a SQL prompt would."""
        table = self.raw_table()
        with self.raw.begin() as connection:
            result = connection.execute(
                sa.update(table).where(table.c.name == name).values(**fields)
            )
        assert result.rowcount == 1, f"no row {name!r} to edit"

    @contextmanager
    def recording(self, **options: Any) -> Iterator[tuple[Any, list[tuple[str, Any]]]]:
        """A store whose every statement is recorded as (SQL text, parameters)."""
        store = self.open(**options)
        sent: list[tuple[str, Any]] = []

        def record(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
            sent.append((statement, parameters))

        event.listen(store.engine, "before_cursor_execute", record)
        try:
            yield store, sent
        finally:
            event.remove(store.engine, "before_cursor_execute", record)

    def cleanup(self) -> None:
        for store in self._stores:
            store.close()
        if sa.inspect(self.raw).has_table(self.table):
            self.raw_table().drop(self.raw)
        self.raw.dispose()


class MongoTarget:
    """``MongoStore`` on the session's MongoDB (secantusdb, or ``AUTOSEQ_MONGO_URL``)."""

    kind = "mongo"
    BAD_TABLES = ("$cmd", "system.users", "a\x00b", ".hidden", None)

    def __init__(self, server: Any) -> None:
        self.id = "mongodb"
        self.server_url = server.url
        self.database = f"autoseq_rel_{uuid.uuid4().hex[:12]}"
        self.collection = unique_table("rel")
        # directConnection: pymongo must not follow the server's own idea of
        # its address, or traffic meant for the fault proxy would bypass it
        base = make_url_mongo(server.url)
        self.spec: Spec = {
            "kind": "mongo",
            "url": f"mongodb://{base[0]}:{base[1]}/{self.database}?directConnection=true",
            "collection": self.collection,
        }
        self._client: Any = None
        self._stores: list[Any] = []

    def open(self, spec: Spec | None = None, **options: Any) -> Any:
        store = open_store(spec or self.spec, **options)
        self._stores.append(store)
        return store

    def fail_fast(self) -> dict[str, Any]:
        return {"timeout": 1.0, "max_retries": 3}

    @property
    def address(self) -> tuple[str, int] | None:
        return make_url_mongo(self.server_url)

    def spec_via(self, port: int) -> Spec:
        url = f"mongodb://127.0.0.1:{port}/{self.database}?directConnection=true"
        return {**self.spec, "url": url}

    def open_source(self, source: Any) -> Any:
        from autoseq.stores.mongo import MongoStore

        return MongoStore(source)

    def open_table(self, index: int) -> Any:
        return open_store({**self.spec, "collection": self.BAD_TABLES[index]})

    def tables(self) -> set[str]:
        """The collections of this target's private database."""
        return set(self.raw.database.list_collection_names())

    @property
    def raw(self) -> Any:
        """A pymongo collection of our own on the sequence collection."""
        if self._client is None:
            import pymongo

            self._client = pymongo.MongoClient(self.spec["url"], serverSelectionTimeoutMS=5000)
        return self._client[self.database][self.collection]

    def rows(self) -> list[dict[str, Any]]:
        return [
            {"name": doc.pop("_id"), **{k: v for k, v in doc.items() if k != "updated_at"}}
            for doc in self.raw.find({}).sort("_id", 1)
        ]

    def write_raw(self, name: str, **fields: Any) -> None:
        result = self.raw.update_one({"_id": name}, {"$set": fields})
        assert result.matched_count == 1, f"no document {name!r} to edit"

    @contextmanager
    def recording(self, **options: Any) -> Iterator[tuple[Any, list[tuple[str, Any]]]]:
        """A store whose every command is recorded as (command name, command document)."""
        import pymongo
        from pymongo import monitoring

        from autoseq.stores.mongo import MongoStore

        sent: list[tuple[str, Any]] = []

        class Recorder(monitoring.CommandListener):
            def started(self, event: monitoring.CommandStartedEvent) -> None:
                sent.append((event.command_name, event.command))

            def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
                pass

            def failed(self, event: monitoring.CommandFailedEvent) -> None:
                pass

        client: Any = pymongo.MongoClient(self.spec["url"], event_listeners=[Recorder()])
        store = MongoStore(client, collection=self.collection, database=self.database, **options)
        try:
            yield store, sent
        finally:
            store.close()
            client.close()

    def cleanup(self) -> None:
        for store in self._stores:
            store.close()
        if self._client is None:
            self.raw  # noqa: B018 - opens the client
        self._client.drop_database(self.database)
        self._client.close()


class RedisTarget:
    """``RedisStore`` on the Redis server, under a key prefix of its own."""

    kind = "redis"
    BAD_TABLES = ("a:b", "{slot}", "with space", "", None)

    def __init__(self) -> None:
        import redis
        from backends import REDIS_URL

        self.id = "redis"
        self.url = REDIS_URL
        self.prefix = unique_table("rel")
        self.spec: Spec = {"kind": "redis", "url": REDIS_URL, "prefix": self.prefix}
        try:
            self.raw = redis.Redis.from_url(REDIS_URL, socket_timeout=5, socket_connect_timeout=3)
            self.raw.ping()
        except redis.RedisError as exc:
            unavailable("redis", f"cannot reach {REDIS_URL}: {type(exc).__name__}: {exc}")
        self._stores: list[Any] = []

    def open(self, spec: Spec | None = None, **options: Any) -> Any:
        store = open_store(spec or self.spec, **options)
        self._stores.append(store)
        return store

    def fail_fast(self) -> dict[str, Any]:
        return {"socket_timeout": 1.0, "socket_connect_timeout": 1.0}

    @property
    def address(self) -> tuple[str, int] | None:
        url = make_url(self.url.replace("redis://", "redis+x://", 1))
        return url.host or "127.0.0.1", int(url.port or 6379)

    def spec_via(self, port: int) -> Spec:
        database = self.url.rsplit("/", 1)[1] if self.url.count("/") > 2 else "0"
        return {**self.spec, "url": f"redis://127.0.0.1:{port}/{database}"}

    def open_source(self, source: Any) -> Any:
        from autoseq.stores.redis import RedisStore

        return RedisStore(source)

    def open_table(self, index: int) -> Any:
        return open_store({**self.spec, "prefix": self.BAD_TABLES[index]})

    def _key(self, name: str) -> str:
        from urllib.parse import quote

        return f"{{{self.prefix}:{quote(name, safe='')}}}:seq"

    def tables(self) -> set[str]:
        """Every key under this target's prefix (the index, and each name's own keys)."""
        return {key.decode() for key in self.raw.scan_iter(match=f"{{{self.prefix}[:}}]*")}

    def rows(self) -> list[dict[str, Any]]:
        rows = []
        for key in sorted(self.raw.scan_iter(match=f"{{{self.prefix}:*}}:seq")):
            raw = {k.decode(): v.decode() for k, v in self.raw.hgetall(key).items()}
            row: dict[str, Any] = {"name": raw.pop("name")}
            for field, value in raw.items():
                if field in ("batch", "cycle"):
                    row[field] = value == "1"
                elif field != "updated_at":
                    row[field] = int(value)
            rows.append(row)
        return sorted(rows, key=lambda row: row["name"])

    def write_raw(self, name: str, **fields: Any) -> None:
        key = self._key(name)
        assert self.raw.exists(key), f"no hash {key!r} to edit"
        self.raw.hset(key, mapping={k: int(v) for k, v in fields.items()})

    @contextmanager
    def recording(self, **options: Any) -> Iterator[tuple[Any, list[tuple[str, Any]]]]:
        """A store on a client that records every command it sends, as (name, arguments)."""
        import redis

        from autoseq.stores.redis import RedisStore

        sent: list[tuple[str, Any]] = []

        class RecordingRedis(redis.Redis):  # type: ignore[type-arg]
            def execute_command(self, *args: Any, **kwargs: Any) -> Any:
                sent.append((str(args[0]), args[1:]))
                return super().execute_command(*args, **kwargs)

        client = RecordingRedis.from_url(self.url)
        store = RedisStore(client, prefix=self.prefix, **options)
        try:
            yield store, sent
        finally:
            client.close()

    def cleanup(self) -> None:
        for store in self._stores:
            store.close()
        keys = list(self.raw.scan_iter(match=f"{{{self.prefix}[:}}]*"))
        if keys:
            self.raw.delete(*keys)
        self.raw.close()


def make_url_mongo(url: str) -> tuple[str, int]:
    """Host and port of a single-host ``mongodb://`` URL."""
    hostport = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0]
    host, _, port = hostport.rpartition(":")
    return host or "127.0.0.1", int(port or 27017)


def mongo_target(request: pytest.FixtureRequest, tmp_path: Path) -> MongoTarget:
    return MongoTarget(request.getfixturevalue("mongo_server"))


def redis_target(request: pytest.FixtureRequest, tmp_path: Path) -> RedisTarget:
    return RedisTarget()


def sql_target_of(backend: str) -> Any:
    return lambda request, tmp_path: SQLTarget(backend, tmp_path)


#: Every store the scenarios run against: one line each.
TARGETS = [
    pytest.param(sql_target_of("sqlite"), id="sqlite"),
    pytest.param(sql_target_of("postgres"), id="postgres", marks=pytest.mark.postgres),
    pytest.param(sql_target_of("mysql"), id="mysql", marks=pytest.mark.mysql),
    pytest.param(mongo_target, id="mongodb", marks=pytest.mark.mongodb),
    pytest.param(redis_target, id="redis", marks=pytest.mark.redis),
]


def _made(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    made = request.param(request, tmp_path)
    yield made
    made.cleanup()


@pytest.fixture(params=TARGETS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Each store on its real server, on a fresh table or collection, cleaned up after."""
    yield from _made(request, tmp_path)


@pytest.fixture(params=[p for p in TARGETS if p.id != "sqlite"])
def network_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """Each store reached over TCP (the fault proxy goes in between)."""
    yield from _made(request, tmp_path)


@pytest.fixture(params=[p for p in TARGETS if p.id in ("sqlite", "postgres", "mysql")])
def sql_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLTarget]:
    """Each SQL database (the scenarios about SQL transactions and SQL text)."""
    yield from _made(request, tmp_path)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print every scenario's figures: values checked, duplicates, gaps, kills, outages."""
    if not TALLIES:
        return
    terminalreporter.section("reliability figures")
    counted: Counter[tuple[str, str]] = Counter()
    for row in TALLIES:
        if row["scenario"] in COUNTED:
            counted[row["store"], row["scenario"]] += 1
            continue
        figures = ", ".join(f"{k}={v}" for k, v in row.items() if k not in ("store", "scenario"))
        terminalreporter.write_line(f"{row['store']:<9} {row['scenario']:<22} {figures}")
    for (store, scenario), cases in sorted(counted.items()):
        terminalreporter.write_line(f"{store:<9} {scenario:<22} cases passed={cases}")
