"""Crash: workers SIGKILLed at random moments, and inside a reservation, never repeat a value."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from autoseq import SequenceConfig, SequenceRegistry

from .harness import Check, read_values, spawn, tally, value_files

SHORT = {"workers": 3, "kills": 16, "seconds": 20.0}
SOAK = {"workers": 4, "kills": 200, "seconds": 240.0}


def crash_run(
    target: Any, tmp_path: Path, record_property: Any, *, workers: int, kills: int, seconds: float
) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    config = {"name": "crash", "batch_count": 10}
    out = tmp_path / "values"
    out.mkdir()
    stop = tmp_path / "stop"
    job: dict[str, Any] = {
        "spec": target.spec,
        "options": {},
        "config": config,
        "policy": {"retry_initial": 0.01, "retry_max": 0.2},
        "threads": 2,
        "pace": 0.0002,
        "hold": 0.4,
        "hold_seconds": 0.05,
        "stop": str(stop),
    }
    started = 0

    def start(slot: int) -> Any:
        nonlocal started
        started += 1
        return spawn({**job, "out": str(out / f"w{slot}-{started}")})

    pool = [start(slot) for slot in range(workers)]
    killed = mid_reservation = 0
    deadline = time.monotonic() + seconds
    try:
        while killed < kills and time.monotonic() < deadline:
            slot = rng.randrange(workers)
            victim = pool[slot]
            if killed % 2:
                # inside a reservation: the store's transaction is open, or the
                # block is committed but not yet served
                mid_reservation += victim.wait_for("hold", timeout=3.0)
            else:
                time.sleep(rng.uniform(0.05, 0.3))
            if victim.process.poll() is not None:
                pytest.fail(
                    f"worker exited by itself ({victim.process.returncode}): {victim.stderr()}"
                )
            victim.kill()
            killed += 1
            pool[slot] = start(slot)
        time.sleep(0.3)  # the last restarted workers take some values too
    finally:
        stop.touch()
        for worker in pool:
            try:
                worker.process.wait(timeout=20)
            except Exception:
                worker.kill()
    failures = [w.stderr() for w in pool if w.process.returncode not in (0, -9)]
    assert not failures, failures

    per_file = read_values(value_files(out))
    values = [v for vs in per_file.values() for v in vs]
    check = Check.of(values)
    assert check.duplicates == 0, f"seed {seed}: repeated values {check.repeated(values)}"
    for name, vs in per_file.items():
        assert vs == sorted(vs), f"{name}: values went backwards in one thread"

    store = target.open()
    assert store.read("crash").current > check.highest
    registry = SequenceRegistry(store)
    after = registry.register(SequenceConfig(**config)).next()
    assert after > check.highest, f"sequence restarted at {after}, below {check.highest}"
    registry.close(release=False)
    tally(
        record_property,
        target.id,
        "crash",
        values=check.values,
        duplicates=check.duplicates,
        gaps=check.gaps,
        kills=killed,
        kills_mid_reservation=mid_reservation,
        processes=started,
        seed=seed,
    )
    assert killed >= kills // 2, f"only {killed} kills in {seconds}s"
    assert check.values > 1000, "workers took too few values for the run to mean anything"


def test_sigkill_never_repeats_a_value(target: Any, tmp_path: Path, record_property: Any) -> None:
    """Workers SIGKILLed at random and mid-reservation, then restarted: no value twice."""
    crash_run(target, tmp_path, record_property, **SHORT)  # type: ignore[arg-type]


@pytest.mark.slow
def test_sigkill_soak(target: Any, tmp_path: Path, record_property: Any) -> None:
    """The crash scenario with 200 kills: still no value twice, the sequence continues past all."""
    crash_run(target, tmp_path, record_property, **SOAK)  # type: ignore[arg-type]
