"""``python -m benchmarks.one_row``: what one ``sys_sequence`` row on one PostgreSQL serves.

Processes reserve from one row as fast as they can for a fixed time, each
with its own ``SQLStore``: raw reservations (``store.reserve(name, 1)``,
one round trip each) and values through a ``SequenceLock`` with the
default block sizing. Then one process reserves through a proxy adding
``--latency`` seconds each way, as a synchronous standby or a remote
primary would. Prints one Markdown table; figures for ``docs/scaling.md``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from typing import Any

URL = os.environ.get("AUTOSEQ_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _worker(mode: str, url: str, table: str, ready: Any, seconds: float, out: Any) -> None:
    """One process: connect, wait for every other one, take for ``seconds``, report."""
    from autoseq import SequenceLock
    from autoseq.stores import SQLStore

    store = SQLStore(url, table=table)
    store.read("one")
    lock = SequenceLock("one", store)
    count = 0
    ready.wait()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if mode == "reserve":
            store.reserve("one", 1)
            count += 1
        else:
            for _ in range(256):
                lock.next()
            count += 256
    reservations = store.reservations
    lock.close(release=False)
    store.close()
    out.put((count, reservations))


def trial(mode: str, processes: int, seconds: float, url: str = URL) -> tuple[float, float]:
    """(per second: what was taken, reservations) for ``processes`` on one fresh row."""
    from autoseq import SequenceConfig
    from autoseq.stores import SQLStore

    table = f"onerow_{os.getpid()}_{mode}_{processes}"
    setup = SQLStore(url, table=table)
    setup.create_table()
    setup.create(SequenceConfig("one"))
    context = multiprocessing.get_context("spawn")
    ready, out = context.Barrier(processes), context.Queue()
    workers = [
        context.Process(target=_worker, args=(mode, url, table, ready, seconds, out))
        for _ in range(processes)
    ]
    try:
        for worker in workers:
            worker.start()
        results = [out.get(timeout=300) for _ in workers]
        for worker in workers:
            worker.join(60)
    finally:
        setup.drop()
        setup.close()
    taken = sum(count for count, _ in results)
    reservations = sum(r for _, r in results)
    return taken / seconds, reservations / seconds


def latency_trial(latency: float, seconds: float) -> float:
    """Reservations/s of one process through a proxy adding ``latency`` s each way."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from reliability.faultproxy import FaultProxy
    from sqlalchemy.engine import make_url

    url = make_url(URL)
    with FaultProxy(url.port or 5432) as proxy:
        proxied = url.set(port=proxy.port).render_as_string(hide_password=False)
        proxy.latency = latency
        rate, _ = trial("reserve", 1, seconds, proxied)
    return rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.one_row", description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--processes", default="1,4,16")
    parser.add_argument("--latency", type=float, default=0.01)
    args = parser.parse_args(argv)
    rows: list[Any] = []
    for processes in (int(p) for p in args.processes.split(",")):
        reserved, _ = trial("reserve", processes, args.seconds)
        values, reservations = trial("values", processes, args.seconds)
        rows.append((processes, reserved, values, reservations))
    print(
        "| processes | reservations/s (one value each) | values/s (default blocks) "
        "| reservations/s behind them |"
    )
    print("| --- | --- | --- | --- |")
    for processes, reserved, values, reservations in rows:
        print(f"| {processes} | {reserved:,.0f} | {values:,.0f} | {reservations:,.0f} |")
    if args.latency:
        rate = latency_trial(args.latency, args.seconds)
        print(
            f"\none process, {args.latency * 1000:.0f} ms added each way: "
            f"{rate:,.1f} reservations/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
