"""``MemoryStore``: rows in a dict; one process, the reference store."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from autoseq.config import SequenceConfig, utc_now, validate_name
from autoseq.errors import SequenceNotFound
from autoseq.stores.base import (
    Block,
    check_configs,
    check_count,
    check_requests,
    plan_reservation,
)
from autoseq.stores.capabilities import one_per_store

if TYPE_CHECKING:
    from autoseq.workers import WorkerLeases


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
                row = config.with_current(config.next_value, utc_now()).replace_version(0)
                self._rows[config.name] = row
            return row

    def create_many(self, configs: list[SequenceConfig]) -> list[SequenceConfig]:
        """``create`` of each, all under the lock (no other writer sees half of them)."""
        items = check_configs(configs)
        now = utc_now()
        with self._lock:
            rows = self._rows
            out = []
            for config in items:
                row = rows.get(config.name)
                if row is None:
                    row = config.with_current(config.next_value, now).replace_version(0)
                    rows[config.name] = row
                out.append(row)
            return out

    def reserve_many(self, requests: list[tuple[str, int]]) -> list[Block | None]:
        """``reserve`` of each under the lock; None for a missing or exhausted row."""
        items = check_requests(requests)
        out: list[Block | None] = []
        with self._lock:
            for name, count in items:
                row = self._rows.get(name)
                if row is None or (row.exhausted and not row.cycle):
                    out.append(None)
                    continue
                block, _ = plan_reservation(row, count)
                self._rows[name] = block.row
                self.reservations += 1
                out.append(block)
        return out

    def read(self, name: str) -> SequenceConfig | None:
        validate_name(name)
        with self._lock:
            return self._rows.get(name)

    def read_raw(self, name: str) -> dict[str, Any] | None:
        """The stored row as plain data (what ``autoseq.maintenance.repair`` reads)."""
        row = self.read(name)
        return None if row is None else row.as_row()

    def read_all(self) -> list[SequenceConfig]:
        with self._lock:
            return sorted(self._rows.values(), key=lambda row: row.name)

    def update(self, config: SequenceConfig) -> SequenceConfig:
        with self._lock:
            if config.name not in self._rows:
                raise SequenceNotFound(config.name)
            old = self._rows[config.name]
            row = config.with_current(config.next_value, utc_now()).replace_version(old.version + 1)
            self._rows[config.name] = row
            return row

    def reserve(self, name: str, count: int) -> Block:
        validate_name(name)
        check_count(count)
        with self._lock:
            row = self._rows.get(name)
            if row is None:
                raise SequenceNotFound(name)
            block, _ = plan_reservation(row, count)
            self._rows[name] = block.row
            self.reservations += 1
            return block

    def release(self, block: Block) -> bool:
        return self.compare_and_set(block.row.with_current(block.first), block.version) is not None

    def compare_and_set(self, row: SequenceConfig, version: int) -> SequenceConfig | None:
        with self._lock:
            stored = self._rows.get(row.name)
            if stored is None:
                raise SequenceNotFound(row.name)
            if stored.version != version:
                return None
            written = row.with_current(row.next_value, utc_now()).replace_version(version + 1)
            self._rows[row.name] = written
            return written

    def worker_leases(self) -> WorkerLeases:
        """Snowflake worker-id leases kept in this process's memory."""
        from autoseq.workers import MemoryWorkers

        return one_per_store(self, MemoryWorkers)

    def after_fork(self) -> None:
        self._lock = threading.Lock()

    def close(self) -> None:
        """Nothing to release."""
