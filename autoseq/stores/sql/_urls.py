"""Where a ``SQLStore`` keeps its table for an application's database URL.

An asyncio driver is swapped for its sync counterpart; on SQLite the rows
live in a companion file beside the application's (see the package's
docstring for why), and an in-memory database gets a private in-memory one.
"""

from __future__ import annotations

import os

from sqlalchemy.engine import make_url
from sqlalchemy.engine.url import URL

from autoseq.errors import MissingDriver as MissingDriver  # its home before 0.x

SIDECAR_SUFFIX = ".autoseq"

#: The sync driver a store uses where the application's URL names an asyncio
#: one: a reservation is a short blocking round trip, made mostly by the
#: prefetch thread, so it needs no event loop. Driver-specific query options
#: do not carry over; give ``SQLStore`` a sync URL of your own for those.
SYNC_DRIVERS = {
    "aiosqlite": "pysqlite",
    "asyncpg": "psycopg",
    "psycopg_async": "psycopg",
    "aiomysql": "pymysql",
    "asyncmy": "pymysql",
}


#: The extra of autoseq that installs each sync driver a store may need.
DRIVER_EXTRAS = {"psycopg": "postgres", "psycopg2": "postgres", "pymysql": "mysql"}


def check_driver(app_url: URL | str) -> None:
    """Raise ``MissingDriver`` unless the store for ``app_url`` can import its driver.

    An application on an asyncio driver (asyncpg) reserves through the sync
    one (psycopg), which it may never have installed; better said at
    ``install()`` than as a bare ``ModuleNotFoundError`` at the first commit.
    """
    url, _ = store_url(make_url(app_url))
    try:
        url.get_dialect().import_dbapi()
    except ImportError as exc:
        driver = url.get_driver_name()
        extra = DRIVER_EXTRAS.get(driver)
        hint = f"pip install 'autoseq[{extra}]'" if extra else f"install the {driver} package"
        via = (
            f" (autoseq reserves through {driver}, the sync driver for "
            f"{make_url(app_url).get_driver_name()})"
            if url.drivername != make_url(app_url).drivername
            else ""
        )
        raise MissingDriver(
            f"the sequence store for {url.render_as_string(hide_password=True)} needs the "
            f"{driver} driver{via}, which is not installed ({exc}); {hint}, or give "
            "install() a store=SQLStore(<a sync URL>)"
        ) from exc


def sync_driver_url(url: URL) -> URL:
    """``url`` with an asyncio driver swapped for its sync counterpart (``SYNC_DRIVERS``).

    For what autoseq reads or writes outside the application's event loop
    (a reservation, the ``max()`` of the keys a new row must start past):
    an asyncio driver can only run inside SQLAlchemy's greenlet.
    """
    sync_driver = SYNC_DRIVERS.get(url.get_driver_name())
    if sync_driver is None:
        return url
    return url.set(drivername=f"{url.get_backend_name()}+{sync_driver}")


def store_url(url: URL) -> tuple[URL, bool]:
    """Where the store keeps its table for an application URL; True when private memory.

    An asyncio driver is swapped for its sync counterpart (``SYNC_DRIVERS``).
    """
    url = sync_driver_url(url)
    if url.get_backend_name() != "sqlite":
        return url, False
    database = url.database or ""
    in_memory = "mode=memory" in database or url.query.get("mode") == "memory"
    if database.endswith(SIDECAR_SUFFIX):
        # A companion named by its owner; in memory, a shared-cache name that
        # the application's own connections can attach.
        return url, in_memory
    if database in ("", ":memory:") or in_memory:
        return make_url("sqlite://"), True
    if not database.startswith("file:"):
        # Two paths to one file (a symlinked release directory) must find
        # one companion, or each would hand out the same keys.
        database = os.path.realpath(database)
    return url.set(database=database + SIDECAR_SUFFIX), False
