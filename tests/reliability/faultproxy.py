"""``FaultProxy``: a loopback TCP proxy that injects network faults on demand.

It sits between a store's driver and the real server, so the faults are the
ones a driver meets in production: connections cut or reset (RST) at any
moment, a peer that stops answering with its sockets still open, latency.
One thread accepts, two threads pump each connection; every wait polls at
``TICK`` so ``close()`` always returns, and connections are capped.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

TICK = 0.02
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(eq=False)  # identity: pairs live in a set
class _Pair:
    client: socket.socket
    server: socket.socket
    closed: bool = False
    held: bool = False  # forwards nothing more to the client (a reply about to be lost)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class _Trigger:
    pattern: bytes
    direction: str  # "up": client -> server, "down": server -> client
    after: bool  # reset after forwarding the matching chunk, not before
    on_fire: Callable[[], None] | None = None  # runs before the reset, the client still waiting


class FaultProxy:
    """Forwards ``127.0.0.1:port`` to ``upstream``; faults are switched by method calls.

    ``latency`` adds seconds before each forwarded chunk; ``stall()`` holds
    every byte (sockets stay open, as with a hung server or a full network
    buffer) until ``heal()``; ``cut()`` resets every connection and resets
    new ones at once until ``heal()``; ``reset_on(pattern)`` resets the next
    connection whose traffic contains ``pattern`` (before or after it is
    forwarded), e.g. a COMMIT, to break a transaction in the middle.
    """

    def __init__(
        self, upstream_port: int, upstream_host: str = "127.0.0.1", *, max_connections: int = 64
    ) -> None:
        if upstream_host not in LOOPBACK:
            raise ValueError(f"FaultProxy only forwards to loopback, not {upstream_host!r}")
        self.upstream = (upstream_host, upstream_port)
        self.max_connections = max_connections
        self.latency = 0.0
        self.accepted = 0
        self.resets = 0
        #: Chunks forwarded each way ("up": client to server): a client's
        #: request is one chunk, so "up" counts round trips.
        self.chunks = {"up": 0, "down": 0}
        self._stalled = False
        self._cutting = False
        self._triggers: list[_Trigger] = []
        self._pairs: set[_Pair] = set()
        self._guard = threading.Lock()
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.settimeout(TICK)
        self.port: int = self._listener.getsockname()[1]
        self._spawn(self._accept_loop, "faultproxy-accept")

    # faults ---------------------------------------------------------------

    def stall(self) -> None:
        """Stop forwarding; bytes wait in the proxy, connections stay open."""
        self._stalled = True

    def cut(self) -> None:
        """Reset every open connection, and every new one, until ``heal()``."""
        self._cutting = True
        for pair in self._snapshot():
            self._reset(pair)

    def reset_on(
        self,
        pattern: bytes,
        *,
        direction: str = "up",
        after: bool = False,
        on_fire: Callable[[], None] | None = None,
    ) -> None:
        """Reset the first connection whose next chunk in ``direction`` contains ``pattern``.

        ``on_fire`` runs when the chunk is met, before the reset, while the
        client still waits for its reply: with ``after=True`` it can let
        another client write between a request that was applied and the
        retry of a client that never saw the reply.
        """
        with self._guard:
            self._triggers.append(_Trigger(pattern, direction, after, on_fire))

    def heal(self) -> None:
        """Back to plain forwarding: no stall, no cut, no latency, no pending trigger."""
        with self._guard:
            self._triggers.clear()
        self.latency = 0.0
        self._cutting = False
        self._stalled = False

    @property
    def open_connections(self) -> int:
        """Connections currently forwarded."""
        return len(self._snapshot())

    @property
    def armed(self) -> int:
        """``reset_on`` triggers not yet fired."""
        with self._guard:
            return len(self._triggers)

    # lifecycle ------------------------------------------------------------

    def close(self) -> None:
        """Reset everything and stop every thread (bounded)."""
        self._closing.set()
        for pair in self._snapshot():
            self._reset(pair)
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=2.0)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # internals --------------------------------------------------------------

    def _spawn(self, target: object, name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)  # type: ignore[arg-type]
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)
        thread.start()

    def _snapshot(self) -> list[_Pair]:
        with self._guard:
            return list(self._pairs)

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            if self._cutting or len(self._snapshot()) >= self.max_connections:
                _hard_close(client)
                self.resets += 1
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=2.0)
            except OSError:
                _hard_close(client)
                continue
            for sock in (client, server):
                sock.settimeout(5.0)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = _Pair(client, server)
            with self._guard:
                self._pairs.add(pair)
            self._spawn(self._pump, "faultproxy-up", pair, client, server, "up")
            self._spawn(self._pump, "faultproxy-down", pair, server, client, "down")

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket, direction: str) -> None:
        try:
            while not pair.closed and not self._closing.is_set():
                ready, _, _ = select.select([src], [], [], TICK)
                if not ready:
                    continue
                data = src.recv(65536)
                if not data:
                    break
                while (
                    (self._stalled or (pair.held and direction == "down"))
                    and not pair.closed
                    and not self._closing.is_set()
                ):
                    time.sleep(TICK)
                if pair.closed:
                    break
                trigger = self._fire(direction, data)
                if trigger is not None and not trigger.after:
                    self._reset(pair)
                    break
                if trigger is not None and trigger.on_fire is not None:
                    pair.held = True  # the client never sees the reply to this chunk
                if self.latency:
                    time.sleep(self.latency)
                self.chunks[direction] += 1
                dst.sendall(data)
                if trigger is not None:
                    if trigger.on_fire is not None:
                        trigger.on_fire()
                    self._reset(pair)
                    break
        except (OSError, ValueError):
            pass  # the other pump or a fault closed the pair
        self._reset(pair, count=False, abort=False)

    def _fire(self, direction: str, data: bytes) -> _Trigger | None:
        with self._guard:
            for trigger in self._triggers:
                if trigger.direction == direction and trigger.pattern in data:
                    self._triggers.remove(trigger)
                    return trigger
        return None

    def _reset(self, pair: _Pair, *, count: bool = True, abort: bool = True) -> None:
        with pair.lock:
            if pair.closed:
                return
            pair.closed = True
        with self._guard:
            self._pairs.discard(pair)
        if count:
            self.resets += 1
        _hard_close(pair.client, abort)
        _hard_close(pair.server, abort)


def _hard_close(sock: socket.socket, abort: bool = True) -> None:
    """Close; ``abort`` sends RST (SO_LINGER 0), as a crashed peer or a firewall would."""
    if abort:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
