"""The MongoDB server for the tests (a pytest plugin, loaded from conftest).

``AUTOSEQ_MONGO_URL`` names a real MongoDB to use. Without it, the session
starts secantusdb (a MongoDB wire-protocol server from PyPI) on a free port
with its data in a temporary directory, and stops it when the session ends.
A server that cannot be reached or started skips the MongoDB tests, or
fails them when ``AUTOSEQ_REQUIRE_BACKENDS`` names ``mongodb``.

What secantusdb 0.7 was seen to do here. ``find_one_and_update`` (upsert,
``$setOnInsert``, ``w="majority"``), ``insert_many``, sessions and
transactions (``ClientSession.bind()`` included) and ``drop_database`` work
as on MongoDB; the loser of a race of upserts may get no document back
instead of a DuplicateKeyError. Writes get ~20x slower once the oplog holds
``--oplog-max-entries`` entries (it then prunes on every write), hence the
huge cap below. ``findAndModify`` slows down as its collection grows (a
matching replacement took ~90 ms at 10,000 documents), and mongoengine's
``save()`` of a new document with a key sends one before its insert, so
saves into a large collection are slow: tests keep those collections small
and put volume in bulk inserts. ``insert(load_bulk=True)`` (its ``$in``
read-back) is slow for thousands of documents too.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from backends import unavailable

MONGO_URL = os.environ.get("AUTOSEQ_MONGO_URL", "")
START_TIMEOUT = 30.0


class MongoServer:
    """A reachable MongoDB server: its URL, and secantusdb's process when we started it."""

    def __init__(self, url: str, process: subprocess.Popen[bytes] | None, log: Path | None):
        self.url = url
        self.process = process
        self.log = log

    def client(self, **kwargs: Any) -> Any:
        """A new pymongo client on this server (the caller closes it)."""
        import pymongo

        return pymongo.MongoClient(self.url, serverSelectionTimeoutMS=5000, **kwargs)

    def stop(self) -> None:
        """Stop the server we started (a real MongoDB is left alone)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)


def _problem(url: str, timeout: float) -> str | None:
    try:
        import pymongo

        client: Any = pymongo.MongoClient(url, serverSelectionTimeoutMS=int(timeout * 1000))
        try:
            client.admin.command("ping")
        finally:
            client.close()
    except Exception as exc:
        return f"cannot reach {url}: {type(exc).__name__}: {exc}".splitlines()[0]
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(lines[-5:])


def start_secantus(directory: Path) -> MongoServer | str:
    """Start secantusdb in ``directory``; the server, or why it did not start."""
    port = _free_port()
    log = directory / "secantus.log"
    command = [
        sys.executable,
        "-m",
        "secantus",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--storage-path",
        str(directory / "data"),
        "--log-level",
        "WARNING",
        # Once its oplog reaches the cap (or entries pass the retention),
        # secantusdb prunes on every write and writes get ~20x slower; a test
        # session never needs the oplog, so it is never allowed to fill.
        "--oplog-max-entries",
        str(10**9),
        "--oplog-retention-seconds",
        str(30 * 24 * 3600),
    ]
    with log.open("wb") as out:
        try:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=directory)
        except OSError as exc:
            return f"cannot run {' '.join(command)}: {exc}"
    url = f"mongodb://127.0.0.1:{port}"
    server = MongoServer(url, process, log)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return f"secantusdb exited with status {process.returncode}: {_tail(log)}"
        if _problem(url, 0.5) is None:
            return server
        time.sleep(0.1)
    server.stop()
    return f"secantusdb did not answer on {url} within {START_TIMEOUT:.0f}s: {_tail(log)}"


@pytest.fixture(scope="session")
def mongo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MongoServer]:
    """The session's MongoDB server (AUTOSEQ_MONGO_URL, or secantusdb started here)."""
    if MONGO_URL:
        problem = _problem(MONGO_URL, 5.0)
        if problem:
            unavailable("mongodb", problem)
        yield MongoServer(MONGO_URL, None, None)
        return
    started = start_secantus(tmp_path_factory.mktemp("secantus"))
    if isinstance(started, str):
        unavailable("mongodb", started)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def mongo_db_name(mongo_server: MongoServer) -> Iterator[str]:
    """A database name no other test uses, dropped afterwards."""
    name = f"autoseq_{uuid.uuid4().hex[:12]}"
    yield name
    client = mongo_server.client()
    try:
        client.drop_database(name)
    finally:
        client.close()


class CommandLog:
    """Records every command a pymongo client sends, with the collection it targets.

    Pass ``log.listener`` in a client's ``event_listeners``.
    """

    def __init__(self) -> None:
        from pymongo import monitoring

        self.commands: list[tuple[str, Any]] = []
        commands = self.commands

        class Listener(monitoring.CommandListener):
            def started(self, event: monitoring.CommandStartedEvent) -> None:
                commands.append((event.command_name, event.command.get(event.command_name)))

            def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
                pass

            def failed(self, event: monitoring.CommandFailedEvent) -> None:
                pass

        self.listener = Listener()

    def count(self, collection: str, command: str | None = None) -> int:
        """Commands sent to ``collection`` (only those named ``command``, if given)."""
        return sum(
            1
            for name, target in self.commands
            if target == collection and (command is None or name == command)
        )


@pytest.fixture
def command_log() -> CommandLog:
    """The commands the test's mongoengine connection sends."""
    return CommandLog()


@pytest.fixture
def me_db(mongo_server: MongoServer, mongo_db_name: str, command_log: CommandLog) -> Iterator[Any]:
    """mongoengine's default alias on a fresh database; autoseq's sequences closed after."""
    import mongoengine

    from autoseq_mongoengine import sequences

    mongoengine.connect(
        db=mongo_db_name,
        host=mongo_server.url,
        serverSelectionTimeoutMS=5000,
        uuidRepresentation="standard",
        event_listeners=[command_log.listener],
    )
    yield mongoengine.get_db()
    sequences.close()
    mongoengine.disconnect()


#: The servers the mongoengine field's tests run on: a real one, then mongomock.
ME_SERVERS = [
    pytest.param("secantusdb", id="secantusdb"),
    pytest.param("mongomock", id="mongomock"),
]
#: Fixtures only a real server has (command monitoring, restarts, other clients).
REAL_SERVER_ONLY = {"command_log", "mongo_server"}


def me_db_on(request: pytest.FixtureRequest, fixture: str = "me_db") -> Iterator[Any]:
    """mongoengine's default alias on a fresh database of ``request.param``'s server.

    For a module that overrides ``me_db`` with ``params=ME_SERVERS``: the real
    server comes from the shared ``me_db``; mongomock skips a test that needs
    what only a real server has.
    """
    if request.param != "mongomock":
        yield request.getfixturevalue(fixture)
        return
    if REAL_SERVER_ONLY & set(request.fixturenames):
        pytest.skip("needs a real server (command monitoring or other clients)")
    mongomock = pytest.importorskip("mongomock")
    import mongoengine

    from autoseq_mongoengine import sequences

    mongoengine.connect(
        db=f"mock_{uuid.uuid4().hex[:8]}",
        host="mongodb://localhost",
        mongo_client_class=mongomock.MongoClient,
        uuidRepresentation="standard",
    )
    yield mongoengine.get_db()
    sequences.close()
    mongoengine.disconnect()
