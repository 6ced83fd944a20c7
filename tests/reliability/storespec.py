"""Store specs: a store described as plain JSON, opened the same way in any process.

The reliability scenarios start worker processes with ``subprocess`` and kill
them; a worker gets the spec on its command line and opens the same store
the test opened. Imports no pytest, so a worker starts fast.

A spec is ``{"kind": ..., ...}``; ``open_store`` is the one place that maps
a kind onto a store class, so a new store plugs in here and in
``conftest.TARGETS``.
"""

from __future__ import annotations

from typing import Any

from autoseq.stores.base import SequenceStore

Spec = dict[str, Any]


def open_store(spec: Spec, **options: Any) -> SequenceStore:
    """The store ``spec`` describes; ``options`` go to the store's constructor."""
    kind = spec["kind"]
    if kind == "sql":
        from autoseq.stores.sql import SQLStore

        return SQLStore(spec["url"], table=spec["table"], **options)
    if kind == "mongo":
        from autoseq.stores.mongo import MongoStore

        return MongoStore(spec["url"], collection=spec["collection"], **options)
    if kind == "redis":
        from autoseq.stores.redis import RedisStore

        return RedisStore(spec["url"], prefix=spec["prefix"], **options)
    raise ValueError(f"unknown store kind {kind!r} in spec {spec!r}")
