"""A minimal in-process Django: one database alias per reachable server.

Aliases are the backend names (``sqlite``, ``postgres``, ``mysql``); the
SQLite one is also ``default`` and lives in the run's scratch folder. On
PostgreSQL and MariaDB the run creates a private database (dropped at the
end), so the tables that apps name themselves (django-sequences'
``sequences_sequence``, autoseq_django's ``sys_sequence``) never meet anyone
else's. Models are made at run time (:func:`make_model`) and created with the
schema editor, so no migration runs.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from benchmarks.harness import Unavailable
from benchmarks.servers import (
    MYSQL_URL,
    POSTGRES_URL,
    Context,
    emptying_sql,
    sql_problem,
    unique_name,
)

_ready: dict[str, str] | None = None
_problems: dict[str, str] = {}


def _from_url(url: str, engine: str) -> dict[str, Any]:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    return {
        "ENGINE": engine,
        "NAME": parsed.database,
        "USER": parsed.username or "",
        "PASSWORD": parsed.password or "",
        "HOST": parsed.host or "",
        "PORT": str(parsed.port or ""),
    }


def has_autoseq_django() -> bool:
    return importlib.util.find_spec("autoseq_django") is not None


def setup(ctx: Context) -> dict[str, str]:
    """Configure Django once per process; returns ``{backend: alias}`` of usable databases."""
    global _ready
    if _ready is not None:
        return _ready
    try:
        import django
        from django.conf import settings
    except ImportError as exc:
        raise Unavailable("Django is not installed") from exc
    databases: dict[str, dict[str, Any]] = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(ctx.workdir / "dj.db")}
    }
    databases["sqlite"] = dict(databases["default"])
    if sql_problem(POSTGRES_URL) is None:
        databases["postgres"] = _from_url(POSTGRES_URL, "django.db.backends.postgresql")
        databases["postgres"]["NAME"] = _private_database(ctx, POSTGRES_URL)
    else:
        _problems["postgres"] = f"PostgreSQL {sql_problem(POSTGRES_URL)}"
    if sql_problem(MYSQL_URL) is None:
        try:
            import pymysql

            pymysql.install_as_MySQLdb()
            databases["mysql"] = _from_url(MYSQL_URL, "django.db.backends.mysql")
            databases["mysql"]["OPTIONS"] = {"charset": "utf8mb4"}
            databases["mysql"]["NAME"] = _private_database(ctx, MYSQL_URL)
        except ImportError:
            _problems["mysql"] = "PyMySQL is not installed"
    else:
        _problems["mysql"] = f"MariaDB {sql_problem(MYSQL_URL)}"
    apps = ["django.contrib.contenttypes", "sequences", "benchmarks"]
    if has_autoseq_django():
        apps.append("autoseq_django")
    settings.configure(
        DATABASES=databases,
        INSTALLED_APPS=apps,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        USE_TZ=True,
    )
    django.setup()
    _ready = {
        backend: backend for backend in ("sqlite", "postgres", "mysql") if backend in databases
    }
    return _ready


def _private_database(ctx: Context, url: str) -> str:
    """Create a database of our own on the server of ``url``; dropped when the run ends."""
    import sqlalchemy as sa

    name = unique_name("db")
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    postgres = engine.dialect.name == "postgresql"
    with engine.connect() as connection:
        connection.execute(
            sa.text(f'CREATE DATABASE "{name}"' if postgres else f"CREATE DATABASE `{name}`")
        )

    def drop() -> None:
        from django.db import connections

        connections.close_all()
        _close_autoseq_django()
        with engine.connect() as connection:
            if postgres:
                connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            else:
                connection.execute(sa.text(f"DROP DATABASE IF EXISTS `{name}`"))
        engine.dispose()

    ctx.cleanups.append(drop)
    return name


def _close_autoseq_django() -> None:
    # Its stores hold pooled connections to the private databases.
    if has_autoseq_django():
        try:
            from autoseq_django import registry as sequences

            sequences.reset()
        except Exception:
            pass


def alias(ctx: Context, backend: str) -> str:
    """The Django alias of ``backend``, or :class:`Unavailable`."""
    aliases = setup(ctx)
    if backend not in aliases:
        raise Unavailable(_problems.get(backend, f"{backend} is not configured"))
    return aliases[backend]


_counter = 0


def make_model(prefix: str, fields: dict[str, Any]) -> Any:
    """A new model class on a fresh, unique table (not created yet)."""
    global _counter
    from django.db import models

    _counter += 1
    table = unique_name(prefix)
    meta = type("Meta", (), {"app_label": "benchmarks", "db_table": table})
    attrs: dict[str, Any] = {"__module__": "benchmarks.models", "Meta": meta, **fields}
    return type(models.Model)(f"Bench{prefix.title()}{_counter}", (models.Model,), attrs)


def rename_table(model: Any, prefix: str) -> str:
    """Point ``model`` (an app's model with a fixed table) at a fresh, unique table.

    Fields cache their column expression with the table name of its first
    use; it is dropped so queries name the new table, not one an earlier
    suite used and dropped.
    """
    model._meta.db_table = unique_name(prefix)
    for field in model._meta.concrete_fields:
        field.__dict__.pop("cached_col", None)
    return str(model._meta.db_table)


def create_table(model: Any, using: str) -> None:
    from django.db import connections

    with connections[using].schema_editor() as editor:
        editor.create_model(model)


def empty_table(model: Any, using: str) -> None:
    """Empty ``model``'s table (untimed, before a trial; see ``emptying_sql``)."""
    from django.db import connections

    connection = connections[using]
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(emptying_sql(connection.vendor, table))


def drop_table(model: Any, using: str) -> None:
    from django.db import connections

    with connections[using].schema_editor() as editor:
        editor.delete_model(model)
