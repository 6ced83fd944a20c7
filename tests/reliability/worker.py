"""A worker process for the reliability scenarios: takes values and writes each one down.

Run as ``python worker.py '<json job>'``. Every value is appended to the
thread's own file with one unbuffered ``os.write`` before it is "used", so
a SIGKILL at any instant leaves on disk exactly the values handed out.

Job keys: ``spec`` (storespec), ``options`` (store constructor), ``config``
(SequenceConfig keywords), ``policy`` (BufferPolicy keywords), ``out``
(file prefix), ``threads``, ``count`` (values per thread; None: until the
``stop`` file appears), ``pace`` (seconds between values), ``go`` (a file to
wait for before the first value, so many processes start at once),
``hold`` (probability that a reservation pauses ``hold_seconds``, announced
on stdout: ``hold-txn`` inside the store's open transaction after its
UPDATE, ``hold-commit`` after the commit but before the block is used).
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from typing import Any

from storespec import open_store

from autoseq import BufferPolicy, SequenceConfig, SequenceRegistry
from autoseq.config import SequenceConfig as _Config
from autoseq.stores.base import Block, SequenceStore

GO_TIMEOUT = 60.0


def announce(word: str) -> None:
    os.write(1, f"{word}\n".encode())


class HoldingStore:
    """Wraps a store; sometimes pauses after a reservation committed, before it is used."""

    def __init__(self, inner: SequenceStore, hold: float, seconds: float) -> None:
        self.inner = inner
        self.hold = hold
        self.seconds = seconds

    def reserve(self, name: str, count: int) -> Block:
        block = self.inner.reserve(name, count)
        if self.hold and random.random() < self.hold / 2:
            announce("hold-commit")
            time.sleep(self.seconds)
        return block

    def create(self, config: _Config) -> _Config:
        return self.inner.create(config)

    def read(self, name: str) -> _Config | None:
        return self.inner.read(name)

    def read_all(self) -> list[_Config]:
        return self.inner.read_all()

    def update(self, config: _Config) -> _Config:
        return self.inner.update(config)

    def release(self, block: Block) -> bool:
        return self.inner.release(block)

    def after_fork(self) -> None:
        self.inner.after_fork()

    def close(self) -> None:
        self.inner.close()


def hold_inside_transactions(store: Any, hold: float, seconds: float) -> None:
    """On a SQLStore, pause after the reservation's UPDATE, with the row locked, uncommitted."""
    engine = getattr(store, "engine", None)
    if engine is None or not hold:
        return
    from sqlalchemy import event

    @event.listens_for(engine, "after_cursor_execute")
    def _pause(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        text = statement.lstrip().upper()
        if text.startswith("UPDATE") and "CURRENT" in text and random.random() < hold / 2:
            announce("hold-txn")
            time.sleep(seconds)


def take(lock: Any, path: str, count: int | None, pace: float, stop: str | None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        taken = 0
        while count is None or taken < count:
            if stop is not None and taken % 50 == 0 and os.path.exists(stop):
                return
            value = lock.next()
            os.write(fd, b"%d\n" % value)
            taken += 1
            if pace:
                time.sleep(pace)
    finally:
        os.close(fd)


def main(job: dict[str, Any]) -> int:
    store = open_store(job["spec"], **job.get("options", {}))
    hold, seconds = job.get("hold", 0.0), job.get("hold_seconds", 0.05)
    hold_inside_transactions(store, hold, seconds)
    registry = SequenceRegistry(
        HoldingStore(store, hold, seconds), policy=BufferPolicy(**job.get("policy", {}))
    )
    go = job.get("go")
    if go:  # everything imported and built: wait for the start signal
        announce("ready")
        deadline = time.monotonic() + GO_TIMEOUT
        while not os.path.exists(go):
            if time.monotonic() > deadline:
                raise SystemExit(f"worker: {go} never appeared")
            time.sleep(0.001)
    lock = registry.register(SequenceConfig(**job["config"]))
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            take(
                lock,
                f"{job['out']}.t{index}",
                job.get("count"),
                job.get("pace", 0.0),
                job.get("stop"),
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(job.get("threads", 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    registry.close()
    if errors:
        for exc in errors:
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
