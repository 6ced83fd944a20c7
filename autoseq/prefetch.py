"""One small pool of threads reserves the next block of every sequence of a process.

A [`autoseq.lock.SequenceLock`][autoseq.lock.SequenceLock] past its prefetch point hands a task to
`shared`, the process's pool: at most `MAX_WORKERS` daemon
threads (`DEFAULT_WORKERS` unless `configure` says otherwise),
started as tasks arrive and kept for the life of the process, whatever the
number of sequences (Meituan Leaf and CosId serve every segment of a
process from one executor likewise). Ten thousand sequences then cost a
handful of threads, not ten thousand.

Why not `concurrent.futures.ThreadPoolExecutor`: its workers are not
daemon threads and the interpreter joins them at exit, so a prefetch stuck
on a stalled store would hold exit up; and when a worker cannot start
(``RuntimeError: can't start new thread`` under a process limit) the task
stays queued with no thread to run it. Here `PrefetchPool.submit`
says False when no worker exists and none could start, and the caller then
reserves inline when its block runs out: serving goes on, nothing waits
on a task that will never run.

A slow store holds one worker per sequence waiting on it. With more such
sequences than workers, the others' tasks wait in the queue; a caller
whose block runs out while its task is still queued takes the task back
and reserves inline (`autoseq.lock.SequenceLock._reserve_now`), so it
waits on its own store's round trip, never on another sequence's store.

Tasks that say they may run together (a ``batch_key`` attribute, not
None, and a ``run_together`` method: the prefetches of sequences on one
store that reserves many rows in one round trip) are taken together: a
worker popping one takes every task queued with the same key, up to
`MAX_TOGETHER`, and runs them in one call. A trickle of prefetches runs
one by one as before; a wave of them (thousands of sequences reaching
their prefetch points together) costs a round trip per `MAX_TOGETHER`
instead of one each.

After ``fork()`` the child starts with an empty pool (the parent's threads
do not exist there, and its lock may have been held); a thread starts on
the child's first prefetch.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable

from autoseq import _hooks
from autoseq.errors import InvalidSequenceConfig

__all__ = [
    "DEFAULT_WORKERS",
    "MAX_TOGETHER",
    "MAX_WORKERS",
    "PrefetchPool",
    "configure",
    "shared",
]

log = logging.getLogger("autoseq")

#: Threads of the shared pool unless `configure` says otherwise.
DEFAULT_WORKERS = 4
#: The most threads a pool may have: issue 34 asks for at most 8 in all.
MAX_WORKERS = 8
#: The most queued tasks of one ``batch_key`` a worker takes together.
MAX_TOGETHER = 1000

Task = Callable[[], None]


class PrefetchPool:
    """Up to ``workers`` daemon threads running queued tasks in arrival order."""

    def __init__(self, workers: int = DEFAULT_WORKERS) -> None:
        self.workers = _checked(workers)
        self._reset()
        _pools.add(self)

    def resize(self, workers: int) -> None:
        """At most ``workers`` threads from now on; extra ones end once idle."""
        with self._cond:
            self.workers = _checked(workers)
            self._cond.notify_all()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._tasks: deque[Task] = deque()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # workers waiting for a task
        self._pid = os.getpid()

    def submit(self, task: Task) -> bool:
        """Queue ``task``; False (and nothing queued) if no worker runs nor can start.

        A worker starts when none is idle and the pool is not full; if it
        cannot start but others run, they take the task in turn.
        """
        if self._pid != os.getpid():  # pragma: no cover - the at-fork hook resets first
            self._reset()
        with self._cond:
            if self._idle <= len(self._tasks) and len(self._threads) < self.workers:
                started = self._start_worker()
                if not started and not self._threads:
                    return False
            self._tasks.append(task)
            self._cond.notify()
            return True

    def _start_worker(self) -> bool:
        thread = threading.Thread(
            target=self._run, name=f"autoseq-prefetch-{len(self._threads)}", daemon=True
        )
        try:
            thread.start()
        except RuntimeError as exc:  # a process thread limit, or interpreter exit
            log.debug("prefetch: no new worker thread (%s); callers reserve inline", exc)
            return False
        self._threads.append(thread)
        return True

    def _run(self) -> None:
        cond = self._cond
        tasks = self._tasks
        while True:
            with cond:
                while not tasks:
                    if len(self._threads) > self.workers:
                        self._threads.remove(threading.current_thread())
                        return
                    self._idle += 1
                    cond.wait()
                    self._idle -= 1
                task = tasks.popleft()
                together = _same_key(task, tasks) if tasks else None
            try:
                if together:
                    task.run_together([task, *together])  # type: ignore[attr-defined]
                else:
                    task()
            except Exception:  # a task reports its own failures; this one escaped
                log.exception("prefetch: a task failed")

    def threads(self) -> int:
        """Worker threads alive now."""
        with self._cond:
            return sum(1 for thread in self._threads if thread.is_alive())

    def queued(self) -> int:
        """Tasks waiting for a worker."""
        with self._cond:
            return len(self._tasks)

    def _after_fork_in_child(self) -> None:
        self._reset()


def _same_key(task: Task, tasks: deque[Task]) -> list[Task]:
    """Take out of ``tasks`` those that may run with ``task`` (its ``batch_key``), up to
    `MAX_TOGETHER` in all; the others keep their order. Called under the pool's lock."""
    key = getattr(task, "batch_key", None)
    if key is None:
        return []
    together: list[Task] = []
    kept: list[Task] = []
    for other in tasks:
        if len(together) < MAX_TOGETHER - 1 and getattr(other, "batch_key", None) is key:
            together.append(other)
        else:
            kept.append(other)
    if together:
        tasks.clear()
        tasks.extend(kept)
    return together


def _checked(workers: int) -> int:
    if not 1 <= workers <= MAX_WORKERS:
        raise InvalidSequenceConfig(
            f"prefetch workers={workers}; use 1 to {MAX_WORKERS} "
            "(one pool serves every sequence of the process)"
        )
    return workers


_pools: weakref.WeakSet[PrefetchPool] = weakref.WeakSet()
_shared: PrefetchPool | None = None
_shared_guard = threading.Lock()


def shared() -> PrefetchPool:
    """The process's pool, made on first use."""
    pool = _shared
    if pool is not None:
        return pool
    return configure()


def configure(workers: int | None = None) -> PrefetchPool:
    """The process's pool, made if missing, resized to ``workers`` threads if given.

    ``workers``: 1 to `MAX_WORKERS` (default `DEFAULT_WORKERS`).
    """
    global _shared
    with _shared_guard:
        if _shared is None:
            _shared = PrefetchPool(DEFAULT_WORKERS if workers is None else workers)
        elif workers is not None:
            _shared.resize(workers)
        return _shared


def _after_fork_in_child() -> None:
    global _shared_guard
    _shared_guard = threading.Lock()
    for pool in list(_pools):
        pool._after_fork_in_child()


_hooks.on_fork(after_in_child=_after_fork_in_child)
