"""The servers a run measures on, found once per run; unique names so runs never collide.

PostgreSQL and MariaDB are shared with other people's test runs, so every
table, sequence and collection a benchmark makes has a unique name and is
dropped afterwards. The MongoDB-compatible server (secantusdb) is started by
the run itself on a free port and stopped at the end, unless
``AUTOSEQ_MONGO_URL`` points at a running one.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import Group, Unavailable

POSTGRES_URL = os.environ.get(
    "AUTOSEQ_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("AUTOSEQ_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
REDIS_URL = os.environ.get("AUTOSEQ_REDIS_URL", "redis://127.0.0.1:6379/15")
SQL_BACKENDS = ("sqlite", "postgres", "mysql")
BACKEND_LABELS = {"sqlite": "SQLite", "postgres": "PostgreSQL", "mysql": "MariaDB"}


def unique_name(prefix: str) -> str:
    """A table/sequence/collection name no one else uses."""
    return f"bench_{prefix}_{uuid.uuid4().hex[:10]}"


def emptying_sql(dialect: str, quoted_table: str) -> str:
    """The statement that empties a table before a trial (untimed).

    ``TRUNCATE`` on the servers, so every trial writes into a fresh table and
    index, not into one holding the last trial's dead rows until a vacuum
    (which then lands in some trials and not others); SQLite's ``DELETE``
    without ``WHERE`` already empties the file's pages.
    """
    verb = "DELETE FROM" if dialect == "sqlite" else "TRUNCATE TABLE"
    return f"{verb} {quoted_table}"


@functools.cache
def sql_problem(url: str) -> str | None:
    """Why ``url`` cannot be used, or None when a ``SELECT 1`` works."""
    try:
        import sqlalchemy as sa

        engine = sa.create_engine(url, connect_args={"connect_timeout": 3})
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        return f"cannot connect: {type(exc).__name__}: {exc}".splitlines()[0]
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Context:
    """What every suite gets: the scale of the run, a scratch folder, the servers."""

    quick: bool
    workdir: Path
    log_lines: list[str] = field(default_factory=list)
    checks: list[dict[str, object]] = field(default_factory=list)
    cleanups: list[Callable[[], None]] = field(default_factory=list)
    _mongo_url: str | None = None
    _mongo_problem: str | None = None
    _mongo_process: subprocess.Popen[bytes] | None = None

    @property
    def repeats(self) -> int:
        return 3 if self.quick else 5

    @property
    def insert_repeats(self) -> int:
        """Repeats of the SQLAlchemy and Django insert groups, whose ratios sit near 0.97x."""
        return 2 if self.quick else 11

    def n(self, full: int, quick: int) -> int:
        """A workload size: ``full`` in a full run, ``quick`` with ``--quick``."""
        return quick if self.quick else full

    def log(self, line: str) -> None:
        self.log_lines.append(line)
        print(line, flush=True)

    def check(self, name: str, passed: bool, detail: str, **figures: object) -> None:
        """Record a target (issue 2, issue 5) with the figures that decide it."""
        self.checks.append({"name": name, "passed": passed, "detail": detail, **figures})
        self.log(f"  check {'PASS' if passed else 'MISS'}: {name}: {detail}")

    def floor_check(self, group: Group, floor: str, native: str) -> None:
        """Issue 16, target 3: ``group``'s subject >= 0.97x ``floor``, keys set by the caller.

        ``floor`` is the same model (or the same column type) with keys the
        caller sets: the floor of any explicit-key generator. The ratio to
        ``native`` (the database's own key) is reported beside it, with what
        sending the key costs per row whoever chose it (``floor`` vs
        ``native``), which explains the gap between the two ratios.
        """
        ratio, against_native = group.ratio(floor), group.ratio(native)
        keyed, plain = group.get(floor), group.get(native)
        if ratio is None or keyed is None or plain is None:
            return
        keyed_rate, plain_rate = keyed.median(), plain.median()
        column = ""
        if keyed_rate and plain_rate:
            extra = (1 / keyed_rate - 1 / plain_rate) * 1e6
            column = f"; the key column costs {extra:+.1f} us per row (keys set vs {native})"
            group.notes.append(column[2:])
        against = ""
        if against_native:
            low, high = against_native[1], against_native[2]
            against = f"; vs {native} {against_native[0]:.2f}x ({low:.2f}..{high:.2f})"
        self.check(
            f"issue 16: {group.title} >= 0.97x keys set by the caller",
            ratio[0] >= 0.97,
            f"{ratio[0]:.2f}x (repeats {ratio[1]:.2f}..{ratio[2]:.2f}){against}{column}",
        )

    def sqlite_url(self, label: str) -> str:
        """A fresh SQLite file of this run."""
        return f"sqlite:///{self.workdir / (unique_name(label) + '.db')}"

    def sql_url(self, backend: str) -> str:
        """The URL of ``backend``; raises :class:`Unavailable` if its server is not reachable."""
        if backend == "sqlite":
            return self.sqlite_url("db")
        url = {"postgres": POSTGRES_URL, "mysql": MYSQL_URL}[backend]
        problem = sql_problem(url)
        if problem:
            raise Unavailable(f"{BACKEND_LABELS[backend]} {problem}")
        return url

    def mongo_url(self) -> str:
        """A MongoDB wire-protocol server: AUTOSEQ_MONGO_URL or a secantusdb started here."""
        if self._mongo_url:
            return self._mongo_url
        if self._mongo_problem:
            raise Unavailable(self._mongo_problem)
        given = os.environ.get("AUTOSEQ_MONGO_URL")
        if given:
            self._mongo_url = given
            return given
        try:
            self._mongo_url = self._start_secantus()
        except Unavailable as exc:
            self._mongo_problem = str(exc)
            raise
        return self._mongo_url

    def _start_secantus(self) -> str:
        try:
            import pymongo
        except ImportError as exc:
            raise Unavailable("pymongo is not installed") from exc
        storage = self.workdir / "secantus"
        storage.mkdir(exist_ok=True)
        port = free_port()
        log = open(self.workdir / "secantus.log", "wb")  # noqa: SIM115 - lives as long as the server
        self._mongo_process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "secantus",
                "--port",
                str(port),
                "--storage-path",
                str(storage),
                "--log-level",
                "WARNING",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"mongodb://127.0.0.1:{port}/"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._mongo_process.poll() is not None:
                raise Unavailable(
                    f"secantusdb exited with status {self._mongo_process.returncode}; "
                    f"see {self.workdir / 'secantus.log'}"
                )
            try:
                client: pymongo.MongoClient[dict[str, object]] = pymongo.MongoClient(
                    url, serverSelectionTimeoutMS=500
                )
                client.admin.command("ping")
                client.close()
                return url
            except Exception:
                time.sleep(0.2)
        self.stop()
        raise Unavailable("secantusdb did not answer within 30 s")

    def stop(self) -> None:
        """Undo what this run made (last first) and stop what it started."""
        while self.cleanups:
            try:
                self.cleanups.pop()()
            except Exception as exc:
                print(f"cleanup failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        process, self._mongo_process = self._mongo_process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def run_context(quick: bool) -> Iterator[Context]:
    """A :class:`Context` with its scratch folder, torn down (servers stopped) afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="autoseq-bench-"))
    ctx = Context(quick=quick, workdir=workdir)
    try:
        yield ctx
    finally:
        ctx.stop()
        shutil.rmtree(workdir, ignore_errors=True)
