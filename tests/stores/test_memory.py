"""The store contract on MemoryStore."""

from __future__ import annotations

import pytest

from autoseq.stores import MemoryStore
from autoseq.testing.contract import MaintenanceContract, StoreContract


class TestMemoryStore(StoreContract):
    shared_between_processes = False

    @pytest.fixture
    def store(self) -> MemoryStore:
        return MemoryStore()

    @pytest.fixture
    def unavailable_store(self) -> MemoryStore:
        pytest.skip("a MemoryStore has no server to lose")


class TestMemoryMaintenance(MaintenanceContract):
    @pytest.fixture
    def store(self) -> MemoryStore:
        return MemoryStore()
