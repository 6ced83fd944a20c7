"""Where a Django database's sequences live: its SQLAlchemy URL and the database holding them.

A row written to database ``W`` takes its values from the ``sys_sequence`` of
`sequence_database` (``W``): ``AUTOSEQ["DATABASE"]`` if set, else the alias a
router's ``db_for_write(SysSequence)`` names, else ``W`` itself. `database_url`
builds the SQLAlchemy URL from the alias's settings when used (so test
databases set up by Django's runner or pytest-django are the ones reached);
an in-memory SQLite database gets a shared-cache in-memory store named after
it, which Django's connections attach (`autoseq_django.sqlite`).

Low in the package: imports only `autoseq_django.conf`, so the registry
(`autoseq_django.registry`), the column look-ups (`autoseq_django.columns`)
and the SQLite companion (`autoseq_django.sqlite`) all build on it.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, router

from autoseq_django import conf

if TYPE_CHECKING:
    from sqlalchemy.engine.url import URL

# Django-only connection options that mean nothing to a DBAPI driver.
_DJANGO_ONLY_OPTIONS = frozenset(
    {
        "isolation_level",
        "assume_role",
        "server_side_binding",
        "pool",
        "cursor_factory",
        "context",
        "init_command",
        "transaction_mode",
        "timeout",
    }
)

_urls: dict[tuple[Any, ...], str] = {}


def sqlite_in_memory(name: object) -> bool:
    """True when a SQLite ``NAME`` is an in-memory database (tests, ``:memory:``)."""
    text = os.fspath(name) if isinstance(name, os.PathLike) else str(name or "")
    return text in ("", ":memory:") or "mode=memory" in text


def memory_companion_name(alias: str, name: object) -> str:
    """The shared-cache name of the in-memory store of an in-memory SQLite database.

    Named after the database (``file:memorydb_default?mode=memory&cache=shared``,
    Django's test database, gives ``memorydb_default.autoseq``) so that Django's
    connections can attach it (``autoseq_django.sqlite``); in-memory databases
    live in one process, and so does this name.
    """
    text = os.fspath(name) if isinstance(name, os.PathLike) else str(name or "")
    base = text[len("file:") :].split("?", 1)[0] if text.startswith("file:") else ""
    base = base.strip("/") or f"autoseq_memory_{alias}"
    return f"file:{base}.autoseq"


def memory_companion_url(alias: str, name: object) -> URL:
    """The SQLAlchemy URL of the in-memory store of in-memory database ``alias``."""
    from sqlalchemy.engine.url import URL

    return URL.create(
        "sqlite",
        database=memory_companion_name(alias, name),
        query={"mode": "memory", "cache": "shared", "uri": "true"},
    )


def database_url(alias: str) -> URL:
    """The SQLAlchemy URL of Django database ``alias`` (``AUTOSEQ["URLS"]`` wins)."""
    from sqlalchemy.engine.url import URL, make_url

    override = conf.get().urls.get(alias)
    if override:
        return make_url(override)
    connection = connections[alias]
    settings_dict = connection.settings_dict
    options = {
        key: str(value)
        for key, value in (settings_dict.get("OPTIONS") or {}).items()
        if key not in _DJANGO_ONLY_OPTIONS and isinstance(value, (str, int)) and value != ""
    }
    port = int(settings_dict["PORT"]) if settings_dict.get("PORT") else None
    common: dict[str, Any] = {
        "username": settings_dict.get("USER") or None,
        "password": settings_dict.get("PASSWORD") or None,
        "host": settings_dict.get("HOST") or None,
        "port": port,
    }
    vendor = connection.vendor
    if vendor == "sqlite":
        name = settings_dict.get("NAME")
        if sqlite_in_memory(name):
            return memory_companion_url(alias, name)
        path = os.fspath(name or "")
        if path.startswith("file:"):
            path = path[len("file:") :].split("?", 1)[0]
        return URL.create("sqlite", database=os.path.abspath(path))
    if vendor == "postgresql":
        driver = "psycopg" if importlib.util.find_spec("psycopg") else "psycopg2"
        return URL.create(
            f"postgresql+{driver}",
            database=settings_dict.get("NAME") or None,
            query=options,
            **common,
        )
    if vendor == "mysql":
        driver = "pymysql" if importlib.util.find_spec("pymysql") else "mysqldb"
        query = {key: options[key] for key in ("charset", "unix_socket") if key in options}
        query.setdefault("charset", "utf8mb4")
        if common["host"] and str(common["host"]).startswith("/"):
            query["unix_socket"] = str(common.pop("host"))
        return URL.create(
            f"mysql+{driver}", database=settings_dict.get("NAME") or None, query=query, **common
        )
    raise ImproperlyConfigured(
        f"autoseq_django cannot reach database {alias!r} (vendor {vendor!r}); it supports "
        "SQLite, PostgreSQL and MySQL/MariaDB. Set AUTOSEQ['URLS'] = "
        f"{{{alias!r}: '<SQLAlchemy URL>'}} to name the database yourself."
    )


def sequence_database(write_alias: str) -> str:
    """The alias whose ``sys_sequence`` serves rows written to ``write_alias``."""
    chosen = conf.get().database
    if chosen:
        return chosen
    # From Django's record of every model class defined, by app label: this
    # module sits below `autoseq_django.models` (whose manager reaches it
    # through `autoseq_django.sqlite`). Not `apps.get_model()`, which asks the
    # installed apps: Django's own tests narrow INSTALLED_APPS with
    # override_settings and still save rows keyed by our sequences.
    sys_sequence = apps.all_models["autoseq"].get("syssequence")
    if sys_sequence is None:  # the app's models were never imported: no router can know it
        return write_alias
    for candidate in router.routers:
        method = getattr(candidate, "db_for_write", None)
        if method is not None:
            alias = method(sys_sequence)
            if alias:
                return str(alias)
    return write_alias


def url_key(alias: str) -> str:
    """The URL of database ``alias``'s ``sys_sequence`` store, as a string (cached per settings)."""
    settings_dict = connections[alias].settings_dict
    key = (
        alias,
        settings_dict.get("ENGINE"),
        str(settings_dict.get("NAME")),
        settings_dict.get("HOST"),
        settings_dict.get("PORT"),
        settings_dict.get("USER"),
        conf.get().urls.get(alias),
    )
    url = _urls.get(key)
    if url is None:
        url = database_url(alias).render_as_string(hide_password=False)
        _urls[key] = url
    return url


def forget_urls() -> None:
    """Forget the cached URLs of `url_key` (the settings changed)."""
    _urls.clear()
