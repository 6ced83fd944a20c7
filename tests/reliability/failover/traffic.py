"""Clients taking values from a sequence during a failover, and the count of what they got."""

from __future__ import annotations

import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autoseq.errors import AutoseqError

#: Values one call takes, and the pause between calls: a steady stream of
#: small reservations, so a failover always lands between two of them.
TAKE = 20
PAUSE = 0.001


@dataclass
class Client:
    """One application process: its own sequence lock (and store), served to ``threads`` threads."""

    lock: Any
    threads: int = 1
    values: array[int] = field(default_factory=lambda: array("q"))
    errors: int = 0
    guard: threading.Lock = field(default_factory=threading.Lock)

    def taken(self) -> int:
        """How many values this client was handed so far."""
        with self.guard:
            return len(self.values)


class Traffic:
    """Every client's threads take values until :meth:`stop`; store errors are waited out."""

    def __init__(self, clients: list[Client]) -> None:
        self.clients = clients
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(client,), daemon=True)
            for client in clients
            for _ in range(client.threads)
        ]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self, client: Client) -> None:
        while not self._stop.is_set():
            try:
                got = client.lock.next_many(TAKE)
            except AutoseqError:
                with client.guard:
                    client.errors += 1
                time.sleep(0.01)
                continue
            with client.guard:
                client.values.extend(got)
            time.sleep(PAUSE)

    def run_until(self, seconds: float, also: Callable[[], bool] = lambda: True) -> None:
        """Let the clients run ``seconds``, and longer (up to 30 s) until ``also()`` holds."""
        time.sleep(seconds)
        deadline = time.monotonic() + 30
        while not also() and time.monotonic() < deadline:
            time.sleep(0.05)

    def marks(self) -> list[int]:
        """How many values each client has now."""
        return [client.taken() for client in self.clients]

    def all_moved_since(self, marks: list[int]) -> Callable[[], bool]:
        """A check: every client got values after ``marks`` were taken."""
        return lambda: all(now > then for now, then in zip(self.marks(), marks, strict=True))

    def stop(self) -> None:
        """Stop every thread and wait for it."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)


@dataclass(frozen=True)
class Count:
    """What the clients were handed: how many values, and how many of them twice or more."""

    values: int
    twice: int
    within_one_client: int
    after_failover: int

    @classmethod
    def of(cls, clients: list[Client], marks: list[int]) -> Count:
        """Count every value of every client; ``marks``: each client's count at the failover."""
        seen: Counter[int] = Counter()
        within = 0
        for client in clients:
            own = Counter(client.values)
            within += sum(n - 1 for n in own.values() if n > 1)
            seen.update(own)
        after = sum(c.taken() - m for c, m in zip(clients, marks, strict=True))
        twice = sum(n - 1 for n in seen.values() if n > 1)
        return cls(sum(seen.values()), twice, within, after)

    def __str__(self) -> str:
        return (
            f"{self.values:,} values handed out ({self.after_failover:,} after the failover), "
            f"{self.twice:,} handed out twice ({self.within_one_client:,} by one client)"
        )


def run(
    clients: list[Client],
    before_loss: Callable[[], None],
    lose: Callable[[], None],
    then: list[Client] | None = None,
) -> Count:
    """Traffic; ``before_loss`` (the standby falls behind); ``lose`` (the primary goes); traffic.

    ``then``: the first clients stop before the loss and these take over,
    as processes started afresh do, knowing nothing of what the first ones
    served (so no fence of theirs can hide a reservation that was lost).
    """
    with Traffic(clients) as traffic:
        traffic.run_until(0.5, traffic.all_moved_since([0] * len(clients)))
        before_loss()
        traffic.run_until(0.6)
        if then is not None:
            traffic.stop()  # they go down with the primary's machine
        lose()
        if then is None:
            marks = traffic.marks()
            traffic.run_until(0.5, traffic.all_moved_since(marks))
            return shown(Count.of(clients, marks))
    with Traffic(then) as traffic:
        traffic.run_until(0.5, traffic.all_moved_since([0] * len(then)))
    marks = [client.taken() for client in clients] + [0] * len(then)
    return shown(Count.of(clients + then, marks))


def run_with_newcomers(
    clients: list[Client],
    before_loss: Callable[[], None],
    lose: Callable[[], None],
    newcomers: Callable[[], list[Client]],
) -> Count:
    """Traffic; ``before_loss``; ``lose``; then fresh clients join the survivors.

    The first clients keep taking values through the loss, and the clients
    ``newcomers()`` builds after it (processes started once the new primary
    is up, knowing nothing of what was served) take values beside them: a
    value lost with the old primary and handed out again shows up across
    processes, the case no per-process fence can catch.
    """
    with Traffic(clients) as traffic:
        traffic.run_until(0.5, traffic.all_moved_since([0] * len(clients)))
        before_loss()
        traffic.run_until(0.6)
        lose()
        marks = traffic.marks()
        then = newcomers()
        with Traffic(then) as fresh:
            fresh.run_until(
                0.5,
                lambda: (
                    traffic.all_moved_since(marks)() and fresh.all_moved_since([0] * len(then))()
                ),
            )
    return shown(Count.of(clients + then, marks + [0] * len(then)))


def shown(count: Count) -> Count:
    """``count``, printed for the record (``pytest -s`` shows it, passing or not)."""
    print(f"failover trial: {count}")
    return count
