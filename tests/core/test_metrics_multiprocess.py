"""Metrics under pre-fork servers: with PROMETHEUS_MULTIPROC_DIR, a scrape of any
worker reads the total of every worker (real processes, a real SQLite store)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parents[1]  # tests/, where multiprocess_app.py is
ROOT = HERE.parent
SEQUENCE = "orders"


def scrape(port: int) -> dict[str, float]:
    """Every sample of the test sequence on ``port``, by metric name (summed over other labels)."""
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("sequence") == SEQUENCE:
                samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    return samples


def served_everywhere(ports: list[int], expected: float, within: float = 15.0) -> list[float]:
    """What each port says was served, once the first says ``expected`` (or time is up)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if scrape(ports[0]).get("autoseq_values_served_total") == expected:
            break
        time.sleep(0.2)
    return [scrape(port).get("autoseq_values_served_total", 0.0) for port in ports]


@pytest.fixture
def environment(tmp_path: Path) -> dict[str, str]:
    """A shared multi-process directory and SQLite database for the workers."""
    shared = tmp_path / "prometheus"
    shared.mkdir()
    return {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(shared),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)]),
        "AUTOSEQ_TEST_DB_URL": f"sqlite:///{tmp_path / 'app.db'}",
        "AUTOSEQ_TEST_SEQUENCE": SEQUENCE,
    }


@pytest.fixture
def workers(environment: dict[str, str]) -> Iterator[list[tuple[subprocess.Popen[str], Any]]]:
    """Three processes that served 150, 230 and 370 values, each answering on its own port."""
    started = []
    for count in (150, 230, 370):
        process = subprocess.Popen(
            [sys.executable, str(HERE / "multiprocess_app.py"), str(count)],
            env=environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(process)
    try:
        assert all(process.stdout for process in started)
        yield [(process, json.loads(process.stdout.readline())) for process in started]  # type: ignore[union-attr]
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
            process.wait()
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    stream.close()


def test_a_scrape_of_any_worker_adds_up_every_worker(
    workers: list[tuple[subprocess.Popen[str], Any]], environment: dict[str, str]
) -> None:
    """750 values served by three processes: each process's /metrics says 750, with the
    reservations, reserved and buffered values of all three, and 0 duplicates."""
    from prometheus_client import multiprocess

    reports = [report for _, report in workers]
    values = [value for report in reports for value in report["values"]]
    assert len(values) == 750
    assert len(set(values)) == 750  # no duplicates
    ports = [report["port"] for report in reports]
    assert served_everywhere(ports, 750.0) == [750.0, 750.0, 750.0]

    def total(key: str) -> float:
        return float(sum(report["stats"][key] for report in reports))

    buffered = total("current_block_left") + total("next_block_left")
    for port in ports:
        samples = scrape(port)
        assert samples["autoseq_reservations_total"] == total("reservations") == 3
        assert samples["autoseq_reserved_values_total"] == total("reserved_values") == 900
        assert samples["autoseq_buffered_values"] == buffered == 150
    # A worker goes (gunicorn's child_exit marks it dead): its values stay
    # counted, what it held in memory no longer does.
    process, last = workers[-1]
    assert process.stdin is not None
    process.stdin.close()
    assert process.wait(timeout=30) == 0
    multiprocess.mark_process_dead(process.pid, environment["PROMETHEUS_MULTIPROC_DIR"])
    held_by_last = last["stats"]["current_block_left"] + last["stats"]["next_block_left"]
    samples = scrape(ports[0])
    assert samples["autoseq_values_served_total"] == 750
    assert samples["autoseq_buffered_values"] == buffered - held_by_last == 120


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


GUNICORN_CONFIG = """\
from prometheus_client import multiprocess


def child_exit(server, worker):
    multiprocess.mark_process_dead(worker.pid)
"""


@pytest.fixture
def gunicorn(environment: dict[str, str], tmp_path: Path) -> Iterator[int]:
    """gunicorn with 3 sync workers serving ``multiprocess_app:app``; yields its port."""
    pytest.importorskip("gunicorn", reason="gunicorn is in the dev extra")
    config = tmp_path / "gunicorn.conf.py"
    config.write_text(GUNICORN_CONFIG)
    port = free_port()
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "gunicorn", "--config", str(config), "--workers", "3"),
            *("--bind", f"127.0.0.1:{port}", "multiprocess_app:app"),
        ],
        env={**environment, "AUTOSEQ_TEST_DELAY": "0.1"},
        cwd=HERE,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                scrape(port)
                break
            except OSError:
                assert server.poll() is None, "gunicorn exited"
                assert time.monotonic() < deadline, "gunicorn did not answer in 60 s"
                time.sleep(0.2)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_gunicorn_workers_scrape_the_same_total(gunicorn: int) -> None:
    """30 requests spread over 3 gunicorn workers: six scrapes, whichever worker answers,
    all read the exact values served and reservations made by all of them."""

    def serve(count: int) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{gunicorn}/serve?n={count}") as response:
            return json.loads(response.read())

    counts = [7 * index + 11 for index in range(30)]
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(serve, counts))
    values = [value for answer in answers for value in answer["values"]]
    assert len(values) == sum(counts) == 3375
    assert len(set(values)) == len(values)  # no duplicates
    reservations: dict[int, int] = {}
    for answer in answers:
        pid = answer["pid"]
        reservations[pid] = max(reservations.get(pid, 0), answer["stats"]["reservations"])
    assert len(reservations) >= 2, f"every request went to one worker: {reservations}"
    assert served_everywhere([gunicorn] * 6, 3375.0) == [3375.0] * 6
    made = sum(reservations.values())
    assert [scrape(gunicorn)["autoseq_reservations_total"] for _ in range(6)] == [made] * 6


FORKING = """\
import os, sys
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from autoseq import SequenceConfig, SequenceRegistry, metrics
from autoseq.stores import SQLStore

metrics.install()
registry = SequenceRegistry(SQLStore(os.environ["AUTOSEQ_TEST_DB_URL"]))
lock = registry.register(SequenceConfig("orders", batch_count=100))
lock.next_many(100)
metrics.install().publish()
child = os.fork()
if child == 0:
    lock.next_many(40)
    sys.exit(0)  # the exit hook publishes the child's figures
os.waitpid(child, 0)
everyone = CollectorRegistry()
MultiProcessCollector(everyone)
served = [s.value for f in everyone.collect() for s in f.samples
          if s.name == "autoseq_values_served_total"]
print(sum(served))
"""


def run_in_a_worker(script: str, environment: dict[str, str]) -> str:
    """What ``script`` prints, run in a fresh process with ``environment``; it must exit 0."""
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_forked_child_adds_only_what_it_served(environment: dict[str, str]) -> None:
    """100 values served before a fork, 40 by the child: the workers' total is 140
    (the child does not publish the parent's 100 again, nor lose its 40)."""
    assert float(run_in_a_worker(FORKING, environment)) == 140


STARTING_WORKER = """
import os, pathlib
from prometheus_client import generate_latest
from autoseq import metrics
# A worker that has just created its file and not yet sized it (prometheus_client
# opens the file, then truncates it to its first size).
pathlib.Path(os.environ["PROMETHEUS_MULTIPROC_DIR"], "counter_4242.db").touch()
text = generate_latest(metrics.scrape_registry()).decode()
print("autoseq_" in text or text == "")
"""


def test_a_scrape_while_a_worker_starts_answers(environment: dict[str, str]) -> None:
    """A scrape that lands while another worker has created its file but not sized it
    yet answers (prometheus_client's own collector fails there with ``struct.error``,
    which a web server turns into a 500)."""
    assert run_in_a_worker(STARTING_WORKER, environment) == "True"
