"""Snowflake columns' values: the generators ``SnowflakeField`` shares, per store and layout.

A ``SnowflakeField`` (declared in `autoseq.sqlalchemy.columns`) without a
generator of its own takes its ids from one
[`Snowflake`][autoseq.snowflake.Snowflake] per store and layout, made on
first insert on the store ``install()`` gave the engine (else a ``SQLStore``
on the bind's database) and kept until `close_snowflakes`.
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy.engine import Connection, Engine

from autoseq import _hooks
from autoseq.snowflake import Snowflake, close_generators
from autoseq.sqlalchemy.registries import Installation, default_registry

_snowflakes: dict[tuple[int, str], Any] = {}
_snowflakes_guard = threading.Lock()


def snowflake_for(bind: Engine | Connection, name: str, installation: Installation | None) -> Any:
    """The shared generator of layout ``name`` on the store that serves ``bind``."""
    registry = installation.registry_for(bind) if installation else default_registry(bind)
    key = (id(registry.store), name)
    generator = _snowflakes.get(key)
    if generator is None:
        with _snowflakes_guard:
            generator = _snowflakes.get(key)
            if generator is None:
                generator = _snowflakes[key] = Snowflake(registry.store, name=name)
    return generator


def close_snowflakes() -> None:
    """Close the generators ``SnowflakeField`` made (releasing their leases); tests, shutdown."""
    with _snowflakes_guard:
        generators = list(_snowflakes.values())
        _snowflakes.clear()
    if generators:
        close_generators(generators)  # within one deadline in all


def _forget_snowflake_guard_after_fork() -> None:
    global _snowflakes_guard
    _snowflakes_guard = threading.Lock()  # the generators re-lease on their own


_hooks.on_fork(after_in_child=_forget_snowflake_guard_after_fork)


__all__ = ["close_snowflakes", "snowflake_for"]
