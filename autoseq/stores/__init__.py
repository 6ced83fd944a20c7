"""Stores: where ``sys_sequence`` rows live.

``MemoryStore`` is always here; the others import their driver lazily, on
first access, so ``import autoseq`` never imports an ORM or a driver.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from autoseq.stores.base import Block, SequenceStore, plan_reservation
from autoseq.stores.memory import MemoryStore

if TYPE_CHECKING:
    from autoseq.stores.mongo import MongoStore
    from autoseq.stores.redis import RedisStore
    from autoseq.stores.sql import SQLStore

_LAZY = {
    "SQLStore": "autoseq.stores.sql",
    "MongoStore": "autoseq.stores.mongo",
    "RedisStore": "autoseq.stores.redis",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'autoseq.stores' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "Block",
    "MemoryStore",
    "MongoStore",
    "RedisStore",
    "SQLStore",
    "SequenceStore",
    "plan_reservation",
]
