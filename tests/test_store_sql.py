"""The store contract on SQLStore: SQLite (file), PostgreSQL and MariaDB."""

from __future__ import annotations

from typing import Any

import pytest
from contract import StoreContract


class TestSQLStore(StoreContract):
    @pytest.fixture
    def store(self, sql_store: Any) -> Any:
        return sql_store
