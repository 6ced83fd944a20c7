"""Snowflake columns' values: the generators ``SnowflakeField`` shares, per store and layout.

A ``SnowflakeField`` (declared in `autoseq.sqlalchemy.columns`) without a
generator of its own takes its ids from one
[`Snowflake`][autoseq.snowflake.Snowflake] per store and layout, made on
first insert on the store ``install()`` gave the engine (else a ``SQLStore``
on the bind's database) and kept until `close_snowflakes`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection, Engine

from autoseq.snowflake import SharedSnowflakes
from autoseq.sqlalchemy.registries import Installation, default_registry

_snowflakes = SharedSnowflakes()


def snowflake_for(bind: Engine | Connection, name: str, installation: Installation | None) -> Any:
    """The shared generator of layout ``name`` on the store that serves ``bind``."""
    registry = installation.registry_for(bind) if installation else default_registry(bind)
    return _snowflakes.get(registry.store, name)


def close_snowflakes() -> None:
    """Close the generators ``SnowflakeField`` made (releasing their leases); tests, shutdown."""
    _snowflakes.close()  # within one deadline in all


__all__ = ["close_snowflakes", "snowflake_for"]
