"""``MemoryStore``: rows in a dict; one process, the reference store."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from autoseq.config import SequenceConfig, validate_name
from autoseq.errors import SequenceNotFound
from autoseq.stores.base import Block, plan_reservation


class MemoryStore:
    """A store that keeps rows in memory: tests, examples, single processes."""

    def __init__(self) -> None:
        self._rows: dict[str, SequenceConfig] = {}
        self._lock = threading.Lock()
        self.reservations = 0

    def create(self, config: SequenceConfig) -> SequenceConfig:
        with self._lock:
            row = self._rows.get(config.name)
            if row is None:
                row = config.with_current(config.next_value, _now())
                self._rows[config.name] = row
            return row

    def read(self, name: str) -> SequenceConfig | None:
        validate_name(name)
        with self._lock:
            return self._rows.get(name)

    def read_all(self) -> list[SequenceConfig]:
        with self._lock:
            return sorted(self._rows.values(), key=lambda row: row.name)

    def update(self, config: SequenceConfig) -> SequenceConfig:
        with self._lock:
            if config.name not in self._rows:
                raise SequenceNotFound(config.name)
            row = config.with_current(config.next_value, _now())
            self._rows[config.name] = row
            return row

    def reserve(self, name: str, count: int) -> Block:
        validate_name(name)
        with self._lock:
            row = self._rows.get(name)
            if row is None:
                raise SequenceNotFound(name)
            block, _ = plan_reservation(row, count)
            self._rows[name] = block.row
            self.reservations += 1
            return block

    def release(self, block: Block) -> bool:
        with self._lock:
            row = self._rows.get(block.name)
            if row is None or row.next_value != block.last + block.step:
                return False
            self._rows[block.name] = row.with_current(block.first, _now())
            return True

    def after_fork(self) -> None:
        self._lock = threading.Lock()

    def close(self) -> None:
        """Nothing to release."""


def _now() -> datetime:
    return datetime.now(UTC)
