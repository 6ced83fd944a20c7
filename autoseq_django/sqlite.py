"""SQLite: Django's connections see the companion file's ``sys_sequence``, read-only.

The sequences of ``db.sqlite3`` live in ``db.sqlite3.autoseq`` (one writer
per file: a reservation must never wait for the caller's transaction). So
that ``SysSequence`` queries and the admin show them with no extra
settings, every Django connection to a SQLite file attaches the companion
read-only (``ATTACH ... ?mode=ro``) and ``db.sqlite3`` keeps no
``sys_sequence`` of its own: the unqualified name then resolves to the
companion's table. Read-only matters: ``BEGIN IMMEDIATE`` takes a write
lock on every attached database it may write, and a read-only one never.
Changes still go through the store (admin, ``manage.py autoseq``).

An in-memory database (Django's and pytest-django's test database on
SQLite) has its sequences in a shared-cache in-memory database named after
it (``memorydb_default.autoseq``), which its connections attach the same
way. Memory cannot be opened read-only, so those connections read it with
``PRAGMA read_uncommitted``: in shared-cache mode a reader then takes no
table lock that would make a reservation fail with "database table is
locked" while the caller's transaction (a whole ``TestCase``) is open. A
connection that begins its transactions with ``BEGIN IMMEDIATE`` or
``EXCLUSIVE`` would lock it for writing, so that one does not attach it.
"""

from __future__ import annotations

import os
import urllib.parse
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from autoseq_django import registry as sequences

#: The schema name the companion is attached under.
SCHEMA = "autoseq"
#: The table SysSequence reads, and where a SQLite file keeps its gapless rows.
SEQUENCES = "sys_sequence"
GAPLESS = f"{SEQUENCES}_gapless"


def companion_path(connection: Any) -> str | None:
    """The companion file of a Django SQLite connection, or None (memory, companion itself)."""
    from autoseq.stores.sql import SIDECAR_SUFFIX, store_url

    if connection.vendor != "sqlite":
        return None
    name = connection.settings_dict.get("NAME")
    if sequences.sqlite_in_memory(name) or str(name).endswith(SIDECAR_SUFFIX):
        return None
    try:
        url, in_memory = store_url(sequences.database_url(connection.alias))
        holder = sequences.sequence_database(connection.alias)
        used = store_url(sequences.database_url(holder))[0] if holder != connection.alias else url
    except ImproperlyConfigured:
        return None  # checks E008 / E011 say why
    if in_memory or not url.database or url.get_backend_name() != "sqlite":
        return None  # AUTOSEQ["URLS"] may send this alias's sequences elsewhere
    if used.get_backend_name() != "sqlite" or not used.database:
        return None
    if os.path.realpath(str(used.database)) != os.path.realpath(str(url.database)):
        return None  # its sequences live in another database, which the router reads
    return str(url.database)


def memory_companion_uri(connection: Any) -> str | None:
    """The URI of the in-memory store of an in-memory SQLite connection, or None.

    None as well when the connection must not attach it: its sequences live
    elsewhere, or it begins transactions with ``BEGIN IMMEDIATE``/``EXCLUSIVE``.
    """
    from autoseq.stores.sql import SIDECAR_SUFFIX

    if connection.vendor != "sqlite":
        return None
    settings_dict = connection.settings_dict
    if not sequences.sqlite_in_memory(settings_dict.get("NAME")):
        return None
    mode = str((settings_dict.get("OPTIONS") or {}).get("transaction_mode") or "").upper()
    if mode in ("IMMEDIATE", "EXCLUSIVE"):
        return None
    try:
        url = sequences.database_url(connection.alias)
        holder = sequences.sequence_database(connection.alias)
        if holder != connection.alias and sequences.database_url(holder) != url:
            return None  # its sequences live in another database, which the router reads
    except ImproperlyConfigured:
        return None  # checks E008 / E011 say why
    database = str(url.database or "")
    if url.get_backend_name() != "sqlite" or url.query.get("mode") != "memory":
        return None
    if not database.endswith(SIDECAR_SUFFIX):
        return None
    return f"{database}?mode=memory&cache=shared"


def has_companion(connection: Any) -> bool:
    """True when ``connection``'s sequences live in a database it attaches (file or memory)."""
    return companion_path(connection) is not None or memory_companion_uri(connection) is not None


def attach_companion(connection: Any) -> bool:
    """Attach the companion of ``connection`` (a file read-only) if it exists; True when attached.

    Harmless to call again; does nothing inside a transaction (SQLite
    refuses ``ATTACH`` there) or before the companion file exists.
    """
    path = companion_path(connection)
    memory = memory_companion_uri(connection) if path is None else None
    if memory is None and (path is None or not os.path.exists(path)):
        return False
    raw = getattr(connection, "connection", None)
    if raw is None or raw.in_transaction:
        return False
    attached = {row[1] for row in raw.execute("PRAGMA database_list")}
    if SCHEMA in attached:
        return True
    if "sys_sequence" in main_tables(raw):
        return False  # an older main-file table would shadow it; migration 0003 drops it
    if memory is not None:
        raw.execute("PRAGMA read_uncommitted = 1")
        uri = memory
    else:
        uri = f"file:{urllib.parse.quote(str(path))}?mode=ro"
    raw.execute(f"ATTACH DATABASE ? AS {SCHEMA}", (uri,))
    return True


def main_tables(raw: Any) -> set[str]:
    """Tables of the main database of a raw sqlite3 connection."""
    return tables(raw, "main")


#: The schema a companion opened as its own database attaches its application's file under.
APPLICATION_SCHEMA = "autoseq_app"


def show_gapless_rows(connection: Any) -> bool:
    """Let ``sys_sequence`` on ``connection`` show the file's gapless rows too; True when it does.

    Gapless rows live in the application's file (``sys_sequence_gapless``),
    beside the companion's rows, and the store treats both as one table; a
    temporary view named ``sys_sequence`` (resolved before any attached
    table) does the same for ``SysSequence`` and the admin. A name in both
    is the gapless row, as in the store. Made once the gapless table exists;
    ``SysSequence.objects`` asks again, so a connection opened before the
    first gapless value sees it next time. Read-only, like the companion.
    """
    raw = getattr(connection, "connection", None)
    if raw is None or connection.vendor != "sqlite":
        return False
    temp = raw.execute("SELECT name FROM sqlite_temp_master WHERE type = 'view'")
    if SEQUENCES in {row[0] for row in temp}:
        return True
    schemas = _rows_and_gapless_schemas(connection, raw)
    if schemas is None:
        return False
    rows, gapless = schemas
    if SEQUENCES not in tables(raw, rows) or GAPLESS not in tables(raw, gapless):
        return False
    from autoseq.stores.sql import sequence_table

    columns = ", ".join(f'"{column.name}"' for column in sequence_table().columns)
    raw.execute(
        f"CREATE TEMP VIEW IF NOT EXISTS {SEQUENCES} AS "  # noqa: S608 - constant identifiers
        f"SELECT {columns} FROM {gapless}.{GAPLESS} UNION ALL "
        f"SELECT {columns} FROM {rows}.{SEQUENCES} "
        f"WHERE name NOT IN (SELECT name FROM {gapless}.{GAPLESS})"
    )
    return True


def _rows_and_gapless_schemas(connection: Any, raw: Any) -> tuple[str, str] | None:
    """(schema of the companion's rows, schema of the gapless rows) on ``connection``, or None.

    An application's file has its companion attached (``autoseq``); a
    companion opened as its own database (Django's companion alias) attaches
    its application's file read-only, when it exists and no transaction is open.
    """
    from autoseq.stores.sql import SIDECAR_SUFFIX

    attached = {row[1] for row in raw.execute("PRAGMA database_list")}
    if SCHEMA in attached:
        # In memory, the store cannot reach this connection's own database:
        # a row shown here could not be changed, so none is shown.
        return (SCHEMA, "main") if companion_path(connection) is not None else None
    name = str(connection.settings_dict.get("NAME") or "")
    application = name.removesuffix(SIDECAR_SUFFIX)
    if application == name or not os.path.exists(application):
        return None
    if APPLICATION_SCHEMA not in attached:
        if raw.in_transaction:
            return None  # SQLite refuses ATTACH inside a transaction
        uri = f"file:{urllib.parse.quote(os.path.realpath(application))}?mode=ro"
        raw.execute(f"ATTACH DATABASE ? AS {APPLICATION_SCHEMA}", (uri,))
    return "main", APPLICATION_SCHEMA


def tables(raw: Any, schema: str) -> set[str]:
    """Tables of ``schema`` (``main`` or an attached database) of a raw sqlite3 connection."""
    rows = raw.execute(f"SELECT name FROM {schema}.sqlite_master WHERE type = 'table'")  # noqa: S608
    return {row[0] for row in rows}
