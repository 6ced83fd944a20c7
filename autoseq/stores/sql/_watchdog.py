"""The socket watchdog: bound an operation on a driver that has no read timeout.

A server (or a middlebox) that stops answering on an established connection
would block libpq forever, pre-ping included. When an operation overruns,
every socket of the store's own pool is shut down: the blocked driver wakes
with a disconnect and the caller gets ``StoreUnavailable``. The pool is
private to the store, so only its own operations, all equally stuck, are
affected.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from sqlalchemy.exc import DBAPIError

log = logging.getLogger("autoseq")


class Watchdog:
    """Calls ``expire`` when an armed operation runs past ``timeout`` seconds.

    One thread serves every operation of a store (instead of a timer thread
    started per operation, which cost as much as a round trip), and exits
    after a few idle seconds; the next ``arm`` starts another.
    """

    IDLE = 5.0

    def __init__(self, timeout: float, expire: Callable[[], None]) -> None:
        self.timeout = timeout
        self._expire = expire
        self._cond = threading.Condition()
        self._armed: dict[int, float] = {}  # token -> deadline, in arming order
        self._fired: set[int] = set()
        self._tokens = itertools.count()
        self._running = False

    def arm(self) -> int:
        with self._cond:
            token = next(self._tokens)
            self._armed[token] = time.monotonic() + self.timeout
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="autoseq-sql-watchdog", daemon=True).start()
            elif len(self._armed) == 1:
                self._cond.notify()
            return token

    def fired(self, token: int) -> bool:
        """True when ``token`` overran and ``expire`` was called for it."""
        with self._cond:
            return token in self._fired

    def disarm(self, token: int) -> None:
        with self._cond:
            self._armed.pop(token, None)
            self._fired.discard(token)

    def _run(self) -> None:
        cond = self._cond
        with cond:
            while True:
                if not self._armed:
                    cond.wait(self.IDLE)
                    if not self._armed:
                        self._running = False
                        return
                    continue
                # Deadlines grow with arming order: the first is the earliest.
                deadline = next(iter(self._armed.values()))
                wait = deadline - time.monotonic()
                if wait > 0:
                    cond.wait(wait)
                    continue
                now = time.monotonic()
                late = [t for t, d in self._armed.items() if d <= now]
                for t in late:
                    del self._armed[t]
                    self._fired.add(t)
                cond.release()
                try:
                    self._expire()
                except Exception:  # waking sockets is best effort
                    log.debug("autoseq: shutting stalled sockets failed", exc_info=True)
                finally:
                    cond.acquire()


class SocketWatch:
    """The sockets of one store's pool, shut down when an operation overruns ``timeout``."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._sockets: weakref.WeakSet[Any] = weakref.WeakSet()
        self._timers = Watchdog(timeout, self.shut_sockets)

    def add(self, dbapi_connection: Any) -> None:
        """Watch a connection the store's engine just opened."""
        self._sockets.add(dbapi_connection)

    @contextmanager
    def deadline(self) -> Iterator[None]:
        """Bound the operation inside to ``timeout``; a stalled driver error is marked.

        ``exc.autoseq_stalled`` tells the store's error translation that the
        disconnect was the watchdog's doing.
        """
        token = self._timers.arm()
        try:
            yield
        except DBAPIError as exc:
            if self._timers.fired(token):
                exc.autoseq_stalled = True  # type: ignore[attr-defined]  # read by _translate
            raise
        finally:
            self._timers.disarm(token)

    def shut_sockets(self) -> None:
        for dbapi_connection in list(self._sockets):
            # a connection closed already has nothing to wake
            with (
                suppress(Exception),
                socket.socket(fileno=os.dup(dbapi_connection.fileno())) as sock,
            ):
                sock.shutdown(socket.SHUT_RDWR)

    def after_fork(self) -> None:
        """Forget the parent's connections: a child must never shut the parent's sockets."""
        self._sockets = weakref.WeakSet()
        self._timers = Watchdog(self.timeout, self.shut_sockets)
