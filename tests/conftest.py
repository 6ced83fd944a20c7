"""Shared fixtures: one per backend, each isolated per test."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from backends import (
    DECLARED_STORE_TABLES,
    MYSQL_URL,
    POSTGRES_URL,
    SQL_BACKENDS,
    drop_tables,
    server_tables,
    sql_url,
    unique_table,
)
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


@pytest.fixture(scope="session", autouse=True)
def no_declared_store_tables_left() -> Iterator[None]:
    """The run leaves the shared servers as it found them: store tables a run's
    ``create_all()`` made there (the models declare them) are dropped at its end."""
    before = {url: server_tables(url) for url in (POSTGRES_URL, MYSQL_URL)}
    yield
    for url, tables in before.items():
        if tables is not None:
            drop_tables(url, set(DECLARED_STORE_TABLES - tables))


@pytest.fixture(autouse=True)
def fresh_reservation_budget() -> None:
    """Each test starts with no active sequence in the process's reservation budget: one
    that made thousands of sequences reserve must not stretch the next test's blocks."""
    from autoseq.pacing import shared_budget

    shared_budget().reset()


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
    store.drop()
    store.close()
