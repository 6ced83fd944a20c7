"""What the reliability scenarios share: worker processes, value files, the tally."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
WORKER = HERE / "worker.py"

#: Every scenario's summary line, printed at the end of the run (conftest).
TALLIES: list[dict[str, Any]] = []


@dataclass
class Worker:
    """One worker process; its stdout lines arrive on ``lines``.

    Both pipes are read to their end on threads and closed there, so no
    pipe is left for the GC to close (a ResourceWarning fails the suite).
    """

    process: subprocess.Popen[bytes]
    out: str
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    errors: list[bytes] = field(default_factory=list)
    errors_read: threading.Event = field(default_factory=threading.Event)

    def wait_for(self, word: str, timeout: float, *, fresh: bool = True) -> bool:
        """True once the worker prints a line starting with ``word`` (within ``timeout``).

        ``fresh``: only lines printed from now on count.
        """
        while fresh and not self.lines.empty():
            self.lines.get_nowait()
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                if self.lines.get(timeout=left).startswith(word):
                    return True
            except queue.Empty:
                return False
        return False

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stderr(self) -> str:
        """Everything the worker wrote to stderr (waits for it to close the pipe)."""
        self.errors_read.wait(60)
        return b"".join(self.errors).decode(errors="replace")


def spawn(job: dict[str, Any], script: Path = WORKER) -> Worker:
    """Start ``script`` (worker.py) on ``job``; stdout is read on a thread so it never blocks."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)])}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    process = subprocess.Popen(
        [sys.executable, str(script), json.dumps(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=str(REPO),
    )
    worker = Worker(process, job["out"])

    def read() -> None:
        assert process.stdout is not None
        with process.stdout:
            for raw in process.stdout:
                worker.lines.put(raw.decode().strip())

    def read_errors() -> None:
        assert process.stderr is not None
        try:
            with process.stderr:
                worker.errors.append(process.stderr.read())
        finally:
            worker.errors_read.set()

    threading.Thread(target=read, daemon=True).start()
    threading.Thread(target=read_errors, daemon=True).start()
    return worker


def start_together(jobs: list[dict[str, Any]], go: Path, timeout: float = 120.0) -> list[Worker]:
    """Start a worker per job, release them at once (the ``go`` file), wait for them all.

    Each job must name ``go``. A worker still running after ``timeout``
    seconds is killed (its return code is then -9).
    """
    workers = [spawn(job) for job in jobs]
    deadline = time.monotonic() + timeout
    for worker in workers:
        if not worker.wait_for("ready", max(0.0, deadline - time.monotonic()), fresh=False):
            break
    go.touch()
    for worker in workers:
        try:
            worker.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.kill()
    return workers


def value_files(directory: Path) -> list[Path]:
    """Every value file the workers wrote under ``directory``."""
    return sorted(p for p in directory.iterdir() if ".t" in p.name)


def read_values(paths: Iterable[Path]) -> dict[str, list[int]]:
    """The values in each file, in the order they were handed out."""
    return {p.name: [int(line) for line in p.read_text().split()] for p in paths}


@dataclass(frozen=True)
class Check:
    """Uniqueness figures of a set of values handed out."""

    values: int
    duplicates: int
    gaps: int
    highest: int

    @classmethod
    def of(cls, values: list[int], *, start: int = 1, step: int = 1) -> Check:
        counts = Counter(values)
        duplicates = sum(n - 1 for n in counts.values() if n > 1)
        highest = max(values) if values else start - step
        span = (highest - start) // step + 1 if values else 0
        return cls(len(values), duplicates, span - len(counts), highest)

    def repeated(self, values: list[int], limit: int = 10) -> list[int]:
        """A few of the values that were handed out more than once (for messages)."""
        return [v for v, n in Counter(values).items() if n > 1][:limit]


def tally(record_property: Any, store: str, scenario: str, **figures: Any) -> None:
    """Record a scenario's figures on the test (junit) and for the end-of-run summary."""
    for key, value in figures.items():
        record_property(key, value)
    TALLIES.append({"store": store, "scenario": scenario, **figures})
