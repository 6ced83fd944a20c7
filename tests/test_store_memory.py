"""The store contract on MemoryStore."""

from __future__ import annotations

import pytest
from contract import StoreContract

from autoseq.stores import MemoryStore


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self) -> MemoryStore:
        return MemoryStore()
