"""A worker process for the snowflake scenarios: generates ids and writes each one down.

Run as ``python snowflake_worker.py '<json job>'``. Job keys: ``spec``
(storespec), ``options`` (store constructor), ``snowflake`` (Snowflake
keywords), ``threads``, ``count`` (ids per thread; None: until killed),
``go`` (a file to wait for first), ``out`` (file prefix), ``churn`` (seconds
of taking, using and dropping generators one after another; see
``churn()``). With ``count`` None every id is written with its own
``os.write`` before the next is made, so a SIGKILL leaves on disk exactly
the ids issued.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from typing import Any

from storespec import open_store

from autoseq.errors import LeaseLost, WorkersExhausted
from autoseq.snowflake import Snowflake


def announce(word: str) -> None:
    os.write(1, f"{word}\n".encode())


def wait_for_go(job: dict[str, Any]) -> None:
    go = job.get("go")
    deadline = time.monotonic() + 60
    while go and not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.005)


def churn(job: dict[str, Any], store: Any) -> None:
    """Take a generator, use it a moment, then close or abandon it; again until time is up.

    An abandoned generator stops renewing without releasing: its lease must
    expire before anyone else may use the worker id. One line per round:
    ``<worker> <owner> <id> <id> ...``.
    """
    rng = random.Random()
    fd = os.open(f"{job['out']}.rounds", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    deadline = time.monotonic() + job["churn"]
    while time.monotonic() < deadline:
        try:
            gen = Snowflake(store, **job["snowflake"])
        except WorkersExhausted:
            time.sleep(rng.uniform(0.01, 0.05))
            continue
        assert gen.lease is not None
        owner, worker = gen.lease.owner, gen.worker_id
        ids = []
        until = time.monotonic() + rng.uniform(0.05, 0.3)
        try:
            while time.monotonic() < until:
                ids.append(gen.next())
                time.sleep(0.001)
        except LeaseLost:
            pass
        os.write(fd, (" ".join(map(str, [worker, owner, *ids])) + "\n").encode())
        if rng.random() < 0.3:
            gen._stop.set()  # abandoned: no renewal, no release
        else:
            gen.close()
    os.close(fd)


def main() -> None:
    job = json.loads(sys.argv[1])
    store = open_store(job["spec"], **job.get("options", {}))
    announce("ready")
    wait_for_go(job)
    if job.get("churn"):
        churn(job, store)
        announce("done")
        return
    gen = Snowflake(store, **job["snowflake"])
    announce(f"worker {gen.worker_id}")
    count = job.get("count")

    def work(index: int) -> None:
        path = f"{job['out']}.t{index}"
        if count is None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            announce("generating")
            while True:
                os.write(fd, b"%d\n" % gen.next())
        ids = []
        for _ in range(count // 2):
            ids.append(gen.next())
        ids += gen.next_many(count - count // 2)
        with open(path, "w") as f:
            f.write("\n".join(map(str, ids)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(job.get("threads", 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gen.close()
    announce("done")


if __name__ == "__main__":
    main()
