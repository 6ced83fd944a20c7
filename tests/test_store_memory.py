"""The store contract on MemoryStore."""

from __future__ import annotations

import pytest
from contract import MaintenanceContract, StoreContract

from autoseq.stores import MemoryStore


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self) -> MemoryStore:
        return MemoryStore()


class TestMemoryMaintenance(MaintenanceContract):
    @pytest.fixture
    def store(self) -> MemoryStore:
        return MemoryStore()
