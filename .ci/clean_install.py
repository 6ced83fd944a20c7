"""Each extra installed alone into a fresh virtual environment runs its quick start verbatim.

The development install pulls every extra, so a dependency that one extra
forgets (greenlet under SQLAlchemy 2.1) never shows in ``make test``. Here
each case copies the checkout (the files git tracks or would track, as an
archive of it holds), makes its own venv with only
``pip install "<copy>[extra]"`` (plus the SQLAlchemy pin it names), and runs
a quick start in an empty directory: the Python block that follows a
``<!-- clean-install: NAME -->`` line in README.md or a page of docs/.
Snippets read their server from an environment variable with a default
(``DATABASE_URL``, ``MONGODB_URL``, ``REDIS_URL``); here they get the
machine's servers (as in tests/backends.py; secantusdb started here for
MongoDB), each case in its own database, dropped afterwards, and the
script checks that the snippet's rows landed there. Two cases run at a
time. Exit status 1 names every case that failed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import venv
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POSTGRES_URL = os.environ.get(
    "AUTOSEQ_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("AUTOSEQ_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
# The tests use database 15; the quick starts get their own.
REDIS_URL = os.environ.get("AUTOSEQ_CLEAN_INSTALL_REDIS_URL", "redis://127.0.0.1:6379/14")
MARKER = re.compile(r"<!-- clean-install: ([\w-]+) -->\n```python\n(.*?)```", re.DOTALL)
SA_21, SA_20 = ["sqlalchemy>=2.1"], ["sqlalchemy<2.1"]
PARALLEL = 2


@dataclass
class Case:
    """One extra, alone in a venv, running one marked snippet (against ``server``)."""

    name: str
    extra: str
    snippet: str
    pins: list[str] = field(default_factory=list)
    server: str | None = None


CASES = [
    Case("sqlalchemy-2.1", "sqlalchemy", "sqlalchemy", SA_21),
    Case("sqlalchemy-2.0", "sqlalchemy", "sqlalchemy", SA_20),
    Case("postgres-2.1", "postgres", "sqlalchemy", SA_21, "postgres"),
    Case("postgres-2.0", "postgres", "sqlalchemy", SA_20, "postgres"),
    Case("mysql-2.1", "mysql", "sqlalchemy", SA_21, "mysql"),
    Case("mysql-2.0", "mysql", "sqlalchemy", SA_20, "mysql"),
    Case("django-2.1", "django", "django", SA_21),
    Case("django-2.0", "django", "django", SA_20),
    Case("mongoengine", "mongoengine", "mongoengine", server="mongodb"),
    Case("redis", "redis", "redis", server="redis"),
    Case("prometheus", "prometheus", "prometheus"),
]


def snippets() -> dict[str, str]:
    """Every marked Python block of README.md and docs/*.md, by name."""
    found: dict[str, str] = {}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name, code in MARKER.findall(page.read_text()):
            if name in found:
                raise SystemExit(f"clean-install snippet {name!r} is marked twice ({page})")
            found[name] = code
    return found


def copy_checkout(target: Path) -> Path:
    """The files an archive of the checkout holds, copied to ``target``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():  # a file deleted in the work tree is still listed
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


# the servers ------------------------------------------------------------------------------

Check = Callable[[], str | None]


@contextlib.contextmanager
def sql_database(server_url: str, case: str) -> Iterator[tuple[dict[str, str], Check]]:
    """A database of its own on ``server_url``'s server for ``case``, dropped afterwards."""
    import sqlalchemy as sa

    name = "autoseq_clean_" + re.sub(r"\W", "_", case)
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    url = sa.engine.make_url(server_url).set(database=name)

    def check() -> str | None:
        engine = sa.create_engine(url)
        try:
            with engine.connect() as connection:
                rows = connection.exec_driver_sql("SELECT count(*) FROM orders").scalar()
        finally:
            engine.dispose()
        return None if rows else f"no rows in {name}.orders: the snippet did not use the server"

    try:
        yield {"DATABASE_URL": url.render_as_string(hide_password=False)}, check
    finally:
        with admin.connect() as connection:
            force = " WITH (FORCE)" if admin.dialect.name == "postgresql" else ""
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}{force}")
        admin.dispose()


@contextlib.contextmanager
def redis_database() -> Iterator[tuple[dict[str, str], Check]]:
    """``REDIS_URL``'s database; the keys the snippet made are deleted afterwards."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    before = set(client.keys("*"))

    def check() -> str | None:
        made = set(client.keys("*")) - before
        return None if made else f"no keys made in {REDIS_URL}: the snippet did not use it"

    try:
        yield {"REDIS_URL": REDIS_URL}, check
    finally:
        made = set(client.keys("*")) - before
        if made:
            client.delete(*made)
        client.close()


@contextlib.contextmanager
def mongodb(directory: Path) -> Iterator[tuple[dict[str, str], Check]]:
    """secantusdb (a MongoDB wire-protocol server from PyPI) on a free port, stopped afterwards."""
    import pymongo

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "secantus", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--storage-path", str(directory / "mongo"), "--log-level", "WARNING"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"mongodb://127.0.0.1:{port}"
    client: pymongo.MongoClient[dict[str, object]] = pymongo.MongoClient(
        url, serverSelectionTimeoutMS=500
    )

    def check() -> str | None:
        found = sum(
            client[name]["ticket"].count_documents({}) for name in client.list_database_names()
        )
        return None if found else f"no tickets in {url}: the snippet did not use it"

    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client.admin.command("ping")
                break
            except pymongo.errors.PyMongoError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"secantusdb did not start: {' '.join(command)}") from None
                time.sleep(0.2)
        yield {"MONGODB_URL": url}, check
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=30)


@contextlib.contextmanager
def server_for(case: Case, directory: Path) -> Iterator[tuple[dict[str, str], Check]]:
    """The environment the case's snippet reads its server from, and how to check it was used."""
    if case.server == "postgres":
        with sql_database(POSTGRES_URL, case.name) as found:
            yield found
    elif case.server == "mysql":
        with sql_database(MYSQL_URL, case.name) as found:
            yield found
    elif case.server == "redis":
        with redis_database() as found:
            yield found
    elif case.server == "mongodb":
        with mongodb(directory) as found:
            yield found
    else:
        yield {}, lambda: None


# one case -----------------------------------------------------------------------------------


def run_case(case: Case, code: str) -> str | None:
    """None when the extra installed alone and its quick start ran; else what went wrong."""
    with tempfile.TemporaryDirectory(prefix=f"autoseq-clean-{case.name}-") as tmp:
        directory = Path(tmp)
        checkout = copy_checkout(directory / "autoseq")
        env_dir = directory / "venv"
        venv.create(env_dir, with_pip=True)
        python = str(env_dir / "bin" / "python")
        install = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        install += [f"{checkout}[{case.extra}]", *case.pins]
        done = subprocess.run(install, capture_output=True, text=True, check=False)
        if done.returncode:
            return f"pip install failed: {done.stderr.strip()[-2000:]}"
        script = directory / "quickstart.py"
        script.write_text(code)
        work = directory / "work"
        work.mkdir()
        with server_for(case, directory) as (variables, check):
            # Nothing of this interpreter's environment leaks in (PYTHONPATH, other URLs).
            clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
            for name in ("DATABASE_URL", "MONGODB_URL", "REDIS_URL"):
                clean.pop(name, None)
            ran = subprocess.run(
                [python, str(script)],
                cwd=work,
                env={**clean, **variables},
                capture_output=True,
                text=True,
                check=False,
            )
            if ran.returncode:
                return f"quick start failed: {ran.stderr.strip()[-2000:]}"
            return check()


def main(names: list[str]) -> int:
    """Run every case, or those named on the command line (``clean_install.py redis``)."""
    found = snippets()
    missing = sorted({case.snippet for case in CASES} - set(found))
    if missing:
        print(f"no <!-- clean-install: NAME --> block for {missing}", file=sys.stderr)
        return 1
    unknown = sorted(set(names) - {case.name for case in CASES})
    if unknown:
        print(f"no case {unknown}; cases: {[case.name for case in CASES]}", file=sys.stderr)
        return 2
    cases = [case for case in CASES if not names or case.name in names]
    started = time.monotonic()

    def timed(case: Case) -> tuple[str | None, float]:
        begun = time.monotonic()
        return run_case(case, found[case.snippet]), time.monotonic() - begun

    failed = []
    with ThreadPoolExecutor(PARALLEL) as pool:
        for case, (problem, seconds) in zip(cases, pool.map(timed, cases), strict=True):
            status = "ok" if problem is None else "FAILED"
            print(
                f"clean install {case.name} [{case.extra}]: {status} ({seconds:.0f} s)", flush=True
            )
            if problem is not None:
                print(problem, file=sys.stderr)
                failed.append(case.name)
    took = time.monotonic() - started
    print(f"clean installs: {len(cases) - len(failed)} of {len(cases)} cases ran ({took:.0f} s)")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
