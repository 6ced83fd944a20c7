"""Test helpers for users and for autoseq's own suites.

`FlakyStore` is a store you can slow down or cut. The store contract
suite (pytest) is in `autoseq.testing.contract`, imported on its own so
that ``import autoseq.testing`` never imports pytest.
"""

from __future__ import annotations

import threading
import time

from autoseq.config import SequenceConfig
from autoseq.errors import StoreUnavailable
from autoseq.stores.base import Block, SequenceStore, reserve_many


class FlakyStore:
    """Wraps a real store: adds ``delay`` seconds to each reservation round trip, and can be cut.

    While ``down`` is True every call raises ``StoreUnavailable`` at once,
    as a store whose server went away would (after its own timeout).
    ``reservations`` counts the reservations that reached the inner store.
    """

    def __init__(self, inner: SequenceStore, *, delay: float = 0.0) -> None:
        self.inner = inner
        self.delay = delay
        self.down = False
        self.reservations = 0
        self.calls_while_down = 0
        self._count_lock = threading.Lock()

    def _check(self, what: str) -> None:
        if self.down:
            with self._count_lock:
                self.calls_while_down += 1
            raise StoreUnavailable(f"{what}: store is down (FlakyStore)")

    def create(self, config: SequenceConfig) -> SequenceConfig:
        self._check("create")
        return self.inner.create(config)

    def read(self, name: str) -> SequenceConfig | None:
        self._check("read")
        return self.inner.read(name)

    def read_all(self) -> list[SequenceConfig]:
        self._check("read_all")
        return self.inner.read_all()

    def update(self, config: SequenceConfig) -> SequenceConfig:
        self._check("update")
        return self.inner.update(config)

    def reserve(self, name: str, count: int) -> Block:
        self._check(f"reserve {name!r}")
        if self.delay:
            time.sleep(self.delay)
        self._check(f"reserve {name!r}")
        block = self.inner.reserve(name, count)
        with self._count_lock:
            self.reservations += 1
        return block

    def reserve_many(self, requests: list[tuple[str, int]]) -> list[Block | None]:
        """The inner store's ``reserve_many`` after one ``delay``: one round trip for all.

        None for each request when the inner store cannot (see
        `autoseq.stores.base.reserve_many`), so ``warm()`` on a slowed store
        costs what it costs on a real one, not ``delay`` per sequence.
        """
        self._check("reserve_many")
        if self.delay:
            time.sleep(self.delay)
        self._check("reserve_many")
        blocks = reserve_many(self.inner, requests)
        with self._count_lock:
            self.reservations += sum(block is not None for block in blocks)
        return blocks

    def release(self, block: Block) -> bool:
        self._check("release")
        return self.inner.release(block)

    def compare_and_set(self, row: SequenceConfig, version: int) -> SequenceConfig | None:
        self._check("compare_and_set")
        return self.inner.compare_and_set(row, version)

    def after_fork(self) -> None:
        self.inner.after_fork()

    def close(self) -> None:
        self.inner.close()
