"""Process-level promises of the core: lazy imports, fork safety, clean exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autoseq import SequenceConfig, SequenceRegistry
from autoseq.stores import SQLStore

HEAVY = ["sqlalchemy", "django", "mongoengine", "pymongo", "redis", "psycopg", "pymysql"]


def run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_import_autoseq_imports_no_orm_or_driver() -> None:
    """`import autoseq` (and its memory store and signals) loads no ORM or database driver."""
    result = run_python(
        f"""
        import json, sys
        import autoseq, autoseq.stores, autoseq.signals, autoseq.testing
        from autoseq.stores import MemoryStore
        registry = autoseq.SequenceRegistry(MemoryStore(), auto_create=True)
        registry.next("x")
        heavy = {HEAVY!r}
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy)))
        """
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_children_never_serve_the_parents_block(tmp_path: Path) -> None:
    """After fork, children reserve their own blocks: no value repeats anywhere."""
    store = SQLStore(f"sqlite:///{tmp_path / 'fork.db'}")
    registry = SequenceRegistry(store)
    lock = registry.register(SequenceConfig("forked", batch_count=50))
    parent = [lock.next() for _ in range(10)]  # the parent holds 11..50 (and maybe a spare)
    children = []
    for _i in range(4):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            os.close(read)
            try:
                values = [lock.next() for _ in range(120)]
                os.write(write, json.dumps(values).encode())
            finally:
                os._exit(0)
        os.close(write)
        children.append((pid, read))
    collected = list(parent)
    for pid, read in children:
        with os.fdopen(read) as pipe:
            values = json.loads(pipe.read())
        os.waitpid(pid, 0)
        assert values == sorted(values)
        collected += values
    collected += [lock.next() for _ in range(100)]
    registry.close()
    assert len(collected) == len(set(collected)) == 10 + 4 * 120 + 100


def test_interpreter_exits_promptly_with_a_prefetch_worker(tmp_path: Path) -> None:
    """A process with a live prefetch worker exits at once: the worker does not hold it up."""
    started = time.monotonic()
    result = run_python(
        f"""
        from autoseq import SequenceRegistry, SequenceConfig
        from autoseq.stores import SQLStore
        registry = SequenceRegistry(SQLStore("sqlite:///{tmp_path / "exit.db"}"))
        lock = registry.register(SequenceConfig("bye", batch_count=10))
        print([lock.next() for _ in range(15)][-1])
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "15"
    assert time.monotonic() - started < 20


def test_exit_hands_back_the_unused_block(tmp_path: Path) -> None:
    """A process that exits normally returns its unused block, so the next one has no gap."""
    url = f"sqlite:///{tmp_path / 'gapless.db'}"
    code = f"""
        from autoseq import BufferPolicy, SequenceRegistry, SequenceConfig
        from autoseq.stores import SQLStore
        registry = SequenceRegistry(SQLStore({url!r}), policy=BufferPolicy(prefetch=False))
        lock = registry.register(SequenceConfig("restart", batch_count=100))
        print([lock.next() for _ in range(15)][-1])
        """
    first = run_python(code)
    second = run_python(code)
    assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
    assert (first.stdout.strip(), second.stdout.strip()) == ("15", "30")
    assert SQLStore(url).read("restart").current == 31


def test_a_busy_process_leaves_a_short_range_to_a_second_process(tmp_path: Path) -> None:
    """Two real processes on a five-digit range: the second is served while the first holds.

    Before blocks were capped at 1/100 of a short range, the first process's
    blocks grew to the rest of the range and the second got SequenceExhausted.
    """
    url = f"sqlite:///{tmp_path / 'serial.db'}"
    busy = SequenceRegistry(SQLStore(url))
    lock = busy.register(SequenceConfig("serial", end=99_999, batch_count=100))
    taken = [lock.next() for _ in range(20_000)]
    deadline = time.monotonic() + 10
    while lock.stats()["loading"] and time.monotonic() < deadline:
        time.sleep(0.01)  # the busy process's prefetch has landed
    second = run_python(
        f"""
        from autoseq import SequenceConfig, SequenceRegistry
        from autoseq.stores import SQLStore
        registry = SequenceRegistry(SQLStore({url!r}))
        lock = registry.register(SequenceConfig("serial", end=99_999, batch_count=100))
        print(lock.next_many(500)[-1])
        registry.close()
        """
    )
    assert second.returncode == 0, second.stderr
    last = int(second.stdout.strip())
    assert last > max(taken)
    assert last - 499 not in taken
    busy.close()
