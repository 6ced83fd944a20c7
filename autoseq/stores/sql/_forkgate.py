"""The fork gate: no fork while a thread of this process is inside a SQLite operation."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ForkGate:
    """Lets a fork wait until no thread of this process is inside a SQLite operation.

    SQLite keeps the lock state of each open database file in per-process
    memory, which a child inherits. Forked while another thread is inside a
    write transaction, the child believes that transaction still holds the
    lock and gets "database is locked" on every reservation, forever. So
    operations pass through the gate; before a fork it is closed (waiting,
    at most ``timeout`` seconds, for those inside to leave) and reopened in
    the parent after; the child starts with a new, open gate.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._cond = threading.Condition()
        self._inside = 0

    @contextmanager
    def passage(self) -> Iterator[None]:
        with self._cond:
            self._inside += 1
        try:
            yield
        finally:
            with self._cond:
                self._inside -= 1
                self._cond.notify_all()

    def close(self) -> None:
        self._cond.acquire()
        self._cond.wait_for(lambda: self._inside == 0, self.timeout)

    def reopen(self) -> None:
        self._cond.release()
