"""Fork: a parent that served values forks workers (gunicorn --preload); nothing repeats.

The parent forks while it holds a cached block, and again while its
background worker is in the middle of a reservation (inside the store's
open transaction on SQL), so the children inherit a lock mid-flight and
the parent's open connection. Children and parent keep serving at once.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

from autoseq import BufferPolicy, SequenceConfig, SequenceRegistry

from .harness import Check, tally

CHILDREN = 4
THREADS = 2
PER_THREAD = 300
CHILD_BOUND = 60.0


def pause_reservations(store: Any, entered: threading.Event, seconds: float) -> None:
    """While ``entered`` is clear, the next reservation sets it and pauses ``seconds``.

    On SQL the pause is inside the reservation's transaction, after its
    UPDATE and before COMMIT; elsewhere it follows the single atomic write.
    """
    engine = getattr(store, "engine", None)
    if engine is not None:
        from sqlalchemy import event

        @event.listens_for(engine, "after_cursor_execute")
        def _pause(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if statement.lstrip().upper().startswith("UPDATE") and not entered.is_set():
                entered.set()
                time.sleep(seconds)

        return
    reserve = store.reserve

    def paused(name: str, count: int) -> Any:
        block = reserve(name, count)
        if not entered.is_set():
            entered.set()
            time.sleep(seconds)
        return block

    store.reserve = paused


def fork_child(lock: Any) -> tuple[int, int]:
    """Fork a child that takes values on THREADS threads; returns (pid, read end of its pipe)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(read)
            taken: list[list[int]] = [[] for _ in range(THREADS)]
            errors: list[str] = []

            def run(out: list[int]) -> None:
                try:
                    out.extend(lock.next() for _ in range(PER_THREAD))
                except Exception as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")

            threads = [threading.Thread(target=run, args=(out,)) for out in taken]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            with os.fdopen(write, "w") as pipe:
                json.dump({"values": taken, "errors": errors}, pipe)
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    return pid, read


def collect(children: list[tuple[int, int]]) -> tuple[list[list[int]], list[str]]:
    """Each child's per-thread values and errors; a child over CHILD_BOUND is killed."""
    per_thread: list[list[int]] = []
    errors: list[str] = []
    deadline = time.monotonic() + CHILD_BOUND
    for pid, read in children:
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                errors.append(f"child {pid} hung for {CHILD_BOUND}s")
                break
            time.sleep(0.01)
        with os.fdopen(read) as pipe:
            text = pipe.read()
        if not text:
            errors.append(f"child {pid} wrote nothing")
            continue
        result = json.loads(text)
        per_thread += result["values"]
        errors += result["errors"]
    return per_thread, errors


def test_forked_workers_never_repeat_parent_or_sibling_values(
    target: Any, record_property: Any
) -> None:
    """Children forked from a serving parent, also mid-reservation: every value is unique."""
    store = target.open()
    registry = SequenceRegistry(store, policy=BufferPolicy(prefetch_at=0.5))
    registry.register(SequenceConfig("forked", batch_count=20))
    registry.load()  # the --preload start-up: rows read before the fork
    lock = registry.get("forked")
    parent = [lock.next() for _ in range(15)]  # the parent holds a cached block

    children = [fork_child(lock) for _ in range(CHILDREN // 2)]
    parent += [lock.next() for _ in range(50)]

    entered = threading.Event()
    pause_reservations(store, entered, 0.3)
    mid_flight = 0
    for _ in range(CHILDREN - CHILDREN // 2):
        entered.clear()
        while not entered.is_set():  # drive the parent into its next reservation
            parent.append(lock.next())
            time.sleep(0.001)
        children.append(fork_child(lock))  # the parent's worker is inside the reservation
        mid_flight += 1
    parent += [lock.next() for _ in range(100)]

    per_thread, errors = collect(children)
    assert not errors, errors
    for values in per_thread:
        assert values == sorted(values), "a child thread's values went backwards"
    parent += [lock.next() for _ in range(100)]
    values = parent + [v for vs in per_thread for v in vs]
    check = Check.of(values)
    assert check.duplicates == 0, f"repeated values {check.repeated(values)}"
    assert check.values == len(parent) + CHILDREN * THREADS * PER_THREAD
    registry.close(release=False)
    tally(
        record_property,
        target.id,
        "fork",
        values=check.values,
        duplicates=check.duplicates,
        gaps=check.gaps,
        children=CHILDREN,
        forked_mid_reservation=mid_flight,
    )
