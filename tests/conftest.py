"""Shared fixtures: one per backend, each isolated per test."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from backends import SQL_BACKENDS, sql_url, unique_table
from mongo_server import command_log, me_db, mongo_db_name, mongo_server  # noqa: F401 - fixtures

# The store contract lives in the package (shipped for third-party stores);
# rewrite its asserts as pytest does for test modules, so failures show values.
pytest.register_assert_rewrite("autoseq.testing.contract")

SQL_PARAMS = [
    pytest.param(backend, marks=getattr(pytest.mark, backend), id=backend)
    if backend != "sqlite"
    else pytest.param(backend, id=backend)
    for backend in SQL_BACKENDS
]


@pytest.fixture(params=SQL_PARAMS)
def sql_backend(request: pytest.FixtureRequest) -> str:
    """Each SQL backend in turn."""
    return str(request.param)


@pytest.fixture
def db_url(sql_backend: str, tmp_path: Path) -> str:
    """The database URL of ``sql_backend`` (a fresh SQLite file per test)."""
    return sql_url(sql_backend, tmp_path)


@pytest.fixture
def sql_store(db_url: str) -> Iterator[object]:
    """A ``SQLStore`` on its own fresh table, dropped afterwards."""
    from autoseq.stores import SQLStore

    store = SQLStore(db_url, table=unique_table())
    store.create_table()
    yield store
    store.drop_table()
    store.close()
