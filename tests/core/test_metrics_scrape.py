"""What a scrape reads, pinned: a fixed scenario (``metrics_scenario.py``) scraped in one
process and over two processes in multi-process mode gives the text recorded in
``metrics_scrape*.txt``, line for line, and the metrics cost little memory per sequence.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CREATED = re.compile(r"^(\w+_created\{[^}]*\}) (\S+)$", re.MULTILINE)


def scenario(part: str, **environment: str) -> str:
    """What ``metrics_scenario.py part`` prints, run in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, str(HERE / "metrics_scenario.py"), part],
        env={**os.environ, "PYTHONPATH": str(ROOT), **environment},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def expected(name: str) -> str:
    return (HERE / name).read_text()


def test_one_process_scrapes_the_text_recorded() -> None:
    """Caller and prefetch reservations, latencies in six buckets and past the last,
    a lock closed and collected: the scrape is the recorded text, the same families,
    help, types, label sets, order and values; each ``_created`` is a time of the run."""
    started = time.time()
    text = scenario("single")
    ended = time.time()
    times = [float(value) for _, value in CREATED.findall(text)]
    assert len(times) == 11
    assert all(started <= value <= ended for value in times), (started, times, ended)
    assert CREATED.sub(r"\1 <time>", text) == expected("metrics_scrape.txt")


def test_two_processes_in_multiprocess_mode_scrape_the_text_recorded(tmp_path: Path) -> None:
    """The scenario shared between two processes with PROMETHEUS_MULTIPROC_DIR: what the
    files add up to is the recorded text, sample for sample (the files' order, and so
    the samples', follows the processes' ids: the lines are compared sorted)."""
    shared = tmp_path / "prometheus"
    shared.mkdir()
    for part in ("first", "second"):
        scenario(part, PROMETHEUS_MULTIPROC_DIR=str(shared))
    everyone = CollectorRegistry()
    MultiProcessCollector(everyone, path=str(shared))  # type: ignore[no-untyped-call]
    lines = sorted(generate_latest(everyone).decode().splitlines())
    assert lines == sorted(expected("metrics_scrape_multiprocess.txt").splitlines())
